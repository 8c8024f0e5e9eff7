//! Layers 2 and 3 in one PostgreSQL call: the SQL function `transfer()`
//! (migrations/20261202000005_transfer.sql) checks that the token is live
//! and the caller owns the source, claims the idempotency key
//! (`idempotency_claim()`), runs the row guard (`row_guard_transfer()`:
//! lock both wallets in id order, guarded debit, credit, record), stores
//! the response with the claim and commits. One round trip; the row locks
//! are held only while the row guard's statements run. The call goes down
//! a connection one of the transfer executors holds (`crate::executors`);
//! transfers waiting together go in one call of `transfer_batch()`
//! (`call.rs` makes both calls), each
//! decided as `transfer()` decides it, with every wallet of the batch
//! locked in one order first.
//!
//! Business refusals (insufficient funds, unknown target) are committed with
//! the claim so that retries replay them. Everything else (authentication,
//! ownership, infrastructure failures) rolls back, which frees the key.
//! Serialization failures and deadlocks are retried up to
//! `transfer_retries_max` times; neither should happen with the fixed lock
//! order, and neither reaches the client as a 500.
//!
//! The race lab's weakened transaction, one statement at a time so that a
//! weakened layer can stand in, is in `weakened/transfer_transaction.rs`.

use std::future::Future;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgRow;
use uuid::Uuid;

use crate::auth::VerifiedToken;
use crate::decision::{Decision, Layer, Outcome};
use crate::defense::Refusal;
use crate::defense::idempotency::{Claim, ClaimVerdict, IdempotencyKey, StoredColumns};
use crate::defense::row_guard::{GuardVerdict, Guarded};
use crate::domain::{TransferOrder, TransferRequest};
use crate::ending::{self, AccessRefusal, Settled, layer_span};
use crate::executors::Failure;
use crate::problem::{Problem, SqlState};
use crate::state::AppState;

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

/// One transfer request's inputs to the transaction.
#[derive(Clone, Copy)]
pub struct Call<'a> {
    pub state: &'a AppState,
    pub caller: &'a VerifiedToken,
    pub request: &'a TransferRequest,
    pub key: Option<IdempotencyKey>,
    pub fingerprint: &'a [u8; 32],
    /// Goes into stored problem bodies, so a replayed refusal still points
    /// at the trace of the request that decided it.
    pub trace_id: &'a str,
}

/// How one attempt at the transaction failed.
pub enum TransactionError {
    Database {
        error: sqlx::Error,
        /// The error came from the call that commits (the one-call
        /// statement, or `COMMIT`): if the connection broke, the transfer
        /// may have been made.
        may_have_committed: bool,
    },
    /// Refused without storing anything; the transaction rolls back.
    /// Boxed: a refusal carries its whole problem, and the common path
    /// should not move it around.
    Refused(Box<Refusal>),
    /// The database answered with a combination the protocol rules out: a
    /// bug on one side, never guessed at.
    Protocol(String),
}

impl TransactionError {
    pub fn refused(refusal: Refusal) -> Self {
        TransactionError::Refused(Box::new(refusal))
    }

    pub fn at_commit(error: sqlx::Error) -> Self {
        TransactionError::Database {
            error,
            may_have_committed: true,
        }
    }
}

/// Any statement before the commit: a broken connection there rolls back.
/// A protocol error from reading an answer is a bug, not a failure.
impl From<sqlx::Error> for TransactionError {
    fn from(error: sqlx::Error) -> Self {
        match error {
            sqlx::Error::Protocol(what) => TransactionError::Protocol(what),
            error => TransactionError::Database {
                error,
                may_have_committed: false,
            },
        }
    }
}

/// Runs the transaction, retrying it on serialization failures and
/// deadlocks.
pub async fn execute(call: Call<'_>) -> Result<Settled, Refusal> {
    with_retries(call.state, || in_one_call(call)).await
}

/// Runs one attempt after another until one ends, and says every way it
/// can end as a decision. Shared with the demonstration's step-by-step
/// transaction, so that both end the same way.
pub async fn with_retries<Attempt, Running>(state: &AppState, attempt: Attempt) -> Result<Settled, Refusal>
where
    Attempt: Fn() -> Running,
    Running: Future<Output = Result<Settled, TransactionError>>,
{
    let mut retries = 0;
    loop {
        let error = match attempt().await {
            Ok(settled) => return Ok(settled),
            Err(TransactionError::Refused(refusal)) => return Err(*refusal),
            Err(TransactionError::Protocol(what)) => {
                tracing::error!(what, "the database's answer to a transfer broke the protocol");
                return Err(Refusal::new(Problem::internal(), Layer::NoLayer, Outcome::Error));
            }
            Err(TransactionError::Database {
                error,
                may_have_committed,
            }) => (error, may_have_committed),
        };
        match error {
            (error, _) if is_retryable(&error) && retries < state.config.database.transfer_retries_max => {
                retries += 1;
                tracing::info!(attempt = retries, error = %error, "retrying a transfer transaction");
            }
            (error, may_have_committed) => return Err(database_refusal(&error, may_have_committed, retries)),
        }
    }
}

