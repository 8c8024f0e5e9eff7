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

use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;
use wallet_client::{Client, RetryPolicy};

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
    #[arg(long, default_value_t = 64)]
    pub users: usize,
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    #[arg(long, default_value_t = 10.0)]
    pub duration_s: f64,
    /// How long to wait for the outbox to send everything accepted.
    #[arg(long, default_value_t = 300)]
    pub drain_s_max: u64,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub struct PayoutReport {
    pub accepted: u64,
    pub accepted_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Answers other than 202, by status.
    pub other_answers: Vec<(u16, u64)>,
    pub dispatched_per_s: f64,
    /// From the first acceptance to the last payout leaving the outbox.
    pub dispatch_seconds: f64,
    /// Payouts still in the outbox when the wait ended.
    pub left_in_outbox: i64,
    pub gateway_per_s: f64,
}

pub async fn run(args: &PayoutArgs) -> anyhow::Result<PayoutReport> {
    let db = PgPool::connect(&args.database_url).await?;
    let targets: Vec<&str> = args.targets.iter().map(String::as_str).collect();
    let client = Client::over(&targets, RetryPolicy::default())?;
    let run = &Uuid::new_v4().simple().to_string()[..8];
    let mut people = Vec::new();
    for index in 0..args.users.max(1) {
        let password = Uuid::new_v4().simple().to_string();
        people.push(client.sign_up(&format!("bench-{run}-{index}"), &password).await?);
    }
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .build()?;
    let people = Arc::new(people);
    let duration = Duration::from_secs_f64(args.duration_s);

    let started = Instant::now();
    let workers = (0..args.concurrency).map(|worker| {
        let (http, people, targets) = (http.clone(), people.clone(), args.targets.clone());
        tokio::spawn(async move {
            let mut answers: Vec<(u16, Duration)> = Vec::new();
            let mut n = worker;
            while started.elapsed() < duration {
                let person = &people[n % people.len()];
                let target = &targets[n % targets.len()];
                let sent = Instant::now();
                let status = http
                    .post(format!("{target}/api/v1/payouts"))
                    .bearer_auth(&person.token)
                    .header("Idempotency-Key", Uuid::new_v4().to_string())
                    .json(&serde_json::json!({
                        "from_wallet_id": person.wallet_id, "amount_minor": 1, "destination": format!("bench-{n}")
                    }))
                    .send()
                    .await
                    .map_or(0, |response| response.status().as_u16());
                answers.push((status, sent.elapsed()));
                n += 1;
            }
            answers
        })
    });
    let mut answers = Vec::new();
    for worker in futures::future::join_all(workers).await {
        answers.extend(worker?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut latencies: Vec<Duration> = answers
        .iter()
        .filter(|(status, _)| *status == 202)
        .map(|(_, took)| *took)
        .collect();
    latencies.sort();
    let percentile = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |took| took.as_secs_f64() * 1000.0)
    };
    let mut other_answers: Vec<(u16, u64)> = Vec::new();
    for (status, _) in answers.iter().filter(|(status, _)| *status != 202) {
        match other_answers.iter_mut().find(|(seen, _)| seen == status) {
            Some((_, count)) => *count += 1,
            None => other_answers.push((*status, 1)),
        }
    }
    let accepted = latencies.len() as u64;
    let users: Vec<Uuid> = people.iter().map(|person| person.user_id).collect();
    let (dispatch_seconds, left_in_outbox) = drain(&db, &users, args.drain_s_max).await?;
    let gateway_per_s = gateway_ceiling(&http, &args.gateway_url, args.concurrency, duration).await;
    Ok(PayoutReport {
        accepted,
        accepted_per_s: accepted as f64 / elapsed,
        p50_ms: percentile(0.5),
        p99_ms: percentile(0.99),
        other_answers,
        dispatched_per_s: accepted as f64 / dispatch_seconds.max(f64::EPSILON),
        dispatch_seconds,
        left_in_outbox,
        gateway_per_s,
    })
}

/// Waits until the users' payouts have all left the outbox; the seconds
/// from the first one's creation to the last one's leaving, and how many
/// were left when the wait ended.
async fn drain(db: &PgPool, users: &[Uuid], drain_s_max: u64) -> anyhow::Result<(f64, i64)> {
    let deadline = Instant::now() + Duration::from_secs(drain_s_max);
    loop {
        let (left, seconds): (i64, Option<f64>) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE state IN ('pending', 'sent')),
                    extract(epoch FROM max(updated_at) - min(created_at))::double precision
               FROM payouts WHERE user_id = ANY($1)",
        )
        .bind(users)
        .fetch_one(db)
        .await?;
        if left == 0 || Instant::now() > deadline {
            return Ok((seconds.unwrap_or(0.0), left));
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
        report.accepted, report.accepted_per_s, report.p50_ms, report.p99_ms, report.other_answers
    );
    println!(
        "dispatched: {:.0}/s over {:.1} s ({} left in the outbox); the gateway alone: {:.0}/s",
        report.dispatched_per_s, report.dispatch_seconds, report.left_in_outbox, report.gateway_per_s
    );
}
