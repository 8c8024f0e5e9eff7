//! Transfers: the pipeline through the three layers (`pipeline`), the
//! PostgreSQL transaction that holds layers 2 and 3 (`transaction`), the
//! history (`history`), and who money goes to (`recipient`).

pub mod admission;
mod call;
pub mod history;
pub mod pipeline;
pub mod recipient;
mod statement_by_statement;
mod transaction;

pub use call::Settled;
pub use transaction::*;
