//! The deposit pipeline: a signed, well-formed event goes through the
//! three layers in order, and every exit is one decision:
//!
//! 1. the edge lock (`edge`), whose duplicates answer with the first
//!    delivery's answer without touching PostgreSQL;
//! 2. and 3. the inbox claim and the credit, in one PostgreSQL call
//!    (`transaction`), or, in the naive demonstration variant only, one
//!    statement after another (`check_then_insert`);
//!
//! then the decision is reported (span, log line, metrics, the wallet
//! owner's feed) and sent: the same status and the same bytes for every
//! delivery of one event.

use std::time::Instant;

use actix_web::HttpResponse;
use chrono::Utc;

use super::check_then_insert;
use super::edge::{EdgeAnswer, EdgeVerdict, PassedOn};
use super::transaction::{self, Settled};
use super::{DepositEvent, DepositVariants};
use crate::decision::{Decision, Layer, Outcome};
use crate::defense::Refusal;
use crate::defense::idempotency::StoredResponse;
use crate::domain::UserId;
use crate::feed::{EntryPoint, FeedEntry};
use crate::settings::InboxMode;
use crate::state::AppState;
use crate::telemetry::RequestContext;
use crate::transfer::pipeline::Answer;

/// How one delivery ended.
pub struct DepositDecided {
    pub decision: Decision,
    pub answer: Answer,
    /// The owner of the wallet, when known: their feed gets the entry.
    pub owner: Option<UserId>,
    pub event: Option<DepositEvent>,
}

impl DepositDecided {
    /// Refused before or by a layer, storing nothing.
    pub fn refused(refusal: Refusal, event: Option<DepositEvent>) -> Self {
        Self {
            decision: refusal.decision,
            answer: Answer::Refused(refusal.problem),
            owner: None,
            event,
        }
    }

    pub fn status(&self) -> u16 {
        self.answer.status()
    }

    /// The HTTP response, with the `Defense-Decision` header.
    pub fn into_response(self, context: &RequestContext) -> HttpResponse {
        self.answer.into_response(self.decision, context)
    }
}

/// The three layers in order, for a signed event that parsed (or one of
/// the race lab's), each in the variant `variants` says.
pub async fn through_the_layers(
    state: &AppState,
    context: &RequestContext,
    event: DepositEvent,
    variants: DepositVariants,
) -> DepositDecided {
    let fingerprint = event.fingerprint();

    // Layer 1: the edge lock. A duplicate answered here touches no
    // database.
    let started = Instant::now();
    let edge = if variants.event_lock {
        state.event_lock.pass(variants.source, &event.event_id).await
    } else {
        EdgeVerdict::Disabled
    };
    state
        .metrics
        .observe_layer(Layer::EdgeLock.as_str(), started.elapsed());
    let (permit, without_store) = match edge {
        EdgeVerdict::Holder(permit) => (Some(permit), false),
        EdgeVerdict::Answered(answer) if answer.fingerprint == fingerprint => {
            return DepositDecided {
                decision: Decision::new(Layer::EdgeLock, Outcome::Replayed),
                answer: Answer::Stored {
                    response: StoredResponse {
                        status: answer.status,
                        body: answer.body,
                    },
                    replayed: true,
                },
                owner: answer.owner,
                event: Some(event),
            };
        }
        EdgeVerdict::Answered(_) => {
            let mut refused = DepositDecided::refused(transaction::payload_changed(), Some(event));
            refused.decision.layer = Layer::EdgeLock;
            return refused;
        }
        EdgeVerdict::PassedOn(PassedOn::StoreUnavailable) => (None, true),
        EdgeVerdict::PassedOn(PassedOn::WaitedOut) | EdgeVerdict::Disabled => (None, false),
    };

    // Layers 2 and 3: the inbox claim and the credit, in one transaction.
    let settled = match variants.inbox {
        InboxMode::Atomic => {
            transaction::execute(state, &event, &fingerprint, &context.trace_id, variants).await
        }
        InboxMode::CheckThenInsert => {
            check_then_insert::execute(state, &event, &fingerprint, &context.trace_id, variants).await
        }
    };
    if let Some(permit) = permit {
        match &settled {
            Ok(settled) => {
                let answer = EdgeAnswer {
                    fingerprint,
                    status: settled.response.status,
                    owner: settled.owner,
                    body: settled.response.body.clone(),
                };
                state.event_lock.leave_answer(&permit, &answer).await;
            }
            Err(_) => state.event_lock.release(&permit).await,
        }
    }
    match settled {
        Ok(Settled {
            mut decision,
            response,
            owner,
            replayed,
        }) => {
            if without_store && decision.outcome == Outcome::Accepted {
                decision.outcome = Outcome::Degraded;
            }
            DepositDecided {
                decision,
                answer: Answer::Stored { response, replayed },
                owner,
                event: Some(event),
            }
        }
        Err(refusal) => DepositDecided::refused(refusal, Some(event)),
    }
}

/// Reports the decision everywhere, the same way as a transfer's: the
/// request's span, the metrics, one log line and the wallet owner's feed.
pub fn report(state: &AppState, context: &RequestContext, decided: &DepositDecided) {
    let decision = decided.decision;
    let status = decided.status();
    let latency_ms = context.started.elapsed().as_secs_f64() * 1000.0;
    let span = tracing::Span::current();
    span.record("defense.layer", decision.layer.as_str());
    span.record("defense.outcome", decision.outcome.as_str());
    state.metrics.count_deposit_decision(decision);
    let event = decided.event.as_ref();
    tracing::info!(
        decision.layer = decision.layer.as_str(),
        decision.outcome = decision.outcome.as_str(),
        http.status = status,
        latency_ms,
        request.id = %context.request_id,
        trace.id = %context.trace_id,
        deposit.event_id = event.map(|event| event.event_id.as_str()),
        user.id = decided.owner.map(|user| user.to_string()),
        instance.id = %state.instance_id,
        "deposit decided"
    );
    if let Some(owner) = decided.owner {
        state.feed.publish(
            owner,
            FeedEntry {
                time: Utc::now(),
                instance_id: state.instance_id.to_string(),
                request_id: context.request_id.clone(),
                trace_id: context.trace_id.clone(),
                idempotency_key: None,
                layer: decision.layer,
                outcome: decision.outcome,
                status,
                latency_ms,
                amount_minor: event.map(|event| event.amount_minor),
                to_wallet_id: event.map(|event| event.wallet.0),
                problem_type: decided.answer.problem_type().map(|kind| kind.slug().to_owned()),
                lab: false,
                entry_point: EntryPoint::Deposit,
            },
        );
    }
}
