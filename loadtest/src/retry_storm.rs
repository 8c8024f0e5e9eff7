//! `retry-storm`: every client has a payment in flight when the database
//! goes down, and every client retries as the client library does, with
//! one key per payment. Whether they come back spread out or all at once
//! once the database is back is up to the retries' jitter: without it,
//! clients that failed together wait exactly as long and return together,
//! and those the instance sheds return together again.
//!
//! The outage is the caller's: `--outage-begin` and `--outage-end` are
//! shell commands (`pg_ctl stop`, `pg_ctl start`), run `--outage-s` apart.
//! With `--keep-paying-s`, each client goes on paying (a new key per
//! payment) that long after the database is back, so that what comes back
//! is more than the instance sustains, and its goodput under the returning
//! crowd can be measured against its sustainable rate.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::future::join_all;
use indicatif::ProgressBar;
use serde::Serialize;
use tokio::sync::Barrier;

use crate::client::{Api, Planned, Sample, User};
use crate::report::{self, ms};
use crate::scenarios::Shape;

/// The commands that take the database down and bring it back.
pub struct Outage {
    pub begin: String,
    pub end: String,
    pub length: Duration,
    /// How long clients go on paying after the database is back.
    pub keep_paying: Duration,
}

/// When the database went down and came back, by the load test's clock.
pub struct OutageClock {
    pub began: Instant,
    pub ended: Instant,
}

/// Takes the database down, fires one payment per client at once, brings
/// the database back after the outage's length, and waits until every
/// call has ended (paid, or out of attempts or time). With `keep_paying`,
/// each client starts its next payment as soon as one ends, until that
/// long after the database is back: clients with money to move, not only
/// the one payment the outage caught.
pub async fn run(
    api: &Api,
    users: &Arc<Vec<User>>,
    shape: &Shape,
    outage: &Outage,
    bar: &ProgressBar,
) -> anyhow::Result<(Vec<Sample>, OutageClock)> {
    shell(&outage.begin).await?;
    let began = Instant::now();
    let back: Arc<OnceLock<Instant>> = Arc::default();
    let end = {
        let (command, length, back) = (outage.end.clone(), outage.length, back.clone());
        tokio::spawn(async move {
            tokio::time::sleep(length).await;
            shell(&command).await?;
            let ended = Instant::now();
            let _ = back.set(ended);
            anyhow::Ok(ended)
        })
    };
    let count = users.len();
    let barrier = Arc::new(Barrier::new(shape.concurrency));
    let keep_paying = outage.keep_paying;
    let clients = (0..shape.concurrency).map(|client| {
        let plan = Planned {
            target: client % api.targets.len(),
            from: client % count,
            to_wallet: users[(client + 1) % count].wallet_id,
            amount_minor: shape.amount_minor,
            key: None,
        };
        let (api, users, barrier, back, bar) = (
            api.clone(),
            users.clone(),
            barrier.clone(),
            back.clone(),
            bar.clone(),
        );
        tokio::spawn(async move {
            barrier.wait().await;
            let mut samples = Vec::new();
            loop {
                let planned = Planned {
                    key: Some(uuid::Uuid::new_v4().to_string()),
                    ..plan.clone()
                };
                samples.push(api.transfer(&users, &planned).await);
                bar.inc(1);
                // A call that gave up while the database was still down is
                // followed by the next one only when the client goes on paying.
                let go_on = match back.get() {
                    Some(back) => back.elapsed() < keep_paying,
                    None => !keep_paying.is_zero(),
                };
                if !go_on {
                    return samples;
                }
            }
        })
    });
    let samples = join_all(clients)
        .await
        .into_iter()
        .filter_map(Result::ok)
        .flatten()
        .collect();
    let ended = end.await.context("the outage's end")??;
    Ok((samples, OutageClock { began, ended }))
}

async fn shell(command: &str) -> anyhow::Result<()> {
    let owned = command.to_owned();
    let status =
        tokio::task::spawn_blocking(move || std::process::Command::new("sh").arg("-c").arg(owned).status())
            .await
            .context("the command's thread")?
            .with_context(|| format!("could not run `{command}`"))?;
    anyhow::ensure!(status.success(), "`{command}` failed with {status}");
    Ok(())
}

