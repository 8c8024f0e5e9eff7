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
//! run in one round trip (`transfer()`); this module calls it on its own
//! when the transfer runs step by step (demonstration modes).
//!
//! **Does not guarantee** that a retried request is not a second transfer:
//! that is the idempotency key's job.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use super::Refusal;
use crate::decision::{Layer, Outcome};
use crate::domain::{TransferRequest, UserId};
use crate::problem::{Problem, ProblemType};
use crate::settings::RowGuardMode;

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

/// The wallet's row lock was held by other transfers for longer than
/// `wallet_lock_wait_ms_max`: the transaction rolled back, so nothing was
/// changed, and a retry may go through.
pub fn wallet_busy() -> Refusal {
    Refusal::new(
        Problem::unavailable("The wallet is busy with other transfers. Nothing was changed; retry shortly."),
        Layer::RowGuard,
        Outcome::Error,
    )
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
    fn refused(verdict: GuardVerdict) -> Self {
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

// ---------------------------------------------------------------------------
// DEMO ONLY: the step-by-step variants (`row_guard_mode`, or a race-lab
// run's switch), each of which reads the balance, decides in Rust and
// writes, and differs in what protects the gap between the read and the
// write:
//
// - `for_update`, the textbook alternative: both wallets are locked first
//   (`SELECT … FOR UPDATE`, in id order), so nobody else writes them until
//   the commit. Safe, but the locks are held across every round trip to the
//   commit, where the guarded `UPDATE` holds them for one statement.
// - `optimistic_version`: nothing is locked; the write is a compare-and-set
//   on the wallet's version (`UPDATE … WHERE version = $read`), which every
//   balance change bumps. A write that matches no row lost the race: the
//   whole transfer is a conflict, for the client to retry.
// - `read_decide_write`, the row guard switched off: nothing protects the
//   gap. Two debits that read the same balance both pass the check (an
//   overdraft of the intent), and the second write overwrites the first (a
//   lost update: money is created). Never use outside a demonstration.
// ---------------------------------------------------------------------------

/// What a step-by-step variant read, and decided, before it writes.
enum Decided {
    Refused(GuardVerdict),
    /// The source covers the amount: its balance and version as read.
    Covered {
        balance: i64,
        version: i64,
    },
}

/// Reads both wallets and decides as the guard would. With `lab_only` (a
/// race-lab run's switch), every statement here matches lab rows only: a
/// real wallet is not even seen, let alone written.
async fn read_and_decide(
    tx: &mut PgConnection,
    request: &TransferRequest,
    caller: UserId,
    lab_only: bool,
) -> Result<Decided, sqlx::Error> {
    let source = sqlx::query_as::<_, (Uuid, i64, i64, String)>(
        "SELECT user_id, balance_minor, version, currency FROM wallets
         WHERE id = $1 AND (lab_slot IS NOT NULL OR NOT $2) AND lab_slot IS DISTINCT FROM 3",
    )
    .bind(request.from.0)
    .bind(lab_only)
    .fetch_optional(&mut *tx)
    .await?;
    let target_currency = sqlx::query_scalar::<_, String>(
        "SELECT currency FROM wallets
         WHERE id = $1 AND (lab_slot IS NOT NULL OR NOT $2) AND lab_slot IS DISTINCT FROM 3
           AND clearing_source IS NULL",
    )
    .bind(request.to.0)
    .bind(lab_only)
    .fetch_optional(&mut *tx)
    .await?;
    // Naive about races, not about currencies: the demonstration shows
    // double charges and overdrafts, never a conversion at 1:1.
    Ok(match (source, target_currency) {
        (Some((owner, ..)), _) if owner != caller.0 => Decided::Refused(GuardVerdict::NotOwner),
        (None, _) => Decided::Refused(GuardVerdict::NotOwner),
        (Some(_), None) => Decided::Refused(GuardVerdict::UnknownTarget),
        (Some((.., source_currency)), Some(target_currency)) if source_currency != target_currency => {
            Decided::Refused(GuardVerdict::CurrencyMismatch)
        }
        (Some((_, balance, ..)), _) if balance < request.amount.get() => {
            Decided::Refused(GuardVerdict::InsufficientFunds)
        }
        (Some((_, balance, version, _)), _) => Decided::Covered { balance, version },
    })
}

/// Which step-by-step variant runs, and how.
#[derive(Debug, Clone, Copy)]
pub struct StepByStep {
    pub mode: RowGuardMode,
    /// The pause between the read and the write (`naive_window_ms`).
    pub race_window: std::time::Duration,
    /// A race-lab run's: every statement matches lab rows only.
    pub lab_only: bool,
}

/// One of the step-by-step variants; `None` when the optimistic write
/// found the version moved (a conflict: the caller rolls back).
#[tracing::instrument(
    name = "defense.row_guard",
    skip_all,
    fields(
        defense.layer = "row_guard",
        defense.mode = crate::settings::choice_name(&variant.mode),
        defense.outcome = tracing::field::Empty,
        wallet.from = %request.from,
        wallet.to = %request.to,
    )
)]
pub async fn apply_step_by_step(
    tx: &mut PgConnection,
    transfer_id: Uuid,
    request: &TransferRequest,
    caller: UserId,
    idempotency_key: Option<Uuid>,
    variant: StepByStep,
) -> Result<Option<Guarded>, sqlx::Error> {
    let StepByStep {
        mode,
        race_window,
        lab_only,
    } = variant;
    if mode == RowGuardMode::ForUpdate {
        sqlx::query(
            "SELECT id FROM wallets
              WHERE id IN ($1, $2) AND (lab_slot IS NOT NULL OR NOT $3) AND lab_slot IS DISTINCT FROM 3
              ORDER BY id FOR UPDATE",
        )
        .bind(request.from.0)
        .bind(request.to.0)
        .bind(lab_only)
        .execute(&mut *tx)
        .await?;
    }
    let (balance, version) = match read_and_decide(tx, request, caller, lab_only).await? {
        Decided::Refused(verdict) => return Ok(Some(refused(verdict))),
        Decided::Covered { balance, version } => (balance, version),
    };
    // The gap the variants differ on, widened so that a demonstration
    // shows what fills it; under a lock there is nothing to show.
    if mode != RowGuardMode::ForUpdate {
        tokio::time::sleep(race_window).await;
    }
    let computed = balance - request.amount.get();
    // Written in wallet id order, as the guard locks, so crossing
    // transfers wait for each other instead of deadlocking.
    let credit_first = request.to.0 < request.from.0;
    let mut created_at = None;
    if credit_first {
        created_at = Some(credit_and_record(tx, transfer_id, request, caller, idempotency_key).await?);
    }
    let written = sqlx::query(
        "UPDATE wallets SET balance_minor = $2, version = version + 1
          WHERE id = $1 AND (lab_slot IS NOT NULL OR NOT $3) AND ($4::bigint IS NULL OR version = $4)",
    )
    .bind(request.from.0)
    .bind(computed)
    .bind(lab_only)
    .bind((mode == RowGuardMode::OptimisticVersion).then_some(version))
    .execute(&mut *tx)
    .await?;
    if written.rows_affected() != 1 {
        tracing::Span::current().record("defense.outcome", "conflict");
        return Ok(match mode {
            RowGuardMode::OptimisticVersion => None,
            _ => Some(refused(GuardVerdict::NotOwner)),
        });
    }
    let created_at = match created_at {
        Some(created_at) => created_at,
        None => credit_and_record(tx, transfer_id, request, caller, idempotency_key).await?,
    };
    let guarded = Guarded {
        verdict: GuardVerdict::Accepted,
        applied: Some(Applied {
            balance_minor_after: computed,
            created_at,
        }),
    };
    tracing::Span::current().record("defense.outcome", guarded.verdict.decision_outcome().as_str());
    Ok(Some(guarded))
}

