//! The race lab's deliveries of one deposit event: what a payment provider
//! does when its retries overlap. Each delivery goes through the deposit
//! pipeline itself (`deposit::pipeline::through_the_layers`: the edge lock,
//! the inbox, the credit), in the variants the run's switches choose, from
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
use crate::deposit::pipeline::{self, DepositDecided};
use crate::deposit::{DepositEvent, DepositVariants, RACE_LAB_SOURCE};
use crate::domain::{UserId, WalletId};
use crate::settings::{IdempotencyMode, InboxMode};
use crate::state::AppState;
use crate::telemetry::RequestContext;
use crate::transfer::pipeline::Answer as PipelineAnswer;

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
    let variants = DepositVariants {
        source: RACE_LAB_SOURCE,
        event_lock: switches.cooldown,
        inbox: match switches.idempotency {
            IdempotencyMode::CheckThenInsert => InboxMode::CheckThenInsert,
            _ => InboxMode::Atomic,
        },
        naive_window: state.config.race_lab.naive_window,
        lab_clearing: Some(WalletId(wallets.b)),
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
    variants: DepositVariants,
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
    let decided = pipeline::through_the_layers(state, &context, event, variants).await;
    pipeline::report(state, &context, &decided);
    let answered = released.elapsed();
    answer_of(decided, shot, sent, answered)
}

fn answer_of(decided: DepositDecided, shot: Shot, sent: Duration, answered: Duration) -> Answer {
    let status = decided.status();
    let (replayed, body) = match decided.answer {
        PipelineAnswer::Stored { response, replayed } => (replayed, response.body),
        PipelineAnswer::Refused(problem) => (false, problem.body()),
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
