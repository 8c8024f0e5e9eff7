//! `wallet-sim payouts`: people paying money out through instances this
//! program starts, to a bank gateway this program starts, while the gateway
//! loses answers after sending, fails before applying, crashes after
//! sending (and is started again), and instances are killed mid-call and
//! started again. Then `wallet-server reconcile` for whatever needs a
//! person, and the verdict of both ledgers: the wallets' and the gateway's.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::Rng;
use serde::Serialize;
use sqlx::PgPool;
use tokio::sync::Mutex;
use uuid::Uuid;
use wallet_client::{Client, IdempotencyKey, PayoutOrder, RetryPolicy};

use crate::checks::Checks;
use crate::instances::{Instances, Stores, free_port};

#[derive(Debug, Clone, clap::Args)]
pub struct PayoutArgs {
    #[command(flatten)]
    pub stores: Stores,
    /// The program that serves the gateway (`… gateway`); default: this one.
    #[arg(long)]
    pub gateway_bin: Option<PathBuf>,
    /// The gateway's own database (its tables are made on start).
    #[arg(long, env = "SIM_GATEWAY_DATABASE_URL")]
    pub gateway_database_url: String,
    #[arg(long, default_value_t = 3)]
    pub instances: usize,
    #[arg(long, default_value_t = 20)]
    pub accounts: usize,
    #[arg(long, default_value_t = 300)]
    pub payouts: usize,
    /// Every n-th payout goes to a closed account, which the gateway
    /// refuses for good.
    #[arg(long, default_value_t = 10)]
    pub refused_every: usize,
    /// The gateway's share of sendings whose answer it holds back past the
    /// instances' call time-out.
    #[arg(long, default_value_t = 0.2)]
    pub lose_answer_rate: f64,
    /// The gateway's share of requests answered 503 before applying.
    #[arg(long, default_value_t = 0.1)]
    pub failure_rate: f64,
    /// The gateway's share of sendings after which it exits; it is started
    /// again at once.
    #[arg(long, default_value_t = 0.01)]
    pub crash_after_send_rate: f64,
    /// Instances killed (`SIGKILL`) and started again during the run.
    #[arg(long, default_value_t = 3)]
    pub kills: usize,
    /// The instances' `payout_call_timeout_ms`.
    #[arg(long, default_value_t = 500)]
    pub call_timeout_ms: u64,
    /// The instances' `payout_lease_ms`.
    #[arg(long, default_value_t = 2_000)]
    pub lease_ms: u64,
    /// The instances' `payout_attempts_max`.
    #[arg(long, default_value_t = 8)]
    pub attempts_max: u32,
    /// The instances' `payout_mode`. Anything but `outbox` is an unsafe
    /// demonstration (the run allows it), whose double sendings the checks
    /// must find.
    #[arg(long, default_value = "outbox")]
    pub payout_mode: String,
    /// How long to wait, after the last payout was accepted, for every
    /// payout to be settled, refused or given up on.
    #[arg(long, default_value_t = 120)]
    pub settle_s: u64,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub instances: usize,
    pub payouts: usize,
    pub kills: usize,
    pub gateway_crashes: usize,
    /// Payouts by state once the dispatchers were done, before reconcile.
    pub states_before_reconcile: Vec<(String, i64)>,
    /// Reconcile's work: settled, released, left.
    pub reconciled: (usize, usize, usize),
    /// Payouts by final state.
    pub states: Vec<(String, i64)>,
    /// Gateway calls in all, and those whose outcome was unknown, as the
    /// instances counted them (a killed instance's counts are read just
    /// before it is killed).
    pub attempts: i64,
    pub unknown_outcomes: f64,
    pub seconds_to_settle: f64,
    pub checks: Checks,
}

/// A gateway process (`<binary> gateway <args>`), killed when dropped; a
/// run starts it again whenever it crashes.
pub struct GatewayProcess {
    binary: PathBuf,
    args: Vec<String>,
    child: Child,
    crashes: usize,
}

impl GatewayProcess {
    pub fn start(binary: PathBuf, args: Vec<String>) -> anyhow::Result<Self> {
        let child = spawn_gateway(&binary, &args)?;
        Ok(Self {
            binary,
            args,
            child,
            crashes: 0,
        })
    }

