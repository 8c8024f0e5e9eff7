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

use actix_web::HttpResponse;
use actix_web::http::header;
use chrono::Utc;

use super::PayoutRequest;
use super::transaction::{self, PayoutCall};
use crate::auth::VerifiedToken;
use crate::decision::{Decision, Layer, Outcome};
use crate::defense::Refusal;
use crate::defense::idempotency::IdempotencyKey;
use crate::domain::UserId;
use crate::feed::{EntryPoint, FeedEntry};
use crate::problem::{Problem, ProblemType};
use crate::state::AppState;
use crate::telemetry::{self, RequestContext};
use crate::transfer::pipeline::{Answer, give_the_window_back_if_unused};

/// The action the cooldown window is scoped to: a payout and a transfer of
/// one person never hold each other's window.
const COOLDOWN_ACTION: &str = "payout";

/// How a payout request ended.
pub struct PayoutDecided {
    pub decision: Decision,
    pub answer: Answer,
    pub user: Option<UserId>,
    pub key: Option<IdempotencyKey>,
    pub request: Option<PayoutRequest>,
}

impl PayoutDecided {
    /// Refused before or by a layer, storing nothing.
    pub fn refused(refusal: Refusal, user: Option<UserId>, key: Option<IdempotencyKey>) -> Self {
        Self {
            decision: refusal.decision,
            answer: Answer::Refused(refusal.problem),
            user,
            key,
            request: None,
        }
    }

    pub fn status(&self) -> u16 {
        self.answer.status()
    }

    /// The id of the payout a `202` is about.
    pub fn payout_id(&self) -> Option<uuid::Uuid> {
        #[derive(serde::Deserialize)]
        struct Receipt {
            id: uuid::Uuid,
        }
        match &self.answer {
            Answer::Stored { response, .. } if response.status == 202 => {
                serde_json::from_str::<Receipt>(&response.body)
                    .ok()
                    .map(|receipt| receipt.id)
            }
            _ => None,
        }
    }

    /// The HTTP response, with the `Defense-Decision` header, and for a
    /// `202` (fresh or replayed) the payout's `Location`.
    pub fn into_response(self, context: &RequestContext) -> HttpResponse {
        let location = self.payout_id().map(|id| format!("/api/v1/payouts/{id}"));
        let mut response = self.answer.into_response(self.decision, context);
        if let Some(location) = location
            && let Ok(value) = header::HeaderValue::from_str(&location)
        {
            response.headers_mut().insert(header::LOCATION, value);
        }
        response
    }
}

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
) -> PayoutDecided {
    let user = Some(caller.user_id);

    // Layer 1: the cooldown lock. A refusal here touches no database.
    let started = Instant::now();
    let cooldown = state
        .cooldown
        .pass(caller, COOLDOWN_ACTION, &request.canonical_json())
        .await;
    state
        .metrics
        .observe_layer(Layer::Cooldown.as_str(), started.elapsed());
    let cooldown = match cooldown {
        Ok(pass) => pass,
        Err(refusal) => {
            let mut decided = PayoutDecided::refused(refusal, user, key);
            decided.request = Some(request);
            return decided;
        }
    };

    // Layers 2 and 3: the claim and the hold, with the outbox row.
    // The current span's when spans are recorded, else the request's.
    let traceparent =
        telemetry::traceparent_of(&tracing::Span::current()).or_else(|| context.traceparent.clone());
    let call = PayoutCall {
        caller,
        request: &request,
        key,
        trace_id: &context.trace_id,
        traceparent: traceparent.as_deref(),
        mode: state.config.payouts.mode,
        lab_bank: None,
    };
    let mut decided = match transaction::execute(state, &call).await {
        Ok(settled) => {
            let mut decision = settled.decision;
            if cooldown.without_store && decision.outcome == Outcome::Accepted {
                decision.outcome = Outcome::Degraded;
            }
            PayoutDecided {
                decision,
                answer: Answer::Stored {
                    response: settled.response,
                    replayed: settled.replayed,
                },
                user,
                key,
                request: None,
            }
        }
        Err(refusal) => PayoutDecided::refused(refusal, user, key),
    };
    give_the_window_back_if_unused(state, cooldown, &decided.answer).await;
    if decided.answer.is_refusal(ProblemType::Unauthorized) {
        // A token found revoked speaks for nobody: no one's feed.
        decided.user = None;
    }
    decided.request = Some(request);
    decided
}

/// Reports the decision everywhere, as a transfer's is: the request's
/// span, the metrics, one log line and the owner's feed.
pub fn report(state: &AppState, context: &RequestContext, decided: &PayoutDecided) {
    let decision = decided.decision;
    let status = decided.status();
    let latency_ms = context.started.elapsed().as_secs_f64() * 1000.0;
    let span = tracing::Span::current();
    span.record("defense.layer", decision.layer.as_str());
    span.record("defense.outcome", decision.outcome.as_str());
    state.metrics.count_payout_decision(decision);
    let payout_id = decided.payout_id();
    tracing::info!(
        decision.layer = decision.layer.as_str(),
        decision.outcome = decision.outcome.as_str(),
        http.status = status,
        latency_ms,
        request.id = %context.request_id,
        trace.id = %context.trace_id,
        user.id = decided.user.map(|user| user.to_string()),
        idempotency.key_hash = decided.key.map(IdempotencyKey::hash_hex),
        payout.id = payout_id.map(|id| id.to_string()),
        instance.id = %state.instance_id,
        "payout decided"
    );
    if let Some(user) = decided.user {
        state.feed.publish(
            user,
            FeedEntry {
                time: Utc::now(),
                instance_id: state.instance_id.to_string(),
                request_id: context.request_id.clone(),
                trace_id: context.trace_id.clone(),
                idempotency_key: decided.key.map(IdempotencyKey::as_uuid),
                layer: decision.layer,
                outcome: decision.outcome,
                status,
                latency_ms,
                amount_minor: decided.request.as_ref().map(|request| request.amount.get()),
                to_wallet_id: None,
                problem_type: decided.answer.problem_type().map(|kind| kind.slug().to_owned()),
                lab: false,
                entry_point: EntryPoint::Payout,
            },
        );
    }
}
