//! The payout pipeline, shared by the API and the browser form: a request
//! that passed the cheap checks (caller, body, key) goes through the three
//! layers in order, as a transfer does, and every exit is one decision:
//!
//! 1. the cooldown lock (Redis), scoped to the user and the action
//!    `payout`, which refuses without touching PostgreSQL;
//! 2. and 3. the idempotency claim and the hold, in one PostgreSQL call
//!    (`transaction`), which also writes the outbox row;
//!
//! then the decision is reported (span, log line, metrics, feed) and turned
//! into an answer by the caller. The gateway is not called here.

use std::time::Instant;

use super::PayoutRequest;
use super::gateway::GatewayClient;
use super::transaction::{self, PayoutCall};
use crate::auth::VerifiedToken;
use crate::decision::{Layer, Outcome};
use crate::defense::Refusal;
use crate::defense::idempotency::IdempotencyKey;
use crate::domain::CanonicalBody;
use crate::ending::{Decided, Settled, Subject, give_the_window_back_if_unused};
use crate::feed::EntryPoint;
use crate::problem::{Problem, ProblemType};
use crate::settings::PayoutMode;
use crate::state::AppState;
use crate::telemetry::{self, RequestContext};
use crate::weakened;

/// The idempotency fingerprint of a payout, from its canonical body: a key
/// used for a transfer and then for a payout is a key reused.
pub fn fingerprint_of(canonical_body: &CanonicalBody) -> [u8; 32] {
    canonical_body.fingerprint("POST", "/api/v1/payouts")
}

/// The action the cooldown window is scoped to: a payout and a transfer of
/// one person never hold each other's window.
const COOLDOWN_ACTION: &str = "payout";

/// This deployment sends no payouts: said before any layer.
pub fn not_offered() -> Refusal {
    Refusal::new(
        Problem::new(
            ProblemType::PayoutsNotOffered,
            "This deployment has no bank gateway configured (payout_gateway_url), so it sends no payouts. \
             Nothing was changed.",
        ),
        Layer::NoLayer,
        Outcome::Invalid,
    )
}

/// The three layers in order, for a request that passed the cheap checks.
pub async fn through_the_layers(
    state: &AppState,
    context: &RequestContext,
    caller: &VerifiedToken,
    request: PayoutRequest,
    key: Option<IdempotencyKey>,
) -> Decided {
    let user = Some(caller.user_id);
    let subject = Subject {
        amount_minor: Some(request.amount.get()),
        ..Subject::default()
    };
    let ended = |decided: Decided| decided.with_key(key).about(subject).for_a_live_token();

    // Layer 1: the cooldown lock. A refusal here touches no database.
    let started = Instant::now();
    let body = request.canonical_json();
    let cooldown = state.cooldown.pass(caller, COOLDOWN_ACTION, body.as_str()).await;
    state.metrics.observe_layer(Layer::Cooldown, started.elapsed());
    let cooldown = match cooldown {
        Ok(pass) => pass,
        Err(refusal) => return ended(Decided::refused(EntryPoint::Payout, refusal, user)),
    };

    // Layers 2 and 3: the claim and the hold, with the outbox row. The
    // current span's trace context when spans are recorded, else the
    // request's: the dispatcher's spans continue it.
    let traceparent =
        telemetry::traceparent_of(&tracing::Span::current()).or_else(|| context.traceparent.clone());
    let fingerprint = fingerprint_of(&body);
    let call = PayoutCall {
        caller,
        request: &request,
        key,
        fingerprint: &fingerprint,
        trace_id: &context.trace_id,
        traceparent: traceparent.as_deref(),
        sent_by_dispatcher: true,
    };
    let settled = match state.config.payouts.mode {
        PayoutMode::CallInTransaction => with_the_call_inside(state, &call).await,
        _ => transaction::execute(state, &call).await,
    };
    let settled = settled.map(|settled| settled.degraded_if(cooldown.without_store));
    let decided = Decided::of(EntryPoint::Payout, settled, user);
    give_the_window_back_if_unused(state, cooldown, &decided.answer).await;
    ended(decided)
}

/// DEMO ONLY: a deployment started with `payout_mode = call_in_transaction`
/// calls its gateway inside the transaction (`weakened::payout_transaction`).
async fn with_the_call_inside(state: &AppState, call: &PayoutCall<'_>) -> Result<Settled, Refusal> {
    let payouts = &state.config.payouts;
    let gateway = GatewayClient::new(&payouts.gateway_url, payouts.retry.request_timeout)
        .map_err(|_| Refusal::new(Problem::internal(), Layer::NoLayer, Outcome::Error))?;
    weakened::payout_transaction::execute(state, call, &gateway).await
}
