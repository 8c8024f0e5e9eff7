//! The transfer pipeline, shared by the API and the browser form: a request
//! that passed the cheap checks (caller, body, key) goes through the three
//! layers in order, and every exit is one decision (`crate::ending`):
//!
//! 1. the cooldown lock (Redis), which refuses without touching PostgreSQL;
//!    then admission (`admission`), which counts only what the cooldown let
//!    through, so that a burst of copies meets the cooldown's 429s, not
//!    the 503 of a full instance;
//! 2. and 3. the idempotency claim and the row guard, in one PostgreSQL
//!    call (`transaction`);
//!
//! then the caller reports the decision (`ending::report`) and turns it
//! into an answer: JSON for the API, a page for the form.

use std::time::Instant;

use crate::auth::VerifiedToken;
use crate::decision::Layer;
use crate::defense::idempotency::IdempotencyKey;
use crate::domain::{CanonicalBody, TransferRequest};
use crate::ending::{Decided, Subject, give_the_window_back_if_unused};
use crate::feed::EntryPoint;
use crate::state::AppState;
use crate::telemetry::RequestContext;
use crate::transfer::transaction::{self, Call};
use crate::weakened::transfer_transaction::{self, Variants};

/// The action name the cooldown window is scoped to.
pub const COOLDOWN_ACTION: &str = "transfer";

/// The idempotency fingerprint of a transfer, from its canonical body
/// (`TransferRequest::canonical_json`): the same operation whether it came
/// from a script or the browser's form.
pub fn fingerprint_of(canonical_body: &CanonicalBody) -> [u8; 32] {
    canonical_body.fingerprint("POST", "/api/v1/transfers")
}

/// The three layers in order, for a request that passed the cheap checks.
pub async fn through_the_layers(
    state: &AppState,
    context: &RequestContext,
    caller: &VerifiedToken,
    transfer_request: &TransferRequest,
    key: Option<IdempotencyKey>,
) -> Decided {
    let ended = |decided: Decided| {
        decided
            .with_key(key)
            .about(subject_of(transfer_request))
            .for_a_live_token()
    };
    let user = Some(caller.user_id);

    // Layer 1: the cooldown lock. A refusal here touches no database.
    let started = Instant::now();
    let body = transfer_request.canonical_json();
    let cooldown = state.cooldown.pass(caller, COOLDOWN_ACTION, body.as_str()).await;
    state.metrics.observe_layer(Layer::Cooldown, started.elapsed());
    let cooldown = match cooldown {
        Ok(pass) => pass,
        Err(refusal) => return ended(Decided::refused(EntryPoint::Transfer, refusal, user)),
    };

    // Admission, after the cooldown and before the transaction: a copy of
    // a transfer already in its window was refused above in one Redis
    // round trip, and is no load; only what passed is counted against what
    // this instance takes at once. A transfer refused here changed nothing,
    // so it gives its window back. The place is held until the decision.
    let _place = match state.transfer_admission.admit().await {
        Ok(place) => place,
        Err(overloaded) => {
            let decided = Decided::refused(EntryPoint::Transfer, overloaded, user);
            give_the_window_back_if_unused(state, cooldown, &decided.answer).await;
            return ended(decided);
        }
    };

    // Layers 2 and 3: the idempotency claim and the row guard, in one call.
    let fingerprint = fingerprint_of(&body);
    let call = Call {
        state,
        caller,
        request: transfer_request,
        key,
        fingerprint: &fingerprint,
        trace_id: &context.trace_id,
    };
    let settled = match Variants::of_deployment(&state.config) {
        None => transaction::execute(call).await,
        // DEMO ONLY: a deployment started in a demonstration mode
        // (`idempotency_mode`, `row_guard_mode`) runs a weakened variant.
        // Boxed, so that its many kilobytes of future are not carried by
        // every transfer's.
        Some(variants) => Box::pin(transfer_transaction::execute(call, variants)).await,
    };
    let settled = settled.map(|settled| settled.degraded_if(cooldown.without_store));
    let decided = Decided::of(EntryPoint::Transfer, settled, user);
    give_the_window_back_if_unused(state, cooldown, &decided.answer).await;
    ended(decided)
}

/// What the feed and the log line say the transfer was about.
pub fn subject_of(transfer_request: &TransferRequest) -> Subject {
    Subject {
        amount_minor: Some(transfer_request.amount.get()),
        to_wallet_id: Some(transfer_request.to.0),
        event_id: None,
        sender: None,
    }
}
