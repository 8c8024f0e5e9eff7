//! `wallet-loadtest demo`: the defense ladder. Starts instances in each
//! configuration, from everything off and naive to all three layers, runs
//! the same duplicate and race scenarios against each, and prints what went
//! wrong where.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;

use crate::scenarios::Scenario;
use crate::{RunArgs, RunReport};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// The wallet-server binary (default: next to this one).
    #[arg(long)]
    server_bin: Option<PathBuf>,
    /// The database the instances use (they migrate it); also read for the
    /// invariants.
    #[arg(long, env = "LOADTEST_DATABASE_URL")]
    database_url: String,
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// Instances per configuration.
    #[arg(long, default_value_t = 2)]
    instances: usize,
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    #[arg(long, default_value_t = 20)]
    copies: usize,
    /// Print the table as JSON.
    #[arg(long)]
    json: bool,
}

struct Rung {
    name: &'static str,
    cooldown: bool,
    idempotency: &'static str,
    row_guard: &'static str,
}

const LADDER: [Rung; 4] = [
    Rung {
        name: "all off, naive",
        cooldown: false,
        idempotency: "check_then_insert",
        row_guard: "read_decide_write",
    },
    Rung {
        name: "+ row guard",
        cooldown: false,
        idempotency: "check_then_insert",
        row_guard: "guarded",
    },
    Rung {
        name: "+ idempotency key",
        cooldown: false,
        idempotency: "atomic",
        row_guard: "guarded",
    },
    Rung {
        name: "+ cooldown (all on)",
        cooldown: true,
        idempotency: "atomic",
        row_guard: "guarded",
    },
];

/// The grant the demo instances give, so that `overdraw` can pay at most
/// ten transfers of a tenth each.
const GRANT_MINOR: i64 = 1_000;

#[derive(Serialize)]
struct Row {
    configuration: &'static str,
    /// Keys that paid more than once (`storm`: one key, many copies).
    keys_paid_twice: i64,
    /// Extra transfers from keyless double clicks (`no-key`).
    keyless_double_pays: i64,
    /// Transfers beyond what the balance allowed (`overdraw`).
    overdrafts: i64,
    /// Money created or destroyed by lost updates, all scenarios.
    money_created_minor: i64,
    /// Requests that got past the cooldown, i.e. reached PostgreSQL.
    requests_reaching_database: u64,
    requests: u64,
}

/// Servers of one rung; killed when dropped.
struct Instances(Vec<Child>);

impl Drop for Instances {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub async fn run(args: &DemoArgs) -> anyhow::Result<bool> {
    let server = match &args.server_bin {
        Some(path) => path.clone(),
        None => std::env::current_exe()?.with_file_name("wallet-server"),
    };
    if !server.exists() {
        bail!(
            "no wallet-server at {}; build it or pass --server-bin",
            server.display()
        );
    }
    let mut rows = Vec::new();
    for rung in &LADDER {
        if !args.json {
            eprintln!("configuration: {}", rung.name);
        }
        let (targets, _instances) = start(&server, args, rung).await?;
        let mut row = Row {
            configuration: rung.name,
            keys_paid_twice: 0,
            keyless_double_pays: 0,
            overdrafts: 0,
            money_created_minor: 0,
            requests_reaching_database: 0,
            requests: 0,
        };
        for scenario in [Scenario::Storm, Scenario::NoKey, Scenario::Overdraw] {
            let report = run_scenario(scenario, &targets, args).await?;
            let findings = report
                .invariants
                .as_ref()
                .context("the demo always checks invariants")?;
            row.money_created_minor += findings.money_created_minor;
            row.requests += report.summary.requests;
            row.requests_reaching_database += report
                .summary
                .outcomes
                .iter()
                .filter(|o| o.layer != "cooldown" && o.status != 0)
                .map(|o| o.count)
                .sum::<u64>();
            match scenario {
                Scenario::Storm => row.keys_paid_twice = findings.keys_paid_more_than_once,
                Scenario::NoKey => {
                    row.keyless_double_pays = (findings.new_transfers - args.rounds as i64).max(0)
                }
                Scenario::Overdraw => {
                    row.overdrafts = (findings.new_transfers - 10 * args.rounds as i64).max(0)
                }
                _ => {}
            }
        }
        rows.push(row);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print_rows(&rows, args);
    }
    // The ladder succeeds when the naive bottom shows damage and the top
    // shows none.
    let bottom = &rows[0];
    let top = &rows[rows.len() - 1];
    let damage = |row: &Row| {
        row.keys_paid_twice + row.keyless_double_pays + row.overdrafts + row.money_created_minor.abs()
    };
    Ok(damage(bottom) > 0 && damage(top) == 0)
}

fn print_rows(rows: &[Row], args: &DemoArgs) {
    println!();
    println!(
        "Defense ladder: {} instances per configuration; per scenario {} rounds of {} simultaneous requests",
        args.instances, args.rounds, args.copies
    );
    println!();
    println!(
        "| configuration | keys paid twice (storm) | keyless double pays (no-key) | overdrafts (overdraw) | money created (minor units) | requests reaching PostgreSQL |"
    );
    println!("|---|---|---|---|---|---|");
    for row in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} of {} |",
            row.configuration,
            row.keys_paid_twice,
            row.keyless_double_pays,
            row.overdrafts,
            row.money_created_minor,
            row.requests_reaching_database,
            row.requests
        );
    }
}

