//! The scenarios: how requests are planned and fired.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use indicatif::{ProgressBar, ProgressStyle};
use rand::Rng;
use tokio::sync::Barrier;
use uuid::Uuid;

use crate::client::{Api, Planned, Sample, User};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// M concurrent copies of one request with one key, per round.
    Storm,
    /// M concurrent copies of one request, a new key on every copy.
    BuggyClient,
    /// M concurrent copies of one request without a key (double clicks).
    NoKey,
    /// M distinct transfers (own keys) at once against one balance.
    Overdraw,
    /// A→B and B→A transfers at once.
    Cross,
    /// A keyed transfer, then a retry after the cooldown window: a replay.
    LateRetry,
    /// Many users making distinct legitimate transfers for a fixed time.
    Throughput,
    /// Throughput with a share of duplicated and keyless requests.
    Mixed,
    /// Every user pays into one wallet: contention on one row.
    HotWallet,
    /// One wallet pays every other user at once: contention on the row
    /// whose balance is checked.
    HotPayer,
    /// Each worker repeats one keyed request: after the first, replays.
    Replay,
    /// `GET /healthz`: the HTTP ceiling of the same server and client.
    Healthz,
    /// `--concurrency` clients each send one payment while the database is
    /// down (`--outage-begin`, `--outage-end`), and retry until it is back.
    RetryStorm,
}

impl Scenario {
    /// The name on the command line, e.g. `buggy-client`.
    pub fn name(self) -> String {
        use clap::ValueEnum;
        self.to_possible_value()
            .map(|value| value.get_name().to_owned())
            .unwrap_or_default()
    }

    /// Users the scenario needs, given the options.
    pub fn users_needed(self, options: &Shape) -> usize {
        match self {
            Scenario::Healthz => 0,
            Scenario::Throughput
            | Scenario::Mixed
            | Scenario::HotWallet
            | Scenario::HotPayer
            | Scenario::Replay
            | Scenario::RetryStorm => options.users.max(2),
            _ => 2 * options.rounds,
        }
    }

    /// A scenario whose requests are fired in simultaneous waves.
    pub fn is_burst(self) -> bool {
        !matches!(
            self,
            Scenario::Throughput
                | Scenario::Mixed
                | Scenario::HotWallet
                | Scenario::HotPayer
                | Scenario::Replay
                | Scenario::Healthz
        )
    }
}

/// The knobs of a run.
#[derive(Debug, Clone)]
pub struct Shape {
    pub rounds: usize,
    pub copies: usize,
    pub users: usize,
    pub concurrency: usize,
    pub duration: Duration,
    pub rate_per_s: Option<f64>,
    pub duplicate_ratio: f64,
    pub retry_after: Duration,
    pub amount_minor: i64,
}

pub fn progress(total: Option<u64>, hidden: bool) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    let bar = match total {
        Some(total) => ProgressBar::new(total),
        None => ProgressBar::new_spinner(),
    };
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} {per_sec} {msg}")
    {
        bar.set_style(style);
    }
    bar
}

fn key() -> Option<String> {
    Some(Uuid::new_v4().to_string())
}

/// Fires every request of a wave at the same moment.
pub(crate) async fn fire_wave(
    api: &Api,
    users: &Arc<Vec<User>>,
    wave: Vec<Planned>,
    bar: &ProgressBar,
) -> Vec<Sample> {
    let barrier = Arc::new(Barrier::new(wave.len()));
    let tasks = wave.into_iter().map(|planned| {
        let (api, users, barrier, bar) = (api.clone(), users.clone(), barrier.clone(), bar.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            let sample = api.transfer(&users, &planned).await;
            bar.inc(1);
            sample
        })
    });
    join_all(tasks).await.into_iter().filter_map(Result::ok).collect()
}

/// The waves of a burst scenario: round r uses users 2r and 2r+1, and
/// copies are spread round-robin across the targets.
pub async fn run_burst(
    scenario: Scenario,
    api: &Api,
    users: &Arc<Vec<User>>,
    shape: &Shape,
    bar: &ProgressBar,
) -> Vec<Sample> {
    let targets = api.targets.len();
    let mut samples = Vec::new();
    for round in 0..shape.rounds {
        let (a, b) = (2 * round, 2 * round + 1);
        let to_b = users[b].wallet_id;
        let shared_key = key();
        let plan = |copy: usize, from: usize, to_wallet: Uuid, key: Option<String>| Planned {
            target: (copy + round) % targets,
            from,
            to_wallet,
            amount_minor: shape.amount_minor,
            key,
        };
        let wave: Vec<Planned> = match scenario {
            Scenario::Storm => (0..shape.copies)
                .map(|c| plan(c, a, to_b, shared_key.clone()))
                .collect(),
            Scenario::BuggyClient | Scenario::Overdraw => {
                (0..shape.copies).map(|c| plan(c, a, to_b, key())).collect()
            }
            Scenario::NoKey => (0..shape.copies).map(|c| plan(c, a, to_b, None)).collect(),
            Scenario::Cross => (0..shape.copies)
                .map(|c| {
                    if c % 2 == 0 {
                        plan(c, a, to_b, key())
                    } else {
                        plan(c, b, users[a].wallet_id, key())
                    }
                })
                .collect(),
            Scenario::LateRetry => {
                let first = plan(0, a, to_b, shared_key.clone());
                samples.extend(fire_wave(api, users, vec![first], bar).await);
                tokio::time::sleep(shape.retry_after).await;
                // One retry, on another instance: the window has passed,
                // so only the key can answer it.
                vec![plan(1, a, to_b, shared_key.clone())]
            }
            _ => unreachable!("not a burst scenario"),
        };
        samples.extend(fire_wave(api, users, wave, bar).await);
    }
    samples
}

