//! Layers 2 and 3 in one PostgreSQL transaction: claim the idempotency key,
//! check the caller may debit the source, run the guarded debit, credit and
//! record, store the response with the claim, commit.
//!
//! Business refusals (insufficient funds, unknown target) are committed with
//! the claim so that retries replay them. Everything else (authentication,
//! ownership, infrastructure failures) rolls back, which frees the key.
//! Serialization failures and deadlocks are retried up to
//! `transfer_retries_max` times; neither should happen with the fixed lock
//! order, and neither reaches the client as a 500.

use std::time::Instant;

use actix_web::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{AssertSqlSafe, PgConnection};
use uuid::Uuid;

use crate::auth::{self, VerifiedToken};
use crate::decision::{Decision, Layer, Outcome};
use crate::defense::idempotency::{self, Claim, IdempotencyKey, StoredResponse};
use crate::defense::row_guard::{self, Guarded};
use crate::domain::TransferRequest;
use crate::problem::{self, Problem};
use crate::settings::{IdempotencyMode, RowGuardMode};
use crate::state::AppState;

/// The body of a successful `POST /api/v1/transfers`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TransferReceipt {
    pub id: Uuid,
    pub from_wallet_id: Uuid,
    pub to_wallet_id: Uuid,
    pub amount_minor: i64,
    pub created_at: DateTime<Utc>,
    /// The source wallet's balance right after this transfer.
    pub balance_minor_after: i64,
}

/// How layers 2 and 3 ended a transfer request.
#[derive(Debug)]
pub enum TransferOutcome {
    /// This request did the work: a 201, or a business refusal (422) that
    /// was stored with the key like a success.
    Decided {
        response: StoredResponse,
        decision: Decision,
    },
    /// A retry of a completed request: its stored response.
    Replayed(StoredResponse),
    /// The key belongs to a different request.
    KeyReused,
    /// The key's first request is still running.
    InFlight,
}

/// A refusal that is not stored with the key: the transaction rolled back.
#[derive(Debug)]
pub struct Refusal {
    pub problem: Problem,
    pub decision: Decision,
}

impl Refusal {
    fn new(problem: Problem, layer: Layer, outcome: Outcome) -> Self {
        Self {
            problem,
            decision: Decision::new(layer, outcome),
        }
    }
}

/// Runs the transaction, retrying it on serialization failures and
/// deadlocks. `trace_id` goes into stored problem bodies, so a replayed
/// refusal still points at the trace of the request that decided it.
pub async fn execute(
    state: &AppState,
    caller: &VerifiedToken,
    request: &TransferRequest,
    key: Option<IdempotencyKey>,
    fingerprint: &[u8; 32],
    trace_id: &str,
) -> Result<TransferOutcome, Refusal> {
    let mut attempt = 0;
    loop {
        match execute_once(state, caller, request, key, fingerprint, trace_id).await {
            Err(Failure::Database(error))
                if is_retryable(&error) && attempt < state.settings.transfer_retries_max =>
            {
                attempt += 1;
                tracing::info!(attempt, error = %error, "retrying a transfer transaction");
            }
            Err(Failure::Database(error)) if is_lock_timeout(&error) => {
                tracing::warn!("gave up waiting for a wallet row lock");
                return Err(Refusal::new(
                    Problem::unavailable(
                        "The wallet is busy with other transfers. Nothing was changed; retry shortly.",
                    ),
                    Layer::RowGuard,
                    Outcome::Error,
                ));
            }
            Err(Failure::Database(error)) => {
                return Err(Refusal::new(
                    problem::from_database_error(&error, "running a transfer"),
                    Layer::NoLayer,
                    Outcome::Error,
                ));
            }
            Err(Failure::Refused(refusal)) => return Err(refusal),
            Ok(outcome) => return Ok(outcome),
        }
    }
}

enum Failure {
    Database(sqlx::Error),
    /// Refused without storing anything; the transaction rolls back.
    Refused(Refusal),
}

impl From<sqlx::Error> for Failure {
    fn from(error: sqlx::Error) -> Self {
        Failure::Database(error)
    }
}

