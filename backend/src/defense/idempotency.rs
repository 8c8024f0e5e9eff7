//! Layer 2: the idempotency key.
//!
//! **Stops:** a client retrying the same transfer: after a timeout, a lost
//! response, a browser resubmit, or from another instance at the same
//! moment. The first request with a key claims it by inserting a row whose
//! primary key is `(user_id, key)`; the claim lives in the same transaction
//! as the transfer, so the key is taken exactly when the money moves and
//! freed exactly when it does not (a rollback).
//!
//! A second request with the key either
//! - finds the claim committed with the same fingerprint: it replays the
//!   stored status and body byte for byte;
//! - finds a different fingerprint: 422 `idempotency-key-reused`, nothing
//!   changes;
//! - finds the claim still in flight: PostgreSQL makes its insert wait for
//!   the first transaction; if that takes longer than
//!   `idempotency_wait_ms_max` (a transaction-local `lock_timeout`), 409.
//!
//! The claim's SQL is the function `idempotency_claim()`
//! (migrations/20261130000002_idempotency_claim.sql), so that the whole
//! transfer can run in one round trip (`transfer()`); this module calls it
//! on its own when the transfer runs step by step (demonstration modes).
//!
//! **Does not guarantee** anything for requests without a key (the cooldown
//! sheds those bursts, the row guard keeps the balance right) or after a key
//! expires: after `idempotency_retention_hours` the same key is a new
//! request.
//!
//! **When PostgreSQL fails:** the transaction rolls back, so nothing is
//! stored and the key is free for a retry; the client gets 503.

use actix_web::HttpRequest;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::domain::UserId;
use crate::problem::Problem;

pub const HEADER: &str = "Idempotency-Key";

/// A client-chosen UUID naming one logical operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdempotencyKey(Uuid);

impl IdempotencyKey {
    /// Accepts a bare UUID or the RFC 8941 string form `"…uuid…"`.
    pub fn parse(value: &str) -> Result<Self, Problem> {
        let value = value.trim();
        let unquoted = value
            .strip_prefix('"')
            .and_then(|rest| rest.strip_suffix('"'))
            .unwrap_or(value);
        crate::domain::parse_uuid(unquoted).map(Self).ok_or_else(|| {
            Problem::validation(
                "The Idempotency-Key header must be a UUID in its hyphenated form, optionally in double quotes.",
            )
        })
    }

    /// Reads the header. Missing is fine unless the deployment requires a
    /// key (then 400); present but malformed is always 422.
    pub fn from_request(request: &HttpRequest, required: bool) -> Result<Option<Self>, Problem> {
        let mut values = request.headers().get_all(HEADER);
        let Some(value) = values.next() else {
            if required {
                return Err(Problem::bad_request(
                    "This deployment requires an Idempotency-Key header (a UUID) on every transfer.",
                ));
            }
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(Problem::validation("Send exactly one Idempotency-Key header."));
        }
        let value = value
            .to_str()
            .map_err(|_| Problem::validation("The Idempotency-Key header must be a UUID."))?;
        Self::parse(value).map(Some)
    }

    pub fn as_uuid(self) -> Uuid {
        self.0
    }

    /// A short SHA-256 of the key, for logs and spans: enough to correlate,
    /// without writing the key itself everywhere.
    pub fn hash_hex(self) -> String {
        use sha2::{Digest, Sha256};
        hex::encode(&Sha256::digest(self.0.as_bytes())[..8])
    }
}

/// A response written by the first request, for replay to its retries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub body: String,
}

/// The outcome of claiming a key.
#[derive(Debug)]
pub enum Claim {
    /// The key is ours: do the work in this transaction, then `complete`.
    Started,
    /// A completed request with the same fingerprint: replay its response.
    Replay(StoredResponse),
    /// The key was used for a different request.
    Mismatch,
    /// Another request with the key did not finish within the wait. The
    /// transaction is aborted; roll it back.
    InFlight,
}

/// Claims `key` for `user` inside `tx`, waiting at most `wait_ms` for a
/// concurrent claim of the same key (the SQL is `idempotency_claim()` in
/// migrations/20261130000002_idempotency_claim.sql).
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
    retention_hours: u64,
    wait_ms: u64,
) -> Result<Claim, sqlx::Error> {
    let (outcome, status, body) = sqlx::query_as::<_, (String, Option<i16>, Option<String>)>(
        "SELECT outcome, response_status, response_body FROM idempotency_claim($1, $2, $3, $4, $5)",
    )
    .bind(user.0)
    .bind(key.0)
    .bind(&fingerprint[..])
    .bind(i32::try_from(retention_hours).unwrap_or(i32::MAX))
    .bind(i32::try_from(wait_ms).unwrap_or(i32::MAX))
    .fetch_one(&mut *tx)
    .await?;
    let claim = Claim::from_outcome(&outcome, status, body);
    tracing::Span::current().record("defense.outcome", claim.outcome());
    Ok(claim)
}

impl Claim {
    /// Reads `idempotency_claim()`'s answer.
    pub fn from_outcome(outcome: &str, status: Option<i16>, body: Option<String>) -> Self {
        match (outcome, status, body) {
            ("started", _, _) => Claim::Started,
            ("mismatch", _, _) => Claim::Mismatch,
            ("replay", Some(status), Some(body)) => Claim::Replay(StoredResponse {
                status: u16::try_from(status).unwrap_or(500),
                body,
            }),
            // 'in_flight', or anything unexpected: never guess a response.
            _ => Claim::InFlight,
        }
    }

