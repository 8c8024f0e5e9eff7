//! The three defenses a transfer passes, in order, each in its own file:
//!
//! 1. [`cooldown`]: a Redis lock per user and action that sheds duplicates at
//!    the edge, before any database work;
//! 2. [`idempotency`]: a PostgreSQL claim on the client's key, in the same
//!    transaction as the transfer, that turns retries into replays;
//! 3. [`row_guard`]: the guarded debit that makes an overdraft or a lost
//!    update impossible, whatever got through the first two.
//!
//! The first is an efficiency measure and may fail open; the last two are
//! the correctness guarantee and never do.

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
