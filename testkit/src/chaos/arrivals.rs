//! The chaos suite for money that arrives. The same private deployment as
//! the transfer storm, its instances also receiving a payment provider's
//! deposit webhooks and consuming a broker's transfer commands, with one
//! fault in the middle: a consumer killed or stalled past the claim time,
//! Redis killed and started again from its append-only file, PostgreSQL
//! restarted. Afterwards the database must show every event credited
//! exactly once and every command applied at most once, exactly once when
//! its outcome is stored, and nothing lost: the checks `wallet-sim` makes.
//!
//! The provider behaves as a provider does: it retries a delivery that
//! timed out or got a 5xx, on the next instance, until it gets a final
//! answer. The issuer republishes a command only when, after the streams
//! have drained, it has no outcome: what the documentation asks of an
//! issuer after a Redis failure.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use layered_wallet::command::{Command, Streams, new_command_id};
use layered_wallet::domain::WalletId;
use layered_wallet::settings::StoreErrorPolicy;
use rand::Rng;
use secrecy::SecretString;
use wallet_client::RetryPolicy;
use wallet_sim::accounts::{self, Account};
use wallet_sim::broker_run::{self, Published};
use wallet_sim::checks::Checks;
use wallet_sim::provider::{self, Attempts, DepositEvent, Provider};
use wallet_sim::provider_run;

use super::SETTLE_SECONDS_MAX;
use super::deployment::{Deployment, Extras};
use super::report::{assert_checks_held, counted, publish_row};
use super::scale::Scale;
use crate::private_stores::PgStopMode;

/// The provider's signing secret in the arrivals deployment.
const ARRIVALS_PROVIDER_SECRET: &str = "chaos-provider-secret-chaos-provider-secret-0123";
/// The consumers' claim time: short, so that a stall outlasts it.
const ARRIVALS_CLAIM_IDLE_MS: u64 = 1_000;
const ARRIVALS_PARTITIONS: u16 = 4;
/// Accounts deposits go to, and accounts commands move money among: apart,
/// so that each check knows all the money its accounts saw.
const DEPOSIT_ACCOUNTS: usize = 6;
const COMMAND_ACCOUNTS: usize = 6;
/// The largest command; the accounts' grant covers thousands of them.
const COMMAND_MINOR_MAX: i64 = 5_000;
/// How long the provider waits for one delivery's answer before it
/// redelivers to the next instance: shorter than a stall.
const DELIVERY_TIMEOUT_MS: u64 = 1_500;
/// Provider loops delivering at once.
const PROVIDERS: usize = 4;
/// Every n-th event is first delivered as a storm of this many copies.
const STORM_EVERY: usize = 3;
const STORM_COPIES: usize = 3;
/// Every n-th command is published twice.
const DUPLICATE_EVERY: usize = 5;
/// The issuer's pause between publications.
const PUBLISH_PAUSE_MS: u64 = 15;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrivalFault {
    /// One instance (a consumer, and a webhook receiver) gets SIGKILL and is
    /// started again.
    ConsumerKilled,
    /// One instance gets SIGSTOP for twice the claim time, then SIGCONT.
    ConsumerStalled,
    /// Redis (append-only file on, `appendfsync everysec`) gets SIGKILL and
    /// is started again on its files.
    RedisRestarted,
    /// `pg_ctl stop -m fast`, then start.
    PostgresRestarted,
}

impl ArrivalFault {
    pub const ALL: [ArrivalFault; 4] = [
        ArrivalFault::ConsumerKilled,
        ArrivalFault::ConsumerStalled,
        ArrivalFault::RedisRestarted,
        ArrivalFault::PostgresRestarted,
    ];

    pub fn describe(self) -> &'static str {
        match self {
            ArrivalFault::ConsumerKilled => "one instance `kill -9`, then start",
            ArrivalFault::ConsumerStalled => "one instance stalled (`SIGSTOP`) for twice the claim time",
            ArrivalFault::RedisRestarted => "Redis `kill -9`, then start from its append-only file",
            ArrivalFault::PostgresRestarted => "PostgreSQL `stop -m fast`, then start",
        }
    }
}

