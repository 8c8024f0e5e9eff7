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
pub mod idempotency;
pub mod row_guard;

pub use crate::decision::Layer;
