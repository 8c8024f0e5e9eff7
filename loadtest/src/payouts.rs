//! `wallet-loadtest payouts`: how fast payouts are accepted, how fast the
//! dispatchers send them, and how fast the gateway alone takes payouts,
//! in one run.
//!
//! 1. **Accepted**: closed-loop workers `POST /api/v1/payouts` with a new
//!    key each, spread over the users, for the duration: 202s per second
//!    and their latency.
//! 2. **Dispatched**: from the first acceptance until the outbox has sent
//!    every one of them (settled or refused): payouts per second, the
//!    dispatchers' sustained rate while they had a backlog.
//! 3. **The gateway alone**: the same number of workers `POST` straight to
//!    the gateway with a new key each, for the duration: its own ceiling.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::closed_loop::{self, Load, Tally};

#[derive(clap::Args, Clone)]
pub struct PayoutArgs {
    /// Base URL of an instance; repeat to spread requests across several.
    #[arg(long = "target", default_value = "http://127.0.0.1:8080")]
    pub targets: Vec<String>,
    /// The instances' database, read for when each payout left the outbox.
    #[arg(long, env = "LOADTEST_DATABASE_URL")]
    pub database_url: String,
    /// The gateway the instances send to (`payout_gateway_url`).
    #[arg(long)]
    pub gateway_url: String,
    /// The accounts paying out, the workers, the duration.
    #[command(flatten)]
    pub load: Load,
    /// How long to wait for the outbox to send everything accepted.
    #[arg(long, default_value_t = 300)]
    pub drain_s_max: u64,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub struct PayoutReport {
    /// The 202s, and the other answers by status.
    pub accepted: Tally,
    pub dispatched_per_s: f64,
    /// From the first acceptance to the last payout leaving the outbox.
    pub dispatch_seconds: f64,
    /// Payouts that left the outbox after the acceptance ended, per second
    /// until the last: the dispatchers' rate on a backlog, with the machine
    /// to themselves.
    pub drained_per_s: f64,
    /// How many the dispatchers had left to send when the acceptance ended.
    pub backlog: i64,
    /// Payouts still in the outbox when the wait ended.
    pub left_in_outbox: i64,
    pub gateway_per_s: f64,
}

pub async fn run(args: &PayoutArgs) -> anyhow::Result<PayoutReport> {
    let db = PgPool::connect(&args.database_url).await?;
    let people = Arc::new(closed_loop::sign_up(&args.targets, args.load.users).await?);
    let http = wallet_client::http_client_builder()
        .pool_max_idle_per_host(args.load.concurrency)
        .build()?;
    let duration = args.load.duration();
    let targets = Arc::new(args.targets.clone());
    let tally = closed_loop::run(args.load.concurrency, duration, 202, {
        let (http, people) = (http.clone(), people.clone());
        move |n: usize| {
            let (http, people, targets) = (http.clone(), people.clone(), targets.clone());
            async move {
                let person = &people[n % people.len()];
                http.post(format!("{}/api/v1/payouts", targets[n % targets.len()]))
                    .bearer_auth(&person.token)
                    .header("Idempotency-Key", Uuid::new_v4().to_string())
                    .json(&serde_json::json!({
                        "from_wallet_id": person.wallet_id, "amount_minor": 1, "destination": format!("bench-{n}")
                    }))
                    .send()
                    .await
                    .map_or(0, |response| response.status().as_u16())
            }
        }
    })
    .await?;
    let users: Vec<Uuid> = people.iter().map(|person| person.user_id).collect();
    let accepting_ended: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(&db).await?;
    let drained = drain(&db, &users, accepting_ended, args.drain_s_max).await?;
    let gateway_per_s = gateway_ceiling(&http, &args.gateway_url, args.load.concurrency, duration).await;
    Ok(PayoutReport {
        dispatched_per_s: tally.succeeded as f64 / drained.seconds.max(f64::EPSILON),
        accepted: tally,
        dispatch_seconds: drained.seconds,
        drained_per_s: drained.backlog as f64 / drained.backlog_seconds.max(f64::EPSILON),
        backlog: drained.backlog,
        left_in_outbox: drained.left,
        gateway_per_s,
    })
}

/// How the outbox drained.
#[derive(sqlx::FromRow)]
struct Drained {
    /// From the first payout's creation to the last one's leaving.
    seconds: f64,
    /// Payouts still there when the acceptance ended.
    backlog: i64,
    /// From the acceptance's end to the last one's leaving.
    backlog_seconds: f64,
    /// Payouts still there when the wait ended.
    left: i64,
}

/// Waits until the users' payouts have all left the outbox, at most
/// `drain_s_max` seconds.
async fn drain(
    db: &PgPool,
    users: &[Uuid],
    accepting_ended: DateTime<Utc>,
    drain_s_max: u64,
) -> anyhow::Result<Drained> {
    let deadline = Instant::now() + Duration::from_secs(drain_s_max);
    loop {
        let drained: Drained = sqlx::query_as(
            "SELECT coalesce(extract(epoch FROM max(updated_at) - min(created_at)), 0)::double precision
                        AS seconds,
                    count(*) FILTER (WHERE state IN ('pending', 'sent') OR updated_at > $2) AS backlog,
                    coalesce(extract(epoch FROM max(updated_at) - $2), 0)::double precision AS backlog_seconds,
                    count(*) FILTER (WHERE state IN ('pending', 'sent')) AS left
               FROM payouts WHERE user_id = ANY($1)",
        )
        .bind(users)
        .bind(accepting_ended)
        .fetch_one(db)
        .await?;
        if drained.left == 0 || Instant::now() > deadline {
            return Ok(drained);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Payouts per second the gateway takes straight from `concurrency`
/// closed-loop workers, each with a new key.
async fn gateway_ceiling(
    http: &reqwest::Client,
    gateway: &str,
    concurrency: usize,
    duration: Duration,
) -> f64 {
    let started = Instant::now();
    let workers = (0..concurrency).map(|worker| {
        let (http, url) = (http.clone(), format!("{gateway}/v1/payouts"));
        tokio::spawn(async move {
            let mut sent = 0u64;
            while started.elapsed() < duration {
                let answer = http
                    .post(&url)
                    .header("Idempotency-Key", Uuid::new_v4().to_string())
                    .json(&serde_json::json!({
                        "amount_minor": 1, "currency": "USD", "destination": format!("ceiling-{worker}")
                    }))
                    .send()
                    .await;
                sent += u64::from(answer.is_ok_and(|response| response.status().is_success()));
            }
            sent
        })
    });
    let sent: u64 = futures::future::join_all(workers)
        .await
        .into_iter()
        .map(|sent| sent.unwrap_or(0))
        .sum();
    sent as f64 / started.elapsed().as_secs_f64()
}

pub fn print(report: &PayoutReport) {
    println!(
        "payouts accepted: {} ({:.0}/s, p50 {:.1} ms, p99 {:.1} ms; other answers {:?})",
        report.accepted.succeeded,
        report.accepted.per_s,
        report.accepted.p50_ms,
        report.accepted.p99_ms,
        report.accepted.other_answers
    );
    println!(
        "dispatched: {:.0}/s over {:.1} s, the {} left when the acceptance ended at {:.0}/s ({} left in the \
         outbox); the gateway alone: {:.0}/s",
        report.dispatched_per_s,
        report.dispatch_seconds,
        report.backlog,
        report.drained_per_s,
        report.left_in_outbox,
        report.gateway_per_s
    );
}
