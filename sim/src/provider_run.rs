//! `wallet-sim provider`: a payment provider that misbehaves on purpose
//! against instances this program starts, then the database's verdict.
//!
//! Each event is delivered in one of four ways, in turn:
//!
//! - **storm**: `copies` deliveries at the same moment, spread over every
//!   instance, then redeliveries until a final answer;
//! - **impatient**: a first delivery that gives up after
//!   `impatient_timeout_ms`, shorter than the service takes, and the
//!   redeliveries the retry policy makes while it is still being applied;
//! - **changed**: delivered, then the same event id with another amount
//!   (which must be refused and credit nothing), then the event again;
//! - **late**: held back until every other event was delivered, then
//!   delivered newest first, each twice.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use futures::StreamExt;
use layered_wallet::decision::Decision;
use rand::Rng;
use secrecy::SecretString;
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;
use wallet_client::RetryPolicy;

use crate::accounts::{self, Account};
use crate::checks::Checks;
use crate::instances::{Instances, Stores};
use crate::provider::{self, Attempts, DepositEvent, Provider};

#[derive(Debug, Clone, clap::Args)]
pub struct ProviderArgs {
    #[command(flatten)]
    pub stores: Stores,
    #[arg(long, default_value_t = 2)]
    pub instances: usize,
    /// Accounts the deposits go to.
    #[arg(long, default_value_t = 20)]
    pub accounts: usize,
    #[arg(long, default_value_t = 400)]
    pub events: usize,
    /// Deliveries of a storm event at the same moment.
    #[arg(long, default_value_t = 10)]
    pub copies: usize,
    /// Events being delivered at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// How long an impatient first delivery waits for its answer.
    #[arg(long, default_value_t = 2)]
    pub impatient_timeout_ms: u64,
    /// The retry policy's first backoff ceiling; short, so that
    /// redeliveries overlap the delivery they retry.
    #[arg(long, default_value_t = 10)]
    pub backoff_base_ms: u64,
    /// The instances' edge lock (`event_lock_enabled`); off, every
    /// duplicate reaches the inbox.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub event_lock: bool,
    /// The instances' inbox (`inbox_mode`): `check_then_insert`, the naive
    /// one, shows the double credits the checks then find.
    #[arg(long, default_value = "atomic")]
    pub inbox: String,
    /// How the provider signs: `provider-signature` (ours) or
    /// `standard-webhooks`.
    #[arg(long, value_enum, default_value_t = SignatureScheme::ProviderSignature)]
    pub scheme: SignatureScheme,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The two ways a provider may sign a deposit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SignatureScheme {
    /// `Provider-Signature: t=…,v1=…`.
    #[default]
    ProviderSignature,
    /// `webhook-id`, `webhook-timestamp`, `webhook-signature`, under a
    /// `whsec_` secret.
    StandardWebhooks,
}

impl SignatureScheme {
    /// A fresh secret of this scheme, shared by the provider and the
    /// instances.
    fn new_secret(self) -> String {
        match self {
            Self::ProviderSignature => format!("sim-provider-{}", Uuid::new_v4().simple()),
            Self::StandardWebhooks => {
                let key: [u8; 32] = rand::thread_rng().r#gen();
                format!(
                    "{}{}",
                    layered_wallet::settings::STANDARD_WEBHOOKS_SECRET_PREFIX,
                    base64::engine::general_purpose::STANDARD.encode(key)
                )
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
enum Misbehaviour {
    Storm,
    Impatient,
    Changed,
    Late,
}

const MISBEHAVIOURS: [Misbehaviour; 4] = [
    Misbehaviour::Storm,
    Misbehaviour::Impatient,
    Misbehaviour::Changed,
    Misbehaviour::Late,
];

/// One event's story: what was sent, and every answer.
struct Delivered {
    event: DepositEvent,
    misbehaviour: Misbehaviour,
    attempts: Attempts,
    /// Answers to the changed payload (the `changed` misbehaviour only).
    changed: Attempts,
}

#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub instances: usize,
    pub event_lock: bool,
    pub scheme: SignatureScheme,
    pub events: usize,
    pub deliveries: usize,
    /// Deliveries that got no answer in time (the provider's time-outs).
    pub unanswered: usize,
    /// Answers by status, e.g. `200`, `409`.
    pub by_status: Vec<(u16, usize)>,
    /// Answers by the layer and outcome that decided, e.g. `edge_lock/replayed`.
    pub by_decision: Vec<(String, usize)>,
    pub most_deliveries_of_one_event: usize,
    pub seconds: f64,
    pub checks: Checks,
}

pub async fn run(args: &ProviderArgs) -> anyhow::Result<Report> {
    let secret = args.scheme.new_secret();
    let spec = args
        .stores
        .spec("sim-provider")?
        .with("WALLET_PROVIDER_WEBHOOK_SECRETS", &secret)
        .with("WALLET_EVENT_LOCK_ENABLED", args.event_lock)
        .with("WALLET_INBOX_MODE", &args.inbox)
        .with("WALLET_ALLOW_UNSAFE_DEMO_MODES", args.inbox != "atomic")
        .with("WALLET_NAIVE_WINDOW_MS", 50);
    let servers = Instances::start(spec, args.instances).await?;
    let db = PgPool::connect(&args.stores.database_url).await?;
    let accounts = accounts::sign_up(&servers.urls(), args.accounts.max(1)).await?;
    let currency = accounts::currency_of(&db, &accounts[0]).await?;
    let opening = accounts::balances(&db, &accounts).await?;

    let policy = RetryPolicy {
        base: Duration::from_millis(args.backoff_base_ms),
        cap: Duration::from_secs(2),
        attempts_max: 10,
        request_timeout: Duration::from_secs(10),
        call_time_max: Duration::from_secs(60),
        jitter: true,
    };
    let provider = Provider::new(servers.urls(), SecretString::from(secret), policy)?;
    let events: Vec<(DepositEvent, Misbehaviour)> = (0..args.events)
        .map(|n| {
            let account = accounts[rand::thread_rng().gen_range(0..accounts.len())];
            let amount = rand::thread_rng().gen_range(1..=10_000);
            (
                DepositEvent::new(account.wallet_id, amount, &currency),
                MISBEHAVIOURS[n % MISBEHAVIOURS.len()],
            )
        })
        .collect();

    let started = Instant::now();
    let (late, now): (Vec<_>, Vec<_>) = events
        .into_iter()
        .partition(|(_, misbehaviour)| *misbehaviour == Misbehaviour::Late);
    let args_shared = Arc::new(args.clone());
    let mut delivered: Vec<Delivered> = futures::stream::iter(now)
        .map(|(event, misbehaviour)| {
            let (provider, args) = (provider.clone(), args_shared.clone());
            async move { deliver(&provider, &args, event, misbehaviour).await }
        })
        .buffer_unordered(args.concurrency.max(1))
        .collect()
        .await;
    // The held-back events, newest first, each delivered twice.
    for (event, misbehaviour) in late.into_iter().rev() {
        delivered.push(deliver(&provider, args, event, misbehaviour).await);
    }
    let seconds = started.elapsed().as_secs_f64();

    let mut report = tally(&delivered, servers.len(), seconds);
    report.event_lock = args.event_lock;
    report.scheme = args.scheme;
    check_answers(&delivered, &mut report.checks);
    let events: Vec<DepositEvent> = delivered.iter().map(|one| one.event.clone()).collect();
    check_credits(&db, &accounts, &opening, &events, &mut report.checks).await?;
    Ok(report)
}

async fn deliver(
    provider: &Provider,
    args: &ProviderArgs,
    event: DepositEvent,
    misbehaviour: Misbehaviour,
) -> Delivered {
    let patient = Duration::from_secs(10);
    let first = rand::thread_rng().gen_range(0..provider.targets());
    let mut attempts = Attempts::default();
    let mut changed = Attempts::default();
    match misbehaviour {
        Misbehaviour::Storm => {
            attempts.deliveries = provider.storm(&event, args.copies, patient).await;
            if attempts.deliveries.iter().any(|delivery| delivery.is_retried()) {
                attempts
                    .deliveries
                    .extend(provider.deliver(first, &event, patient).await.deliveries);
            }
        }
        Misbehaviour::Impatient => {
            let impatient = Duration::from_millis(args.impatient_timeout_ms);
            attempts
                .deliveries
                .push(provider.deliver_once(first, &event, impatient).await);
            attempts
                .deliveries
                .extend(provider.deliver(first + 1, &event, patient).await.deliveries);
        }
        Misbehaviour::Changed => {
            attempts = provider.deliver(first, &event, patient).await;
            changed = provider.deliver(first + 1, &event.changed(), patient).await;
            attempts
                .deliveries
                .extend(provider.deliver(first, &event, patient).await.deliveries);
        }
        Misbehaviour::Late => {
            attempts = provider.deliver(first, &event, patient).await;
            attempts
                .deliveries
                .extend(provider.deliver(first + 1, &event, patient).await.deliveries);
        }
    }
    Delivered {
        event,
        misbehaviour,
        attempts,
        changed,
    }
}

fn tally(delivered: &[Delivered], instances: usize, seconds: f64) -> Report {
    let mut by_status: HashMap<u16, usize> = HashMap::new();
    let mut by_decision: HashMap<String, usize> = HashMap::new();
    let mut report = Report {
        instances,
        events: delivered.len(),
        seconds,
        ..Report::default()
    };
    for one in delivered {
        let all = one.attempts.deliveries.iter().chain(&one.changed.deliveries);
        report.most_deliveries_of_one_event = report
            .most_deliveries_of_one_event
            .max(one.attempts.deliveries.len() + one.changed.deliveries.len());
        for delivery in all {
            report.deliveries += 1;
            match delivery.status {
                None => report.unanswered += 1,
                Some(status) => *by_status.entry(status).or_default() += 1,
            }
            if let Some(Decision { layer, outcome }) = delivery.decision {
                *by_decision.entry(format!("{layer}/{outcome}")).or_default() += 1;
            }
        }
    }
    report.by_status = sorted(by_status);
    report.by_decision = sorted(by_decision);
    report
}

fn sorted<K: Ord, V>(map: HashMap<K, V>) -> Vec<(K, V)> {
    let mut pairs: Vec<(K, V)> = map.into_iter().collect();
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    pairs
}

/// What the provider saw: a final answer for every event, one body for
/// every answer of an event, and every changed payload refused.
fn check_answers(delivered: &[Delivered], checks: &mut Checks) {
    provider::check_answers(delivered.iter().map(|one| &one.attempts), checks);
    let changed_not_refused = delivered
        .iter()
        .filter(|one| {
            one.misbehaviour == Misbehaviour::Changed
                && one.changed.last().is_none_or(|answer| answer.status != Some(422))
        })
        .count();
    checks.add(
        "changed payloads not refused with 422",
        i64::try_from(changed_not_refused).unwrap_or(i64::MAX),
    );
}

/// What the database holds: each event credited exactly once, for its
/// first payload, and nothing else credited into `accounts`, whose
/// balances were `opening` before the first event and which no other money
/// reached since.
pub async fn check_credits(
    db: &PgPool,
    accounts: &[Account],
    opening: &[i64],
    events: &[DepositEvent],
    checks: &mut Checks,
) -> anyhow::Result<()> {
    let event_ids: Vec<&str> = events.iter().map(|event| event.event_id.as_str()).collect();
    let amounts: Vec<i64> = events.iter().map(|event| event.amount_minor).collect();
    let wallets: Vec<Uuid> = events.iter().map(|event| event.wallet_id).collect();
    // Every event, against its inbox row and the transfer the row names.
    let (missing, not_credited, wrong_credit): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE i.event_id IS NULL),
                count(*) FILTER (WHERE i.event_id IS NOT NULL AND i.verdict IS DISTINCT FROM 'credited'),
                count(*) FILTER (WHERE i.verdict = 'credited' AND (t.id IS NULL
                    OR t.amount_minor <> e.amount OR t.to_wallet_id <> e.wallet))
         FROM unnest($1::text[], $2::bigint[], $3::uuid[]) AS e(event_id, amount, wallet)
         LEFT JOIN inbox i ON i.source = 'provider' AND i.event_id = e.event_id
         LEFT JOIN transfers t ON t.id = i.transfer_id",
    )
    .bind(&event_ids)
    .bind(&amounts)
    .bind(&wallets)
    .fetch_one(db)
    .await?;
    checks.add("events without an inbox row", missing);
    checks.add("events not credited", not_credited);
    checks.add(
        "credits for another amount or wallet than the event's first payload",
        wrong_credit,
    );

    // Every credit into the run's wallets, against the events.
    let run_wallets: Vec<Uuid> = accounts.iter().map(|account| account.wallet_id).collect();
    let credits: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM transfers t JOIN wallets c ON c.id = t.from_wallet_id
         WHERE c.clearing_source = 'provider' AND t.to_wallet_id = ANY($1)",
    )
    .bind(&run_wallets)
    .fetch_one(db)
    .await?;
    checks.add(
        "credits beyond one per event",
        credits - i64::try_from(events.len())?,
    );
    let now = accounts::balances(db, accounts).await?;
    let mut expected: HashMap<Uuid, i64> = HashMap::new();
    for event in events {
        *expected.entry(event.wallet_id).or_default() += event.amount_minor;
    }
    let wrong_balances = accounts
        .iter()
        .zip(opening.iter().zip(&now))
        .filter(|(account, (before, after))| {
            *after - *before != expected.get(&account.wallet_id).copied().unwrap_or(0)
        })
        .count();
    checks.add(
        "wallets whose balance grew by other than their events' amounts",
        i64::try_from(wrong_balances)?,
    );
    let users: Vec<Uuid> = accounts.iter().map(|account| account.user_id).collect();
    checks.money_invariants(db, &users).await
}

pub fn print(report: &Report) {
    println!();
    println!(
        "Provider run: {} events over {} instances (edge lock {}, signed with {}), {} deliveries in {:.1} s ({} \
         unanswered in time; at most {} deliveries of one event)",
        report.events,
        report.instances,
        if report.event_lock { "on" } else { "off" },
        match report.scheme {
            SignatureScheme::ProviderSignature => "Provider-Signature",
            SignatureScheme::StandardWebhooks => "Standard Webhooks",
        },
        report.deliveries,
        report.seconds,
        report.unanswered,
        report.most_deliveries_of_one_event
    );
    println!();
    println!("| answered | deliveries |");
    println!("|---|---|");
    for (status, count) in &report.by_status {
        println!("| {status} | {count} |");
    }
    println!();
    println!("| decided by | deliveries |");
    println!("|---|---|");
    for (decision, count) in &report.by_decision {
        println!("| {decision} | {count} |");
    }
    println!();
    report.checks.print();
}
