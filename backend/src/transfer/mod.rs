//! Transfers: the pipeline through the three layers (`pipeline`), the
//! PostgreSQL transaction that holds layers 2 and 3 (`transaction`), and
//! the history (`history`).

pub mod history;
pub mod pipeline;
mod transaction;

pub use transaction::*;