/// What a run of the arrivals storm came to.
#[derive(Debug)]
pub struct ArrivalsReport {
    pub fault: ArrivalFault,
    pub events: usize,
    pub deliveries: usize,
    /// Deliveries the provider stopped waiting for.
    pub unanswered: usize,
    pub commands: usize,
    pub publications: usize,
    /// Commands the issuer published again after the streams drained
    /// without their outcome.
    pub republished: usize,
    /// Outcomes by verdict.
    pub outcomes: Vec<(String, i64)>,
    pub checks: Checks,
    pub logs: PathBuf,
}

impl ArrivalsReport {
    /// Panics with every check that found something.
    pub fn assert_held(&self) {
        assert_checks_held(
            &self.checks,
            self.fault.describe(),
            &self.markdown_row(),
            &self.logs,
        );
    }

    /// One row of the arrivals table in `docs/reliability.md`.
    pub fn markdown_row(&self) -> String {
        format!(
            "| {} | {} ({} deliveries, {} unanswered in time) | {} ({} publications, {} republished): {} | {} |",
            self.fault.describe(),
            self.events,
            self.deliveries,
            self.unanswered,
            self.commands,
            self.publications,
            self.republished,
            counted(&self.outcomes),
            self.checks.at_zero(),
        )
    }

    /// Prints the row, and writes it for `scripts/chaos` (`publish_row`).
    pub fn publish(&self) {
        let place = ArrivalFault::ALL
            .iter()
            .position(|f| *f == self.fault)
            .unwrap_or(ArrivalFault::ALL.len());
        publish_row("arrivals-", ARRIVALS_REPORT_HEADER, place, &self.markdown_row());
    }
}

/// The arrivals table's header, matching `markdown_row`.
pub const ARRIVALS_REPORT_HEADER: &str =
    "| fault | deposit events | commands: outcomes | database checks at zero |\n|---|---|---|---|";

