//! Layer 3: the row guard.
//!
//! **Stops:** overdrafts and lost updates, whatever got through the first
//! two layers (a request without a key, a second instance, an expired
//! cooldown, a fail-open pass). The debit is one statement that checks and
//! writes at once:
//!
//! ```sql
//! UPDATE wallets SET balance_minor = balance_minor - $amount
//! WHERE id = $from AND balance_minor >= $amount
//! ```
//!
//! PostgreSQL re-checks the `WHERE` against the newest row version after
//! waiting for a concurrent writer, so two debits can never both see the same
//! old balance. Zero rows updated means insufficient funds. The
//! `balance_minor >= 0` constraint backs the guard up.
//!
//! **Deadlocks:** a transfer A→B and one B→A would each lock one wallet and
//! wait for the other. Both wallets are therefore locked up front, in wallet
//! id order, so every transfer takes its locks in the same order.
//!
//! **Bounds:** a wait for a wallet lock is bounded by the transaction's
//! `lock_timeout` (`wallet_lock_wait_ms_max`).
//!
//! **Where the SQL is:** the function `row_guard_transfer()`
//! (migrations/20261202000003_row_guard.sql), so that the whole transfer can
//! run in one round trip (`transfer()`); `apply` calls it on its own for the
//! demonstration's step-by-step transaction. The weakened guards the race
//! lab shows beside it (read-decide-write, `FOR UPDATE`, optimistic
//! versions) are in `weakened/row_guard.rs`, not here.
//!
//! **Does not guarantee** that a retried request is not a second transfer:
//! that is the idempotency key's job.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::decision::{Layer, Outcome};
use crate::domain::{TransferRequest, UserId};
use crate::problem::{Problem, ProblemType};

/// The row guard's answer: the PostgreSQL enum `guard_verdict`
/// (migrations/20261202000003_row_guard.sql), value for value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "guard_verdict", rename_all = "snake_case")]
pub enum GuardVerdict {
    /// Debited, credited and recorded.
    Accepted,
    InsufficientFunds,
    UnknownTarget,
    /// The wallets hold different currencies: minor units never move 1:1
    /// across currencies.
    CurrencyMismatch,
    /// The caller does not own the source wallet (or it does not exist).
    NotOwner,
}

impl GuardVerdict {
    /// The decision this answer makes, as traces, metrics and the feed name
    /// it.
    pub fn decision_outcome(self) -> Outcome {
        match self {
            GuardVerdict::Accepted => Outcome::Accepted,
            GuardVerdict::InsufficientFunds => Outcome::InsufficientFunds,
            GuardVerdict::UnknownTarget | GuardVerdict::CurrencyMismatch => Outcome::Rejected,
            GuardVerdict::NotOwner => Outcome::Unauthorized,
        }
    }

    /// The business refusal this answer is: stored with the key (by kind)
    /// and sent as a 422, rendered from the catalogue only when needed.
    /// `None` for an accepted transfer, and for a caller who does not own
    /// the source, who is refused without storing anything.
    pub fn refusal(self) -> Option<Problem> {
        let (kind, detail) = match self {
            GuardVerdict::Accepted | GuardVerdict::NotOwner => return None,
            GuardVerdict::InsufficientFunds => (
                ProblemType::InsufficientFunds,
                "The source wallet's balance is lower than the amount.",
            ),
            GuardVerdict::UnknownTarget => (
                ProblemType::UnknownTargetWallet,
                "No wallet has the id given as to_wallet_id.",
            ),
            GuardVerdict::CurrencyMismatch => (
                ProblemType::CurrencyMismatch,
                "The source and target wallets hold different currencies; money is never converted.",
            ),
        };
        Some(Problem::new(kind, detail).with_layer(Layer::RowGuard))
    }
}

/// An accepted transfer's results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub balance_minor_after: i64,
    pub created_at: DateTime<Utc>,
}

/// What the row guard decided, with an accepted transfer's results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guarded {
    pub verdict: GuardVerdict,
    /// Set exactly when `verdict` is `Accepted`.
    pub applied: Option<Applied>,
}

impl Guarded {
    pub fn refused(verdict: GuardVerdict) -> Self {
        Self {
            verdict,
            applied: None,
        }
    }

