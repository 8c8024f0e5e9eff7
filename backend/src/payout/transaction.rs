//! Layers 2 and 3 for a payout, in one PostgreSQL call: `payout()` checks
//! the token and the wallet, claims the idempotency key, holds the amount
//! (the row guard on the available balance), writes the payout and its
//! outbox row, and stores the `202` with the claim. One statement, one
//! round trip, committed or rolled back as a whole; the gateway is called
//! later, by the dispatcher.
//!
//! Only the demonstration mode `payout_mode = call_in_transaction` calls
//! the gateway here, inside the transaction, to show what that costs. A
//! race-lab run's payouts (`lab_bank`) come through here too, in the mode
//! the run chose: lab money from the visitor's lab wallet A, sent to the
//! lab's own bank.

use uuid::Uuid;

use super::PayoutRequest;
use super::bank::Bank;
use super::dispatcher;
use super::gateway::{GatewayAnswer, GatewayClient, GatewayPayout};
use super::lab_bank::LabBank;
use crate::auth::VerifiedToken;
use crate::decision::{Decision, Layer, Outcome};
use crate::defense::Refusal;
use crate::defense::idempotency::{Claim, ClaimVerdict, IdempotencyKey, StoredColumns, StoredResponse};
use crate::defense::row_guard::GuardVerdict;
use crate::problem::{self, Problem, ProblemType};
use crate::settings::PayoutMode;
use crate::state::AppState;
use crate::transfer::layer_span;

/// What the transaction settled on: a `202`, or a business refusal stored
/// with the key like one, fresh or replayed.
#[derive(Debug)]
pub struct Settled {
    pub decision: Decision,
    pub response: StoredResponse,
    pub replayed: bool,
}

/// `payout()`'s row, by column name.
#[derive(sqlx::FromRow)]
struct PayoutRow {
    refused: Option<AccessRefusal>,
    claim: Option<ClaimVerdict>,
    claim_ms: Option<f64>,
    guard: Option<GuardVerdict>,
    guard_ms: Option<f64>,
    #[sqlx(flatten)]
    stored: StoredColumns,
}

/// Why `payout()` refused before the layers: the PostgreSQL enum
/// `access_refusal`, value for value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "access_refusal", rename_all = "snake_case")]
enum AccessRefusal {
    TokenNotLive,
    NotOwner,
}

/// Everything one payout request brings to the transaction.
pub struct PayoutCall<'a> {
    pub caller: &'a VerifiedToken,
    pub request: &'a PayoutRequest,
    pub key: Option<IdempotencyKey>,
    pub trace_id: &'a str,
    /// The request span's, stored with the payout: the dispatcher's spans
    /// continue its trace.
    pub traceparent: Option<&'a str>,
    /// How the payout reaches its bank: `payout_mode`, or a lab run's
    /// switch.
    pub mode: PayoutMode,
    /// A race-lab run's bank: the payout is then lab money from the
    /// caller's lab wallet A, and is never the dispatcher's.
    pub lab_bank: Option<&'a LabBank>,
}

const PAYOUT_STATEMENT: &str = "SELECT refused, claim, claim_ms, guard, guard_ms,
        response_status, response_body, response_refusal, response_trace_id
   FROM payout($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)";

/// Runs the payout's transaction. Every way it ends is a decision: a
/// stored answer, or a refusal that stored nothing.
pub async fn execute(state: &AppState, call: &PayoutCall<'_>) -> Result<Settled, Refusal> {
    if call.mode == PayoutMode::CallInTransaction {
        return with_the_call_inside(state, call).await;
    }
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

fn bind<'q>(
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
        .bind(call.request.fingerprint().to_vec())
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
        .bind(call.lab_bank.is_some())
}