/// How the load came back.
#[derive(Debug, Serialize)]
pub struct Recovery {
    /// Calls made: one per client, more when the clients went on paying.
    pub calls: usize,
    /// From the database going down to its being back, as measured.
    pub outage_s: f64,
    /// Calls that ended paid (201 or a replay of it).
    pub paid: u64,
    /// Calls that ended without paying: out of attempts or out of time.
    pub gave_up: u64,
    /// From the database's return to the first and the last payment.
    pub first_paid_after_s: Option<f64>,
    pub last_paid_after_s: Option<f64>,
    /// The paying attempt's own time, not the call's (which includes the
    /// outage and the waits).
    pub paying_attempt_p99_ms: f64,
    pub paying_attempt_max_ms: f64,
    /// The attempts that ended after the database was back, in all.
    pub after_return: Second,
    /// With clients that go on paying: how long they did, after the
    /// database was back, and the payments made per second in that time,
    /// the first second of reconnecting included.
    pub keep_paying_s: f64,
    pub paid_per_s_while_paying: Option<f64>,
    /// Per second from the database going down: what the attempts that
    /// ended in that second were answered.
    pub seconds: Vec<Second>,
}

#[derive(Debug, Default, Serialize)]
pub struct Second {
    pub attempts: u64,
    pub paid: u64,
    /// 503 `/problems/overloaded`: refused at once by a full instance.
    pub overloaded: u64,
    /// Any other answer, or none (the database down, a timeout).
    pub other: u64,
}

impl Second {
    fn count(&mut self, paid: bool, overloaded: bool) {
        self.attempts += 1;
        match (paid, overloaded) {
            (true, _) => self.paid += 1,
            (false, true) => self.overloaded += 1,
            (false, false) => self.other += 1,
        }
    }
}

pub fn recovery(samples: &[Sample], clock: &OutageClock, keep_paying_s: f64) -> Recovery {
    let since_down = |at: Instant| at.saturating_duration_since(clock.began);
    let since_back = |at: Instant| at.saturating_duration_since(clock.ended).as_secs_f64();
    let mut seconds: Vec<Second> = Vec::new();
    let mut paying = report::new_histogram();
    let mut after_return = Second::default();
    let mut paid_at: Vec<Instant> = Vec::new();
    for attempt in samples.iter().flat_map(|sample| &sample.attempts) {
        let second = since_down(attempt.ended).as_secs() as usize;
        if seconds.len() <= second {
            seconds.resize_with(second + 1, Second::default);
        }
        let paid = (200..300).contains(&attempt.status);
        if paid {
            paid_at.push(attempt.ended);
            let micros = u64::try_from(attempt.took.as_micros()).unwrap_or(u64::MAX).max(1);
            let _ = paying.record(micros);
        }
        seconds[second].count(paid, attempt.overloaded());
        if attempt.ended > clock.ended {
            after_return.count(paid, attempt.overloaded());
        }
    }
    let paid = samples.iter().filter(|s| (200..300).contains(&s.status)).count() as u64;
    let paid_per_s_while_paying = (keep_paying_s > 0.0).then(|| {
        let while_paying = paid_at
            .iter()
            .filter(|at| **at > clock.ended && since_back(**at) <= keep_paying_s)
            .count();
        while_paying as f64 / keep_paying_s
    });
    Recovery {
        calls: samples.len(),
        outage_s: clock.ended.saturating_duration_since(clock.began).as_secs_f64(),
        paid,
        gave_up: samples.len() as u64 - paid,
        first_paid_after_s: paid_at.iter().min().map(|at| since_back(*at)),
        last_paid_after_s: paid_at.iter().max().map(|at| since_back(*at)),
        paying_attempt_p99_ms: ms(paying.value_at_quantile(0.99)),
        paying_attempt_max_ms: ms(paying.max()),
        after_return,
        keep_paying_s,
        paid_per_s_while_paying,
        seconds,
    }
}