async fn execute_once(
    state: &AppState,
    caller: &VerifiedToken,
    request: &TransferRequest,
    key: Option<IdempotencyKey>,
    fingerprint: &[u8; 32],
    trace_id: &str,
) -> Result<TransferOutcome, Failure> {
    let settings = &state.settings;
    let naive_window = std::time::Duration::from_millis(settings.naive_window_ms);
    // The first lock this transaction may wait for is the key's claim (when
    // there is a key), then the wallet rows; each wait has its own bound.
    let first_wait_ms = match key {
        Some(_) => settings.idempotency_wait_ms_max,
        None => settings.wallet_lock_wait_ms_max,
    };
    let mut tx = state
        .db
        .begin_with(AssertSqlSafe(format!(
            "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = '{first_wait_ms}ms'"
        )))
        .await?;

    if !auth::token_is_live(&mut *tx, caller).await? {
        return Err(Failure::Refused(Refusal::new(
            Problem::invalid_token("The bearer token has been revoked or has expired."),
            Layer::NoLayer,
            Outcome::Unauthorized,
        )));
    }

    // Layer 2: claim the key.
    let key = key.filter(|_| settings.idempotency_mode != IdempotencyMode::Off);
    if let Some(key) = key {
        let started = Instant::now();
        let claim = match settings.idempotency_mode {
            IdempotencyMode::CheckThenInsert => {
                let seen = idempotency::naive_check(&mut tx, caller.user_id, key, fingerprint).await?;
                tokio::time::sleep(naive_window).await;
                seen.unwrap_or(Claim::Started)
            }
            _ => {
                idempotency::claim(
                    &mut tx,
                    caller.user_id,
                    key,
                    fingerprint,
                    settings.idempotency_retention_hours,
                )
                .await?
            }
        };
        state
            .metrics
            .observe_layer(Layer::Idempotency.as_str(), started.elapsed());
        match claim {
            Claim::Started => set_lock_timeout_ms(&mut tx, settings.wallet_lock_wait_ms_max).await?,
            Claim::Replay(stored) => return Ok(TransferOutcome::Replayed(stored)),
            Claim::Mismatch => return Ok(TransferOutcome::KeyReused),
            Claim::InFlight => return Ok(TransferOutcome::InFlight),
        }
    }

    // Layer 3: the row guard.
    let transfer_id = Uuid::now_v7();
    let started = Instant::now();
    let key_uuid = key.map(IdempotencyKey::as_uuid);
    let guarded = match settings.row_guard_mode {
        RowGuardMode::Guarded => {
            row_guard::apply(&mut tx, transfer_id, request, caller.user_id, key_uuid).await?
        }
        RowGuardMode::ReadDecideWrite => {
            row_guard::apply_read_decide_write(
                &mut tx,
                transfer_id,
                request,
                caller.user_id,
                key_uuid,
                naive_window,
            )
            .await?
        }
    };
    state
        .metrics
        .observe_layer(Layer::RowGuard.as_str(), started.elapsed());
    let (response, decision) = match guarded {
        Guarded::NotOwner => {
            return Err(Failure::Refused(Refusal::new(
                Problem::new(
                    StatusCode::FORBIDDEN,
                    "not-your-wallet",
                    "Not your wallet",
                    "You can only send money from a wallet you own.",
                ),
                Layer::NoLayer,
                Outcome::Unauthorized,
            )));
        }
        Guarded::UnknownTarget => (
            refusal(unknown_target().with_trace_id(trace_id)),
            Decision::new(Layer::RowGuard, Outcome::Rejected),
        ),
        Guarded::InsufficientFunds => (
            refusal(insufficient_funds().with_trace_id(trace_id)),
            Decision::new(Layer::RowGuard, Outcome::InsufficientFunds),
        ),
        Guarded::Applied {
            balance_minor_after,
            created_at,
        } => {
            let receipt = TransferReceipt {
                id: transfer_id,
                from_wallet_id: request.from.0,
                to_wallet_id: request.to.0,
                amount_minor: request.amount.get(),
                created_at,
                balance_minor_after,
            };
            let body = serde_json::to_string(&receipt).map_err(|error| {
                tracing::error!(error = %error, "could not serialise a transfer receipt");
                Failure::Refused(Refusal::new(Problem::internal(), Layer::NoLayer, Outcome::Error))
            })?;
            (
                StoredResponse {
                    status: StatusCode::CREATED.as_u16(),
                    body,
                },
                Decision::new(Layer::RowGuard, Outcome::Accepted),
            )
        }
    };
    let transfer_id = (decision.outcome == Outcome::Accepted).then_some(transfer_id);

    match (key, settings.idempotency_mode) {
        (Some(key), IdempotencyMode::CheckThenInsert) => {
            tx.commit().await?;
            idempotency::naive_record(
                &state.db,
                caller.user_id,
                key,
                fingerprint,
                &response,
                transfer_id,
                settings.idempotency_retention_hours,
            )
            .await?;
        }
        (Some(key), _) => {
            idempotency::complete(&mut tx, caller.user_id, key, &response, transfer_id).await?;
            tx.commit().await?;
        }
        (None, _) => tx.commit().await?,
    }
    Ok(TransferOutcome::Decided { response, decision })
}

async fn set_lock_timeout_ms(tx: &mut PgConnection, ms: u64) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(AssertSqlSafe(format!("SET LOCAL lock_timeout = '{ms}ms'")))
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// A business refusal as stored and sent: its layer is the row guard's.
fn refusal(problem: Problem) -> StoredResponse {
    StoredResponse {
        status: problem.status,
        body: problem.body(),
    }
}

pub fn insufficient_funds() -> Problem {
    Problem::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "insufficient-funds",
        "Insufficient funds",
        "The source wallet's balance is lower than the amount.",
    )
    .with_layer(Layer::RowGuard)
}

pub fn unknown_target() -> Problem {
    Problem::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "unknown-target-wallet",
        "Unknown target wallet",
        "No wallet has the id given as to_wallet_id.",
    )
    .with_layer(Layer::RowGuard)
}

fn sqlstate(error: &sqlx::Error) -> Option<String> {
    match error {
        sqlx::Error::Database(db) => db.code().map(|code| code.into_owned()),
        _ => None,
    }
}

/// serialization_failure or deadlock_detected: safe to run again.
fn is_retryable(error: &sqlx::Error) -> bool {
    matches!(sqlstate(error).as_deref(), Some("40001" | "40P01"))
}

fn is_lock_timeout(error: &sqlx::Error) -> bool {
    sqlstate(error).as_deref() == Some("55P03")
}