/// Reads `payout()`'s row: the decision, or a refusal that stored
/// nothing.
async fn settle(state: &AppState, key: Option<IdempotencyKey>, row: PayoutRow) -> Result<Settled, Refusal> {
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
        Some(AccessRefusal::TokenNotLive) => return Ok(Err(Refusal::token_not_live())),
        Some(AccessRefusal::NotOwner) => return Ok(Err(not_your_wallet())),
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
            Some(key.hash_hex()),
        );
        match claim {
            Claim::Started => {}
            Claim::Replayed(response) => {
                return Ok(Ok(Settled {
                    decision: Decision::new(Layer::Idempotency, Outcome::Replayed),
                    response,
                    replayed: true,
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
        return Ok(Err(not_your_wallet()));
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
    }))
}

fn not_your_wallet() -> Refusal {
    Refusal::new(
        Problem::new(
            ProblemType::NotYourWallet,
            "You can only pay out from a wallet of your own that holds real money. Nothing was changed.",
        ),
        Layer::NoLayer,
        Outcome::Unauthorized,
    )
}

/// A database failure, said as what is known.
fn database_refusal(error: &sqlx::Error, may_have_committed: bool) -> Refusal {
    let problem = problem::of_the_work(error, may_have_committed, "holding a payout", || {
        Problem::new(
            ProblemType::OutcomeUnknown,
            "The connection to the database broke after this payout was sent to it, so we cannot tell whether \
             it was accepted. Retry with the same Idempotency-Key: the retry shows the payout if it was made, \
             or makes it exactly once. Without a key, look for it in GET /api/v1/payouts before retrying.",
        )
        .with_retry_after_s(1)
    });
    Refusal::new(problem, Layer::NoLayer, Outcome::Error)
}

/// DEMO ONLY (`payout_mode = call_in_transaction`, or a lab run's switch):
/// the hold, the gateway
/// call and the settlement in one transaction, rolled back when the call
/// fails. The rollback undoes the debit, not the sending: a call whose
/// answer was lost leaves money gone without a debit, and the client's
/// retry sends it again under a new payout id.
async fn with_the_call_inside(state: &AppState, call: &PayoutCall<'_>) -> Result<Settled, Refusal> {
    let payout_id = Uuid::now_v7();
    let mut tx = state
        .db
        .begin()
        .await
        .map_err(|error| database_refusal(&error, false))?;
    let row: PayoutRow = bind(sqlx::query_as(PAYOUT_STATEMENT), state, call, payout_id)
        .fetch_one(&mut *tx)
        .await
        .map_err(|error| database_refusal(&error, false))?;
    let settled = settle(state, call.key, row).await?;
    if settled.replayed || settled.decision.outcome != Outcome::Accepted {
        tx.commit()
            .await
            .map_err(|error| database_refusal(&error, true))?;
        return Ok(settled);
    }
    let gateway;
    let bank = match call.lab_bank {
        Some(lab) => Bank::Lab(lab),
        None => {
            gateway = GatewayClient::new(
                &state.config.payouts.gateway_url,
                state.config.payouts.retry.request_timeout,
            )
            .map_err(|_| Refusal::new(Problem::internal(), Layer::NoLayer, Outcome::Error))?;
            Bank::Gateway(&gateway)
        }
    };
    let currency: String = sqlx::query_scalar("SELECT currency FROM payouts WHERE id = $1")
        .bind(payout_id)
        .fetch_one(&mut *tx)
        .await
        .map_err(|error| database_refusal(&error, false))?;
    let payout = GatewayPayout {
        amount_minor: call.request.amount.get(),
        currency: &currency,
        destination: &call.request.destination,
        reference: payout_id,
    };
    let answer = bank.send(&payout_id.to_string(), &payout, call.traceparent).await;
    if !bank.is_lab() {
        state
            .metrics
            .payout_attempts
            .with_label_values(&[answer.label()])
            .inc();
    }
    let recorded = match &answer {
        GatewayAnswer::Sent { reference } => dispatcher::settle(&mut *tx, payout_id, reference).await,
        GatewayAnswer::Refused { reason } => {
            dispatcher::release(
                &mut *tx,
                payout_id,
                reason,
                state.config.database.wallet_lock_wait_ms_max,
            )
            .await
        }
        GatewayAnswer::Unknown { .. } | GatewayAnswer::Rejected { .. } | GatewayAnswer::NeverReceived => {
            tracing::warn!(
                payout.id = %payout_id,
                gateway.answer = answer.label(),
                "UNSAFE: rolled a payout back after a gateway call whose outcome is unknown"
            );
            drop(tx);
            return Err(Refusal::new(
                Problem::unavailable(
                    "The bank did not answer in time, so this payout's hold was rolled back. Unsafe demonstration \
                     mode: the bank may have sent the money anyway, and a retry may send it again.",
                ),
                Layer::NoLayer,
                Outcome::Error,
            ));
        }
    };
    recorded.map_err(|error| database_refusal(&error, false))?;
    tx.commit()
        .await
        .map_err(|error| database_refusal(&error, true))?;
    Ok(settled)
}
