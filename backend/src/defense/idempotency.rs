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
//!   stored response (a receipt byte for byte; a refusal, stored by kind,
//!   rendered from the catalogue with the original trace id). This is a
//!   read alone: no insert is attempted, nothing is written;
//! - finds a different fingerprint: 422 `idempotency-key-reused`, nothing
//!   changes;
//! - finds the claim still in flight: PostgreSQL makes its insert wait for
//!   the first transaction; if that takes longer than
//!   `idempotency_wait_ms_max` (a transaction-local `lock_timeout`), 409.
//!
//! The claim's SQL is the function `idempotency_claim()`
//! (migrations/20261202000004_idempotency.sql), so that the whole
//! transfer can run in one round trip (`transfer()`). The race lab's
//! weakened claims (check-then-insert, an advisory lock, a Redis lock on
//! the key) are in `weakened/idempotency.rs` and
//! `weakened/idempotency_key_lock.rs`, not here.
//!
//! **Does not guarantee** anything for requests without a key (the cooldown
//! sheds those bursts, the row guard keeps the balance right) or after a key
//! expires: after `idempotency_retention_hours` the same key is a new
//! request.
//!
//! **When PostgreSQL fails:** the transaction rolls back, so nothing is
//! stored and the key is free for a retry; the client gets 503.

use actix_web::HttpRequest;
use sqlx::PgPool;
use uuid::Uuid;

use crate::decision::{Layer, Outcome};
use crate::defense::Refusal;
use crate::defense::row_guard::GuardVerdict;
use crate::domain::UserId;
use crate::problem::{Problem, ProblemType};

pub const HEADER: &str = "Idempotency-Key";

/// A client-chosen UUID naming one logical operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdempotencyKey(Uuid);

/// A key the service chose itself: a race-lab run's orders.
impl From<Uuid> for IdempotencyKey {
    fn from(key: Uuid) -> Self {
        Self(key)
    }
}

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
        let Some(value) = crate::headers::single(request, HEADER)? else {
            if required {
                return Err(Problem::bad_request(
                    "This deployment requires an Idempotency-Key header (a UUID) on every transfer.",
                ));
            }
            return Ok(None);
        };
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

impl StoredResponse {
    /// A business refusal as it is sent, fresh or replayed: rendered from
    /// the catalogue, with the trace id of the request that decided it.
    pub fn refusal(refusal: GuardVerdict, trace_id: Option<&str>) -> Result<Self, sqlx::Error> {
        let problem = refusal
            .refusal()
            .ok_or_else(|| sqlx::Error::Protocol(format!("{refusal:?} was stored as a refusal")))?;
        let problem = match trace_id {
            Some(trace_id) => problem.with_trace_id(trace_id),
            None => problem,
        };
        Ok(Self {
            status: problem.status,
            body: problem.body(),
        })
    }
}

/// The columns of `idempotency_keys` that hold a stored response, as every
/// query that reads one returns them. A completed claim holds a receipt's
/// body, or a business refusal's kind (rendered when sent, so that a
/// request serialises a refusal only when it meets one).
#[derive(Debug, Default, sqlx::FromRow)]
pub struct StoredColumns {
    pub response_status: Option<i16>,
    pub response_body: Option<String>,
    pub response_refusal: Option<GuardVerdict>,
    pub response_trace_id: Option<String>,
}

impl StoredColumns {
    /// The stored response, `None` while the claim is in flight. A
    /// combination the schema's constraints rule out is a protocol error.
    pub fn into_response(self) -> Result<Option<StoredResponse>, sqlx::Error> {
        match (self.response_status, self.response_body, self.response_refusal) {
            (None, None, None) => Ok(None),
            (Some(status), Some(body), None) => Ok(Some(StoredResponse {
                status: u16::try_from(status)
                    .map_err(|_| sqlx::Error::Protocol(format!("stored status {status}")))?,
                body,
            })),
            (Some(_), None, Some(refusal)) => {
                StoredResponse::refusal(refusal, self.response_trace_id.as_deref()).map(Some)
            }
            (status, body, refusal) => Err(sqlx::Error::Protocol(format!(
                "a stored response with status {status:?}, a body: {}, refusal {refusal:?}",
                body.is_some()
            ))),
        }
    }
}

/// A claim's answer: the PostgreSQL enum `claim_verdict`
/// (migrations/20261202000004_idempotency.sql), value for value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "claim_verdict", rename_all = "snake_case")]
pub enum ClaimVerdict {
    Started,
    Replayed,
    KeyReused,
    InFlight,
}

/// The outcome of claiming a key.
#[derive(Debug)]
pub enum Claim {
    /// The key is ours: do the work in this transaction, then `complete`.
    Started,
    /// A completed request with the same fingerprint: replay its response.
    Replayed(StoredResponse),
    /// The key was used for a different request.
    KeyReused,
    /// Another request with the key did not finish within the wait. The
    /// transaction is aborted; roll it back.
    InFlight,
}

