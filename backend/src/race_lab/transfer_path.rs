//! A race-lab transfer: the production layers, or the weakened variants
//! the run's switches ask for (`crate::weakened`), in the same order as
//! `transfer::pipeline`, ending the same way (`crate::ending`). It runs
//! beside the production path, never through it: the route sends a
//! request here only when it carries switches with a valid pass.
//!
//! What differs from production, and why:
//! - the sandbox: switches are honoured for transfers between the caller's
//!   own two lab wallets only, checked with access, before any layer;
//! - the cooldown window is the lab's own (per run), or off;
//! - no admission: a lab run has bounds of its own (`race_lab_requests_max`,
//!   `race_lab_db_connections_max`), and must show the layers, not this
//!   instance's limit.

use std::borrow::Cow;
use std::time::Instant;

use crate::auth::VerifiedToken;
use crate::decision::{Layer, Outcome};
use crate::defense::Refusal;
use crate::defense::cooldown::CooldownPass;
use crate::defense::idempotency::IdempotencyKey;
use crate::domain::TransferRequest;
use crate::ending::{Decided, Settled, give_the_window_back_if_unused};
use crate::feed::EntryPoint;
use crate::problem::{self, Problem, ProblemType};
use crate::race_lab::{Switches, both_are_own_lab_wallets};
use crate::state::AppState;
use crate::telemetry::RequestContext;
use crate::transfer::pipeline::{fingerprint_of, subject_of};
use crate::transfer::transaction::{self, Call};
use crate::weakened::transfer_transaction::{self, Variants};

/// The cooldown's action for race-lab requests, so that a lab run and the
/// visitor's real transfers never hold each other's window.
const LAB_COOLDOWN_ACTION: &str = "race-lab-transfer";

/// The layers in order, each as the run's switches say.
pub async fn through_the_layers(
    state: &AppState,
    context: &RequestContext,
    caller: &VerifiedToken,
    transfer_request: &TransferRequest,
    key: Option<IdempotencyKey>,
    switches: Switches,
) -> Decided {
    let user = Some(caller.user_id);
    let ended = |decided: Decided| {
        let mut decided = decided
            .with_key(key)
            .about(subject_of(transfer_request))
            .for_a_live_token();
        decided.lab = true;
        decided
    };

    // Access: the lab's sandbox, before any layer.
    if let Err(refusal) = in_the_sandbox(state, caller, transfer_request).await {
        return ended(Decided::refused(EntryPoint::Transfer, refusal, user));
    }

    // Layer 1: the cooldown lock, in the lab's own window, or off.
    let started = Instant::now();
    let body = transfer_request.canonical_json();
    let cooldown = match cooldown_action(switches) {
        Some(action) => state.cooldown.pass(caller, &action, body.as_str()).await,
        None => Ok(CooldownPass::OFF),
    };
    state.metrics.observe_layer(Layer::Cooldown, started.elapsed());
    let cooldown = match cooldown {
        Ok(pass) => pass,
        Err(refusal) => return ended(Decided::refused(EntryPoint::Transfer, refusal, user)),
    };

    // Layers 2 and 3, on one of the lab's own connections.
    let fingerprint = fingerprint_of(&body);
    let call = Call {
        state,
        caller,
        request: transfer_request,
        key,
        fingerprint: &fingerprint,
        trace_id: &context.trace_id,
    };
    let settled = layers_2_and_3(call, switches).await;
    let settled = settled.map(|settled| settled.degraded_if(cooldown.without_store));
    let decided = Decided::of(EntryPoint::Transfer, settled, user);
    give_the_window_back_if_unused(state, cooldown, &decided.answer).await;
    ended(decided)
}

/// The production call when the switches leave both layers at full
/// strength, else the weakened step-by-step transaction. A lab run's
/// transactions wait for one of the lab's own connections
/// (`race_lab_db_connections_max`) before taking one from the pool, so a
/// burst never holds the whole pool.
async fn layers_2_and_3(call: Call<'_>, switches: Switches) -> Result<Settled, Refusal> {
    let state = call.state;
    let _lab_connection = state
        .lab_db_slots
        .acquire()
        .await
        .map_err(|_| Refusal::new(Problem::internal(), Layer::NoLayer, Outcome::Error))?;
    let variants = Variants {
        idempotency: switches.idempotency,
        row_guard: switches.row_guard,
        naive_window: state.config.race_lab.naive_window,
        lab_only: true,
    };
    match variants.weakened() {
        None => transaction::execute(call).await,
        Some(variants) => transfer_transaction::execute(call, variants).await,
    }
}

/// Switches are honoured for the caller's own two lab wallets only. A
/// wallet never becomes or stops being one, so this read needs no
/// transaction.
async fn in_the_sandbox(
    state: &AppState,
    caller: &VerifiedToken,
    transfer_request: &TransferRequest,
) -> Result<(), Refusal> {
    match both_are_own_lab_wallets(&state.db, caller.user_id, transfer_request).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(Refusal::new(
            Problem::new(
                ProblemType::LabWalletsOnly,
                "Race-lab switches apply only to transfers between your own two race-lab wallets. \
                 Nothing was changed.",
            ),
            Layer::NoLayer,
            Outcome::Invalid,
        )),
        Err(error) => Err(Refusal::new(
            problem::from_database_error(&error, "checking the race lab's wallets"),
            Layer::NoLayer,
            Outcome::Error,
        )),
    }
}

/// The action the cooldown window is scoped to, or `None` when the run
/// switched the layer off. A named run has windows of its own.
fn cooldown_action(switches: Switches) -> Option<Cow<'static, str>> {
    match switches {
        Switches { cooldown: false, .. } => None,
        Switches { run: Some(run), .. } => Some(Cow::Owned(format!("{LAB_COOLDOWN_ACTION}:{run}"))),
        _ => Some(Cow::Borrowed(LAB_COOLDOWN_ACTION)),
    }
}
