//! `wallet-loadtest demo`: the defense ladder. Starts instances in each
//! configuration, from everything off and naive to all three layers, runs
//! the same duplicate and race scenarios against each, and prints what went
//! wrong where.

use std::path::{Path, PathBuf};

use anyhow::Context;
use layered_wallet::decision::Layer;
use serde::Serialize;
use wallet_sim::instances::{Instances, Spec};
use wallet_sim::provider::{DepositEvent, Provider};

use crate::scenarios::Scenario;

mod payouts;
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
    /// The bank gateway simulator's own database, for the payout ladder.
    /// Default: the database of `--database-url` with `_gateway` after its
    /// name, made if missing.
    #[arg(long, env = "LOADTEST_GATEWAY_DATABASE_URL")]
    gateway_database_url: Option<String>,
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

pub async fn run(args: &DemoArgs) -> anyhow::Result<bool> {
    let server = wallet_sim::instances::server_binary(args.server_bin.as_deref())?;
    let mut rows = Vec::new();
    for rung in &LADDER {
        if !args.json {
            eprintln!("configuration: {}", rung.name);
        }
        let rung_settings = [
            ("WALLET_COOLDOWN_ENABLED", rung.cooldown.to_string()),
            ("WALLET_IDEMPOTENCY_MODE", rung.idempotency.to_owned()),
            ("WALLET_ROW_GUARD_MODE", rung.row_guard.to_owned()),
        ];
        let instances = Instances::start(spec(&server, args, &rung_settings), args.instances).await?;
        let targets = instances.urls();
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
    let deliveries = run_deliveries(&server, args).await?;
    let payouts = payouts::run(&server, args).await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "transfers": rows, "deliveries": deliveries, "payouts": payouts })
            )?
        );
    } else {
        print_rows(&rows, args);
        print_delivery_rows(&deliveries, args);
        payouts::print(&payouts, args);
    }
    // Each ladder succeeds when its naive bottom shows damage and its top
    // shows none.
    let damage = |row: &Row| {
        row.keys_paid_twice + row.keyless_double_pays + row.overdrafts + row.money_created_minor.abs()
    };
    let credit_damage = |row: &DeliveryRow| row.events_credited_twice + row.money_credited_twice_minor;
    let shows = |bottom: i64, top: i64| bottom > 0 && top == 0;
    Ok(shows(damage(&rows[0]), damage(&rows[rows.len() - 1]))
        && shows(
            credit_damage(&deliveries[0]),
            credit_damage(&deliveries[deliveries.len() - 1]),
        )
        && payouts::shows_the_ladder(&payouts))
}

/// The ladder for money that arrives: a provider's storm of one deposit
/// event per round, `copies` deliveries at once over the instances.
struct DeliveryRung {
    name: &'static str,
    event_lock: bool,
    inbox: &'static str,
}

const DELIVERY_LADDER: [DeliveryRung; 3] = [
    DeliveryRung {
        name: "deliveries: edge lock off, naive inbox",
        event_lock: false,
        inbox: "check_then_insert",
    },
    DeliveryRung {
        name: "deliveries: + inbox",
        event_lock: false,
        inbox: "atomic",
    },
    DeliveryRung {
        name: "deliveries: + edge lock (all on)",
        event_lock: true,
        inbox: "atomic",
    },
];

/// What each deposit event of the delivery ladder credits.
const DEPOSIT_MINOR: i64 = 100;

#[derive(Serialize)]
struct DeliveryRow {
    configuration: &'static str,
    /// Events credited more than once.
    events_credited_twice: i64,
    /// Money credited beyond one credit per event.
    money_credited_twice_minor: i64,
    /// Deliveries that got past the edge lock, i.e. reached PostgreSQL.
    deliveries_reaching_database: u64,
    deliveries: u64,
}

