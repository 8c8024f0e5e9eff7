//! `wallet-loadtest`: proves Layered Wallet's invariants under real
//! concurrency, across instances, and measures its speed.
//!
//! Each run signs up its own users through the API, runs one scenario
//! against one or more instances (`--target`, repeatable), counts outcomes
//! by the `Defense-Decision` header with latency percentiles, and, given
//! `--database-url`, checks the invariants on the database (read-only).
//! A violation is reported and makes the exit status non-zero, or, with
//! `--expect-violations`, its absence does.

pub mod client;
pub mod closed_loop;
pub mod commands;
pub mod costs;
pub mod demo;
pub mod deposits;
pub mod invariants;
pub mod payouts;
pub mod pg_wire;
pub mod report;
pub mod retry_storm;
pub mod scenarios;
pub mod variants;
pub mod wire;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use futures::StreamExt;
use serde::Serialize;
use sqlx::postgres::PgPoolOptions;

use client::{Api, User};
use scenarios::{Scenario, Shape};
use wallet_client::RetryPolicy;

#[derive(Args, Clone)]
pub struct RunArgs {
    #[arg(value_enum)]
    pub scenario: Scenario,
    /// Base URL of an instance; repeat to spread requests across several.
    #[arg(long = "target", default_value = "http://127.0.0.1:8080")]
    pub targets: Vec<String>,
    /// Check the invariants on this database at the end (read-only).
    #[arg(long, env = "LOADTEST_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Burst scenarios: rounds, each with a fresh pair of users.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Burst scenarios: simultaneous requests per round.
    #[arg(long, default_value_t = 50)]
    pub copies: usize,
    /// Duration scenarios: users to spread the transfers over.
    #[arg(long, default_value_t = 64)]
    pub users: usize,
    /// Duration scenarios: closed-loop workers.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Duration scenarios: how long to run.
    #[arg(long, default_value_t = 10.0)]
    pub duration_s: f64,
    /// Duration scenarios: open loop at this many operations per second
    /// instead of closed loop.
    #[arg(long)]
    pub rate_per_s: Option<f64>,
    /// `mixed`: share of operations sent twice at once with one key.
    #[arg(long, default_value_t = 0.2)]
    pub duplicate_ratio: f64,
    /// `late-retry`: wait before retrying; must exceed the cooldown TTL.
    #[arg(long, default_value_t = 5_500)]
    pub retry_after_ms: u64,
    /// Amount of each transfer (`overdraw` defaults to a tenth of the grant).
    #[arg(long)]
    pub amount_minor: Option<i64>,
    /// The servers' `signup_grant_minor`.
    #[arg(long, default_value_t = 100_000)]
    pub signup_grant_minor: i64,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Succeed only if an invariant was violated (to demonstrate an unsafe
    /// configuration).
    #[arg(long)]
    pub expect_violations: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Measure this server process's CPU time over the run (repeatable).
    #[arg(long = "server-pid")]
    pub server_pids: Vec<u32>,
    /// Count Redis's commands over the run (`INFO commandstats`).
    #[arg(long)]
    pub redis_url: Option<String>,
    /// Count the server's Redis round trips over the run (its admin
    /// `/metrics`).
    #[arg(long)]
    pub metrics_url: Option<String>,
    /// Count the server's PostgreSQL round trips over the run, on the wire:
    /// the counts `wallet-loadtest pg-wire` serves at this URL.
    #[arg(long)]
    pub pg_wire_url: Option<String>,
    /// With the cost probes: pause this long before each sample, so that
    /// PostgreSQL's statistics have been flushed.
    #[arg(long, default_value_t = 0)]
    pub settle_ms: u64,
    /// Count the transaction ids PostgreSQL hands out over the run: one per
    /// transaction that writes, and one per subtransaction that writes.
    /// Read from `--database-url` at once, without waiting for statistics;
    /// server-wide, so run it where nothing else writes.
    #[arg(long)]
    pub count_transaction_ids: bool,
    /// Attempts per request: 1 sends each once; more retries as the client
    /// library does (409, 429 and 503, with backoff and full jitter) and
    /// counts every attempt.
    #[arg(long, default_value_t = 1)]
    pub attempts_max: u32,
    /// With retries: how long one call may take in all, attempts and waits.
    #[arg(long, default_value_t = 60.0)]
    pub call_time_max_s: f64,
    /// With retries: wait each backoff's whole ceiling instead of a random
    /// part of it, to show what the jitter is for.
    #[arg(long)]
    pub no_jitter: bool,
    /// `retry-storm`: the shell command that takes the database down.
    #[arg(long)]
    pub outage_begin: Option<String>,
    /// `retry-storm`: the shell command that brings it back.
    #[arg(long)]
    pub outage_end: Option<String>,
    /// `retry-storm`: how long the database stays down.
    #[arg(long, default_value_t = 10.0)]
    pub outage_s: f64,
    /// `retry-storm`: how long each client goes on paying once the
    /// database is back, starting its next payment (a new key) as soon as
    /// one ends. 0: one payment per client.
    #[arg(long, default_value_t = 0.0)]
    pub keep_paying_s: f64,
}

impl RunArgs {
    /// A run of `scenario` against `targets` with the command line's
    /// defaults, quiet and in JSON, checking invariants on `database_url`.
    pub fn new(scenario: Scenario, targets: Vec<String>, database_url: Option<String>) -> Self {
        Self {
            scenario,
            targets,
            database_url,
            rounds: 5,
            copies: 50,
            users: 64,
            concurrency: 32,
            duration_s: 10.0,
            rate_per_s: None,
            duplicate_ratio: 0.2,
            retry_after_ms: 5_500,
            amount_minor: None,
            signup_grant_minor: 100_000,
            json: true,
            expect_violations: false,
            quiet: true,
            server_pids: Vec::new(),
            redis_url: None,
            metrics_url: None,
            pg_wire_url: None,
            settle_ms: 0,
            count_transaction_ids: false,
            attempts_max: 1,
            call_time_max_s: 60.0,
            no_jitter: false,
            outage_begin: None,
            outage_end: None,
            outage_s: 10.0,
            keep_paying_s: 0.0,
        }
    }
}

#[derive(Serialize)]
pub struct RunReport {
    pub scenario: Scenario,
    pub targets: Vec<String>,
    #[serde(flatten)]
    pub summary: report::Summary,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invariants: Option<invariants::Findings>,
    /// What the run cost the server, when probes were given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub costs: Option<costs::Costs>,
    /// `retry-storm`: how the load came back after the outage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery: Option<retry_storm::Recovery>,
    /// Every request's sample, for a caller that sums several runs.
    #[serde(skip)]
    pub samples: Vec<client::Sample>,
}

pub fn print_findings(findings: Option<&invariants::Findings>) {
    match findings {
        None => println!("invariants: not checked (no --database-url)"),
        Some(findings) if findings.violations.is_empty() => println!(
            "invariants: all held ({} accepted responses = {} new transfers; money conserved; no negative balance; \
             every balance matches its ledger; no key paid twice; every replay identical)",
            findings.accepted_responses, findings.new_transfers
        ),
        Some(findings) => {
            println!("INVARIANTS VIOLATED:");
            for violation in &findings.violations {
                println!("  - {violation}");
            }
        }
    }
}

/// True when the run ended as it should.
pub fn verdict(findings: Option<&invariants::Findings>, expect_violations: bool) -> bool {
    let violated = findings.is_some_and(|f| !f.violations.is_empty());
    if expect_violations {
        if findings.is_none() {
            eprintln!("--expect-violations needs --database-url");
            return false;
        }
        if !violated {
            eprintln!("expected violations, found none");
        }
        violated
    } else {
        !violated
    }
}

pub async fn run(args: &RunArgs) -> anyhow::Result<RunReport> {
    let shape = Shape {
        rounds: args.rounds.max(1),
        copies: args.copies.max(1),
        users: args.users,
        concurrency: args.concurrency.max(1),
        duration: Duration::from_secs_f64(args.duration_s.max(0.1)),
        rate_per_s: args.rate_per_s,
        duplicate_ratio: args.duplicate_ratio.clamp(0.0, 0.9),
        retry_after: Duration::from_millis(args.retry_after_ms),
        amount_minor: args.amount_minor.unwrap_or(match args.scenario {
            Scenario::Overdraw => (args.signup_grant_minor / 10).max(1),
            _ => 100,
        }),
    };
    let policy = RetryPolicy {
        attempts_max: args.attempts_max,
        call_time_max: Duration::from_secs_f64(args.call_time_max_s.max(0.1)),
        jitter: !args.no_jitter,
        ..RetryPolicy::default()
    };
    let api = Api::new(
        args.targets.clone(),
        shape.concurrency.max(shape.copies) * 2,
        policy,
    )?;
    let users = Arc::new(sign_up_users(&api, args.scenario.users_needed(&shape), args.quiet).await?);

    let bar = scenarios::progress(
        args.scenario.is_burst().then(|| {
            let per_round = if args.scenario == Scenario::LateRetry {
                2
            } else {
                shape.copies
            };
            (shape.rounds * per_round) as u64
        }),
        args.quiet || args.json,
    );
    let probes = costs::Probes {
        server_pids: args.server_pids.clone(),
        redis_url: args.redis_url.clone(),
        metrics_url: args.metrics_url.clone(),
        pg_wire_url: args.pg_wire_url.clone(),
        database_url: args.database_url.clone(),
        count_transaction_ids: args.count_transaction_ids,
        settle: Duration::from_millis(args.settle_ms),
    };
    let before = match probes.any() {
        true => Some(probes.sample().await?),
        false => None,
    };
    let started = Instant::now();
    let mut clock = None;
    let samples = if args.scenario == Scenario::RetryStorm {
        let outage = retry_storm::Outage {
            begin: args
                .outage_begin
                .clone()
                .context("retry-storm needs --outage-begin")?,
            end: args
                .outage_end
                .clone()
                .context("retry-storm needs --outage-end")?,
            length: Duration::from_secs_f64(args.outage_s.max(0.0)),
            keep_paying: Duration::from_secs_f64(args.keep_paying_s.max(0.0)),
        };
        let (samples, outage_clock) = retry_storm::run(&api, &users, &shape, &outage, &bar).await?;
        clock = Some(outage_clock);
        samples
    } else if args.scenario.is_burst() {
        scenarios::run_burst(args.scenario, &api, &users, &shape, &bar).await
    } else {
        scenarios::run_for_duration(args.scenario, &api, &users, &shape, &bar).await
    };
    let elapsed = started.elapsed();
    bar.finish_and_clear();

    let summary = report::summarize(&samples, elapsed);
    let costs = match before {
        Some(before) => {
            let after = probes.sample().await?;
            let accepted = samples
                .iter()
                .filter(|s| (200..300).contains(&s.status) && !s.replayed)
                .count() as u64;
            Some(costs::Costs::between(&before, &after, accepted))
        }
        None => None,
    };
    let invariants = match &args.database_url {
        Some(url) if args.scenario != Scenario::Healthz => {
            let db = PgPoolOptions::new()
                .max_connections(2)
                .connect(url)
                .await
                .context("failed to connect to --database-url")?;
            let ids: Vec<uuid::Uuid> = users.iter().map(|user| user.user_id).collect();
            let mut findings = invariants::check(&db, &ids, &samples).await?;
            if args.scenario == Scenario::LateRetry {
                late_retry_check(&samples, shape.rounds, &mut findings);
            }
            Some(findings)
        }
        _ => None,
    };
    Ok(RunReport {
        scenario: args.scenario,
        targets: args.targets.clone(),
        summary,
        invariants,
        costs,
        recovery: clock.map(|clock| retry_storm::recovery(&samples, &clock, args.keep_paying_s.max(0.0))),
        samples,
    })
}

/// `late-retry`: every retry after the window must be a replay.
fn late_retry_check(samples: &[client::Sample], rounds: usize, findings: &mut invariants::Findings) {
    let not_replayed = samples
        .iter()
        .filter(|s| !s.replayed)
        .count()
        .saturating_sub(rounds);
    if not_replayed > 0 {
        findings
            .violations
            .push(format!("{not_replayed} late retries were not replays"));
    }
}

/// Signs up `count` fresh users, spread across the targets.
pub async fn sign_up_users(api: &Api, count: usize, quiet: bool) -> anyhow::Result<Vec<User>> {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let bar = scenarios::progress(Some(count as u64), quiet);
    bar.set_message("signing up users");
    let results: Vec<anyhow::Result<User>> = futures::stream::iter(0..count)
        .map(|i| {
            let (api, name, bar) = (api.clone(), format!("lt-{}-{i}", &run[..10]), bar.clone());
            async move {
                let user = api
                    .sign_up(i % api.targets.len(), &name, "load-test-password")
                    .await;
                bar.inc(1);
                user
            }
        })
        .buffered(8)
        .collect()
        .await;
    bar.finish_and_clear();
    results.into_iter().collect()
}
