//! The ladder for money that leaves: one payout order per round, through a
//! gateway that holds back the answer of every sending past the call's
//! time-out, so that every order meets the race a lost answer starts. Each
//! rung switches off one thing the outbox relies on; the gateway's own
//! ledger says how often each order's money left.

use std::time::Duration;

use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;
use wallet_client::{Client, IdempotencyKey, PayoutOrder, RetryPolicy};
use wallet_sim::instances::{Instances, free_port};
use wallet_sim::payout_run::{GatewayProcess, PayoutsOf, wait_for, wait_until_dispatched};

use super::{DemoArgs, spec};

struct PayoutRung {
    name: &'static str,
    payout_mode: &'static str,
    gateway_deduplicates: bool,
}

const PAYOUT_LADDER: [PayoutRung; 4] = [
    PayoutRung {
        name: "payouts: gateway called inside the transaction",
        payout_mode: "call_in_transaction",
        gateway_deduplicates: true,
    },
    PayoutRung {
        name: "payouts: outbox, a new key per attempt",
        payout_mode: "new_key_per_attempt",
        gateway_deduplicates: true,
    },
    PayoutRung {
        name: "payouts: outbox, one key, gateway without deduplication",
        payout_mode: "outbox",
        gateway_deduplicates: false,
    },
    PayoutRung {
        name: "payouts: outbox, one key, deduplicating gateway (all on)",
        payout_mode: "outbox",
        gateway_deduplicates: true,
    },
];

/// The instances' call time-out; the gateway holds every answer back twice
/// as long.
const CALL_TIMEOUT_MS: u64 = 300;
/// Gateway calls per payout, and the client's attempts per order.
const ATTEMPTS_MAX: u32 = 3;
/// What each order pays out.
const PAYOUT_MINOR: i64 = 100;
/// How long the ladder waits for a rung's payouts to leave the outbox.
const SETTLE_WAIT_S: u64 = 30;

#[derive(Serialize)]
pub(super) struct PayoutRow {
    configuration: &'static str,
    /// Orders whose money the gateway sent more than once.
    orders_paid_twice: i64,
    /// Money the gateway sent beyond one sending per order.
    extra_money_sent_minor: i64,
    /// Money the gateway sent for orders with no hold and no debit here.
    money_sent_without_a_debit_minor: i64,
    /// Requests the gateway received, and orders.
    gateway_requests: i64,
    orders: usize,
}

pub(super) async fn run(server: &std::path::Path, args: &DemoArgs) -> anyhow::Result<Vec<PayoutRow>> {
    let db = PgPool::connect(&args.database_url).await?;
    let gateway_url_of_db = gateway_database(&db, args).await?;
    let gateway_db = PgPool::connect(&gateway_url_of_db).await?;
    let gateway_bin = std::env::current_exe()?.with_file_name("wallet-sim");
    anyhow::ensure!(
        gateway_bin.exists(),
        "no wallet-sim at {}; build it (cargo build --workspace --bins)",
        gateway_bin.display()
    );
    let mut rows = Vec::new();
    for rung in &PAYOUT_LADDER {
        if !args.json {
            eprintln!("configuration: {}", rung.name);
        }
        let port = free_port()?;
        let gateway_url = format!("http://127.0.0.1:{port}");
        let mut gateway_args = vec![
            "--listen".to_owned(),
            format!("127.0.0.1:{port}"),
            "--database-url".to_owned(),
            gateway_url_of_db.clone(),
            "--lose-answer-rate".to_owned(),
            "1".to_owned(),
            "--lose-answer-ms".to_owned(),
            (2 * CALL_TIMEOUT_MS).to_string(),
        ];
        if !rung.gateway_deduplicates {
            gateway_args.push("--no-dedup".to_owned());
        }
        let _gateway = GatewayProcess::start(gateway_bin.clone(), gateway_args)?;
        wait_for(&format!("{gateway_url}/healthz")).await?;
        let rung_settings = [
            ("WALLET_PAYOUT_GATEWAY_URL", gateway_url),
            ("WALLET_PAYOUT_MODE", rung.payout_mode.to_owned()),
            ("WALLET_PAYOUT_CALL_TIMEOUT_MS", CALL_TIMEOUT_MS.to_string()),
            ("WALLET_PAYOUT_LEASE_MS", "2000".to_owned()),
            ("WALLET_PAYOUT_RETRY_BASE_MS", "50".to_owned()),
            ("WALLET_PAYOUT_RETRY_CAP_MS", "200".to_owned()),
            ("WALLET_PAYOUT_ATTEMPTS_MAX", ATTEMPTS_MAX.to_string()),
            ("WALLET_PAYOUT_DISPATCH_IDLE_MS", "50".to_owned()),
        ];
        let instances = Instances::start(spec(server, args, &rung_settings), args.instances).await?;
        let targets = instances.urls();
        let targets: Vec<&str> = targets.iter().map(String::as_str).collect();
        let client = Client::over(
            &targets,
            RetryPolicy {
                base: Duration::from_millis(50),
                cap: Duration::from_millis(200),
                attempts_max: ATTEMPTS_MAX,
                ..RetryPolicy::default()
            },
        )?;
        let run = &Uuid::new_v4().simple().to_string()[..8];
        let mut orders = Vec::new();
        for round in 0..args.rounds {
            let password = Uuid::new_v4().simple().to_string();
            let person = client
                .sign_up(&format!("payout-{run}-{round}"), &password)
                .await?;
            let order = PayoutOrder {
                from_wallet_id: person.wallet_id,
                amount_minor: PAYOUT_MINOR,
                destination: format!("order-{run}-{round}"),
            };
            // The client retries a 503 with the same key; the order's fate
            // is read from the ledgers below, whatever the client heard.
            let _ = client
                .with_token(&person.token)
                .pay_out(&order, IdempotencyKey::new())
                .await;
            orders.push(order);
        }
        let destinations: Vec<&str> = orders.iter().map(|order| order.destination.as_str()).collect();
        wait_until_dispatched(
            &db,
            PayoutsOf::Destinations(&destinations),
            Duration::from_secs(SETTLE_WAIT_S),
            async || Ok(()),
        )
        .await?;
        rows.push(measure(rung.name, &db, &gateway_db, &orders).await?);
    }
    Ok(rows)
}