async fn run_deliveries(server: &Path, args: &DemoArgs) -> anyhow::Result<Vec<DeliveryRow>> {
    let db = sqlx::PgPool::connect(&args.database_url).await?;
    let mut rows = Vec::new();
    for rung in &DELIVERY_LADDER {
        if !args.json {
            eprintln!("configuration: {}", rung.name);
        }
        let secret = format!("demo-provider-{}", uuid::Uuid::new_v4().simple());
        let rung_settings = [
            ("WALLET_PROVIDER_WEBHOOK_SECRETS", secret.clone()),
            ("WALLET_EVENT_LOCK_ENABLED", rung.event_lock.to_string()),
            ("WALLET_INBOX_MODE", rung.inbox.to_owned()),
        ];
        let instances = Instances::start(spec(server, args, &rung_settings), args.instances).await?;
        let accounts = wallet_sim::accounts::sign_up(&instances.urls(), args.rounds).await?;
        let currency = wallet_sim::accounts::currency_of(&db, &accounts[0]).await?;
        let provider = Provider::new(
            instances.urls(),
            secrecy::SecretString::from(secret),
            wallet_client::RetryPolicy::default(),
        )?;
        let mut row = DeliveryRow {
            configuration: rung.name,
            events_credited_twice: 0,
            money_credited_twice_minor: 0,
            deliveries_reaching_database: 0,
            deliveries: 0,
        };
        // One event per round, into an account of its own, so that the
        // account's credits are that event's.
        for account in &accounts {
            let event = DepositEvent::new(account.wallet_id, DEPOSIT_MINOR, &currency);
            let deliveries = provider
                .storm(&event, args.copies, std::time::Duration::from_secs(10))
                .await;
            row.deliveries += deliveries.len() as u64;
            row.deliveries_reaching_database += deliveries
                .iter()
                .filter(|delivery| delivery.status.is_some() && delivery.layer() != Some(Layer::EdgeLock))
                .count() as u64;
            let credits: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM transfers t JOIN wallets c ON c.id = t.from_wallet_id
                 WHERE c.clearing_source = 'provider' AND t.to_wallet_id = $1",
            )
            .bind(account.wallet_id)
            .fetch_one(&db)
            .await?;
            if credits > 1 {
                row.events_credited_twice += 1;
                row.money_credited_twice_minor += (credits - 1) * DEPOSIT_MINOR;
            }
        }
        rows.push(row);
    }
    Ok(rows)
}

fn print_delivery_rows(rows: &[DeliveryRow], args: &DemoArgs) {
    println!();
    println!(
        "Deposit ladder: {} instances per configuration; {} deposit events, each delivered {} times at once",
        args.instances, args.rounds, args.copies
    );
    println!();
    println!(
        "| configuration | events credited more than once | money credited more than once (minor units) | deliveries reaching PostgreSQL |"
    );
    println!("|---|---|---|---|");
    for row in rows {
        println!(
            "| {} | {} | {} | {} of {} |",
            row.configuration,
            row.events_credited_twice,
            row.money_credited_twice_minor,
            row.deliveries_reaching_database,
            row.deliveries
        );
    }
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

/// The settings every instance of the ladder shares, and a rung's.
fn spec(server: &Path, args: &DemoArgs, rung_settings: &[(&str, String)]) -> Spec {
    let mut spec = demonstration_spec(
        Spec::new(server.to_owned(), &args.database_url, &args.redis_url, "demo"),
        GRANT_MINOR,
    )
    .with("WALLET_NAIVE_WINDOW_MS", 50);
    for (name, value) in rung_settings {
        spec = spec.with(name, value);
    }
    spec
}

/// What every instance that demonstrates an unsafe mode needs: the modes
/// allowed, each user's grant, and time for a copy to wait for its key.
pub(crate) fn demonstration_spec(spec: Spec, grant_minor: i64) -> Spec {
    spec.with("WALLET_SIGNUP_GRANT_MINOR", grant_minor)
        .with("WALLET_ALLOW_UNSAFE_DEMO_MODES", true)
        .with("WALLET_IDEMPOTENCY_WAIT_MS_MAX", 5000)
        // The transfer statement encloses the idempotency wait and the
        // wallet-lock wait (3000 ms), plus a margin: the server refuses
        // to start with less.
        .with("WALLET_DB_STATEMENT_TIMEOUT_MS", 9000)
}
