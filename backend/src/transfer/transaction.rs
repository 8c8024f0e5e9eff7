//! Layers 2 and 3 in one PostgreSQL transaction: check the token is live
//! and the caller owns the source, claim the idempotency key, run the row
//! guard (lock both wallets, guarded debit, credit, record), store the
//! response with the claim, commit. With every layer at full strength (in
//! production, and in a race-lab run with every layer on) the transaction
//! is one call of the SQL function `transfer()`; only a naive demonstration
//! variant runs statement by statement (`statement_by_statement`), so that
//! it can stand in.
//!
//! Business refusals (insufficient funds, unknown target) are committed with
//! the claim so that retries replay them. Everything else (authentication,
//! ownership, infrastructure failures) rolls back, which frees the key.
//! Serialization failures and deadlocks are retried up to
//! `transfer_retries_max` times; neither should happen with the fixed lock
//! order, and neither reaches the client as a 500.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::auth::VerifiedToken;
use crate::decision::{Layer, Outcome};
use crate::defense::Refusal;
use crate::defense::idempotency::{Claim, ClaimVerdict, IdempotencyKey, StoredColumns};
use crate::defense::row_guard::{self, GuardVerdict, Guarded};
use crate::domain::TransferRequest;
use crate::problem::{self, DatabaseFailure, Problem, ProblemType, SqlState};
use crate::race_lab::Switches;
use crate::state::AppState;

use super::call::{Call, Settled, TransactionError, Variants, decision_of, ended_by_claim, not_your_wallet};

/// The body of a successful `POST /api/v1/transfers`, as the SQL function
/// `transfer_receipt()` writes it (this type documents it in the OpenAPI
/// document).
#[derive(Debug, utoipa::ToSchema)]
pub struct TransferReceipt {
    pub id: Uuid,
    pub from_wallet_id: Uuid,
    pub to_wallet_id: Uuid,
    pub amount_minor: i64,
    pub created_at: DateTime<Utc>,
    /// The source wallet's balance right after this transfer.
    pub balance_minor_after: i64,
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
    lab: Option<Switches>,
) -> Result<Settled, Refusal> {
    let call = Call {
        state,
        caller,
        request,
        key,
        fingerprint,
        trace_id,
        lab,
    };
    // A lab run's transactions wait for one of the lab's own connections
    // (`race_lab_db_connections_max`) before taking one from the pool, so a
    // burst never holds the whole pool, and real transfers, and the lab's
    // own requests, are not refused for want of a connection.
    let _lab_connection = match lab {
        Some(_) => Some(
            state
                .lab_db_slots
                .acquire()
                .await
                .map_err(|_| Refusal::new(Problem::internal(), Layer::NoLayer, Outcome::Error))?,
        ),
        None => None,
    };
    let mut attempt = 0;
    loop {
        match execute_once(&call).await {
            Err(TransactionError::Database { error, .. })
                if is_retryable(&error) && attempt < state.config.database.transfer_retries_max =>
            {
                attempt += 1;
                tracing::info!(attempt, error = %error, "retrying a transfer transaction");
            }
            Err(TransactionError::Database { error, .. }) if is_lock_timeout(&error) => {
                tracing::warn!("gave up waiting for a wallet row lock");
                return Err(row_guard::wallet_busy());
            }
            // Said as what it is: with the fixed lock order only a naive
            // variant's crossing transfers can deadlock.
            Err(TransactionError::Database { error, .. }) if is_retryable(&error) => {
                tracing::warn!(attempts = attempt + 1, error = %error, "a transfer kept failing to serialize");
                return Err(Refusal::new(
                    Problem::unavailable(format!(
                        "This transfer crossed others and PostgreSQL broke the deadlock by rolling it back, {} times. \
                         Nothing was changed; retry shortly.",
                        attempt + 1
                    )),
                    Layer::NoLayer,
                    Outcome::Error,
                ));
            }
            Err(TransactionError::Database {
                error,
                may_have_committed,
            }) => {
                let failure = match DatabaseFailure::of(&error) {
                    // The connection broke inside a transaction that was
                    // never asked to commit: PostgreSQL rolls it back.
                    DatabaseFailure::Unknown if !may_have_committed => DatabaseFailure::NothingCommitted,
                    failure => failure,
                };
                let problem = if failure == DatabaseFailure::Unknown {
                    tracing::error!(error = %error, "lost the database connection after sending a transfer");
                    Problem::outcome_unknown()
                } else {
                    problem::from_database_failure(failure, &error, "running a transfer")
                };
                return Err(Refusal::new(problem, Layer::NoLayer, Outcome::Error));
            }
            Err(TransactionError::Refused(refusal)) => return Err(refusal),
            Err(TransactionError::Protocol(what)) => {
                tracing::error!(what, "the database's answer to a transfer broke the protocol");
                return Err(Refusal::new(Problem::internal(), Layer::NoLayer, Outcome::Error));
            }
            Ok(outcome) => return Ok(outcome),
        }
    }
}

async fn execute_once(call: &Call<'_>) -> Result<Settled, TransactionError> {
    // Switches are honoured for lab wallets only, and a wallet never
    // becomes or stops being one, so this read needs no transaction.
    if call.lab.is_some()
        && !crate::race_lab::both_are_own_lab_wallets(&call.state.db, call.caller.user_id, call.request)
            .await?
    {
        return Err(TransactionError::Refused(lab_wallets_only()));
    }
    match Variants::of(call) {
        None => in_one_call(call).await,
        Some(variants) => super::statement_by_statement::run(call, variants).await,
    }
}

