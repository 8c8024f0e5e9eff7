//! The dispatcher: every instance runs one. It takes due outbox rows under
//! a lease, calls the gateway for each, and records the answers.
//!
//! - **The take** (`payout_take()`) locks due rows with `FOR UPDATE SKIP
//!   LOCKED`, so two instances never take one row at once, and leases each
//!   for `payout_lease_ms` by moving its due time past the lease: a crashed
//!   instance's row is due again, and taken over, when its lease runs out.
//!   A row is taken only into a free call slot (`flight`).
//! - **The calls in flight.** Up to `payout_gateway_calls_in_flight_max`
//!   calls go at once; as they come back, their answers are recorded and
//!   their slots filled with more due rows, so a slow call holds back only
//!   its own slot. The lease outlasts a row's time in flight: the call's
//!   time-out and one record (`flight` says how).
//! - **The call** is made outside any transaction, with the payout's id as
//!   the `Idempotency-Key` of every attempt: a row taken over after a crash
//!   between the gateway's sending and our settlement asks again with the
//!   same key, the gateway replays its answer, and the payout settles once.
//! - **The record** of the answers that came back together: their sent
//!   payouts are settled in one transaction, since each settlement updates
//!   the same two clearing wallets and one commit after another on them
//!   would pace the dispatcher; every other answer is one transaction:
//!   release (a definitive refusal only), or postpone with exponential
//!   backoff and full jitter (`payout_retry_base_ms`,
//!   `payout_retry_cap_ms`, the gateway's `Retry-After` up to that cap),
//!   until `payout_attempts_max`, after which the payout needs a person.
//!   Only the gateway's own refusal releases the hold (`gateway` sorts the
//!   answers), and an unknown outcome is never compensated.
//! - **No retry past the key's retention.** The gateway remembers a key
//!   for `payout_gateway_key_retention_hours`: a retry of an older payout
//!   (after a dispatcher outage) could reach a gateway that forgot a
//!   sending, and be sent again. It is not sent: the payout is set aside
//!   as when its attempts run out, and needs a person. A first attempt,
//!   which nothing was sent before, still goes.
//!
//! The dispatcher's span continues the trace of the request that made the
//! payout, and the gateway call is a client span under it that passes the
//! trace on in `traceparent`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use tracing::Instrument;

use super::gateway::{GatewayAnswer, GatewayClient};
use crate::decision::{Layer, Outcome};
use crate::domain::UserId;
use crate::feed::{EntryPoint, FeedEntry};
use crate::problem::ProblemType;
use crate::settings::PayoutMode;
use crate::state::AppState;
use crate::telemetry;

mod flight;
mod records;
mod taken;

use records::postpone;
pub use records::{Recorded, record_answer, release, settle};
pub use taken::{Taken, attempt_key, take};

/// Starts the dispatcher when this deployment sends payouts and this
/// instance is to dispatch them. It runs until aborted (at shutdown).
pub fn spawn(state: AppState) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    let payouts = &state.config.payouts;
    if !payouts.offered() || !payouts.dispatcher_enabled || payouts.mode == PayoutMode::CallInTransaction {
        return Ok(None);
    }
    let gateway = GatewayClient::new(&payouts.gateway_url, payouts.retry.request_timeout)?;
    Ok(Some(tokio::spawn(flight::run(Arc::new(Dispatcher {
        state,
        gateway,
    })))))
}

struct Dispatcher {
    state: AppState,
    gateway: GatewayClient,
}

impl Dispatcher {
    /// The payout's `payout.dispatch` span, which continues the trace of
    /// the request that made it.
    fn span(&self, row: &Taken) -> tracing::Span {
        let span = tracing::info_span!(
            "payout.dispatch",
            otel.kind = "consumer",
            payout.id = %row.payout_id,
            payout.attempt = row.attempts,
            payout.answer = tracing::field::Empty,
            instance.id = %self.state.instance_id,
        );
        if let Some(traceparent) = &row.traceparent {
            telemetry::continue_trace(&span, traceparent);
        }
        span
    }

    /// A retry the gateway may no longer recognise is not sent: the
    /// payout needs a person, its hold kept, by the path whose attempts
    /// ran out (`payout_postpone()` giving up), never released.
    async fn set_aside(&self, row: &Taken) {
        let payouts = &self.state.config.payouts;
        let why = format!(
            "not retried: the payout was made at {} and the gateway remembers keys for {} hours \
             (payout_gateway_key_retention_hours); an earlier attempt may have been sent, and a retry it no longer \
             recognises would send it again: the hold stays until a person checks the gateway's ledger",
            row.created_at.format("%Y-%m-%d %H:%M:%S UTC"),
            payouts.gateway_key_retention.as_secs() / 3_600,
        );
        let span = self.span(row);
        let recorded = postpone(
            &self.state.db,
            row,
            Duration::ZERO,
            &why,
            payouts.retry.attempts_max,
            true,
        )
        .instrument(span.clone())
        .await;
        span.in_scope(|| match recorded {
            Ok((Recorded::Done, true)) => {
                self.state.metrics.payouts_given_up.inc();
                tracing::warn!(
                    payout.id = %row.payout_id,
                    attempts = row.attempts,
                    reason = why,
                    "a payout's retry past the gateway's key retention was not sent; it needs a person"
                );
                let problem = Some(ProblemType::PayoutNeedsAttention);
                self.publish(row, Outcome::Error, 503, problem, Duration::ZERO);
            }
            // Another holder of the row records it.
            Ok(_) => {}
            Err(error) => tracing::warn!(
                payout.id = %row.payout_id,
                error = %error,
                "could not set aside a retry past the gateway's key retention; when the lease runs out it is \
                 set aside again"
            ),
        });
    }

