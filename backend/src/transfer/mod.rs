//! Transfers: the pipeline through the three layers (`pipeline`), the
//! PostgreSQL call that holds layers 2 and 3 (`transaction`), admission
//! (`admission`), the history (`history`), and who money goes to
//! (`recipient`). The race lab's weakened variants are in `weakened/`, not
//! here.

pub mod call;
pub mod history;
pub mod pipeline;
pub mod recipient;
pub mod transaction;

pub use transaction::TransferReceipt;
