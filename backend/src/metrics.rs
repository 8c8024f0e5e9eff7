//! Prometheus metrics, in a registry per application (not a process-wide
//! global, so that several instances in one test process keep their own
//! counts). Served as text at `GET /metrics`.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

use crate::decision::{Decision, Layer};

/// Latency buckets in seconds, from 0.5 ms to 10 s.
const LATENCY_BUCKETS_S: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// Decisions by entry point, layer and outcome.
    decisions: IntCounterVec,
    /// Gateway calls by how they ended: `sent`, `refused`, `unknown` (a
    /// time-out, a 5xx or a broken connection), `rejected` (an answer no
    /// retry changes).
    pub payout_attempts: IntCounterVec,
    /// Payouts whose attempts ran out without a known outcome.
    pub payouts_given_up: IntCounter,
    /// Outbox rows, due or leased, as last counted.
    pub payout_outbox_rows: IntGauge,
    /// How long the oldest due outbox row has waited, as last counted.
    pub payout_oldest_due_age: Gauge,
    /// Payouts waiting for `wallet-server reconcile`, as last counted.
    pub payouts_needing_attention: IntGauge,
    /// Commands claimed from a consumer whose claim time ran out.
    pub commands_claimed: IntCounter,
    /// Command stream entries moved to the dead-letter stream.
    pub commands_dead_lettered: IntCounter,
    /// Entries delivered and not yet acknowledged, by partition.
    pub commands_pending: IntGaugeVec,
    /// Entries not yet delivered to any consumer, by partition.
    pub commands_lag: IntGaugeVec,
    /// Every HTTP request's latency by route, method and status class.
    pub http_latency: HistogramVec,
    /// Time spent in each defense layer.
    pub layer_latency: HistogramVec,
    /// `layer_latency`'s histogram of each layer, looked up once: a
    /// transfer observes three layers, and a lookup by label hashes the
    /// label and takes the family's lock. Indexed by `Layer`, whose last
    /// variant is `NoLayer`.
    layer_latency_of: Arc<[OnceLock<Histogram>; Layer::NoLayer as usize + 1]>,
    /// Requests let through while Redis could not be asked.
    pub cooldown_fail_open: IntCounter,
    /// Entries the decision feed holds across every user's streams, as
    /// its writer last counted them against `decision_feed_entries_max`.
    pub feed_entries: IntGauge,
    /// Streams removed whole, least recently written first, to keep the
    /// feed within its budget.
    pub feed_streams_removed: IntCounter,
    pub account_limits_fail_open: IntCounter,
    /// Decision feed entries dropped because the queue was full or Redis
    /// failed; the transfer itself was not affected.
    pub feed_dropped: IntCounter,
    /// Round trips to Redis: each command or pipeline sent on the shared
    /// connection (a script is one). What a transfer costs there.
    pub redis_round_trips: IntCounter,
    /// Pool gauges, refreshed at every scrape.
    pool_connections: IntGaugeVec,
    /// The admission limit's places and queue, refreshed at every scrape.
    transfer_admission: IntGaugeVec,
    /// Transfers each call to PostgreSQL carried: 1 for `transfer()`,
    /// more for `transfer_batch()` (`crate::executors`).
    pub transfer_batch_transfers: Histogram,
    /// 1 while the cooldown runs without Redis (fail-open), as last seen by
    /// a readiness probe.
    pub cooldown_degraded: IntGauge,
    /// The configured cooldown window, so that an alert can hold the
    /// transfers' latency against it.
    pub cooldown_window: Gauge,
    /// Transfers answered with a problem, by its type (`outcome-unknown`,
    /// `idempotency-key-in-flight`, `cooldown-active`, …).
    problems: IntCounterVec,
    /// How long the oldest expired idempotency key has waited for the
    /// sweeper, read at every scrape; 0 when none has expired.
    pub idempotency_oldest_expired_age: Gauge,
}

