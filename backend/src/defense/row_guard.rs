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
//! (migrations/20261130000003_row_guard.sql), so that the whole transfer can
//! run in one round trip (`transfer()`); this module calls it on its own
//! when the transfer runs step by step (demonstration modes).
//!
//! **Does not guarantee** that a retried request is not a second transfer:
//! that is the idempotency key's job.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::{TransferRequest, UserId};

/// What the row guard decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guarded {
    /// Debited, credited and recorded.
    Applied {
        balance_minor_after: i64,
        created_at: DateTime<Utc>,
    },
    InsufficientFunds,
    UnknownTarget,
    /// The wallets hold different currencies: minor units never move 1:1
    /// across currencies.
    CurrencyMismatch,
    /// The caller does not own the source wallet (or it does not exist).
    NotOwner,
}

impl Guarded {
    /// The outcome as traces and metrics name it.
    pub fn outcome(self) -> &'static str {
        match self {
            Guarded::Applied { .. } => "accepted",
            Guarded::InsufficientFunds => "insufficient_funds",
            Guarded::UnknownTarget | Guarded::CurrencyMismatch => "rejected",
            Guarded::NotOwner => "unauthorized",
        }
    }
}

/// The whole layer, in the caller's transaction: lock both wallets in id
/// order, check ownership and the target, run the guarded debit, then
/// credit and record. The SQL is `row_guard_transfer()` in
/// migrations/20261130000003_row_guard.sql.
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
    wait_ms: u64,
) -> Result<Guarded, sqlx::Error> {
    let (outcome, balance_minor_after, created_at) = sqlx::query_as::<
        _,
        (String, Option<i64>, Option<DateTime<Utc>>),
    >(
        "SELECT outcome, balance_minor_after, created_at FROM row_guard_transfer($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(transfer_id)
    .bind(caller.0)
    .bind(request.from.0)
    .bind(request.to.0)
    .bind(request.amount.get())
    .bind(idempotency_key)
    .bind(i32::try_from(wait_ms).unwrap_or(i32::MAX))
    .fetch_one(&mut *tx)
    .await?;
    let guarded = Guarded::from_outcome(&outcome, balance_minor_after, created_at).ok_or_else(|| {
        sqlx::Error::Protocol(format!(
            "row_guard_transfer() answered an unknown outcome {outcome:?}"
        ))
    })?;
    tracing::Span::current().record("defense.outcome", guarded.outcome());
    Ok(guarded)
}

impl Guarded {
    /// Reads `row_guard_transfer()`'s answer; `None` for an answer the
    /// function never gives (a bug, never guessed at).
    pub fn from_outcome(
        outcome: &str,
        balance_minor_after: Option<i64>,
        created_at: Option<DateTime<Utc>>,
    ) -> Option<Self> {
        Some(match (outcome, balance_minor_after, created_at) {
            ("applied", Some(balance_minor_after), Some(created_at)) => Guarded::Applied {
                balance_minor_after,
                created_at,
            },
            ("insufficient_funds", _, _) => Guarded::InsufficientFunds,
            ("unknown_target", _, _) => Guarded::UnknownTarget,
            ("currency_mismatch", _, _) => Guarded::CurrencyMismatch,
            ("not_owner", _, _) => Guarded::NotOwner,
            _ => return None,
        })
    }
}

// ---------------------------------------------------------------------------
// DEMO ONLY: read, decide, write (`row_guard_mode = read_decide_write`).
//
// The row guard switched off, i.e. the mistake it exists to avoid, kept so
// the race can be shown: read the balance, compare in Rust, write the
// computed balance back, with no lock and no guard in the `WHERE`. Two
// debits that read the same balance both pass the check (an overdraft of
// the intent), and the second write overwrites the first (a lost update:
// money is created). Never use outside a demonstration.
// ---------------------------------------------------------------------------

#[tracing::instrument(
    name = "defense.row_guard",
    skip_all,
    fields(
        defense.layer = "row_guard",
        defense.mode = "read_decide_write",
        defense.outcome = tracing::field::Empty,
        wallet.from = %request.from,
        wallet.to = %request.to,
    )
)]
pub async fn apply_read_decide_write(
    tx: &mut PgConnection,
    transfer_id: Uuid,
    request: &TransferRequest,
    caller: UserId,
    idempotency_key: Option<Uuid>,
    race_window: std::time::Duration,
) -> Result<Guarded, sqlx::Error> {
    let source = sqlx::query_as::<_, (Uuid, i64, String)>(
        "SELECT user_id, balance_minor, currency FROM wallets WHERE id = $1",
    )
    .bind(request.from.0)
    .fetch_optional(&mut *tx)
    .await?;
    let target_currency = sqlx::query_scalar::<_, String>("SELECT currency FROM wallets WHERE id = $1")
        .bind(request.to.0)
        .fetch_optional(&mut *tx)
        .await?;
    // Naive about races, not about currencies: the demonstration shows
    // double charges and overdrafts, never a conversion at 1:1.
    let guarded = match (source, target_currency) {
        (Some((owner, _, _)), _) if owner != caller.0 => Guarded::NotOwner,
        (None, _) => Guarded::NotOwner,
        (Some(_), None) => Guarded::UnknownTarget,
        (Some((_, _, source_currency)), Some(target_currency)) if source_currency != target_currency => {
            Guarded::CurrencyMismatch
        }
        (Some((_, balance, _)), _) if balance < request.amount.get() => Guarded::InsufficientFunds,
        (Some((_, balance, _)), _) => {
            tokio::time::sleep(race_window).await;
            let computed = balance - request.amount.get();
            sqlx::query("UPDATE wallets SET balance_minor = $2 WHERE id = $1")
                .bind(request.from.0)
                .bind(computed)
                .execute(&mut *tx)
                .await?;
            let created_at = credit_and_record(tx, transfer_id, request, caller, idempotency_key).await?;
            Guarded::Applied {
                balance_minor_after: computed,
                created_at,
            }
        }
    };
    tracing::Span::current().record("defense.outcome", guarded.outcome());
    Ok(guarded)
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
             UPDATE wallets SET balance_minor = balance_minor + $4 WHERE id = $3
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
