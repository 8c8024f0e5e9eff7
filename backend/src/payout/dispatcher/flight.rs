//! The calls in flight: the dispatcher keeps up to
//! `payout_gateway_calls_in_flight_max` gateway calls going at once, takes
//! more due rows as calls come back (at least `payout_take_rows_min` at a
//! time while it is busy) rather than waiting for the slowest call of a
//! batch, and records the answers that came back together, up
//! to `payout_dispatch_batch_rows_max` at a time, while the next calls go.
//!
//! **The lease outlasts a row's time in flight.** A row is taken only
//! into a free slot, and its call starts at once: it never waits for a
//! slot under its lease. The call ends within `payout_call_timeout_ms`
//! (the client's time-out covers connecting and the whole answer, and the
//! client has no connection limit to queue behind). Its answer then waits
//! for the record in progress and the few before its own: the answers
//! waiting are bounded, since the queue to the record holds one batch and
//! a full queue stops the slots from being refilled. `payout_lease_ms`
//! must be longer than `payout_call_timeout_ms` (a setting check), and the
//! rest of the lease is for those records, each one transaction.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use futures::future::join_all;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::Instrument;
use uuid::Uuid;

use super::records::settle_all;
use super::{Dispatcher, Taken, record_answer, take};
use crate::payout::gateway::GatewayAnswer;

/// One gateway call's answer, waiting to be recorded.
pub(super) struct Attempt {
    row: Taken,
    answer: GatewayAnswer,
    took: Duration,
    /// The payout's `payout.dispatch` span: the record is reported in it.
    span: tracing::Span,
}

/// How the last take went.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Take {
    /// It leased as many rows as it asked for: more may be due.
    Full,
    /// Fewer (or it failed): nothing more is due for now.
    Drained,
}

/// The dispatcher: the calls and the record of their answers, side by
/// side in one task, so that a record waiting for the clearing wallets'
/// locks does not stop the calls.
pub(super) async fn run(dispatcher: Arc<Dispatcher>) {
    let batch = usize::try_from(dispatcher.state.config.payouts.batch_rows_max).unwrap_or(usize::MAX);
    let (came_back, answers) = mpsc::channel(batch);
    futures::future::join(
        dispatcher.call_as_slots_free(came_back),
        dispatcher.record_as_they_come(answers, batch),
    )
    .await;
}

impl Dispatcher {
    /// Fills the free slots with due rows, and hands each answer to the
    /// record as it comes back. It waits `payout_dispatch_idle_ms` only
    /// when nothing is due and nothing is in flight; while rows are due,
    /// slots are filled again as soon as `payout_take_rows_min` of them are
    /// free (or every call came back).
    async fn call_as_slots_free(self: &Arc<Self>, came_back: mpsc::Sender<Attempt>) {
        let payouts = &self.state.config.payouts;
        let slots = usize::try_from(payouts.calls_in_flight_max).unwrap_or(usize::MAX);
        let take_min = usize::try_from(payouts.take_rows_min).unwrap_or(usize::MAX);
        let mut calls: JoinSet<Attempt> = JoinSet::new();
        let mut last_census = None;
        loop {
            self.census_if_due(&mut last_census).await;
            let free = slots.saturating_sub(calls.len());
            let take = if free > 0 && (free >= take_min || calls.is_empty()) {
                self.take_into(&mut calls, free).await
            } else {
                Take::Full
            };
            if calls.is_empty() {
                // Nothing in flight: wait, unless the take set all it took aside.
                if take == Take::Drained {
                    tokio::time::sleep(payouts.idle).await;
                }
                continue;
            }
            // With a slot free, look for due rows again after `idle` at the latest.
            let wait_max = (calls.len() < slots).then_some(payouts.idle);
            for attempt in come_back(&mut calls, wait_max).await {
                if came_back.send(attempt).await.is_err() {
                    return;
                }
            }
        }
    }

    /// Records the answers as they come back, up to `batch` together.
    async fn record_as_they_come(&self, mut answers: mpsc::Receiver<Attempt>, batch: usize) {
        let mut came_back = Vec::with_capacity(batch);
        while answers.recv_many(&mut came_back, batch).await > 0 {
            self.record_all(std::mem::take(&mut came_back)).await;
        }
    }

