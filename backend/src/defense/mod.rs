//! The layers, each in its own file, each opening with what it stops, what
//! it does not guarantee, its bounds and what happens when its store fails,
//! and each answering with an outcome of its own:
//!
//! | layer | entry points | file |
//! |---|---|---|
//! | 1. cooldown lock: a Redis window per user and action that sheds duplicates before any database work | transfers, payouts | [`cooldown`] |
//! | 1. edge lock: a Redis lock on a deposit's event id, whose duplicates get the first delivery's answer | deposits | [`edge_lock`] |
//! | 1. partition lease: one consumer applies a command partition at a time | commands | [`partition_lease`] |
//! | 2. idempotency key: a PostgreSQL claim on the client's key, in the same transaction as the effect | transfers, payouts | [`idempotency`] |
//! | 2. inbox: a PostgreSQL claim on the sender's event id, in the same transaction as the effect | deposits, commands | [`inbox`] |
//! | 3. row guard: the guarded debit that makes an overdraft or a lost update impossible | every entry point | [`row_guard`] |
//!
//! The first layer is an efficiency measure and may fail open; the last two
//! are the correctness guarantee and never do. The race lab's weakened
//! versions of these layers are in `weakened/`, never here.

pub mod cooldown;
pub mod edge_lock;
pub mod idempotency;
pub mod inbox;
pub mod partition_lease;
pub mod row_guard;

pub use crate::decision::Layer;

use crate::decision::{Decision, Outcome};
use crate::problem::Problem;

/// A refusal that is not stored with a key: the problem to send and the
/// decision it reports. Each layer builds its own in its file; the
/// transaction builds those of the checks around the layers.
#[derive(Debug)]
pub struct Refusal {
    pub problem: Problem,
    pub decision: Decision,
}

impl Refusal {
    pub fn new(problem: Problem, layer: Layer, outcome: Outcome) -> Self {
        Self {
            problem,
            decision: Decision::new(layer, outcome),
        }
    }

    /// The token passed its MAC but the database no longer holds it: it
    /// was revoked or has expired. It speaks for nobody.
    pub fn token_not_live() -> Self {
        Self::new(Problem::token_not_live(), Layer::NoLayer, Outcome::Unauthorized)
    }
}