/// The gateway's database: the one given, or the wallet's with `_gateway`
/// after its name, made if missing.
async fn gateway_database(db: &PgPool, args: &DemoArgs) -> anyhow::Result<String> {
    if let Some(url) = &args.gateway_database_url {
        return Ok(url.clone());
    }
    let (server, rest) = args
        .database_url
        .rsplit_once('/')
        .ok_or_else(|| anyhow::anyhow!("--database-url has no database name"))?;
    let (name, query) = rest
        .split_once('?')
        .map_or((rest, ""), |(name, query)| (name, query));
    let gateway = format!("{name}_gateway");
    let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
        .bind(&gateway)
        .fetch_one(db)
        .await?;
    if !exists {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{gateway}\"")))
            .execute(db)
            .await?;
    }
    Ok(if query.is_empty() {
        format!("{server}/{gateway}")
    } else {
        format!("{server}/{gateway}?{query}")
    })
}

/// Each order's sendings, from the gateway's ledger, against what the
/// wallets' ledger holds or debited for it.
async fn measure(
    configuration: &'static str,
    db: &PgPool,
    gateway_db: &PgPool,
    orders: &[PayoutOrder],
) -> anyhow::Result<PayoutRow> {
    let destinations: Vec<&str> = orders.iter().map(|order| order.destination.as_str()).collect();
    let sent: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT destination, count(*), sum(amount_minor)::bigint FROM gateway_sent
          WHERE destination = ANY($1) GROUP BY destination",
    )
    .bind(&destinations)
    .fetch_all(gateway_db)
    .await?;
    let gateway_requests: i64 =
        sqlx::query_scalar("SELECT count(*) FROM gateway_sent WHERE destination = ANY($1)")
            .bind(&destinations)
            .fetch_one(gateway_db)
            .await?;
    let held_or_debited: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT destination FROM payouts WHERE destination = ANY($1)")
            .bind(&destinations)
            .fetch_all(db)
            .await?;
    let mut row = PayoutRow {
        configuration,
        orders_paid_twice: 0,
        extra_money_sent_minor: 0,
        money_sent_without_a_debit_minor: 0,
        gateway_requests,
        orders: orders.len(),
    };
    for (destination, sendings, minor) in sent {
        if sendings > 1 {
            row.orders_paid_twice += 1;
            row.extra_money_sent_minor += minor - minor / sendings;
        }
        if !held_or_debited.contains(&destination) {
            row.money_sent_without_a_debit_minor += minor;
        }
    }
    Ok(row)
}

/// The ladder shows what it should: money sent twice, or without a debit,
/// at the bottom, and neither at the top.
pub(super) fn shows_the_ladder(rows: &[PayoutRow]) -> bool {
    let damage = |row: &PayoutRow| row.orders_paid_twice + row.money_sent_without_a_debit_minor;
    rows.first().is_some_and(|bottom| damage(bottom) > 0) && rows.last().is_some_and(|top| damage(top) == 0)
}

pub(super) fn print(rows: &[PayoutRow], args: &DemoArgs) {
    println!();
    println!(
        "Payout ladder: {} instances per configuration; {} payout orders of {PAYOUT_MINOR} minor units, the \
         gateway holding back every sending's answer past the {CALL_TIMEOUT_MS} ms call time-out",
        args.instances, args.rounds
    );
    println!();
    println!(
        "| configuration | orders paid more than once | extra money sent (minor units) | money sent without a debit (minor units) | gateway sendings |"
    );
    println!("|---|---|---|---|---|");
    for row in rows {
        println!(
            "| {} | {} | {} | {} | {} for {} orders |",
            row.configuration,
            row.orders_paid_twice,
            row.extra_money_sent_minor,
            row.money_sent_without_a_debit_minor,
            row.gateway_requests,
            row.orders
        );
    }
}