    /// Takes up to `free` due rows and starts a call for each; a retry
    /// past the gateway's key retention is set aside instead.
    async fn take_into(self: &Arc<Self>, calls: &mut JoinSet<Attempt>, free: usize) -> Take {
        let payouts = &self.state.config.payouts;
        let asked = u32::try_from(free).unwrap_or(u32::MAX);
        let taken = match take(&self.state.db, asked, payouts.lease).await {
            Ok(taken) => taken,
            Err(error) => {
                tracing::warn!(error = %error, "could not take due payouts; trying again");
                return Take::Drained;
            }
        };
        let full = if taken.len() == free {
            Take::Full
        } else {
            Take::Drained
        };
        let (too_late, taken): (Vec<Taken>, Vec<Taken>) = taken
            .into_iter()
            .partition(|row| row.retry_past_key_retention(payouts.gateway_key_retention, Utc::now()));
        for row in taken {
            calls.spawn(self.clone().attempt(row));
        }
        join_all(too_late.iter().map(|row| self.set_aside(row))).await;
        full
    }

    /// The gateway call for one row, under the payout's span, which
    /// continues the trace of the request that made it.
    async fn attempt(self: Arc<Self>, row: Taken) -> Attempt {
        let span = self.span(&row);
        let started = Instant::now();
        let answer = self.call(&row).instrument(span.clone()).await;
        span.record("payout.answer", answer.label());
        self.state
            .metrics
            .payout_attempts
            .with_label_values(&[answer.label()])
            .inc();
        Attempt {
            row,
            answer,
            took: started.elapsed(),
            span,
        }
    }

    /// Records the answers that came back: the sent payouts together, in
    /// one transaction (`payout_settle_all()`), since each settlement
    /// updates the same two clearing wallets and one commit after another
    /// on them would pace the dispatcher; every other answer on its own.
    async fn record_all(&self, attempts: Vec<Attempt>) {
        let sent: Vec<(Uuid, &str)> = attempts
            .iter()
            .filter_map(|attempt| match &attempt.answer {
                GatewayAnswer::Sent { reference } => Some((attempt.row.payout_id, reference.as_str())),
                _ => None,
            })
            .collect();
        let settled = settle_all(&self.state.db, &sent)
            .await
            .map_err(|error| error.to_string());
        join_all(attempts.iter().map(|attempt| {
            let settled = &settled;
            async move {
                let recorded = match (&attempt.answer, settled) {
                    (GatewayAnswer::Sent { .. }, Ok(settled)) => settled
                        .iter()
                        .find(|(payout_id, _)| *payout_id == attempt.row.payout_id)
                        .map(|(_, recorded)| (*recorded, false))
                        .ok_or_else(|| "payout_settle_all() did not answer for it".to_owned()),
                    (GatewayAnswer::Sent { .. }, Err(error)) => Err(error.clone()),
                    (answer, _) => record_answer(&self.state, &attempt.row, answer)
                        .instrument(attempt.span.clone())
                        .await
                        .map_err(|error| error.to_string()),
                };
                attempt
                    .span
                    .in_scope(|| self.report(&attempt.row, &attempt.answer, attempt.took, recorded));
            }
        }))
        .await;
    }
}

/// The answers that have come back: the first one within `wait_max`
/// (`None`: however long it takes), then every other one already there.
async fn come_back(calls: &mut JoinSet<Attempt>, wait_max: Option<Duration>) -> Vec<Attempt> {
    let first = match wait_max {
        None => calls.join_next().await,
        Some(wait) => tokio::time::timeout(wait, calls.join_next()).await.ok().flatten(),
    };
    let joined: Vec<_> = first
        .into_iter()
        .chain(std::iter::from_fn(|| calls.try_join_next()))
        .collect();
    joined
        .into_iter()
        .filter_map(|joined| {
            joined
                .inspect_err(|error| {
                    tracing::warn!(
                        error = %error,
                        "a gateway call ended without an answer; when its lease runs out the next attempt asks \
                         again with the same key"
                    );
                })
                .ok()
        })
        .collect()
}
