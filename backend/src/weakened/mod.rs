//! DEMO ONLY: the layers done wrong, or done the common other way, kept so
//! that the race lab and the variants comparison can show what each
//! production layer prevents. Each file is named after the production layer
//! it weakens, so a reader comparing right with wrong finds both:
//!
//! | production                         | weakened here                     |
//! |------------------------------------|-----------------------------------|
//! | `defense::idempotency`             | `idempotency` (check-then-insert, advisory lock, off), `idempotency_key_lock` (a Redis lock on the key) |
//! | `defense::row_guard`               | `row_guard` (read-decide-write, `FOR UPDATE`, optimistic versions) |
//! | `defense::inbox`                   | `inbox` (check-then-insert)       |
//! | `transfer::transaction`            | `transfer_transaction` (one statement at a time, so a variant can stand in) |
//! | `payout::transaction`              | `payout_transaction` (the bank called inside the transaction) |
//!
//! Nothing in the production path calls into this module except where a
//! deployment was started in a demonstration mode, which the server warns
//! about at start-up. Never copy these into a service.

pub mod idempotency;
pub mod idempotency_key_lock;
pub mod inbox;
pub mod payout_transaction;
pub mod row_guard;
pub mod transfer_transaction;