fn lab_wallets_only() -> Refusal {
    Refusal::new(
        Problem::new(
            ProblemType::LabWalletsOnly,
            "Race-lab switches apply only to transfers between your own two race-lab wallets. Nothing was changed.",
        ),
        Layer::NoLayer,
        Outcome::Invalid,
    )
}

/// Why `transfer()` refused before the layers: the PostgreSQL enum
/// `access_refusal`, value for value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "access_refusal", rename_all = "snake_case")]
enum AccessRefusal {
    TokenNotLive,
    NotOwner,
}

/// `transfer()`'s row, by column name.
#[derive(sqlx::FromRow)]
struct OneCallRow {
    /// Set when access was refused; nothing else is then.
    refused: Option<AccessRefusal>,
    /// The idempotency claim's answer and its time in PostgreSQL.
    claim: Option<ClaimVerdict>,
    claim_ms: Option<f64>,
    /// The row guard's answer and its time in PostgreSQL.
    guard: Option<GuardVerdict>,
    guard_ms: Option<f64>,
    /// An accepted transfer's source balance and time.
    balance_minor_after: Option<i64>,
    created_at: Option<DateTime<Utc>>,
    /// The response to send, fresh or replayed.
    #[sqlx(flatten)]
    stored: StoredColumns,
}

/// The production path: the whole transaction is one call of the SQL
/// function `transfer()` (migrations/20261202000005_transfer.sql),
/// which runs `idempotency_claim()` and then `row_guard_transfer()`: one
/// round trip instead of one per statement, and row locks held only while
/// the row guard's statements run.
async fn in_one_call(call: &Call<'_>) -> Result<Settled, TransactionError> {
    let Call {
        state,
        caller,
        request,
        key,
        fingerprint,
        trace_id,
        lab: _,
    } = *call;
    let config = &state.config;
    let transfer_id = Uuid::now_v7();
    // Acquired apart from the statement, so that an error here is known to
    // have sent nothing.
    let mut connection = state.db.acquire().await?;
    let row: OneCallRow = sqlx::query_as(
        "SELECT refused, claim, claim_ms, guard, guard_ms, balance_minor_after, created_at,
                response_status, response_body, response_refusal, response_trace_id
         FROM transfer($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
    )
    .bind(caller.user_id.0)
    .bind(&caller.hash[..])
    .bind(key.map(IdempotencyKey::as_uuid))
    .bind(&fingerprint[..])
    .bind(i32::from(config.idempotency.retention_hours))
    .bind(i32::from(config.idempotency.wait_ms_max))
    .bind(i32::from(config.database.wallet_lock_wait_ms_max))
    .bind(transfer_id)
    .bind(request.from.0)
    .bind(request.to.0)
    .bind(request.amount.get())
    .bind(trace_id)
    .fetch_one(&mut *connection)
    .await
    .map_err(TransactionError::at_commit)?;
    match row.refused {
        Some(AccessRefusal::TokenNotLive) => {
            return Err(TransactionError::Refused(Refusal::token_not_live()));
        }
        Some(AccessRefusal::NotOwner) => return Err(TransactionError::Refused(not_your_wallet())),
        None => {}
    }
    let mut stored = row.stored;

    // The layers ran inside the database; each is reported as a span of its
    // own with the time it took there, and decides as in the step path.
    if let (Some(claimed), Some(key)) = (row.claim, key) {
        let claim = Claim::from_columns(claimed, &mut stored)?;
        layer_span(
            state,
            Layer::Idempotency,
            claim.outcome(),
            row.claim_ms,
            Some(key.hash_hex()),
        );
        if let Some(ended) = ended_by_claim(claim) {
            return ended;
        }
    }
    let guard = row.guard.ok_or_else(|| {
        TransactionError::Protocol("transfer() answered without the row guard's outcome".into())
    })?;
    let guarded = Guarded::from_columns(guard, row.balance_minor_after, row.created_at)?;
    layer_span(
        state,
        Layer::RowGuard,
        guarded.verdict.decision_outcome(),
        row.guard_ms,
        None,
    );
    let decision =
        decision_of(guarded.verdict).ok_or_else(|| TransactionError::Refused(not_your_wallet()))?;
    let response = stored
        .into_response()?
        .ok_or_else(|| TransactionError::Protocol("transfer() decided without a response".into()))?;
    Ok(Settled {
        response,
        decision,
        replayed: false,
    })
}

/// A layer that ran inside the database, reported as a span of its own
/// with the time it took there (for a transfer's and a payout's layers).
pub(crate) fn layer_span(
    state: &AppState,
    layer: Layer,
    outcome: Outcome,
    db_ms: Option<f64>,
    key_hash: Option<String>,
) {
    let outcome = outcome.as_str();
    let db_ms = db_ms.unwrap_or(0.0);
    state.metrics.observe_layer(
        layer.as_str(),
        std::time::Duration::from_secs_f64(db_ms.max(0.0) / 1000.0),
    );
    let span = match layer {
        Layer::Idempotency => tracing::info_span!(
            "defense.idempotency",
            defense.layer = layer.as_str(),
            defense.outcome = outcome,
            defense.db_ms = db_ms,
            idempotency.key_hash = key_hash,
        ),
        _ => tracing::info_span!(
            "defense.row_guard",
            defense.layer = layer.as_str(),
            defense.outcome = outcome,
            defense.db_ms = db_ms,
        ),
    };
    drop(span.entered());
}

/// serialization_failure or deadlock_detected: safe to run again.
fn is_retryable(error: &sqlx::Error) -> bool {
    SqlState::of(error) == Some(SqlState::RetryTransaction)
}

fn is_lock_timeout(error: &sqlx::Error) -> bool {
    SqlState::of(error) == Some(SqlState::LockNotAvailable)
}