/// Starts a deployment that takes deposits and consumes commands, runs the
/// provider and the issuer with `fault` in the middle, and checks.
pub async fn run_arrivals(binary: PathBuf, fault: ArrivalFault, scale: Scale) -> ArrivalsReport {
    let extras = Extras {
        env: [
            (
                "WALLET_PROVIDER_WEBHOOK_SECRETS",
                ARRIVALS_PROVIDER_SECRET.to_owned(),
            ),
            ("WALLET_COMMANDS_ENABLED", "true".to_owned()),
            ("WALLET_COMMANDS_PARTITIONS", ARRIVALS_PARTITIONS.to_string()),
            (
                "WALLET_COMMANDS_CLAIM_IDLE_MS",
                ARRIVALS_CLAIM_IDLE_MS.to_string(),
            ),
            ("WALLET_COMMANDS_READ_WAIT_MS", "100".to_owned()),
            ("WALLET_COMMANDS_RETRY_BACKOFF_MS", "100".to_owned()),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect(),
        redis_args: vec!["--appendonly", "yes", "--appendfsync", "everysec"],
        replicated: None,
    };
    let mut deployment =
        Deployment::start_with(binary, scale.instances, StoreErrorPolicy::FailOpen, extras).await;
    let depositors = sign_up(&deployment, "dep", DEPOSIT_ACCOUNTS).await;
    let payers = sign_up(&deployment, "pay", COMMAND_ACCOUNTS).await;
    let db = deployment.db.clone();
    let currency = accounts::currency_of(&db, &depositors[0])
        .await
        .expect("the currency");
    let opening_deposits = accounts::balances(&db, &depositors).await.expect("balances");
    let opening_commands = accounts::balances(&db, &payers).await.expect("balances");
    let urls: Vec<String> = deployment.instances.iter().map(|i| i.url("")).collect();
    let provider = Provider::new(
        urls,
        SecretString::from(ARRIVALS_PROVIDER_SECRET),
        RetryPolicy {
            base: Duration::from_millis(50),
            cap: Duration::from_secs(1),
            attempts_max: u32::MAX,
            request_timeout: Duration::from_millis(DELIVERY_TIMEOUT_MS),
            call_time_max: Duration::from_secs(SETTLE_SECONDS_MAX),
            jitter: true,
        },
    )
    .expect("a provider");
    let streams = Streams::new("chaos:", ARRIVALS_PARTITIONS);
    let redis = redis::aio::ConnectionManager::new(
        redis::Client::open(deployment.redis.url()).expect("the private Redis's URL"),
    )
    .await
    .expect("connect to the private Redis");

    let stop = Arc::new(AtomicBool::new(false));
    let delivered: Arc<Mutex<Vec<(DepositEvent, Attempts)>>> = Arc::default();
    let providers: Vec<_> = (0..PROVIDERS)
        .map(|number| {
            let (provider, stop, delivered) = (provider.clone(), stop.clone(), delivered.clone());
            let (depositors, currency) = (depositors.clone(), currency.clone());
            tokio::spawn(async move {
                let mut n = number;
                while !stop.load(Ordering::SeqCst) {
                    let account = depositors[n % depositors.len()];
                    let event = DepositEvent::new(account.wallet_id, 1 + (n as i64 % 97), &currency);
                    let mut attempts = Attempts::default();
                    if n % STORM_EVERY == 0 {
                        attempts.deliveries = provider
                            .storm(&event, STORM_COPIES, Duration::from_millis(DELIVERY_TIMEOUT_MS))
                            .await;
                    }
                    let timeout = Duration::from_millis(DELIVERY_TIMEOUT_MS);
                    attempts
                        .deliveries
                        .extend(provider.deliver(n, &event, timeout).await.deliveries);
                    delivered.lock().expect("delivered").push((event, attempts));
                    n += PROVIDERS;
                }
            })
        })
        .collect();
    let issuer = {
        let (stop, payers, streams, redis) = (stop.clone(), payers.clone(), streams.clone(), redis.clone());
        tokio::spawn(async move { issue(stop, payers, streams, redis).await })
    };

    tokio::time::sleep(scale.before_fault).await;
    let stall = Duration::from_millis(2 * ARRIVALS_CLAIM_IDLE_MS).max(scale.fault_length);
    match fault {
        ArrivalFault::ConsumerKilled => {
            deployment.instances[0].kill_9();
            tokio::time::sleep(scale.fault_length).await;
            deployment.instances[0].start_again().await;
        }
        ArrivalFault::ConsumerStalled => {
            deployment.instances[0].stall();
            tokio::time::sleep(stall).await;
            deployment.instances[0].resume();
        }
        ArrivalFault::RedisRestarted => {
            deployment.redis.kill();
            tokio::time::sleep(scale.fault_length).await;
            tokio::task::block_in_place(|| deployment.redis.start_again());
        }
        ArrivalFault::PostgresRestarted => {
            tokio::task::block_in_place(|| deployment.server().stop(PgStopMode::Fast));
            tokio::time::sleep(scale.fault_length).await;
            tokio::task::block_in_place(|| deployment.server().start_again());
        }
    }
    tokio::time::sleep(scale.after_fault).await;
    stop.store(true, Ordering::SeqCst);
    for provider in providers {
        provider.await.expect("a provider loop");
    }
    let (published, publications) = issuer.await.expect("the issuer");
    let delivered = std::mem::take(&mut *delivered.lock().expect("delivered"));

    // A provider keeps redelivering an event until it gets a final answer.
    let mut delivered = delivered;
    for (event, attempts) in &mut delivered {
        if attempts.last().is_none() {
            let timeout = Duration::from_millis(DELIVERY_TIMEOUT_MS);
            attempts
                .deliveries
                .extend(provider.deliver(0, event, timeout).await.deliveries);
        }
    }

    // The issuer waits for every outcome; after the streams drain, it
    // publishes again what has none.
    let mut connection = redis::Client::open(deployment.redis.url())
        .expect("URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the private Redis");
    let mut republished = 0;
    if broker_run::settle(&db, &mut connection, &streams, &published, SETTLE_SECONDS_MAX)
        .await
        .is_err()
    {
        republished = republish_without_outcome(&db, &mut connection, &streams, &published).await;
        broker_run::settle(&db, &mut connection, &streams, &published, SETTLE_SECONDS_MAX)
            .await
            .unwrap_or_else(|error| panic!("under {}: {error}", fault.describe()));
    }

    let mut checks = Checks::default();
    check_answers(&delivered, &mut checks);
    let events: Vec<DepositEvent> = delivered.iter().map(|(event, _)| event.clone()).collect();
    provider_run::check_credits(&db, &depositors, &opening_deposits, &events, &mut checks)
        .await
        .expect("the deposits' checks");
    let settled = broker_run::check_commands(
        &db,
        &mut connection,
        &streams,
        &payers,
        &opening_commands,
        &published,
        0,
        &mut checks,
    )
    .await
    .expect("the commands' checks");
    ArrivalsReport {
        fault,
        events: delivered.len(),
        deliveries: delivered.iter().map(|(_, a)| a.deliveries.len()).sum(),
        unanswered: delivered
            .iter()
            .flat_map(|(_, a)| &a.deliveries)
            .filter(|delivery| delivery.status.is_none())
            .count(),
        commands: published.len(),
        publications,
        republished,
        outcomes: settled.outcomes,
        checks,
        logs: deployment.logs.path().to_path_buf(),
    }
}

async fn sign_up(deployment: &Deployment, what: &str, count: usize) -> Vec<Account> {
    let mut accounts = Vec::with_capacity(count);
    for number in 0..count {
        let user = deployment.sign_up(&format!("{what}{number}")).await;
        accounts.push(Account {
            user_id: user.user_id,
            wallet_id: user.wallet_id,
        });
    }
    accounts
}

/// The issuer: commands among `payers` until told to stop, every
/// `DUPLICATE_EVERY`-th published twice, each publication retried until
/// Redis takes it. Returns each command once, and the publications made.
async fn issue(
    stop: Arc<AtomicBool>,
    payers: Vec<Account>,
    streams: Streams,
    mut redis: redis::aio::ConnectionManager,
) -> (Vec<Published>, usize) {
    let mut published = Vec::new();
    let mut publications = 0;
    let mut n = 0usize;
    while !stop.load(Ordering::SeqCst) {
        let (from, to) = {
            let mut rng = rand::thread_rng();
            let from = rng.gen_range(0..payers.len());
            (from, (from + rng.gen_range(1..payers.len())) % payers.len())
        };
        let command = Command {
            command_id: new_command_id(),
            issuer: "chaos-payroll".into(),
            from: WalletId(payers[from].wallet_id),
            to: WalletId(payers[to].wallet_id),
            amount_minor: rand::thread_rng().gen_range(1..=COMMAND_MINOR_MAX),
        };
        let copies = if n % DUPLICATE_EVERY == 0 { 2 } else { 1 };
        for copy in 0..copies {
            let entry = publish(&mut redis, &streams, &command).await;
            publications += 1;
            if copy == 0 {
                published.push(Published {
                    command: command.clone(),
                    first_entry: entry,
                });
            }
        }
        n += 1;
        tokio::time::sleep(Duration::from_millis(PUBLISH_PAUSE_MS)).await;
    }
    (published, publications)
}

/// `XADD`, retried until Redis takes it (it may be down for the fault).
async fn publish(redis: &mut redis::aio::ConnectionManager, streams: &Streams, command: &Command) -> String {
    let deadline = Instant::now() + Duration::from_secs(SETTLE_SECONDS_MAX);
    loop {
        match command.publication(streams).query_async::<String>(redis).await {
            Ok(entry) => return entry,
            Err(error) => {
                assert!(
                    Instant::now() < deadline,
                    "Redis took no publication for {SETTLE_SECONDS_MAX} s: {error}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Publishes again every command the inbox holds no outcome for; returns
/// how many.
async fn republish_without_outcome(
    db: &sqlx::PgPool,
    redis: &mut redis::aio::MultiplexedConnection,
    streams: &Streams,
    published: &[Published],
) -> usize {
    let ids: Vec<&str> = published.iter().map(|p| p.command.command_id.as_str()).collect();
    let decided: Vec<String> = sqlx::query_scalar(
        "SELECT event_id FROM inbox WHERE source = 'broker' AND event_id = ANY($1) AND verdict IS NOT NULL",
    )
    .bind(&ids)
    .fetch_all(db)
    .await
    .expect("the outcomes");
    let mut republished = 0;
    for one in published
        .iter()
        .filter(|p| !decided.contains(&p.command.command_id))
    {
        one.command
            .publication(streams)
            .query_async::<String>(redis)
            .await
            .expect("XADD");
        republished += 1;
    }
    republished
}

/// What the provider saw: a final 200 for every event, the same bytes each
/// time, and no 5xx other than 503.
fn check_answers(delivered: &[(DepositEvent, Attempts)], checks: &mut Checks) {
    provider::check_answers(delivered.iter().map(|(_, attempts)| attempts), checks);
    let server_errors = delivered
        .iter()
        .flat_map(|(_, attempts)| &attempts.deliveries)
        .filter(|delivery| {
            delivery
                .status
                .is_some_and(|status| status >= 500 && status != 503)
        })
        .count() as i64;
    checks.add("answers 500 or above other than 503", server_errors);
}