async fn run_scenario(scenario: Scenario, targets: &[String], args: &DemoArgs) -> anyhow::Result<RunReport> {
    let run_args = RunArgs {
        rounds: args.rounds,
        copies: args.copies,
        users: 2,
        signup_grant_minor: GRANT_MINOR,
        ..RunArgs::new(scenario, targets.to_vec(), Some(args.database_url.clone()))
    };
    crate::run(&run_args).await
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

async fn start(server: &PathBuf, args: &DemoArgs, rung: &Rung) -> anyhow::Result<(Vec<String>, Instances)> {
    let prefix = format!("demo:{}:", uuid::Uuid::new_v4().simple());
    let signing_key = uuid::Uuid::new_v4().simple().to_string().repeat(2);
    let mut children = Instances(Vec::new());
    let mut targets = Vec::new();
    for index in 0..args.instances.max(1) {
        let port = free_port()?;
        let child = Command::new(server)
            .env("DATABASE_URL", &args.database_url)
            .env("REDIS_URL", &args.redis_url)
            .env("PORT", port.to_string())
            .env("RUST_LOG", "error")
            .env("WALLET_INSTANCE_ID", format!("demo-{index}"))
            .env("WALLET_ADMIN_HTTP_ADDR", "127.0.0.1:0")
            .env("WALLET_ACCOUNT_LIMITS_ENABLED", "false")
            .env("WALLET_TOKEN_SIGNING_KEY", &signing_key)
            .env("WALLET_REDIS_KEY_PREFIX", &prefix)
            .env("WALLET_SIGNUP_GRANT_MINOR", GRANT_MINOR.to_string())
            .env("WALLET_ALLOW_UNSAFE_DEMO_MODES", "true")
            .env("WALLET_NAIVE_WINDOW_MS", "50")
            .env("WALLET_COOLDOWN_ENABLED", rung.cooldown.to_string())
            .env("WALLET_IDEMPOTENCY_MODE", rung.idempotency)
            .env("WALLET_ROW_GUARD_MODE", rung.row_guard)
            .env("WALLET_IDEMPOTENCY_WAIT_MS_MAX", "5000")
            // The transfer statement encloses the idempotency wait and the
            // wallet-lock wait (3000 ms), plus a margin: the server refuses
            // to start with less.
            .env("WALLET_DB_STATEMENT_TIMEOUT_MS", "9000")
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("failed to start {}", server.display()))?;
        children.0.push(child);
        targets.push(format!("http://127.0.0.1:{port}"));
    }
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    for target in &targets {
        loop {
            if client
                .get(format!("{target}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
            {
                break;
            }
            if Instant::now() > deadline {
                bail!("{target} did not become ready in 30 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok((targets, children))
}