impl Metrics {
    /// Every metric with its name and help, made and registered in one
    /// step (`Registrar`), so that none is defined without being served.
    pub fn new() -> Self {
        let registrar = Registrar(Registry::new_custom(Some("wallet".into()), None).unwrap_or_default());
        let metrics = Self {
            decisions: registrar.counter_vec(
                "decisions_total",
                "Decisions by entry point (transfer, deposit, command, payout), the layer that decided and the outcome",
                &["entry_point", "layer", "outcome"],
            ),
            payout_attempts: registrar.counter_vec(
                "payout_attempts_total",
                "Gateway calls by how they ended: sent, refused, unknown (time-out, 5xx, broken connection) or \
                 rejected (an answer no retry changes)",
                &["answer"],
            ),
            payouts_given_up: registrar.counter(
                "payouts_needs_attention_total",
                "Payouts set aside for a person: their gateway calls ran out (payout_attempts_max) without a known outcome, \
                 or a retry came past payout_gateway_key_retention_hours",
            ),
            payout_outbox_rows: registrar.gauge(
                "payout_outbox_rows",
                "Payout outbox rows, due or leased (counted every payout_census_interval_ms)",
            ),
            payout_oldest_due_age: registrar.float_gauge(
                "payout_outbox_oldest_due_age_seconds",
                "How long the oldest due payout outbox row has waited (counted every payout_census_interval_ms)",
            ),
            payouts_needing_attention: registrar.gauge(
                "payouts_needing_attention",
                "Payouts waiting for wallet-server reconcile (counted every payout_census_interval_ms)",
            ),
            commands_claimed: registrar.counter(
                "commands_claimed_total",
                "Commands claimed from a consumer whose claim time (commands_claim_idle_ms) ran out",
            ),
            commands_dead_lettered: registrar.counter(
                "commands_dead_lettered_total",
                "Command stream entries moved to the dead-letter stream",
            ),
            commands_pending: registrar.gauge_vec(
                "commands_pending",
                "Command entries delivered and not yet acknowledged, by partition (read while idle)",
                &["partition"],
            ),
            commands_lag: registrar.gauge_vec(
                "commands_lag",
                "Command entries not yet delivered to any consumer, by partition (read while idle)",
                &["partition"],
            ),
            http_latency: registrar.latency(
                "http_request_duration_seconds",
                "HTTP request latency",
                &["route", "method", "status"],
            ),
            layer_latency: registrar.latency(
                "defense_layer_duration_seconds",
                "Time spent in each defense layer",
                &["layer"],
            ),
            layer_latency_of: Arc::default(),
            cooldown_fail_open: registrar.counter(
                "cooldown_fail_open_total",
                "Requests passed without the cooldown because Redis was unreachable",
            ),
            feed_entries: registrar.gauge(
                "decision_feed_entries",
                "Entries the decision feed holds across every user's streams, as last counted",
            ),
            feed_streams_removed: registrar.counter(
                "decision_feed_streams_removed_total",
                "Users' feed streams removed whole, least recently written first, to keep the feed within its budget",
            ),
            account_limits_fail_open: registrar.counter(
                "account_limits_fail_open_total",
                "Sign-ups and sign-ins passed without their rate limit because Redis was unreachable",
            ),
            feed_dropped: registrar.counter(
                "decision_feed_dropped_total",
                "Decision feed entries dropped (queue full or Redis unavailable)",
            ),
            redis_round_trips: registrar.counter(
                "redis_round_trips_total",
                "Commands and pipelines sent to Redis on the shared connections, each one round trip",
            ),
            pool_connections: registrar.gauge_vec(
                "pool_connections",
                "Connections in each store's pool by state",
                &["store", "state"],
            ),
            transfer_admission: registrar.gauge_vec(
                "transfer_admission",
                "Transfers running and waiting for a place under the admission limit, and the limits",
                &["state"],
            ),
            transfer_batch_transfers: registrar.add(Histogram::with_opts(
                HistogramOpts::new(
                    "transfer_batch_transfers",
                    "Transfers each call to PostgreSQL carried: 1 alone (transfer()), more together (transfer_batch())",
                )
                // One bucket per size a batch can have (`transfers_batch_max`
                // is at most 32), so that the sizes themselves, not only their
                // mean, can be read back: the benchmark has the database alone
                // run the same batches.
                .buckets((1..=32).map(f64::from).collect()),
            )),
            cooldown_degraded: registrar.gauge(
                "cooldown_degraded",
                "1 while Redis is unreachable and the cooldown fails open (set by each /readyz probe)",
            ),
            cooldown_window: registrar.float_gauge(
                "cooldown_window_seconds",
                "The configured cooldown window (cooldown_ttl_ms), in seconds",
            ),
            problems: registrar.counter_vec(
                "problems_total",
                "Requests answered with a problem, by entry point and the problem's type",
                &["entry_point", "type"],
            ),
            idempotency_oldest_expired_age: registrar.float_gauge(
                "idempotency_oldest_expired_age_seconds",
                "How long the oldest expired idempotency key has waited for the sweeper, read at each scrape",
            ),
            registry: registrar.0,
        };
        metrics.start_the_series_alerts_divide_by();
        metrics
    }

