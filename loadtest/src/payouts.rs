//! `wallet-loadtest payouts`: how fast payouts are accepted, how fast the
//! dispatchers send a backlog, and how fast the gateway alone takes
//! payouts.
//!
//! 1. **Accepted**: closed-loop workers `POST /api/v1/payouts` with a new
//!    key each, spread over the users, for the duration: 202s per second
//!    and their latency.
//! 2. **Sent**: the backlog, from the first of it sent to the last:
//!    payouts per second, the dispatchers' sustained rate while a backlog
//!    fed them. The backlog is what was still in the outbox when the
//!    acceptance ended; with `--phase send`, when the newest payout was
//!    made.
//!    For a backlog that feeds them throughout, accept with the instances'
//!    dispatchers off (`--phase accept`, `WALLET_PAYOUT_DISPATCHER_ENABLED
//!    =false`), then start them and measure `--phase send`. Sending can
//!    never outrun accepting for long, so a rate measured from the first
//!    acceptance would be the acceptance's rate.
//! 3. **The gateway alone**: the same number of workers `POST` straight to
//!    the gateway with a new key each, for the duration: its own ceiling.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::closed_loop::{self, Load, Tally};

/// Which of the run's phases to measure.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Accept, then send what the dispatchers had left, then the gateway.
    Both,
    /// Accept only, and leave what was accepted in the outbox.
    Accept,
    /// Send the backlog already in the outbox, then the gateway.
    Send,
}

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
    #[arg(long, value_enum, default_value_t = Phase::Both)]
    pub phase: Phase,
    /// The accounts paying out, the workers, the duration.
    #[command(flatten)]
    pub load: Load,
    /// How long to wait for the outbox to send its backlog.
    #[arg(long, default_value_t = 300)]
    pub drain_s_max: u64,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub struct PayoutReport {
    /// The 202s, and the other answers by status (not with `--phase send`).
    pub accepted: Option<Tally>,
    /// How the backlog was sent (not with `--phase accept`).
    pub sent: Option<Sent>,
    /// The gateway's own ceiling (not with `--phase accept`).
    pub gateway_per_s: Option<f64>,
}

impl PayoutReport {
    /// Whether the run did what it was asked: something accepted when it
    /// was to accept, and the whole backlog sent when it was to send.
    pub fn complete(&self) -> bool {
        self.accepted
            .as_ref()
            .is_none_or(|accepted| accepted.succeeded > 0)
            && self.sent.as_ref().is_none_or(|sent| sent.left_in_outbox == 0)
    }
}

/// How the backlog left the outbox.
#[derive(Debug, Serialize, sqlx::FromRow)]
pub struct Sent {
    /// Payouts waiting in the outbox when the phase started.
    pub backlog: i64,
    /// From the first of them leaving the outbox to the last.
    pub seconds: f64,
    /// The backlog's payouts that left, per second over `seconds`.
    pub per_s: f64,
    /// The backlog's payouts still in the outbox when the wait ended.
    pub left_in_outbox: i64,
}

pub async fn run(args: &PayoutArgs) -> anyhow::Result<PayoutReport> {
    let db = PgPool::connect(&args.database_url).await?;
    let http = wallet_client::http_client_builder()
        .pool_max_idle_per_host(args.load.concurrency)
        .build()?;
    let accepted = match args.phase {
        Phase::Both | Phase::Accept => Some(accept(args, &http).await?),
        Phase::Send => None,
    };
    if args.phase == Phase::Accept {
        return Ok(PayoutReport {
            accepted,
            sent: None,
            gateway_per_s: None,
        });
    }
    let since = backlog_since(&db, accepted.is_some()).await?;
    let sent = send(&db, since, args.drain_s_max).await?;
    let gateway_per_s = gateway_ceiling(
        &http,
        &args.gateway_url,
        args.load.concurrency,
        args.load.duration(),
    )
    .await;
    Ok(PayoutReport {
        accepted,
        sent: Some(sent),
        gateway_per_s: Some(gateway_per_s),
    })
}

/// Closed-loop workers ask for payouts of new users for the duration.
async fn accept(args: &PayoutArgs, http: &reqwest::Client) -> anyhow::Result<Tally> {
    let people = Arc::new(closed_loop::sign_up(&args.targets, args.load.users).await?);
    let targets = Arc::new(args.targets.clone());
    closed_loop::run(args.load.concurrency, args.load.duration(), 202, {
        let http = http.clone();
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
    .await
}

/// The moment the backlog is counted from: the end of the acceptance, or
/// (`--phase send`) the newest payout's creation, which is when the
/// acceptance ended if no instance dispatched during it.
async fn backlog_since(db: &PgPool, accepted_here: bool) -> anyhow::Result<DateTime<Utc>> {
    let since: Option<DateTime<Utc>> = if accepted_here {
        sqlx::query_scalar("SELECT now()").fetch_one(db).await?
    } else {
        sqlx::query_scalar("SELECT max(created_at) FROM payouts WHERE currency <> 'LAB'")
            .fetch_one(db)
            .await?
    };
    since.ok_or_else(|| anyhow::anyhow!("no payout to send: accept some first (--phase accept)"))
}

/// Waits until the backlog (every payout of real money that was still in
/// the outbox at `since`) has left it, at most `drain_s_max` seconds. A
/// payout's `updated_at` is its last change: when it left, once it has.
async fn send(db: &PgPool, since: DateTime<Utc>, drain_s_max: u64) -> anyhow::Result<Sent> {
    let deadline = Instant::now() + Duration::from_secs(drain_s_max);
    loop {
        let sent: Sent = sqlx::query_as(
            "SELECT count(*) AS backlog,
                    coalesce(extract(epoch FROM max(updated_at) FILTER (WHERE NOT waiting)
                                              - min(updated_at) FILTER (WHERE NOT waiting)), 0)::double precision
                        AS seconds,
                    0::double precision AS per_s,
                    count(*) FILTER (WHERE waiting) AS left_in_outbox
               FROM (SELECT updated_at, state IN ('pending', 'sent') AS waiting
                       FROM payouts
                      WHERE currency <> 'LAB' AND (state IN ('pending', 'sent') OR updated_at > $1)) AS backlog",
        )
        .bind(since)
        .fetch_one(db)
        .await?;
        if sent.left_in_outbox == 0 || Instant::now() > deadline {
            // n leavings span n - 1 intervals.
            let intervals = (sent.backlog - sent.left_in_outbox - 1).max(0) as f64;
            return Ok(Sent {
                per_s: intervals / sent.seconds.max(f64::EPSILON),
                ..sent
            });
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
    if let Some(accepted) = &report.accepted {
        println!(
            "payouts accepted: {} ({:.0}/s, p50 {:.1} ms, p99 {:.1} ms; other answers {:?})",
            accepted.succeeded, accepted.per_s, accepted.p50_ms, accepted.p99_ms, accepted.other_answers
        );
    }
    if let Some(sent) = &report.sent {
        println!(
            "sent: a backlog of {} at {:.0}/s over {:.1} s ({} left in the outbox)",
            sent.backlog, sent.per_s, sent.seconds, sent.left_in_outbox
        );
    }
    if let Some(gateway_per_s) = report.gateway_per_s {
        println!("the gateway alone: {gateway_per_s:.0}/s");
    }
}
