//! Outcome counts with latency percentiles, as a table and as JSON.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::client::Sample;

#[derive(Debug, Serialize)]
pub struct OutcomeRow {
    pub layer: String,
    pub outcome: String,
    pub status: u16,
    pub count: u64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

#[derive(Debug, Serialize)]
pub struct Summary {
    pub requests: u64,
    pub elapsed_s: f64,
    pub requests_per_s: f64,
    /// New transfers (2xx, not replays) per second.
    pub accepted_per_s: f64,
    pub cooldown_rejections_per_s: f64,
    pub replays_per_s: f64,
    pub transport_errors: u64,
    /// Every request's whole time, retries and their waits included.
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Attempts sent, retries included: as many as `requests` when the run
    /// does not retry.
    pub attempts: u64,
    /// Attempts answered 409 (a key in flight, a version conflict).
    pub conflict_answers: u64,
    /// Attempts answered 5xx.
    pub server_error_answers: u64,
    /// Requests whose last attempt got no answer, or an answer worth
    /// retrying (409, 429, 503): out of attempts, or never retried.
    pub gave_up: u64,
    pub outcomes: Vec<OutcomeRow>,
}

pub fn new_histogram() -> Histogram<u64> {
    // Microseconds from 1 µs to 60 s at three significant digits; these
    // bounds are constants, so creation cannot fail.
    Histogram::new_with_bounds(1, 60_000_000, 3)
        .unwrap_or_else(|_| Histogram::new(3).unwrap_or_else(|_| unreachable!()))
}

pub fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

pub fn summarize(samples: &[Sample], elapsed: Duration) -> Summary {
    let mut groups: BTreeMap<(String, String, u16), Histogram<u64>> = BTreeMap::new();
    let mut every_request = new_histogram();
    let mut transport_errors = 0;
    for sample in samples {
        let micros = u64::try_from(sample.latency.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        let _ = every_request.record(micros);
        if sample.transport_error {
            transport_errors += 1;
            continue;
        }
        let (layer, outcome) = match sample.decision {
            Some(decision) => (decision.layer.to_string(), decision.outcome.to_string()),
            None => ("-".to_owned(), "-".to_owned()),
        };
        let _ = groups
            .entry((layer, outcome, sample.status))
            .or_insert_with(new_histogram)
            .record(micros);
    }
    let outcomes: Vec<OutcomeRow> = groups
        .into_iter()
        .map(|((layer, outcome, status), histogram)| OutcomeRow {
            layer,
            outcome,
            status,
            count: histogram.len(),
            p50_ms: ms(histogram.value_at_quantile(0.50)),
            p90_ms: ms(histogram.value_at_quantile(0.90)),
            p99_ms: ms(histogram.value_at_quantile(0.99)),
            max_ms: ms(histogram.max()),
        })
        .collect();
    let seconds = elapsed.as_secs_f64().max(1e-9);
    let count = |f: &dyn Fn(&OutcomeRow) -> bool| {
        outcomes
            .iter()
            .filter(|row| f(row))
            .map(|row| row.count)
            .sum::<u64>()
    };
    let accepted =
        count(&|row| row.layer != "-" && (200..300).contains(&row.status) && row.outcome != "replayed");
    let cooldown = count(&|row| row.layer == "cooldown" && row.outcome == "rejected");
    let replays = count(&|row| row.outcome == "replayed");
    let attempts_answered = |f: &dyn Fn(u16) -> bool| {
        samples
            .iter()
            .flat_map(|sample| &sample.attempts)
            .filter(|attempt| f(attempt.status))
            .count() as u64
    };
    Summary {
        requests: samples.len() as u64,
        elapsed_s: seconds,
        requests_per_s: samples.len() as f64 / seconds,
        accepted_per_s: accepted as f64 / seconds,
        cooldown_rejections_per_s: cooldown as f64 / seconds,
        replays_per_s: replays as f64 / seconds,
        transport_errors,
        p50_ms: ms(every_request.value_at_quantile(0.50)),
        p99_ms: ms(every_request.value_at_quantile(0.99)),
        attempts: attempts_answered(&|_| true),
        conflict_answers: attempts_answered(&|status| status == 409),
        server_error_answers: attempts_answered(&|status| status >= 500),
        gave_up: samples
            .iter()
            .filter(|sample| sample.transport_error || wallet_client::may_succeed_later(sample.status))
            .count() as u64,
        outcomes,
    }
}

pub fn print_table(scenario: &str, summary: &Summary) {
    println!();
    println!(
        "{scenario}: {} requests in {:.2} s ({:.0}/s); accepted {:.0}/s, cooldown rejections {:.0}/s, replays {:.0}/s",
        summary.requests,
        summary.elapsed_s,
        summary.requests_per_s,
        summary.accepted_per_s,
        summary.cooldown_rejections_per_s,
        summary.replays_per_s
    );
    println!(
        "{:<12} {:<19} {:>6} {:>8} {:>9} {:>9} {:>9} {:>9}",
        "layer", "outcome", "status", "count", "p50 ms", "p90 ms", "p99 ms", "max ms"
    );
    for row in &summary.outcomes {
        println!(
            "{:<12} {:<19} {:>6} {:>8} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
            row.layer, row.outcome, row.status, row.count, row.p50_ms, row.p90_ms, row.p99_ms, row.max_ms
        );
    }
    if summary.transport_errors > 0 {
        println!("transport errors: {}", summary.transport_errors);
    }
}