    /// A counter that is born with its first event has no earlier sample,
    /// so `rate()` misses that event. The series the alerting rules divide
    /// by are made at zero from the start.
    fn start_the_series_alerts_divide_by(&self) {
        for (layer, outcome) in [
            ("cooldown", "rejected"),
            ("row_guard", "accepted"),
            ("idempotency", "replayed"),
            ("idempotency", "in_flight"),
        ] {
            self.decisions.with_label_values(&["transfer", layer, outcome]);
        }
        for kind in crate::problem::ProblemType::ALL {
            self.problems.with_label_values(&["transfer", kind.slug()]);
        }
    }
    /// Counts a decision at one entry point (`ending::entry_point_label`).
    pub fn count_decision(&self, entry_point: &str, decision: Decision) {
        self.decisions
            .with_label_values(&[entry_point, decision.layer.as_str(), decision.outcome.as_str()])
            .inc();
    }

    /// Counts a problem answered at one entry point, by its type.
    pub fn count_problem(&self, entry_point: &str, problem_type: &str) {
        self.problems
            .with_label_values(&[entry_point, problem_type])
            .inc();
    }

    pub fn observe_layer(&self, layer: Layer, elapsed: Duration) {
        let of_layer = || self.layer_latency.with_label_values(&[layer.as_str()]);
        match self.layer_latency_of.get(layer as usize) {
            Some(slot) => slot.get_or_init(of_layer).observe(elapsed.as_secs_f64()),
            None => of_layer().observe(elapsed.as_secs_f64()),
        }
    }

    pub fn set_pool(&self, store: &str, in_use: usize, idle: usize, max: usize) {
        let set = |state: &str, value: usize| {
            self.pool_connections
                .with_label_values(&[store, state])
                .set(i64::try_from(value).unwrap_or(i64::MAX));
        };
        set("in_use", in_use);
        set("idle", idle);
        set("max", max);
    }

    pub fn set_transfer_admission(&self, occupancy: Occupancy) {
        let set = |state: &str, value: u32| {
            self.transfer_admission
                .with_label_values(&[state])
                .set(i64::from(value));
        };
        set("running", occupancy.running);
        set("waiting", occupancy.waiting);
        set("running_max", occupancy.running_max);
        set("waiting_max", occupancy.waiting_max);
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        // Encoding metrics we defined ourselves into memory cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buffer);
        String::from_utf8(buffer).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Makes a metric and registers it in the same step. The definitions are
/// fixed in this file, so a bad one or a name registered twice is a
/// programming error found by every test that starts the application.
struct Registrar(Registry);

impl Registrar {
    fn add<M: Collector + Clone + 'static>(&self, made: prometheus::Result<M>) -> M {
        let metric = made.expect("static metric definition");
        self.0
            .register(Box::new(metric.clone()))
            .expect("each metric is registered once");
        metric
    }

    fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.add(IntCounter::new(name, help))
    }

    fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.add(IntCounterVec::new(Opts::new(name, help), labels))
    }

    fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.add(IntGauge::new(name, help))
    }

    fn float_gauge(&self, name: &str, help: &str) -> Gauge {
        self.add(Gauge::new(name, help))
    }

    fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.add(IntGaugeVec::new(Opts::new(name, help), labels))
    }

    /// A latency histogram over `LATENCY_BUCKETS_S`.
    fn latency(&self, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
        let opts = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS_S.to_vec());
        self.add(HistogramVec::new(opts, labels))
    }
}

/// How full the transfer admission's places and the queue are, at one moment.
#[derive(Debug, Clone, Copy)]
pub struct Occupancy {
    pub running: u32,
    pub waiting: u32,
    pub running_max: u32,
    pub waiting_max: u32,
}
