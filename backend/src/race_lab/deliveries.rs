//! The race lab's deliveries of one deposit event: what a payment provider
//! does when its retries overlap. Each delivery goes through the deposit
//! pipeline's layers (`deposit::pipeline`: the edge lock, the inbox, the
//! credit), in the variants the run's switches choose (`Variants`), from
//! tasks released together by a barrier. They skip only what comes before
//! the layers, the provider's signature over the HTTP body, which the lab
//! has no provider's secret for.
//!
//! The event credits lab wallet A from lab wallet B, which stands in for
//! the provider's clearing account; its id names the visitor
//! (`lab:<user>:<event>`), so that the next run's reset removes it from the
//! inbox.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use tokio::sync::Barrier;
use uuid::Uuid;

use super::burst::{Answer, Shot, overlap_max};
use super::{LAB_CURRENCY, LabWallets, Switches};
use crate::deposit::pipeline::{self, Passed};
use crate::deposit::{DepositEvent, Origin, transaction};
use crate::domain::{UserId, WalletId};
use crate::ending::{self, Answer as Ended, Decided};
use crate::settings::IdempotencyMode;
use crate::state::AppState;
use crate::telemetry::RequestContext;
use crate::weakened;

/// The inbox's and the edge's name for the race lab's deposits between a
/// visitor's lab wallets.
pub const RACE_LAB_SOURCE: &str = "race_lab";

/// The layers a run's deliveries go through, as its switches say.
#[derive(Clone, Copy)]
struct Variants {
    origin: Origin,
    /// Layer 1, the edge lock on the event, on or off.
    event_lock: bool,
    /// Layer 2: the inbox, or the naive check-then-insert.
    naive_inbox: bool,
    naive_window: Duration,
}

/// What the deliveries of a run gave back.
pub struct Delivered {
    pub answers: Vec<Answer>,
    /// The most deliveries in flight at once.
    pub overlap_max: usize,
}

/// Delivers the run's one event: each wave `pause` after the one before,
/// without waiting for its answers, so that a later wave overlaps an
/// earlier one still being applied.
pub async fn deliver(
    state: &AppState,
    user: UserId,
    wallets: LabWallets,
    switches: Switches,
    waves: &[Vec<Shot>],
    pause: Duration,
) -> Delivered {
    let Some(first) = waves.iter().flatten().next() else {
        return Delivered {
            answers: Vec::new(),
            overlap_max: 0,
        };
    };
    let event = DepositEvent {
        event_id: format!(
            "lab:{}:{}",
            user.0,
            first.key.unwrap_or_else(Uuid::new_v4).simple()
        ),
        wallet: WalletId(wallets.a),
        amount_minor: first.amount_minor,
        currency: LAB_CURRENCY.to_owned(),
        occurred_at: Utc::now(),
    };
    let variants = Variants {
        origin: Origin {
            source: RACE_LAB_SOURCE,
            clearing: Some(WalletId(wallets.b)),
        },
        event_lock: switches.cooldown,
        naive_inbox: switches.idempotency == IdempotencyMode::CheckThenInsert,
        naive_window: state.config.race_lab.naive_window,
    };
    let released = Instant::now();
    let mut tasks = Vec::new();
    for (index, wave) in waves.iter().enumerate() {
        if index > 0 {
            tokio::time::sleep(pause).await;
        }
        let barrier = Arc::new(Barrier::new(wave.len().max(1)));
        for shot in wave {
            let (state, event, barrier, shot) = (state.clone(), event.clone(), barrier.clone(), shot.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                one_delivery(&state, event, variants, shot, released).await
            }));
        }
    }
    let mut answers = Vec::with_capacity(tasks.len());
    for task in tasks {
        if let Ok(answer) = task.await {
            answers.push(answer);
        }
    }
    answers.sort_by_key(|answer| answer.sent);
    let overlap_max = overlap_max(&answers);
    Delivered { answers, overlap_max }
}

async fn one_delivery(
    state: &AppState,
    event: DepositEvent,
    variants: Variants,
    shot: Shot,
    released: Instant,
) -> Answer {
    let context = RequestContext {
        request_id: Uuid::new_v4().to_string(),
        trace_id: "0".repeat(32),
        traceparent: None,
        started: Instant::now(),
    };
    let sent = released.elapsed();
    let decided = through_the_layers(state, &context, event, variants).await;
    ending::report(state, &context, &decided);
    let answered = released.elapsed();
    answer_of(decided, shot, sent, answered)
}

/// The deposit pipeline's layers, each as the run's switches say.
async fn through_the_layers(
    state: &AppState,
    context: &RequestContext,
    event: DepositEvent,
    variants: Variants,
) -> Decided {
    let fingerprint = event.fingerprint();
    let Variants { origin, .. } = variants;
    let passed = match variants.event_lock {
        true => pipeline::at_the_edge(state, origin, &event, &fingerprint).await,
        false => Ok(Passed::NOT_ASKED),
    };
    let passed = match passed {
        Ok(passed) => passed,
        Err(decided) => return decided.about(pipeline::subject_of(&event)),
    };
    let trace_id = &context.trace_id;
    let settled = match variants.naive_inbox {
        false => transaction::execute(state, &event, &fingerprint, trace_id, origin).await,
        true => {
            let naive_window = variants.naive_window;
            weakened::inbox::execute(state, &event, &fingerprint, trace_id, origin, naive_window).await
        }
    };
    let without_store = passed.without_store();
    passed.leave_answer(state, fingerprint, &settled).await;
    pipeline::ended(settled, without_store, &event)
}

fn answer_of(decided: Decided, shot: Shot, sent: Duration, answered: Duration) -> Answer {
    let status = decided.status();
    let (replayed, body) = match decided.answer {
        Ended::Stored { response, replayed } => (replayed, response.body),
        Ended::Refused(problem) => (false, problem.body()),
    };
    Answer {
        shot,
        sent,
        answered,
        status,
        decision: Some(decided.decision),
        replayed,
        body,
        trace_id: None,
    }
}
