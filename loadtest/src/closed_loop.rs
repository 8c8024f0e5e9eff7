//! Closed-loop workers for the entry points measured beside transfers
//! (payouts, deposits), and what their answers add up to. Each worker sends
//! one request, waits for its answer, and sends the next, until the
//! duration is over.

use std::future::Future;
use std::time::{Duration, Instant};

use serde::Serialize;
use wallet_client::RetryPolicy;

use crate::client::{Api, User};
use crate::report;

/// Connections to each target while the run's accounts sign up.
const SIGN_UP_CONNECTIONS_PER_HOST: usize = 8;

/// The shape of a closed-loop run: the accounts it sends as, how many
/// workers, for how long.
#[derive(clap::Args, Clone, Debug)]
pub struct Load {
    /// Accounts to spread the requests over.
    #[arg(long, default_value_t = 64)]
    pub users: usize,
    /// Closed-loop workers.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    #[arg(long, default_value_t = 10.0)]
    pub duration_s: f64,
}

impl Load {
    pub fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.duration_s)
    }
}

/// What the workers saw: the answers with `success` status, per second and
/// with their latency, and every other answer by status (0: no answer).
#[derive(Debug, Serialize)]
pub struct Tally {
    pub succeeded: u64,
    pub per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub other_answers: Vec<(u16, u64)>,
}

/// Runs `concurrency` workers for `duration`; request `n` is
/// `send(n)`, which answers the status it got (0 for none).
pub async fn run<SendOne, Answer>(
    concurrency: usize,
    duration: Duration,
    success: u16,
    send: SendOne,
) -> anyhow::Result<Tally>
where
    SendOne: Fn(usize) -> Answer + Clone + Send + 'static,
    Answer: Future<Output = u16> + Send,
{
    let started = Instant::now();
    let workers = (0..concurrency.max(1)).map(|worker| {
        let send = send.clone();
        tokio::spawn(async move {
            let mut answers: Vec<(u16, Duration)> = Vec::new();
            let mut n = worker;
            while started.elapsed() < duration {
                let sent = Instant::now();
                let status = send(n).await;
                answers.push((status, sent.elapsed()));
                n += concurrency.max(1);
            }
            answers
        })
    });
    let mut answers = Vec::new();
    for worker in futures::future::join_all(workers).await {
        answers.extend(worker?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut latencies = report::new_histogram();
    let mut other_answers: Vec<(u16, u64)> = Vec::new();
    for (status, took) in &answers {
        if *status == success {
            let _ = latencies.record(u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1));
            continue;
        }
        match other_answers.iter_mut().find(|(seen, _)| seen == status) {
            Some((_, count)) => *count += 1,
            None => other_answers.push((*status, 1)),
        }
    }
    other_answers.sort();
    Ok(Tally {
        succeeded: latencies.len(),
        per_s: latencies.len() as f64 / elapsed,
        p50_ms: report::ms(latencies.value_at_quantile(0.50)),
        p99_ms: report::ms(latencies.value_at_quantile(0.99)),
        other_answers,
    })
}

/// Signs `users` people up, spread across `targets`.
pub async fn sign_up(targets: &[String], users: usize) -> anyhow::Result<Vec<User>> {
    // A sign-up is sent once: a failed one fails the run.
    let one_attempt = RetryPolicy {
        attempts_max: 1,
        ..RetryPolicy::default()
    };
    let api = Api::new(targets.to_vec(), SIGN_UP_CONNECTIONS_PER_HOST, one_attempt)?;
    crate::sign_up_users(&api, users.max(1), true).await
}
