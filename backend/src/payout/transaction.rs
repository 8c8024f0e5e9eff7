//! Layers 2 and 3 for a payout, in one PostgreSQL call: `payout()` checks
//! the token and the wallet, claims the idempotency key, holds the amount
//! (the row guard on the available balance), writes the payout and its
//! outbox row, and stores the `202` with the claim. One statement, one
//! round trip, committed or rolled back as a whole; the gateway is called
//! later, by the dispatcher.
//!
//! The weakened variant that calls the bank inside the transaction
//! (`payout_mode = call_in_transaction`, or a race-lab run's switch) is in
//! `weakened/payout_transaction.rs`, not here.

use uuid::Uuid;

use super::PayoutRequest;
use crate::auth::VerifiedToken;
use crate::decision::{Decision, Layer, Outcome};
use crate::defense::Refusal;
use crate::defense::idempotency::{Claim, ClaimVerdict, IdempotencyKey, StoredColumns};
use crate::defense::row_guard::GuardVerdict;
use crate::ending::{self, AccessRefusal, Settled, layer_span};
use crate::problem::{Problem, ProblemType};
use crate::state::AppState;

/// `payout()`'s row, by column name.
#[derive(sqlx::FromRow)]
pub struct PayoutRow {
    refused: Option<AccessRefusal>,
    claim: Option<ClaimVerdict>,
    claim_ms: Option<f64>,
    guard: Option<GuardVerdict>,
    guard_ms: Option<f64>,
    #[sqlx(flatten)]
    stored: StoredColumns,
}

/// Everything one payout request brings to the transaction.
pub struct PayoutCall<'a> {
    pub caller: &'a VerifiedToken,
    pub request: &'a PayoutRequest,
    pub key: Option<IdempotencyKey>,
    /// The request's idempotency fingerprint (`payout::pipeline::fingerprint_of`),
    /// from the body spelled once for it and the cooldown's scope.
    pub fingerprint: &'a [u8; 32],
    pub trace_id: &'a str,
    /// The request span's, stored with the payout: the dispatcher's spans
    /// continue its trace.
    pub traceparent: Option<&'a str>,
    /// Sent by the dispatcher (`true`), or by the requester itself, which
    /// then holds lab money and calls its own bank.
    pub sent_by_dispatcher: bool,
}

pub const PAYOUT_STATEMENT: &str = "SELECT refused, claim, claim_ms, guard, guard_ms,
        response_status, response_body, response_refusal, response_trace_id
   FROM payout($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)";

/// Runs the payout's transaction. Every way it ends is a decision: a
/// stored answer, or a refusal that stored nothing.
pub async fn execute(state: &AppState, call: &PayoutCall<'_>) -> Result<Settled, Refusal> {
    // Acquired apart from the statement, so that an error here is known to
    // have sent nothing.
    let mut connection = state
        .db
        .acquire()
        .await
        .map_err(|error| database_refusal(&error, false))?;
    let row: PayoutRow = bind(sqlx::query_as(PAYOUT_STATEMENT), state, call, Uuid::now_v7())
        .fetch_one(&mut *connection)
        .await
        .map_err(|error| database_refusal(&error, true))?;
    settle(state, call.key, row).await
}

pub fn bind<'q>(
    query: sqlx::query::QueryAs<'q, sqlx::Postgres, PayoutRow, sqlx::postgres::PgArguments>,
    state: &AppState,
    call: &PayoutCall<'q>,
    payout_id: Uuid,
) -> sqlx::query::QueryAs<'q, sqlx::Postgres, PayoutRow, sqlx::postgres::PgArguments> {
    let config = &state.config;
    query
        .bind(call.caller.user_id.0)
        .bind(call.caller.hash.to_vec())
        .bind(call.key.map(IdempotencyKey::as_uuid))
        .bind(&call.fingerprint[..])
        .bind(i32::from(config.idempotency.retention_hours))
        .bind(i32::from(config.idempotency.wait_ms_max))
        .bind(i32::from(config.database.wallet_lock_wait_ms_max))
        .bind(payout_id)
        .bind(Uuid::now_v7())
        .bind(call.request.from.0)
        .bind(call.request.amount.get())
        .bind(call.request.destination.as_str())
        .bind(call.trace_id)
        .bind(call.traceparent)
        .bind(!call.sent_by_dispatcher)
}

/// Reads `payout()`'s row: the decision, or a refusal that stored
/// nothing.
pub async fn settle(
    state: &AppState,
    key: Option<IdempotencyKey>,
    row: PayoutRow,
) -> Result<Settled, Refusal> {
    match read_row(state, key, row) {
        Ok(decided) => decided,
        Err(what) => {
            tracing::error!(what, "the database's answer to a payout broke the protocol");
            Err(Refusal::new(Problem::internal(), Layer::NoLayer, Outcome::Error))
        }
    }
}

/// An impossible row is a protocol error (`Err`), never guessed at.
fn read_row(
    state: &AppState,
    key: Option<IdempotencyKey>,
    row: PayoutRow,
) -> Result<Result<Settled, Refusal>, &'static str> {
    match row.refused {
        Some(AccessRefusal::UnknownTarget) => return Err("payout() refused a target it was not given"),
        Some(refused) => return Ok(Err(refused.refusal(NOT_YOUR_WALLET))),
        None => {}
    }
    let mut stored = row.stored;
    if let (Some(claimed), Some(key)) = (row.claim, key) {
        let claim = Claim::from_columns(claimed, &mut stored).map_err(|_| "a replay without its answer")?;
        layer_span(
            state,
            Layer::Idempotency,
            claim.outcome(),
            row.claim_ms,
            Some(key),
        );
        match claim {
            Claim::Started => {}
            Claim::Replayed(response) => {
                return Ok(Ok(Settled {
                    decision: Decision::new(Layer::Idempotency, Outcome::Replayed),
                    response,
                    replayed: true,
                    owner: None,
                }));
            }
            Claim::KeyReused => return Ok(Err(Claim::key_reused())),
            Claim::InFlight => return Ok(Err(Claim::in_flight())),
        }
    }
    let guard = row.guard.ok_or("payout() answered without the hold's outcome")?;
    layer_span(
        state,
        Layer::RowGuard,
        guard.decision_outcome(),
        row.guard_ms,
        None,
    );
    if guard == GuardVerdict::NotOwner {
        return Ok(Err(AccessRefusal::NotOwner.refusal(NOT_YOUR_WALLET)));
    }
    let response = stored
        .into_response()
        .ok()
        .flatten()
        .ok_or("payout() decided without a response")?;
    Ok(Ok(Settled {
        decision: Decision::new(Layer::RowGuard, guard.decision_outcome()),
        response,
        replayed: false,
        owner: None,
    }))
}

/// What a caller who may not pay out from the wallet is told.
const NOT_YOUR_WALLET: &str =
    "You can only pay out from a wallet of your own that holds real money. Nothing was changed.";

/// A database failure, said as what is known.
pub fn database_refusal(error: &sqlx::Error, may_have_committed: bool) -> Refusal {
    ending::database_refusal(error, may_have_committed, "holding a payout", || {
        Problem::new(
            ProblemType::OutcomeUnknown,
            "The connection to the database broke after this payout was sent to it, so we cannot tell whether \
             it was accepted. Retry with the same Idempotency-Key: the retry shows the payout if it was made, \
             or makes it exactly once. Without a key, look for it in GET /api/v1/payouts before retrying.",
        )
        .with_retry_after_s(1)
    })
}