    /// The outcome as traces and metrics name it.
    pub fn outcome(&self) -> &'static str {
        match self {
            Claim::Started => "accepted",
            Claim::Replay(_) => "replayed",
            Claim::Mismatch => "key_reused",
            Claim::InFlight => "in_flight",
        }
    }
}

/// Stores the response with the claim, in the transaction that did the work.
pub async fn complete(
    tx: &mut PgConnection,
    user: UserId,
    key: IdempotencyKey,
    response: &StoredResponse,
    transfer_id: Option<Uuid>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE idempotency_keys
         SET response_status = $3, response_body = $4, transfer_id = $5
         WHERE user_id = $1 AND key = $2",
    )
    .bind(user.0)
    .bind(key.0)
    .bind(i16::try_from(response.status).unwrap_or(i16::MAX))
    .bind(&response.body)
    .bind(transfer_id)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// The completed response stored under a key with this fingerprint, if
/// any. Read-only: the browser form uses it to show a double submit the
/// original result after the cooldown refused the copy.
pub async fn completed_response(
    pool: &PgPool,
    user: UserId,
    key: IdempotencyKey,
    fingerprint: &[u8; 32],
) -> Result<Option<StoredResponse>, sqlx::Error> {
    let row = sqlx::query_as::<_, (i16, String)>(
        "SELECT response_status, response_body FROM idempotency_keys
         WHERE user_id = $1 AND key = $2 AND fingerprint = $3
           AND response_status IS NOT NULL AND expires_at > now()",
    )
    .bind(user.0)
    .bind(key.0)
    .bind(&fingerprint[..])
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|(status, body)| StoredResponse {
        status: u16::try_from(status).unwrap_or(500),
        body,
    }))
}

// ---------------------------------------------------------------------------
// DEMO ONLY: check, then insert (`idempotency_mode = check_then_insert`).
//
// The mistake this layer exists to avoid, kept so the race can be shown:
// look the key up, do the transfer, record the key afterwards. Two requests
// that arrive together both look before either has recorded, both see no
// key, and both move money. Never use outside a demonstration.
// ---------------------------------------------------------------------------

/// Looks the key up without claiming it: `None` when no request with the
/// key has been recorded yet.
pub async fn naive_check(
    tx: &mut PgConnection,
    user: UserId,
    key: IdempotencyKey,
    fingerprint: &[u8; 32],
) -> Result<Option<Claim>, sqlx::Error> {
    let row = sqlx::query_as::<_, (Vec<u8>, Option<i16>, Option<String>)>(
        "SELECT fingerprint, response_status, response_body
         FROM idempotency_keys WHERE user_id = $1 AND key = $2 AND expires_at > now()",
    )
    .bind(user.0)
    .bind(key.0)
    .fetch_optional(&mut *tx)
    .await?;
    Ok(row.map(
        |(stored, status, body)| match (stored == fingerprint, status, body) {
            (false, _, _) => Claim::Mismatch,
            (true, Some(status), Some(body)) => Claim::Replay(StoredResponse {
                status: u16::try_from(status).unwrap_or(500),
                body,
            }),
            (true, _, _) => Claim::InFlight,
        },
    ))
}

/// Records the key and its response after the transfer has committed, in a
/// statement of its own. A concurrent duplicate's record loses silently;
/// its transfer has already happened.
pub async fn naive_record(
    pool: &PgPool,
    user: UserId,
    key: IdempotencyKey,
    fingerprint: &[u8; 32],
    response: &StoredResponse,
    transfer_id: Option<Uuid>,
    retention_hours: u64,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO idempotency_keys
             (user_id, key, fingerprint, response_status, response_body, transfer_id, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(hours => $7))
         ON CONFLICT (user_id, key) DO NOTHING",
    )
    .bind(user.0)
    .bind(key.0)
    .bind(&fingerprint[..])
    .bind(i16::try_from(response.status).unwrap_or(i16::MAX))
    .bind(&response.body)
    .bind(transfer_id)
    .bind(i32::try_from(retention_hours).unwrap_or(i32::MAX))
    .execute(pool)
    .await?;
    Ok(())
}

/// Deletes expired keys in batches of at most `batch_rows_max` until none
/// are left; returns how many it deleted. Several instances may sweep at
/// once: `SKIP LOCKED` keeps them off each other's rows.
pub async fn sweep_expired(pool: &PgPool, batch_rows_max: i64) -> Result<u64, sqlx::Error> {
    crate::sweep::delete_in_batches(
        pool,
        "DELETE FROM idempotency_keys WHERE ctid IN (
             SELECT ctid FROM idempotency_keys
             WHERE expires_at <= now()
             LIMIT $1
             FOR UPDATE SKIP LOCKED)",
        batch_rows_max,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_may_be_bare_or_quoted_but_must_be_a_uuid() {
        let bare = IdempotencyKey::parse("6f1c1c59-3f5e-4a32-9d5e-0a3a1f1f2b10").expect("bare");
        let quoted = IdempotencyKey::parse("\"6f1c1c59-3f5e-4a32-9d5e-0a3a1f1f2b10\"").expect("quoted");
        assert_eq!(bare, quoted);
        assert_eq!(IdempotencyKey::parse("abc").expect_err("bad").status, 422);
        assert_eq!(IdempotencyKey::parse("\"abc").expect_err("bad").status, 422);
    }
}
