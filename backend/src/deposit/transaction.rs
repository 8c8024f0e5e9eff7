//! Layers 2 and 3 for a deposit, in one PostgreSQL call: `deposit()`
//! claims the event in the inbox, credits the wallet from the provider's
//! clearing wallet, and stores the answer with the claim; or, for an event
//! already applied, reads back its answer. One statement, one round trip,
//! committed or rolled back as a whole.
//!
//! Every answer a provider can get again is stored: a credit, and each
//! refusal that depends on the event alone (an unknown wallet, another
//! currency, over the limit, too old, dated in the future). What is not stored is not final: a
//! changed payload (the event as first delivered stands), a delivery that
//! waited out the first one, and our own failures, which roll back.

use uuid::Uuid;

use super::{DepositEvent, Origin};
use crate::decision::{Decision, Layer, Outcome};
use crate::defense::Refusal;
use crate::defense::idempotency::StoredResponse;
use crate::defense::inbox::InboxClaim;
use crate::domain::UserId;
use crate::ending::{self, Settled, layer_span};
use crate::problem::{Problem, ProblemType};
use crate::state::AppState;

/// How a deposit was decided: the PostgreSQL enum `deposit_verdict`,
/// stored in the inbox as its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DepositVerdict {
    Credited,
    UnknownWallet,
    CurrencyMismatch,
    AmountOverLimit,
    EventTooOld,
    EventInFuture,
}

impl DepositVerdict {
    pub fn of_name(name: &str) -> Option<Self> {
        Some(match name {
            "credited" => Self::Credited,
            "unknown_wallet" => Self::UnknownWallet,
            "currency_mismatch" => Self::CurrencyMismatch,
            "amount_over_limit" => Self::AmountOverLimit,
            "event_too_old" => Self::EventTooOld,
            "event_in_future" => Self::EventInFuture,
            _ => return None,
        })
    }

    /// A stored refusal, as every delivery of the event gets it: rendered
    /// from the catalogue with the trace id of the request that decided
    /// it, so the bytes are the same each time. `None` for a credit.
    pub fn refusal(self, trace_id: Option<&str>) -> Option<Problem> {
        let (kind, detail) = match self {
            Self::Credited => return None,
            Self::UnknownWallet => (
                ProblemType::DepositWalletUnknown,
                "No wallet that can receive deposits has the id given as wallet_id. Nothing was credited, and \
                 every delivery of this event gets this answer.",
            ),
            Self::CurrencyMismatch => (
                ProblemType::DepositCurrencyMismatch,
                "The wallet holds another currency than the deposit's; money is never converted. Nothing was \
                 credited, and every delivery of this event gets this answer.",
            ),
            Self::AmountOverLimit => (
                ProblemType::DepositAmountOverLimit,
                "The amount is larger than this deployment accepts in one deposit (deposit_amount_minor_max). \
                 Nothing was credited, and every delivery of this event gets this answer.",
            ),
            Self::EventTooOld => (
                ProblemType::DepositEventTooOld,
                "The event happened longer ago than this deployment accepts (deposit_event_age_hours_max), so \
                 it cannot be told apart from one already credited. Nothing was credited; reconcile it by hand.",
            ),
            Self::EventInFuture => (
                ProblemType::DepositEventInFuture,
                "occurred_at lies further ahead of our clock than provider_signature_tolerance_s allows. Nothing \
                 was credited, and every delivery of this event gets this answer; send a new event with the true \
                 time.",
            ),
        };
        let problem = Problem::new(kind, detail).with_layer(Layer::RowGuard);
        Some(match trace_id {
            Some(trace_id) => problem.with_trace_id(trace_id),
            None => problem,
        })
    }

    pub fn decision(self) -> Decision {
        match self {
            Self::Credited => Decision::new(Layer::RowGuard, Outcome::Accepted),
            _ => Decision::new(Layer::RowGuard, Outcome::Rejected),
        }
    }
}

/// `deposit()`'s row, by column name.
#[derive(sqlx::FromRow)]
struct DepositRow {
    claim: InboxClaim,
    claim_ms: Option<f64>,
    credit_ms: Option<f64>,
    verdict: Option<String>,
    owner: Option<Uuid>,
    response_status: Option<i16>,
    response_body: Option<String>,
    response_trace_id: Option<String>,
}

/// Runs the deposit's transaction, `deposit()`, one statement. Every way
/// it can end is a decision: a stored answer (fresh or replayed), or a
/// refusal that stored nothing.
pub async fn execute(
    state: &AppState,
    event: &DepositEvent,
    fingerprint: &[u8; 32],
    trace_id: &str,
    origin: Origin,
) -> Result<Settled, Refusal> {
    let config = &state.config;
    // Acquired apart from the statement, so that an error here is known to
    // have sent nothing.
    let mut connection = state
        .db
        .acquire()
        .await
        .map_err(|error| database_refusal(&error, false))?;
    let row: DepositRow = sqlx::query_as(
        "SELECT claim, claim_ms, credit_ms, verdict, owner, response_status, response_body, response_trace_id
         FROM deposit($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15::inbox_source, $16)",
    )
    .bind(&event.event_id)
    .bind(&fingerprint[..])
    .bind(event.wallet.0)
    .bind(event.amount_minor)
    .bind(&event.currency)
    .bind(event.occurred_at)
    .bind(config.deposits.amount_minor_max)
    .bind(i32::from(config.deposits.event_age_hours_max))
    .bind(future_s(config))
    .bind(i32::from(config.deposits.inbox_retention_hours))
    .bind(i32::from(config.deposits.inbox_wait_ms_max))
    .bind(i32::from(config.database.wallet_lock_wait_ms_max))
    .bind(Uuid::now_v7())
    .bind(trace_id)
    .bind(origin.source)
    .bind(origin.clearing.map(|wallet| wallet.0))
    .fetch_one(&mut *connection)
    .await
    .map_err(|error| database_refusal(&error, true))?;
    match settle(state, row) {
        Ok(decided) => decided,
        Err(what) => {
            tracing::error!(what, "the database's answer to a deposit broke the protocol");
            Err(Refusal::new(Problem::internal(), Layer::NoLayer, Outcome::Error))
        }
    }
}