    /// Starts it again if it exited; true when it had.
    pub fn revive(&mut self) -> anyhow::Result<bool> {
        if self.child.try_wait()?.is_none() {
            return Ok(false);
        }
        self.crashes += 1;
        self.child = spawn_gateway(&self.binary, &self.args)?;
        Ok(true)
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_gateway(binary: &PathBuf, args: &[String]) -> anyhow::Result<Child> {
    Command::new(binary)
        .arg("gateway")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("failed to start {} gateway", binary.display()))
}

/// Waits until `url` answers 200, at most 30 s.
pub async fn wait_for(url: &str) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !http.get(url).send().await.is_ok_and(|r| r.status() == 200) {
        anyhow::ensure!(Instant::now() < deadline, "{url} did not answer in 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

pub async fn run(args: &PayoutArgs) -> anyhow::Result<Report> {
    let gateway_port = free_port()?;
    let gateway_url = format!("http://127.0.0.1:{gateway_port}");
    let gateway_args: Vec<String> = vec![
        "--listen".into(),
        format!("127.0.0.1:{gateway_port}"),
        "--database-url".into(),
        args.gateway_database_url.clone(),
        "--lose-answer-rate".into(),
        args.lose_answer_rate.to_string(),
        "--lose-answer-ms".into(),
        (args.call_timeout_ms * 3).to_string(),
        "--failure-rate".into(),
        args.failure_rate.to_string(),
        "--crash-after-send-rate".into(),
        args.crash_after_send_rate.to_string(),
    ];
    let gateway_bin = match &args.gateway_bin {
        Some(binary) => binary.clone(),
        None => std::env::current_exe()?,
    };
    let gateway = Mutex::new(GatewayProcess::start(gateway_bin, gateway_args)?);
    wait_for(&format!("{gateway_url}/healthz")).await?;
    let gateway_db = PgPool::connect(&args.gateway_database_url).await?;

    let spec = args
        .stores
        .spec("sim-payouts")?
        .with("WALLET_PAYOUT_GATEWAY_URL", &gateway_url)
        .with("WALLET_PAYOUT_CALL_TIMEOUT_MS", args.call_timeout_ms)
        .with("WALLET_PAYOUT_LEASE_MS", args.lease_ms)
        .with("WALLET_PAYOUT_RETRY_BASE_MS", 50)
        .with("WALLET_PAYOUT_RETRY_CAP_MS", 1_000)
        .with("WALLET_PAYOUT_ATTEMPTS_MAX", args.attempts_max)
        .with("WALLET_PAYOUT_DISPATCH_IDLE_MS", 50)
        .with("WALLET_COOLDOWN_TTL_MS", 100)
        .with("WALLET_PAYOUT_MODE", &args.payout_mode)
        .with("WALLET_ALLOW_UNSAFE_DEMO_MODES", args.payout_mode != "outbox")
        .with("WALLET_SIGNUP_GRANT_MINOR", 10_000_000);
    let server = spec.server.clone();
    let database_url = spec.database_url.clone();
    let servers = Mutex::new(Instances::start(spec, args.instances).await?);
    let urls = servers.lock().await.urls();
    let db = PgPool::connect(&args.stores.database_url).await?;

    let started = Instant::now();
    let paying = pay_out(&urls, args);
    let done = AtomicBool::new(false);
    let (paid, counted_before_kills) = tokio::join!(
        async {
            let paid = paying.await;
            done.store(true, Ordering::Relaxed);
            paid
        },
        faults(&servers, &gateway, args, &done)
    );
    let (users, payouts) = paid?;
    let counted_before_kills = counted_before_kills?;
    let mut report = Report {
        instances: args.instances,
        payouts: payouts.len(),
        kills: args.kills,
        ..Report::default()
    };
    // The gateway is revived as the wait goes, so that it ends.
    wait_until_dispatched(
        &db,
        PayoutsOf::Ids(&payouts),
        Duration::from_secs(args.settle_s),
        async || gateway.lock().await.revive().map(|_| ()),
    )
    .await?;
    report.seconds_to_settle = started.elapsed().as_secs_f64();
    report.gateway_crashes = gateway.lock().await.crashes;
    report.unknown_outcomes = counted_before_kills
        + servers
            .lock()
            .await
            .counter("wallet_payout_attempts_total{answer=\"unknown\"}")
            .await;
    report.states_before_reconcile = states(&db, &payouts).await?;

    // Whatever needs a person now gets one: reconcile, as an operator runs
    // it (it asks by the payout's own key, which only the outbox mode sends).
    gateway.lock().await.revive()?;
    wait_for(&format!("{gateway_url}/healthz")).await?;
    if args.payout_mode == "outbox" {
        report.reconciled = reconcile(&server, &database_url, &gateway_url).await?;
    }
    report.states = states(&db, &payouts).await?;
    report.attempts =
        sqlx::query_scalar("SELECT coalesce(sum(attempts), 0)::bigint FROM payouts WHERE id = ANY($1)")
            .bind(&payouts)
            .fetch_one(&db)
            .await?;
    check(&db, &gateway_db, &users, &payouts, &mut report.checks).await?;
    Ok(report)
}

/// Every account pays out `payouts / accounts` times, one after another,
/// each through the client's retry policy with one key per payout, all
/// accounts at once.
async fn pay_out(urls: &[String], args: &PayoutArgs) -> anyhow::Result<(Vec<Uuid>, Vec<Uuid>)> {
    let targets: Vec<&str> = urls.iter().map(String::as_str).collect();
    let policy = RetryPolicy {
        attempts_max: 20,
        ..RetryPolicy::default()
    };
    let client = Client::over(&targets, policy)?;
    let run = &Uuid::new_v4().simple().to_string()[..8];
    let counter = AtomicUsize::new(0);
    let mut people = Vec::new();
    for index in 0..args.accounts.max(1) {
        let password = Uuid::new_v4().simple().to_string();
        people.push(client.sign_up(&format!("sim-{run}-{index}"), &password).await?);
    }
    let per_account = args.payouts.div_ceil(people.len());
    let paid = futures::future::join_all(people.iter().map(|person| {
        let client = client.with_token(&person.token);
        let counter = &counter;
        async move {
            let mut ids = Vec::new();
            for _ in 0..per_account {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                if n >= args.payouts {
                    break;
                }
                let destination = if args.refused_every > 0 && n % args.refused_every == 0 {
                    format!("closed-{n}")
                } else {
                    format!("acct-{n}")
                };
                let order = PayoutOrder {
                    from_wallet_id: person.wallet_id,
                    amount_minor: rand::thread_rng().gen_range(100..=5_000),
                    destination,
                };
                let accepted = client.pay_out(&order, IdempotencyKey::new()).await?;
                ids.push(accepted.receipt.id);
            }
            anyhow::Ok(ids)
        }
    }))
    .await;
    let mut payouts = Vec::new();
    for ids in paid {
        payouts.extend(ids?);
    }
    Ok((people.iter().map(|person| person.user_id).collect(), payouts))
}

/// Kills instances one after another and starts each again, while the
/// gateway is started again whenever it crashes. Returns the unknown
/// outcomes the killed instances had counted.
async fn faults(
    servers: &Mutex<Instances>,
    gateway: &Mutex<GatewayProcess>,
    args: &PayoutArgs,
    done: &AtomicBool,
) -> anyhow::Result<f64> {
    let mut counted = 0.0;
    let mut kills_left = args.kills;
    let mut next_kill = Instant::now() + Duration::from_millis(1_500);
    let mut victim = 0;
    while !done.load(Ordering::Relaxed) || kills_left > 0 {
        gateway.lock().await.revive()?;
        if kills_left > 0 && Instant::now() >= next_kill {
            let mut servers = servers.lock().await;
            let index = victim % servers.len();
            counted += servers
                .counter_of(index, "wallet_payout_attempts_total{answer=\"unknown\"}")
                .await;
            servers.kill(index)?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            servers.restart(index).await?;
            kills_left -= 1;
            victim += 1;
            next_kill = Instant::now() + Duration::from_millis(1_500);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(counted)
}

/// Which payouts a wait is about.
pub enum PayoutsOf<'a> {
    Ids(&'a [Uuid]),
    Users(&'a [Uuid]),
    Destinations(&'a [&'a str]),
}

/// How often a wait looks at the payouts again.
const DISPATCH_POLL: Duration = Duration::from_millis(100);

/// Waits until none of `payouts` is pending or sent (the dispatchers are
/// done with each), or `wait` has passed; `between` runs before each look
/// (to revive a crashed gateway, say). A database that cannot be asked,
/// restarting perhaps, is asked again. Whether none was left.
pub async fn wait_until_dispatched(
    db: &PgPool,
    payouts: PayoutsOf<'_>,
    wait: Duration,
    mut between: impl AsyncFnMut() -> anyhow::Result<()>,
) -> anyhow::Result<bool> {
    let (ids, users, destinations): (&[Uuid], &[Uuid], &[&str]) = match payouts {
        PayoutsOf::Ids(ids) => (ids, &[], &[]),
        PayoutsOf::Users(users) => (&[], users, &[]),
        PayoutsOf::Destinations(destinations) => (&[], &[], destinations),
    };
    let deadline = Instant::now() + wait;
    loop {
        between().await?;
        let open: Result<i64, _> = sqlx::query_scalar(
            "SELECT count(*) FROM payouts
              WHERE state IN ('pending', 'sent')
                AND (id = ANY($1) OR user_id = ANY($2) OR destination = ANY($3))",
        )
        .bind(ids)
        .bind(users)
        .bind(destinations)
        .fetch_one(db)
        .await;
        if open.as_ref().is_ok_and(|open| *open == 0) {
            return Ok(true);
        }
        if Instant::now() > deadline {
            return Ok(false);
        }
        tokio::time::sleep(DISPATCH_POLL).await;
    }
}

async fn states(db: &PgPool, payouts: &[Uuid]) -> anyhow::Result<Vec<(String, i64)>> {
    Ok(
        sqlx::query_as("SELECT state::text, count(*) FROM payouts WHERE id = ANY($1) GROUP BY 1 ORDER BY 1")
            .bind(payouts)
            .fetch_all(db)
            .await?,
    )
}

/// `wallet-server reconcile`, as an operator runs it: (settled, released,
/// left).
pub async fn reconcile(
    server: &std::path::Path,
    database_url: &str,
    gateway_url: &str,
) -> anyhow::Result<(usize, usize, usize)> {
    let mut command = Command::new(server);
    command
        .arg("reconcile")
        .env("DATABASE_URL", database_url)
        .env("WALLET_PAYOUT_GATEWAY_URL", gateway_url)
        .env("WALLET_PAYOUT_RECONCILE_QUIET_MS", "0")
        .env("RUST_LOG", "error");
    let output = tokio::task::spawn_blocking(move || command.output()).await??;
    let reconciled: serde_json::Value = serde_json::from_slice(&output.stdout)
        .with_context(|| format!("reconcile said: {}", String::from_utf8_lossy(&output.stderr)))?;
    let count = |field: &str| reconciled[field].as_array().map_or(0, Vec::len);
    Ok((count("settled"), count("released"), count("left")))
}

/// Both ledgers' verdict.
pub async fn check(
    db: &PgPool,
    gateway_db: &PgPool,
    users: &[Uuid],
    payouts: &[Uuid],
    checks: &mut Checks,
) -> anyhow::Result<()> {
    let references: Vec<String> = payouts.iter().map(Uuid::to_string).collect();
    let sent: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT reference, count(*), sum(amount_minor)::bigint FROM gateway_sent
          WHERE reference = ANY($1) GROUP BY reference",
    )
    .bind(&references)
    .fetch_all(gateway_db)
    .await?;
    let sent_more_than_once = sent.iter().filter(|(_, count, _)| *count > 1).count();
    checks.add(
        "payouts the gateway sent more than once",
        sent_more_than_once as i64,
    );
    let sent_ids: Vec<Uuid> = sent
        .iter()
        .filter_map(|(reference, ..)| reference.parse().ok())
        .collect();
    let (settled_not_sent, released_but_sent, open): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE state = 'settled' AND NOT (id = ANY($2))),
                count(*) FILTER (WHERE state = 'failed' AND id = ANY($2)),
                count(*) FILTER (WHERE state NOT IN ('settled', 'failed'))
           FROM payouts WHERE id = ANY($1)",
    )
    .bind(payouts)
    .bind(&sent_ids)
    .fetch_one(db)
    .await?;
    checks.add("settled payouts the gateway never sent", settled_not_sent);
    checks.add("released holds of payouts the gateway sent", released_but_sent);
    let sent_but_not_settled: i64 =
        sqlx::query_scalar("SELECT count(*) FROM payouts WHERE id = ANY($1) AND state <> 'settled'")
            .bind(&sent_ids)
            .fetch_one(db)
            .await?;
    checks.add(
        "payouts the gateway sent that are not settled",
        sent_but_not_settled,
    );
    checks.add("payouts neither settled nor failed after reconcile", open);
    let settled_minor: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(amount_minor), 0)::bigint FROM payouts WHERE id = ANY($1) AND state = 'settled'",
    )
    .bind(payouts)
    .fetch_one(db)
    .await?;
    let sent_minor: i64 = sent.iter().map(|(_, _, minor)| minor).sum();
    checks.add(
        "minor units the gateway sent minus those settled",
        sent_minor - settled_minor,
    );
    checks.money_invariants(db, users).await
}

pub fn print(report: &Report) {
    println!();
    println!(
        "Payout run: {} payouts through {} instances ({} killed and started again) to a gateway that crashed {} \
         times; every payout settled, refused or given up on in {:.1} s",
        report.payouts, report.instances, report.kills, report.gateway_crashes, report.seconds_to_settle
    );
    println!();
    println!("| state | before reconcile | after reconcile |");
    println!("|---|---|---|");
    for (state, count) in &report.states {
        let before = report
            .states_before_reconcile
            .iter()
            .find(|(name, _)| name == state)
            .map_or(0, |(_, count)| *count);
        println!("| {state} | {before} | {count} |");
    }
    for (state, before) in &report.states_before_reconcile {
        if !report.states.iter().any(|(name, _)| name == state) {
            println!("| {state} | {before} | 0 |");
        }
    }
    println!();
    let (settled, released, left) = report.reconciled;
    println!(
        "Gateway calls: {}, of which {} had an unknown outcome and were retried with the same key. Reconcile \
         settled {settled}, released {released}, left {left}.",
        report.attempts, report.unknown_outcomes
    );
    println!();
    report.checks.print();
}
