//! Layer 2 for messages from outside: the inbox.
//!
//! **Stops:** a message applied twice. A provider's deposit event and a
//! broker's command both come again: a retry whose answer was lost, a
//! delivery to two instances at once, a consumer that ran out of time or
//! died between its commit and its acknowledgement. The first delivery
//! claims `(source, event_id)` by inserting a row, in the same transaction
//! as the work it guards, so the claim is taken exactly when the work
//! commits and freed exactly when it rolls back. Every later delivery
//! reads the answer stored with the claim instead of doing the work again.
//!
//! **Does not guarantee** anything past the retention: a claim is swept
//! after `inbox_retention_hours`, and the same id is a new message then.
//! Each caller therefore refuses messages older than the retention, so a
//! message whose claim was swept can never be applied a second time. Nor
//! does it say anything about the work itself: the row guard does.
//!
//! **Bounds:** a delivery waits for a concurrent claim of the same id at
//! most `inbox_wait_ms_max` (a transaction-local `lock_timeout`), then is
//! told the first is still in flight.
//!
//! **When PostgreSQL fails:** the transaction rolls back with the claim, so
//! nothing is stored and the next delivery claims afresh.
//!
//! The claim's SQL is `inbox_claim()`
//! (migrations/20261202000011_inbox_and_deposits.sql), called inside each
//! entry point's one statement (`deposit()`, `broker_command()`), which
//! answers with [`InboxClaim`]. The race lab's weakened inbox
//! (check-then-insert) is in `weakened/inbox.rs`, not here.

use crate::decision::Outcome;

/// The inbox's answer to a claim: the PostgreSQL enum
/// `inbox_claim_verdict`, value for value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "inbox_claim_verdict", rename_all = "snake_case")]
pub enum InboxClaim {
    /// The message is this delivery's: the work runs in its transaction.
    Started,
    /// Applied (or refused) before: the stored answer is the answer.
    Replayed,
    /// The same id came before with other contents; the first stands.
    PayloadChanged,
    /// The first delivery did not finish within the wait.
    InFlight,
}

impl InboxClaim {
    /// The claim's outcome in the decision vocabulary, for traces: a
    /// started claim lets the delivery through.
    pub fn outcome(self) -> Outcome {
        match self {
            Self::Started => Outcome::Accepted,
            Self::Replayed => Outcome::Replayed,
            Self::PayloadChanged => Outcome::PayloadChanged,
            Self::InFlight => Outcome::InFlight,
        }
    }
}

/// An id the inbox takes: what a provider names its event by, and an
/// issuer its command (the `inbox.event_id` column's check). The
/// characters leave it safe in a Redis key and a log line.
pub fn is_event_id(text: &str) -> bool {
    (1..=128).contains(&text.len())
        && text
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || b"_.:-".contains(&byte))
}