/// How far ahead of the database's clock an event's `occurred_at` may
/// lie: the signature's tolerance, the drift already allowed between the
/// provider's clock and ours. Bounded by its declaration (at most an hour),
/// so the conversion to PostgreSQL's `int` never saturates.
pub fn future_s(config: &crate::settings::Config) -> i32 {
    i32::try_from(config.deposits.signature_tolerance.as_secs()).unwrap_or(i32::MAX)
}

/// Reads `deposit()`'s row: the decision, or a refusal that stored
/// nothing; an impossible row is a protocol error, never guessed at.
fn settle(state: &AppState, row: DepositRow) -> Result<Result<Settled, Refusal>, String> {
    layer_span(state, Layer::Inbox, row.claim.outcome(), row.claim_ms, None);
    let owner = row.owner.map(UserId);
    match row.claim {
        InboxClaim::PayloadChanged => return Ok(Err(payload_changed())),
        InboxClaim::InFlight => return Ok(Err(in_flight(state))),
        InboxClaim::Started | InboxClaim::Replayed => {}
    }
    let verdict = row
        .verdict
        .as_deref()
        .and_then(DepositVerdict::of_name)
        .ok_or_else(|| format!("deposit() answered the verdict {:?}", row.verdict))?;
    let response = match (
        verdict.refusal(row.response_trace_id.as_deref()),
        row.response_body,
    ) {
        (None, Some(body)) => StoredResponse { status: 200, body },
        (Some(problem), None) => StoredResponse {
            status: problem.status,
            body: problem.body(),
        },
        (refusal, body) => {
            return Err(format!(
                "a {verdict:?} deposit with a body: {}, a refusal: {}",
                body.is_some(),
                refusal.is_some()
            ));
        }
    };
    if row.response_status != Some(i16::try_from(response.status).unwrap_or_default()) {
        return Err(format!(
            "deposit() stored status {:?} for {verdict:?}",
            row.response_status
        ));
    }
    let replayed = row.claim == InboxClaim::Replayed;
    let decision = if replayed {
        Decision::new(Layer::Inbox, Outcome::Replayed)
    } else {
        layer_span(
            state,
            Layer::RowGuard,
            verdict.decision().outcome,
            row.credit_ms,
            None,
        );
        verdict.decision()
    };
    Ok(Ok(Settled {
        decision,
        response,
        owner,
        replayed,
    }))
}

/// The same event id with other contents: a provider's error. The event as
/// first delivered stands; this delivery credits nothing and is not
/// stored, so the first delivery's answer is still what a faithful retry
/// gets. Said by the inbox, and by the edge when it holds the answer.
pub fn payload_changed() -> Refusal {
    tracing::warn!(
        provider.error = "payload_changed",
        "a deposit event was delivered again with different contents; refused"
    );
    Refusal::new(
        Problem::new(
            ProblemType::EventPayloadChanged,
            "An event with this event_id was delivered before with different contents. That first delivery \
             stands; this one credited nothing. Send a new event for a new deposit.",
        ),
        Layer::Inbox,
        Outcome::PayloadChanged,
    )
}

/// The first delivery of the event did not finish within the waits: it
/// will commit or roll back on its own, and a redelivery after
/// `Retry-After` gets its answer.
fn in_flight(state: &AppState) -> Refusal {
    let wait = std::time::Duration::from_millis(state.config.deposits.inbox_wait_ms_max.into());
    Refusal::new(
        Problem::new(
            ProblemType::EventInFlight,
            "Another delivery of this event is still being applied. Nothing was changed by this one; deliver it \
             again after Retry-After to get the event's answer.",
        )
        .with_retry_after_s(crate::problem::retry_after_s(wait)),
        Layer::Inbox,
        Outcome::InFlight,
    )
}

/// A database failure, said as what is known: nothing credited, or (the
/// connection broke after the statement was sent) unknown, with how to
/// retry safely.
pub fn database_refusal(error: &sqlx::Error, may_have_committed: bool) -> Refusal {
    ending::database_refusal(error, may_have_committed, "crediting a deposit", || {
        Problem::new(
            ProblemType::OutcomeUnknown,
            "The connection to the database broke after this deposit was sent to it, so we cannot tell whether it \
             was credited. Deliver the same event again: the inbox answers with the credit if it was made, or \
             makes it exactly once.",
        )
        .with_retry_after_s(1)
    })
}