    /// Reads the row guard's columns. An accepted transfer without its
    /// results, or a refusal with them, is a protocol error: a bug, never
    /// guessed at.
    pub fn from_columns(
        outcome: GuardVerdict,
        balance_minor_after: Option<i64>,
        created_at: Option<DateTime<Utc>>,
    ) -> Result<Self, sqlx::Error> {
        match (outcome, balance_minor_after, created_at) {
            (GuardVerdict::Accepted, Some(balance_minor_after), Some(created_at)) => Ok(Self {
                verdict: outcome,
                applied: Some(Applied {
                    balance_minor_after,
                    created_at,
                }),
            }),
            (GuardVerdict::Accepted, _, _) => Err(sqlx::Error::Protocol(
                "the row guard accepted a transfer without its balance and time".into(),
            )),
            (outcome, None, None) => Ok(Self::refused(outcome)),
            (outcome, _, _) => Err(sqlx::Error::Protocol(format!(
                "the row guard answered {outcome:?} with an accepted transfer's results"
            ))),
        }
    }
}

/// `row_guard_transfer()`'s row.
#[derive(sqlx::FromRow)]
struct GuardRow {
    outcome: GuardVerdict,
    balance_minor_after: Option<i64>,
    created_at: Option<DateTime<Utc>>,
}

/// The whole layer, in the caller's transaction: lock both wallets in id
/// order, check ownership and the target, run the guarded debit, then
/// credit and record. The SQL is `row_guard_transfer()` in
/// migrations/20261202000003_row_guard.sql.
#[tracing::instrument(
    name = "defense.row_guard",
    skip_all,
    fields(
        defense.layer = "row_guard",
        defense.outcome = tracing::field::Empty,
        wallet.from = %request.from,
        wallet.to = %request.to,
        amount_minor = request.amount.get(),
    )
)]
pub async fn apply(
    tx: &mut PgConnection,
    transfer_id: Uuid,
    request: &TransferRequest,
    caller: UserId,
    idempotency_key: Option<Uuid>,
    wait_ms: i32,
) -> Result<Guarded, sqlx::Error> {
    let row: GuardRow = sqlx::query_as(
        "SELECT outcome, balance_minor_after, created_at FROM row_guard_transfer($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(transfer_id)
    .bind(caller.0)
    .bind(request.from.0)
    .bind(request.to.0)
    .bind(request.amount.get())
    .bind(idempotency_key)
    .bind(wait_ms)
    .fetch_one(&mut *tx)
    .await?;
    let guarded = Guarded::from_columns(row.outcome, row.balance_minor_after, row.created_at)?;
    tracing::Span::current().record("defense.outcome", guarded.verdict.decision_outcome().as_str());
    Ok(guarded)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `idempotency_complete()` stores every business refusal as a 422; the
    /// catalogue must agree, or a replay would change the status.
    #[test]
    fn every_business_refusal_is_a_422_of_the_row_guard() {
        for outcome in [
            GuardVerdict::InsufficientFunds,
            GuardVerdict::UnknownTarget,
            GuardVerdict::CurrencyMismatch,
        ] {
            let problem = outcome.refusal().expect("a refusal");
            assert_eq!(problem.status, 422, "{outcome:?}");
            assert_eq!(problem.layer, Some(Layer::RowGuard), "{outcome:?}");
        }
        assert!(GuardVerdict::Accepted.refusal().is_none());
        assert!(GuardVerdict::NotOwner.refusal().is_none());
    }

    #[test]
    fn an_impossible_answer_is_a_protocol_error_not_a_guess() {
        let accepted_without_results = Guarded::from_columns(GuardVerdict::Accepted, None, None);
        assert!(matches!(accepted_without_results, Err(sqlx::Error::Protocol(_))));
        let refused_with_results =
            Guarded::from_columns(GuardVerdict::InsufficientFunds, Some(1), Some(Utc::now()));
        assert!(matches!(refused_with_results, Err(sqlx::Error::Protocol(_))));
        let refused = Guarded::from_columns(GuardVerdict::UnknownTarget, None, None).expect("a refusal");
        assert_eq!(refused.verdict.decision_outcome(), Outcome::Rejected);
    }
}