/// A database failure after `retries` retries, said as what is known.
fn database_refusal(error: &sqlx::Error, may_have_committed: bool, retries: u32) -> Refusal {
    // Said as what it is: with the fixed lock order only a naive variant's
    // crossing transfers can deadlock.
    if is_retryable(error) {
        tracing::warn!(attempts = retries + 1, error = %error, "a transfer kept failing to serialize");
        return Refusal::new(
            Problem::unavailable(format!(
                "This transfer crossed others and PostgreSQL broke the deadlock by rolling it back, {} times. \
                 Nothing was changed; retry shortly.",
                retries + 1
            )),
            Layer::NoLayer,
            Outcome::Error,
        );
    }
    ending::database_refusal(
        error,
        may_have_committed,
        "running a transfer",
        Problem::outcome_unknown,
    )
}

/// `transfer()`'s row: its columns, or the same columns of a batch's
/// `transfer_answer`.
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
    stored: StoredColumns,
}

/// `transfer()`'s columns, in the order it and the `transfer_answer` type
/// of `transfer_batch()` both give them.
const ANSWER_COLUMNS: usize = 11;

impl OneCallRow {
    /// Reads the answer from the row's last `ANSWER_COLUMNS` columns: the
    /// whole row from `transfer()`, all but the transfer's place (`idx`)
    /// from `transfer_batch()`. By position, each still type-checked: by
    /// name, every column of every transfer cost a lookup.
    fn of(row: &PgRow) -> Result<Self, sqlx::Error> {
        let at = row
            .len()
            .checked_sub(ANSWER_COLUMNS)
            .ok_or_else(|| sqlx::Error::Protocol(format!("a transfer's answer had {} columns", row.len())))?;
        Ok(Self {
            refused: row.try_get(at)?,
            claim: row.try_get(at + 1)?,
            claim_ms: row.try_get(at + 2)?,
            guard: row.try_get(at + 3)?,
            guard_ms: row.try_get(at + 4)?,
            balance_minor_after: row.try_get(at + 5)?,
            created_at: row.try_get(at + 6)?,
            stored: StoredColumns {
                response_status: row.try_get(at + 7)?,
                response_body: row.try_get(at + 8)?,
                response_refusal: row.try_get(at + 9)?,
                response_trace_id: row.try_get(at + 10)?,
            },
        })
    }
}

/// The whole transaction in one call, by one of the transfer executors
/// (`crate::executors`): `transfer()` alone, or `transfer_batch()` with
/// the transfers waiting beside it.
async fn in_one_call(call: Call<'_>) -> Result<Settled, TransactionError> {
    let Call {
        state,
        caller,
        request,
        key,
        fingerprint,
        trace_id,
    } = call;
    let order = TransferOrder {
        user: caller.user_id,
        token_hash: caller.hash,
        key: key.map(IdempotencyKey::as_uuid),
        fingerprint: *fingerprint,
        transfer_id: Uuid::now_v7(),
        request: *request,
        trace_id: trace_id.to_owned(),
    };
    let row = match state.transfers.run(order).await {
        Ok(row) => row,
        Err(Failure {
            error,
            may_have_committed,
        }) => {
            let error = TransactionError::from(error);
            return Err(match error {
                TransactionError::Database { error, .. } => TransactionError::Database {
                    error,
                    may_have_committed,
                },
                other => other,
            });
        }
    };
    settle(state, key, OneCallRow::of(&row)?)
}

/// Reads `transfer()`'s row: the layers ran inside the database; each is
/// reported as a span of its own with the time it took there.
fn settle(
    state: &AppState,
    key: Option<IdempotencyKey>,
    row: OneCallRow,
) -> Result<Settled, TransactionError> {
    if let Some(refused) = row.refused {
        return Err(TransactionError::refused(refused.refusal(NOT_YOUR_WALLET)));
    }
    let mut stored = row.stored;
    if let (Some(claimed), Some(key)) = (row.claim, key) {
        let claim = Claim::from_columns(claimed, &mut stored)?;
        layer_span(
            state,
            Layer::Idempotency,
            claim.outcome(),
            row.claim_ms,
            Some(key),
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
    let decision = decision_of(guarded.verdict)?;
    let response = stored
        .into_response()?
        .ok_or_else(|| TransactionError::Protocol("transfer() decided without a response".into()))?;
    Ok(Settled {
        response,
        decision,
        replayed: false,
        owner: None,
    })
}

/// What a caller who does not own the source wallet is told.
pub const NOT_YOUR_WALLET: &str = "You can only send money from a wallet you own.";

/// A claim that ends the request before the row guard: a replay, or one of
/// the key's refusals. `None` when the claim is ours.
pub fn ended_by_claim(claim: Claim) -> Option<Result<Settled, TransactionError>> {
    match claim {
        Claim::Started => None,
        Claim::Replayed(response) => Some(Ok(Settled {
            response,
            decision: Decision::new(Layer::Idempotency, Outcome::Replayed),
            replayed: true,
            owner: None,
        })),
        Claim::KeyReused => Some(Err(TransactionError::refused(Claim::key_reused()))),
        Claim::InFlight => Some(Err(TransactionError::refused(Claim::in_flight()))),
    }
}

/// The decision the row guard's answer makes; a caller who does not own
/// the source wallet is refused without storing anything.
pub fn decision_of(verdict: GuardVerdict) -> Result<Decision, TransactionError> {
    match verdict {
        GuardVerdict::NotOwner => Err(TransactionError::refused(
            AccessRefusal::NotOwner.refusal(NOT_YOUR_WALLET),
        )),
        verdict => Ok(Decision::new(Layer::RowGuard, verdict.decision_outcome())),
    }
}

/// serialization_failure or deadlock_detected: safe to run again.
fn is_retryable(error: &sqlx::Error) -> bool {
    SqlState::of(error) == Some(SqlState::RetryTransaction)
}