fn refused(verdict: GuardVerdict) -> Guarded {
    tracing::Span::current().record("defense.outcome", verdict.decision_outcome().as_str());
    Guarded::refused(verdict)
}

/// The optimistic write lost the race: nothing was changed, and nothing
/// is stored with the key, so a retry with it runs again.
pub fn version_conflict() -> Refusal {
    Refusal::new(
        Problem::new(
            ProblemType::VersionConflict,
            "Another transfer changed the source balance between this transfer's read and its write. Nothing was \
             changed; retry with the same Idempotency-Key after a random pause (exponential backoff, full jitter).",
        ),
        Layer::RowGuard,
        Outcome::Conflict,
    )
}

/// Credits the target and writes the transfer with its two ledger entries,
/// in one statement: the naive variant's second half.
async fn credit_and_record(
    tx: &mut PgConnection,
    transfer_id: Uuid,
    request: &TransferRequest,
    initiated_by: UserId,
    idempotency_key: Option<Uuid>,
) -> Result<DateTime<Utc>, sqlx::Error> {
    sqlx::query_scalar::<_, DateTime<Utc>>(
        "WITH credit AS (
             UPDATE wallets SET balance_minor = balance_minor + $4, version = version + 1 WHERE id = $3
         ), transfer AS (
             INSERT INTO transfers (id, from_wallet_id, to_wallet_id, amount_minor, initiated_by, idempotency_key)
             VALUES ($1, $2, $3, $4, $5, $6)
             RETURNING created_at
         ), ledger AS (
             INSERT INTO ledger_entries (transfer_id, wallet_id, amount_minor)
             VALUES ($1, $2, -$4), ($1, $3, $4)
         )
         SELECT created_at FROM transfer",
    )
    .bind(transfer_id)
    .bind(request.from.0)
    .bind(request.to.0)
    .bind(request.amount.get())
    .bind(initiated_by.0)
    .bind(idempotency_key)
    .fetch_one(&mut *tx)
    .await
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
