//! The deposit pipeline: a signed, well-formed event goes through the
//! three layers in order, and every exit is one decision (`crate::ending`):
//!
//! 1. the edge lock (`defense::edge_lock`), whose duplicates answer with the
//!    first delivery's answer without touching PostgreSQL;
//! 2. and 3. the inbox claim and the credit, in one PostgreSQL call
//!    (`transaction`);
//!
//! then the caller reports the decision (`ending::report`) and sends it:
//! the same status and the same bytes for every delivery of one event.

use std::time::Instant;

use super::transaction;
use super::{DepositEvent, Origin};
use crate::decision::{Decision, Layer, Outcome};
use crate::defense::Refusal;
use crate::defense::edge_lock::{EdgeAnswer, EdgeVerdict, EventPermit, PassedOn};
use crate::defense::idempotency::StoredResponse;
use crate::ending::{Decided, Settled, Subject};
use crate::feed::EntryPoint;
use crate::settings::InboxMode;
use crate::state::AppState;
use crate::telemetry::RequestContext;
use crate::weakened;

/// The three layers in order, for a signed event that parsed.
pub async fn through_the_layers(state: &AppState, context: &RequestContext, event: DepositEvent) -> Decided {
    let fingerprint = event.fingerprint();
    let origin = Origin::PROVIDER;

    // Layer 1: the edge lock. A duplicate answered here touches no
    // database.
    let edge = match state.config.deposits.event_lock_enabled {
        true => at_the_edge(state, origin, &event, &fingerprint).await,
        false => Ok(Passed::NOT_ASKED),
    };
    let passed = match edge {
        Ok(passed) => passed,
        Err(decided) => return decided.about(subject_of(&event)),
    };

    // Layers 2 and 3: the inbox claim and the credit, in one call.
    let trace_id = &context.trace_id;
    let settled = match state.config.deposits.inbox_mode {
        InboxMode::Atomic => transaction::execute(state, &event, &fingerprint, trace_id, origin).await,
        // DEMO ONLY: a deployment started with the naive inbox.
        InboxMode::CheckThenInsert => {
            let naive_window = state.config.demo.naive_window;
            weakened::inbox::execute(state, &event, &fingerprint, trace_id, origin, naive_window).await
        }
    };
    let without_store = passed.without_store;
    passed.leave_answer(state, fingerprint, &settled).await;
    ended(settled, without_store, &event)
}

/// What the edge let through: the lock this delivery holds, if any, and
/// whether the edge's store was unavailable.
pub struct Passed {
    permit: Option<EventPermit>,
    without_store: bool,
}

impl Passed {
    /// The layer is off.
    pub const NOT_ASKED: Passed = Passed {
        permit: None,
        without_store: false,
    };

    pub fn without_store(&self) -> bool {
        self.without_store
    }

    /// Leaves the answer at the edge for the event's duplicates, or lets
    /// the lock go when the transaction decided nothing.
    pub async fn leave_answer(
        self,
        state: &AppState,
        fingerprint: [u8; 32],
        settled: &Result<Settled, Refusal>,
    ) {
        let Some(permit) = self.permit else {
            return;
        };
        match settled {
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
}

/// Layer 1: a duplicate is answered here with the first delivery's answer
/// (or refused, if its contents changed); anything else goes on.
pub async fn at_the_edge(
    state: &AppState,
    origin: Origin,
    event: &DepositEvent,
    fingerprint: &[u8; 32],
) -> Result<Passed, Decided> {
    let started = Instant::now();
    let edge = state.event_lock.pass(origin.source, &event.event_id).await;
    state.metrics.observe_layer(Layer::EdgeLock, started.elapsed());
    match edge {
        EdgeVerdict::Holder(permit) => Ok(Passed {
            permit: Some(permit),
            without_store: false,
        }),
        EdgeVerdict::Answered(answer) if answer.fingerprint == *fingerprint => Err(Decided::of(
            EntryPoint::Deposit,
            Ok(Settled {
                decision: Decision::new(Layer::EdgeLock, Outcome::Replayed),
                response: StoredResponse {
                    status: answer.status,
                    body: answer.body,
                },
                replayed: true,
                owner: answer.owner,
            }),
            None,
        )),
        EdgeVerdict::Answered(_) => {
            let mut refused = Decided::refused(EntryPoint::Deposit, transaction::payload_changed(), None);
            refused.decision.layer = Layer::EdgeLock;
            Err(refused)
        }
        EdgeVerdict::PassedOn(PassedOn::StoreUnavailable) => Ok(Passed {
            permit: None,
            without_store: true,
        }),
        EdgeVerdict::PassedOn(PassedOn::WaitedOut) | EdgeVerdict::Disabled => Ok(Passed::NOT_ASKED),
    }
}

/// The decision a delivery ends in, once the layers in PostgreSQL spoke.
pub fn ended(settled: Result<Settled, Refusal>, without_store: bool, event: &DepositEvent) -> Decided {
    let settled = settled.map(|settled| settled.degraded_if(without_store));
    Decided::of(EntryPoint::Deposit, settled, None).about(subject_of(event))
}

/// What the feed and the log line say the delivery was about.
pub fn subject_of(event: &DepositEvent) -> Subject {
    Subject {
        amount_minor: Some(event.amount_minor),
        to_wallet_id: Some(event.wallet.0),
        event_id: Some(event.event_id.clone()),
        sender: None,
    }
}
