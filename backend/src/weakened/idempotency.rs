//! DEMO ONLY: layer 2, the idempotency key, one statement at a time, and
//! its weakened variants (`idempotency_mode`, or a race-lab run's switch).
//! The production claim is the SQL function `idempotency_claim()`, called
//! inside `transfer()` (`crate::defense::idempotency` says what it stops);
//! these calls exist so that a variant can stand in for it:
//!
//! - `check_then_insert`: look the key up, pause, then record it after the
//!   transfer committed. Two requests that look together both see nothing
//!   and both transfer. The mistake the claim exists to avoid.
//! - `advisory_lock`: a transaction-scoped advisory lock on the key's hash
//!   before a point read; hashes of different keys can collide.
//! - `redis_key_lock`: a Redis lock on the key (`idempotency_key_lock`).
//! - `off`: no key at all.
//!
//! Never copy these into a service: copy `crate::defense::idempotency`.

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::defense::idempotency::{Claim, ClaimVerdict, IdempotencyKey, StoredColumns};
use crate::defense::row_guard::GuardVerdict;
use crate::domain::UserId;

/// `idempotency_claim()`'s row.
#[derive(sqlx::FromRow)]
struct ClaimRow {
    outcome: ClaimVerdict,
    #[sqlx(flatten)]
    stored: StoredColumns,
}

/// Claims `key` for `user` inside `tx`, waiting at most `wait_ms` for a
/// concurrent claim of the same key (the SQL is `idempotency_claim()` in
/// migrations/20261202000004_idempotency.sql).
#[tracing::instrument(
    name = "defense.idempotency",
    skip_all,
    fields(
        defense.layer = "idempotency",
        defense.outcome = tracing::field::Empty,
        user.id = %user,
        idempotency.key_hash = %key.hash_hex(),
    )
)]
pub async fn claim(
    tx: &mut PgConnection,
    user: UserId,
    key: IdempotencyKey,
    fingerprint: &[u8; 32],
    retention_hours: u16,
    wait_ms: u16,
) -> Result<Claim, sqlx::Error> {
    let row: ClaimRow = sqlx::query_as(
        "SELECT outcome, response_status, response_body, response_refusal, response_trace_id
         FROM idempotency_claim($1, $2, $3, $4, $5)",
    )
    .bind(user.0)
    .bind(key.as_uuid())
    .bind(&fingerprint[..])
    .bind(i32::from(retention_hours))
    .bind(i32::from(wait_ms))
    .fetch_one(&mut *tx)
    .await?;
    let mut stored = row.stored;
    let claim = Claim::from_columns(row.outcome, &mut stored)?;
    tracing::Span::current().record("defense.outcome", claim.outcome().as_str());
    Ok(claim)
}

/// Stores the response with the claim, in the transaction that did the
/// work, through the one definition both transfer paths share
/// (`idempotency_complete()`): a receipt's body, or a refusal's kind.
pub async fn complete(
    tx: &mut PgConnection,
    user: UserId,
    key: IdempotencyKey,
    decided: GuardVerdict,
    receipt: Option<&str>,
    trace_id: &str,
    transfer_id: Uuid,
) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT idempotency_complete($1, $2, $3, $4, $5, $6)")
        .bind(user.0)
        .bind(key.as_uuid())
        .bind(decided)
        .bind(receipt)
        .bind(trace_id)
        .bind(transfer_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Looks the key up without claiming it: `None` when no request with the
/// key has been recorded yet. The check of check-then-insert, and the
/// point read of the alternatives that claim under a lock.
pub async fn look_up(
    tx: &mut PgConnection,
    user: UserId,
    key: IdempotencyKey,
    fingerprint: &[u8; 32],
) -> Result<Option<Claim>, sqlx::Error> {
    #[derive(sqlx::FromRow)]
    struct Seen {
        fingerprint: Vec<u8>,
        #[sqlx(flatten)]
        stored: StoredColumns,
    }
    let seen: Option<Seen> = sqlx::query_as(
        "SELECT fingerprint, response_status, response_body, response_refusal, response_trace_id
         FROM idempotency_keys WHERE user_id = $1 AND key = $2 AND expires_at > now()",
    )
    .bind(user.0)
    .bind(key.as_uuid())
    .fetch_optional(&mut *tx)
    .await?;
    let Some(seen) = seen else { return Ok(None) };
    if seen.fingerprint != fingerprint {
        return Ok(Some(Claim::KeyReused));
    }
    Ok(Some(match seen.stored.into_response()? {
        Some(stored) => Claim::Replayed(stored),
        None => Claim::InFlight,
    }))
}

/// DEMO ONLY (`idempotency_mode = advisory_lock`): the transaction-scoped
/// advisory lock on the key (`idempotency_lock_id()`), held until the
/// transaction ends; `false` when another transaction holds it, or holds a
/// key whose hash is the same. With `waits`, waits for it instead, bounded
/// by the transaction's `lock_timeout`.
pub async fn advisory_lock(
    tx: &mut PgConnection,
    user: UserId,
    key: IdempotencyKey,
    waits: bool,
) -> Result<bool, sqlx::Error> {
    let statement = if waits {
        "SELECT true FROM (SELECT pg_advisory_xact_lock(idempotency_lock_id($1, $2))) AS waited"
    } else {
        "SELECT pg_try_advisory_xact_lock(idempotency_lock_id($1, $2))"
    };
    sqlx::query_scalar(statement)
        .bind(user.0)
        .bind(key.as_uuid())
        .fetch_one(&mut *tx)
        .await
}

/// Records the key after the transfer has committed, in a statement of its
/// own, then stores the response through `idempotency_complete()`. A
/// concurrent duplicate's record loses silently; its transfer has already
/// happened.
#[allow(clippy::too_many_arguments)]
pub async fn naive_record(
    pool: &PgPool,
    user: UserId,
    key: IdempotencyKey,
    fingerprint: &[u8; 32],
    decided: GuardVerdict,
    receipt: Option<&str>,
    trace_id: &str,
    transfer_id: Uuid,
    retention_hours: u16,
) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    let inserted = sqlx::query(
        "INSERT INTO idempotency_keys (user_id, key, fingerprint, expires_at)
         VALUES ($1, $2, $3, now() + make_interval(hours => $4))
         ON CONFLICT (user_id, key) DO NOTHING",
    )
    .bind(user.0)
    .bind(key.as_uuid())
    .bind(&fingerprint[..])
    .bind(i32::from(retention_hours))
    .execute(&mut *tx)
    .await?;
    if inserted.rows_affected() == 1 {
        complete(&mut tx, user, key, decided, receipt, trace_id, transfer_id).await?;
    }
    tx.commit().await
}