/// Closed loop (each worker sends its next request when the last one is
/// answered) or open loop (`rate_per_s` requests started per second,
/// whatever the answers) for `shape.duration`.
pub async fn run_for_duration(
    scenario: Scenario,
    api: &Api,
    users: &Arc<Vec<User>>,
    shape: &Shape,
    bar: &ProgressBar,
) -> Vec<Sample> {
    let deadline = Instant::now() + shape.duration;
    // Shared, not cloned per operation: an `Api` holds a client per target.
    let one = {
        let (api, users, shape) = (Arc::new(api.clone()), users.clone(), shape.clone());
        move |n: usize| {
            let (api, users, shape) = (api.clone(), users.clone(), shape.clone());
            async move { one_operation(scenario, &api, &users, &shape, n).await }
        }
    };
    if let Some(rate) = shape.rate_per_s {
        let interval = Duration::from_secs_f64(1.0 / rate.max(0.001));
        let mut ticker = tokio::time::interval(interval);
        let mut tasks = Vec::new();
        let mut n = 0;
        while Instant::now() < deadline {
            ticker.tick().await;
            let (one, bar) = (one.clone(), bar.clone());
            tasks.push(tokio::spawn(async move {
                let samples = one(n).await;
                bar.inc(samples.len() as u64);
                samples
            }));
            n += 1;
        }
        return join_all(tasks)
            .await
            .into_iter()
            .filter_map(Result::ok)
            .flatten()
            .collect();
    }
    let workers = (0..shape.concurrency).map(|worker| {
        let (one, bar, concurrency) = (one.clone(), bar.clone(), shape.concurrency);
        tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut n = worker;
            while Instant::now() < deadline {
                let batch = one(n).await;
                bar.inc(batch.len() as u64);
                samples.extend(batch);
                n += concurrency;
            }
            samples
        })
    });
    join_all(workers)
        .await
        .into_iter()
        .filter_map(Result::ok)
        .flatten()
        .collect()
}

/// Operation number `n` of a duration scenario. A sender is always the same
/// worker's user, so one user's transfers never overlap in closed loop,
/// except in `hot-payer`, where they are meant to.
async fn one_operation(
    scenario: Scenario,
    api: &Api,
    users: &Arc<Vec<User>>,
    shape: &Shape,
    n: usize,
) -> Vec<Sample> {
    let target = n % api.targets.len();
    if scenario == Scenario::Healthz {
        return vec![api.healthz(target).await];
    }
    let count = users.len();
    let (from, to) = match scenario {
        Scenario::HotWallet => (1 + n % (count - 1), 0),
        Scenario::HotPayer => (0, 1 + n % (count - 1)),
        _ => {
            let from = n % count;
            let offset = 1 + rand::thread_rng().gen_range(0..count - 1);
            (from, (from + offset) % count)
        }
    };
    // Replay: one key per sender, so every request after its first is a
    // replay; the Uuid is derived from the run's own user id.
    let (to, key) = match scenario {
        Scenario::Replay => (
            (from + 1) % count,
            Some(Uuid::from_u128(users[from].user_id.as_u128() ^ 1).to_string()),
        ),
        _ => (to, key()),
    };
    let planned = Planned {
        target,
        from,
        to_wallet: users[to].wallet_id,
        amount_minor: 1,
        key,
    };
    if scenario != Scenario::Mixed {
        return vec![api.transfer(users, &planned).await];
    }
    let roll: f64 = rand::thread_rng().r#gen();
    if roll < shape.duplicate_ratio {
        // A retrying client: the same request and key, twice, at once,
        // on different instances.
        let copy = Planned {
            target: (target + 1) % api.targets.len(),
            ..planned.clone()
        };
        let (first, second) = futures::join!(api.transfer(users, &planned), api.transfer(users, &copy));
        vec![first, second]
    } else if roll < shape.duplicate_ratio + 0.1 {
        vec![api.transfer(users, &Planned { key: None, ..planned }).await]
    } else {
        vec![api.transfer(users, &planned).await]
    }
}
