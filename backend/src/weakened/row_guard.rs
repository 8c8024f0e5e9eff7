//! DEMO ONLY: layer 3, the row guard, weakened (`row_guard_mode`, or a
//! race-lab run's switch). Each variant reads the balance, decides in Rust
//! and writes; they differ in what protects the gap between the read and
//! the write. The production guard is one statement that checks and writes
//! at once (`crate::defense::row_guard`); copy that one, never these.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::decision::{Layer, Outcome};
use crate::defense::Refusal;
use crate::defense::row_guard::{Applied, GuardVerdict, Guarded};
use crate::domain::{TransferRequest, UserId};
use crate::problem::{Problem, ProblemType};
use crate::settings::RowGuardMode;

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
        lock_both(tx, request, lab_only).await?;
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

/// `for_update`: both wallets locked first, in id order, until the commit.
async fn lock_both(
    tx: &mut PgConnection,
    request: &TransferRequest,
    lab_only: bool,
) -> Result<(), sqlx::Error> {
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
    Ok(())
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