impl Claim {
    /// Reads a claim's answer. A replay without a stored response is a
    /// protocol error: a bug, never guessed at.
    /// The stored response is taken from `stored` for a replay only.
    pub fn from_columns(outcome: ClaimVerdict, stored: &mut StoredColumns) -> Result<Self, sqlx::Error> {
        Ok(match outcome {
            ClaimVerdict::Started => Claim::Started,
            ClaimVerdict::KeyReused => Claim::KeyReused,
            ClaimVerdict::InFlight => Claim::InFlight,
            ClaimVerdict::Replayed => {
                Claim::Replayed(std::mem::take(stored).into_response()?.ok_or_else(|| {
                    sqlx::Error::Protocol("a replayed claim without a stored response".into())
                })?)
            }
        })
    }

    /// The claim's outcome in the decision vocabulary, for traces: a
    /// started claim lets the request through.
    pub fn outcome(&self) -> Outcome {
        match self {
            Claim::Started => Outcome::Accepted,
            Claim::Replayed(_) => Outcome::Replayed,
            Claim::KeyReused => Outcome::KeyReused,
            Claim::InFlight => Outcome::InFlight,
        }
    }
}

/// Layer 2's refusals, in its own words: neither is stored with the key.
impl Claim {
    /// The key belongs to a different request (another body, or another
    /// operation): a client bug, answered 422.
    pub fn key_reused() -> Refusal {
        Refusal::new(
            Problem::new(
                ProblemType::IdempotencyKeyReused,
                "This Idempotency-Key was already used for a different request. Use a new key for a new transfer.",
            ),
            Layer::Idempotency,
            Outcome::KeyReused,
        )
    }

    /// The key's first request did not finish within the wait: 409, and a
    /// retry with the same key gets its result.
    pub fn in_flight() -> Refusal {
        Refusal::new(
            Problem::new(
                ProblemType::IdempotencyKeyInFlight,
                "A request with this Idempotency-Key is still being processed. Retry shortly to get its result.",
            )
            .with_retry_after_s(1),
            Layer::Idempotency,
            Outcome::InFlight,
        )
    }
}

/// The completed response stored under a user's key (with this
/// fingerprint, when given), if any. Read-only: the browser form uses it to
/// show a double submit the original result after the cooldown refused the
/// copy, and to show a sent transfer's result after redirecting.
pub async fn completed_response(
    pool: &PgPool,
    user: UserId,
    key: IdempotencyKey,
    fingerprint: Option<&[u8; 32]>,
) -> Result<Option<StoredResponse>, sqlx::Error> {
    let stored: Option<StoredColumns> = sqlx::query_as(
        "SELECT response_status, response_body, response_refusal, response_trace_id FROM idempotency_keys
         WHERE user_id = $1 AND key = $2 AND ($3::bytea IS NULL OR fingerprint = $3)
           AND response_status IS NOT NULL AND expires_at > now()",
    )
    .bind(user.0)
    .bind(key.0)
    .bind(fingerprint.map(|bytes| &bytes[..]))
    .fetch_optional(pool)
    .await?;
    Ok(stored.map(StoredColumns::into_response).transpose()?.flatten())
}

// ---------------------------------------------------------------------------
// DEMO ONLY: check, then insert (`idempotency_mode = check_then_insert`).
//
// The mistake this layer exists to avoid, kept so the race can be shown:
// look the key up, do the transfer, record the key afterwards. Two requests
// that arrive together both look before either has recorded, both see no
// key, and both move money. Never use outside a demonstration.
// ---------------------------------------------------------------------------

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

#[cfg(test)]
mod stored_response_tests {
    use super::*;

    #[test]
    fn a_stored_refusal_is_rendered_from_the_catalogue_with_its_trace_id() {
        let stored = StoredColumns {
            response_status: Some(422),
            response_body: None,
            response_refusal: Some(GuardVerdict::InsufficientFunds),
            response_trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
        };
        let response = stored.into_response().expect("valid").expect("completed");
        assert_eq!(response.status, 422);
        let body: serde_json::Value = serde_json::from_str(&response.body).expect("json");
        assert_eq!(body["type"], "/problems/insufficient-funds");
        assert_eq!(body["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
    }

    #[test]
    fn a_stored_response_the_schema_rules_out_is_a_protocol_error() {
        for stored in [
            StoredColumns {
                response_status: Some(201),
                response_body: Some("{}".into()),
                response_refusal: Some(GuardVerdict::InsufficientFunds),
                response_trace_id: None,
            },
            StoredColumns {
                response_status: None,
                response_body: Some("{}".into()),
                ..StoredColumns::default()
            },
            StoredColumns {
                response_status: Some(422),
                response_refusal: Some(GuardVerdict::Accepted),
                ..StoredColumns::default()
            },
        ] {
            assert!(matches!(stored.into_response(), Err(sqlx::Error::Protocol(_))));
        }
        let mut in_flight = StoredColumns::default();
        assert!(matches!(
            Claim::from_columns(ClaimVerdict::Replayed, &mut in_flight),
            Err(sqlx::Error::Protocol(_))
        ));
    }
}