    async fn call(&self, row: &Taken) -> GatewayAnswer {
        let key = attempt_key(self.state.config.payouts.mode, row);
        let payout = row.as_gateway_payout();
        let call_span = tracing::info_span!(
            "payout.gateway_call",
            otel.kind = "client",
            http.request.method = "POST",
            payout.id = %row.payout_id,
        );
        // Without recorded spans, the gateway still gets the request's trace.
        let traceparent = telemetry::traceparent_of(&call_span).or_else(|| row.traceparent.clone());
        self.gateway
            .send(&key, &payout, traceparent.as_deref())
            .instrument(call_span)
            .await
    }

    /// Says how recording an answer ended: in the metrics, the log and the
    /// owner's feed.
    fn report(
        &self,
        row: &Taken,
        answer: &GatewayAnswer,
        took: Duration,
        recorded: Result<(Recorded, bool), String>,
    ) {
        match recorded {
            Ok((Recorded::Done, true)) => {
                self.state.metrics.payouts_given_up.inc();
                tracing::warn!(
                    payout.id = %row.payout_id,
                    attempts = row.attempts,
                    "a payout's gateway calls ran out without a known outcome; it keeps its hold until \
                     wallet-server reconcile asks the gateway"
                );
                self.tell_the_owner(row, answer, took, true);
            }
            Ok((Recorded::Done, false)) => self.tell_the_owner(row, answer, took, false),
            Ok((Recorded::Already | Recorded::LeaseLost, _)) => {}
            Ok((Recorded::Contradicted, _)) => tracing::error!(
                payout.id = %row.payout_id,
                gateway.answer = answer.label(),
                "the gateway's answer contradicts how the payout ended; a person must look"
            ),
            Err(error) => tracing::warn!(
                payout.id = %row.payout_id,
                error,
                "could not record the gateway's answer; when the lease runs out the next attempt asks again \
                 with the same key"
            ),
        }
    }

    /// The owner's feed gets each ending: paid out, refused (the money is
    /// back), or needing a person.
    fn tell_the_owner(&self, row: &Taken, answer: &GatewayAnswer, took: Duration, needs_attention: bool) {
        let (outcome, status, problem) = match answer {
            _ if needs_attention => (Outcome::Error, 503, Some(ProblemType::PayoutNeedsAttention)),
            GatewayAnswer::Sent { .. } => (Outcome::Accepted, 201, None),
            GatewayAnswer::Refused { .. } => (Outcome::Rejected, 422, Some(ProblemType::PayoutRefused)),
            // A postponed attempt is not an ending.
            _ => return,
        };
        self.publish(row, outcome, status, problem, took);
    }

    /// Puts one ending of the payout in its owner's feed.
    fn publish(
        &self,
        row: &Taken,
        outcome: Outcome,
        status: u16,
        problem: Option<ProblemType>,
        took: Duration,
    ) {
        let span = tracing::Span::current();
        let trace_id = telemetry::traceparent_of(&span)
            .or_else(|| row.traceparent.clone())
            .and_then(|traceparent| traceparent.get(3..35).map(str::to_owned))
            .unwrap_or_default();
        self.state.feed.publish(
            UserId(row.user_id),
            FeedEntry {
                time: Utc::now(),
                instance_id: self.state.instance_id.to_string(),
                request_id: row.payout_id.to_string(),
                trace_id,
                idempotency_key: None,
                layer: Layer::Gateway,
                outcome,
                status,
                latency_ms: took.as_secs_f64() * 1000.0,
                amount_minor: Some(row.amount_minor),
                to_wallet_id: None,
                problem_type: problem.map(|kind| kind.slug().to_owned()),
                lab: false,
                entry_point: EntryPoint::Payout,
            },
        );
    }

    /// The outbox's gauges, at most once per `payout_census_interval_ms`
    /// (`last_census`: when they were last counted).
    async fn census_if_due(&self, last_census: &mut Option<Instant>) {
        let interval = self.state.config.payouts.census_interval;
        if last_census.is_some_and(|last| last.elapsed() < interval) {
            return;
        }
        *last_census = Some(Instant::now());
        let census: Result<(i64, f64, i64), sqlx::Error> =
            sqlx::query_as("SELECT outbox_rows, oldest_due_age_s, needing_attention FROM payout_census()")
                .fetch_one(&self.state.db)
                .await;
        if let Ok((rows, oldest_due_age_s, needing_attention)) = census {
            let metrics = &self.state.metrics;
            metrics.payout_outbox_rows.set(rows);
            metrics.payout_oldest_due_age.set(oldest_due_age_s);
            metrics.payouts_needing_attention.set(needing_attention);
        }
    }
}

/// A duration as PostgreSQL's `int` milliseconds; the settings' bounds
/// keep every one in range.
pub fn millis(duration: Duration) -> i32 {
    i32::try_from(duration.as_millis()).unwrap_or(i32::MAX)
}
