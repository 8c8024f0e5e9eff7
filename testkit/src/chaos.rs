//! The chaos suite's machinery. A deployment of its own (a private
//! PostgreSQL cluster and Redis, a TCP proxy between the instances and
//! PostgreSQL, several `wallet-server` processes), a storm of clients
//! against it, one fault injected in the middle of the storm, and the
//! checks made on the database afterwards.
//!
//! The clients behave as careful clients should: a keyed client retries
//! with the same Idempotency-Key, on the next instance, after Retry-After,
//! until it gets an answer that settles the transfer; keyless clients
//! double-click (several identical requests at once) and never retry.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use layered_wallet::settings::StoreErrorPolicy;
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

use crate::TestUser;
use crate::private_stores::{PgStopMode, PrivatePostgres, PrivateRedis, ScratchDir};
use crate::proxy::CountingProxy;
use crate::server_process::ServerProcess;

/// No request may take longer than this, whatever the fault: the longest
/// wait the service allows itself (`db_statement_timeout_ms`, 6 s by
/// default) plus a margin.
pub const REQUEST_SECONDS_MAX: u64 = 10;
/// Every instance must be ready and transferring again this soon after a
/// fault ends.
pub const RECOVERY_SECONDS_MAX: u64 = 10;
/// After the storm, keys still unsettled get this long to settle.
pub const SETTLE_SECONDS_MAX: u64 = 30;
/// Identical keyless requests fired at once: one double click and then some.
pub const KEYLESS_BURST_REQUESTS: usize = 4;
/// The instances' cooldown window, short so that clients cycle quickly.
pub const CHAOS_COOLDOWN_TTL_MS: u64 = 300;
/// What every client user is given on sign-up: enough that no transfer in
/// a storm is refused for want of funds.
const CHAOS_GRANT_MINOR: i64 = 100_000_000;
const CHAOS_SIGNING_KEY: &str = "chaos-signing-key-chaos-signing-key-0123456789";

/// How big a run is. `CHAOS_FULL=1` gives the run `docs/reliability.md`
/// reports; without it, the subset CI runs on every change.
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    pub instances: usize,
    pub keyed_clients: usize,
    pub keyless_users: usize,
    pub before_fault: Duration,
    pub fault_length: Duration,
    pub after_fault: Duration,
}

impl Scale {
    pub fn from_env() -> Self {
        if std::env::var_os("CHAOS_FULL").is_some() {
            Self {
                instances: 3,
                keyed_clients: 40,
                keyless_users: 10,
                before_fault: Duration::from_secs(3),
                fault_length: Duration::from_secs(3),
                after_fault: Duration::from_secs(3),
            }
        } else {
            Self {
                instances: 3,
                keyed_clients: 12,
                keyless_users: 4,
                before_fault: Duration::from_millis(1_500),
                fault_length: Duration::from_secs(2),
                after_fault: Duration::from_millis(1_500),
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Redis is killed (SIGKILL) and started again, empty, on its port.
    RedisKilled(StoreErrorPolicy),
    /// `pg_ctl stop -m fast`, then start: open transactions roll back.
    PostgresFastRestart,
    /// `pg_ctl stop -m immediate`, then start: a crash and WAL recovery.
    PostgresCrash,
    /// One instance gets SIGKILL and is started again.
    InstanceKilled,
    /// The proxy drops every open database connection, every 200 ms.
    ConnectionsCut,
    /// The proxy lets each `transfer()` call commit, then drops the
    /// connection before the reply reaches the instance.
    CommitRepliesLost,
}

impl Fault {
    /// Every fault, in the order `docs/reliability.md` lists them.
    pub const ALL: [Fault; 7] = [
        Fault::RedisKilled(StoreErrorPolicy::FailOpen),
        Fault::RedisKilled(StoreErrorPolicy::FailClosed),
        Fault::PostgresFastRestart,
        Fault::PostgresCrash,
        Fault::InstanceKilled,
        Fault::ConnectionsCut,
        Fault::CommitRepliesLost,
    ];

    pub fn describe(self) -> &'static str {
        match self {
            Fault::RedisKilled(StoreErrorPolicy::FailOpen) => "Redis killed and restarted, `fail_open`",
            Fault::RedisKilled(StoreErrorPolicy::FailClosed) => "Redis killed and restarted, `fail_closed`",
            Fault::PostgresFastRestart => "PostgreSQL `stop -m fast`, then start",
            Fault::PostgresCrash => "PostgreSQL `stop -m immediate` (a crash), then start",
            Fault::InstanceKilled => "one instance `kill -9`, then start",
            Fault::ConnectionsCut => "every database connection cut, every 200 ms",
            Fault::CommitRepliesLost => "each committed transfer's reply lost",
        }
    }

    fn policy(self) -> StoreErrorPolicy {
        match self {
            Fault::RedisKilled(policy) => policy,
            _ => StoreErrorPolicy::FailOpen,
        }
    }

    /// Keyless double clicks may be charged twice only when the cooldown,
    /// their one defense, lets everything through.
    fn allows_keyless_double_charges(self) -> bool {
        self == Fault::RedisKilled(StoreErrorPolicy::FailOpen)
    }

    /// What `/readyz` must answer during the fault, per instance.
    fn expected_readiness(self, instance: usize) -> Readiness {
        match self {
            Fault::RedisKilled(StoreErrorPolicy::FailOpen) => Readiness::Degraded,
            Fault::RedisKilled(StoreErrorPolicy::FailClosed) => Readiness::NotReady,
            Fault::PostgresFastRestart | Fault::PostgresCrash => Readiness::NotReady,
            Fault::InstanceKilled if instance == 0 => Readiness::NoAnswer,
            Fault::InstanceKilled | Fault::ConnectionsCut | Fault::CommitRepliesLost => Readiness::Ready,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Readiness {
    Ready,
    Degraded,
    NotReady,
    NoAnswer,
}

/// Starts a deployment of `binary` (`wallet-server`) configured for
/// `fault`, runs a storm through it with `fault` in the middle, and reports.
pub async fn run(binary: PathBuf, fault: Fault, scale: Scale) -> ChaosReport {
    Deployment::start(binary, scale.instances, fault.policy())
        .await
        .run(fault, scale)
        .await
}

/// A deployment of the chaos suite's own.
struct Deployment {
    postgres: PrivatePostgres,
    redis: PrivateRedis,
    proxy: CountingProxy,
    instances: Vec<ServerProcess>,
    /// Straight to PostgreSQL, not through the proxy: for the checks.
    db: PgPool,
    client: reqwest::Client,
    logs: ScratchDir,
}

impl Deployment {
    /// Starts everything, with the cooldown policy `policy`, and migrates.
    async fn start(binary: PathBuf, instances: usize, policy: StoreErrorPolicy) -> Self {
        let postgres = tokio::task::spawn_blocking(PrivatePostgres::start)
            .await
            .expect("start the private PostgreSQL");
        postgres.create_database("wallet").await;
        let redis = tokio::task::spawn_blocking(PrivateRedis::start)
            .await
            .expect("start the private Redis");
        let upstream = format!("127.0.0.1:{}", postgres.port).parse().expect("address");
        let proxy = CountingProxy::start(upstream).await;
        let logs = ScratchDir::for_logs("chaos-logs");
        let policy_name = match policy {
            StoreErrorPolicy::FailOpen => "fail_open",
            StoreErrorPolicy::FailClosed => "fail_closed",
        };
        let env: Vec<(String, String)> = [
            // Without TLS, so that the proxy can read the protocol.
            (
                "DATABASE_URL",
                format!(
                    "postgres://postgres@127.0.0.1:{}/wallet?sslmode=disable",
                    proxy.port
                ),
            ),
            ("REDIS_URL", redis.url()),
            ("WALLET_TOKEN_SIGNING_KEY", CHAOS_SIGNING_KEY.to_owned()),
            ("WALLET_REDIS_KEY_PREFIX", "chaos:".to_owned()),
            ("WALLET_COOLDOWN_ON_STORE_ERROR", policy_name.to_owned()),
            ("WALLET_COOLDOWN_TTL_MS", CHAOS_COOLDOWN_TTL_MS.to_string()),
            ("WALLET_SIGNUP_GRANT_MINOR", CHAOS_GRANT_MINOR.to_string()),
            ("WALLET_HTTP_WORKERS", "2".to_owned()),
            ("WALLET_ADMIN_HTTP_ADDR", "127.0.0.1:0".to_owned()),
            ("WALLET_ACCOUNT_LIMITS_ENABLED", "false".to_owned()),
            ("WALLET_MIGRATE_ON_START", "false".to_owned()),
            ("WALLET_SHUTDOWN_GRACE_S", "1".to_owned()),
            ("WALLET_IDEMPOTENCY_SWEEP_INTERVAL_S", "3600".to_owned()),
            ("RUST_LOG", "warn".to_owned()),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
        let migrate_binary = binary.clone();
        let migrate_env = env.clone();
        tokio::task::spawn_blocking(move || ServerProcess::migrate(&migrate_binary, &migrate_env))
            .await
            .expect("migrate");
        let mut processes = Vec::with_capacity(instances);
        for number in 0..instances {
            let log = logs.path().join(format!("instance-{number}.log"));
            processes.push(ServerProcess::start(binary.clone(), env.clone(), log).await);
        }
        let db = PgPoolOptions::new()
            .max_connections(3)
            .connect(&postgres.url("wallet"))
            .await
            .expect("connect to the private PostgreSQL");
        Self {
            postgres,
            redis,
            proxy,
            instances: processes,
            db,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(2 * REQUEST_SECONDS_MAX))
                .pool_max_idle_per_host(64)
                .build()
                .expect("client"),
            logs,
        }
    }

    fn url(&self, instance: usize, path: &str) -> String {
        self.instances[instance % self.instances.len()].url(path)
    }

    async fn sign_up(&self, name: &str) -> TestUser {
        crate::sign_up_at(&self.client, &self.url(0, ""), name).await
    }

    /// Starts the fault; `end_fault` ends it.
    async fn begin_fault(&mut self, fault: Fault) {
        match fault {
            Fault::RedisKilled(_) => self.redis.kill(),
            Fault::PostgresFastRestart => {
                tokio::task::block_in_place(|| self.postgres.stop(PgStopMode::Fast))
            }
            Fault::PostgresCrash => tokio::task::block_in_place(|| self.postgres.stop(PgStopMode::Immediate)),
            Fault::InstanceKilled => self.instances[0].kill_9(),
            Fault::ConnectionsCut => self.proxy.cut_connections(),
            Fault::CommitRepliesLost => self.proxy.keep_losing_replies_to("FROM transfer("),
        }
    }

    /// Keeps a fault going that has to be repeated.
    fn sustain_fault(&self, fault: Fault) {
        if fault == Fault::ConnectionsCut {
            self.proxy.cut_connections();
        }
    }

    async fn end_fault(&mut self, fault: Fault) {
        match fault {
            Fault::RedisKilled(_) => tokio::task::block_in_place(|| self.redis.start_again()),
            Fault::PostgresFastRestart | Fault::PostgresCrash => {
                tokio::task::block_in_place(|| self.postgres.start_again())
            }
            Fault::InstanceKilled => self.instances[0].start_again().await,
            Fault::ConnectionsCut => {}
            Fault::CommitRepliesLost => self.proxy.stop_losing_replies(),
        }
    }

    async fn readiness(&self, instance: usize) -> Readiness {
        let answer = self
            .client
            .get(self.url(instance, "/readyz"))
            .timeout(Duration::from_secs(3))
            .send()
            .await;
        let Ok(response) = answer else {
            return Readiness::NoAnswer;
        };
        let status = response.status();
        let body: Value = response.json().await.unwrap_or_default();
        match (status.as_u16(), body["status"].as_str()) {
            (200, Some("degraded")) => Readiness::Degraded,
            (200, _) => Readiness::Ready,
            _ => Readiness::NotReady,
        }
    }

    /// Runs the storm, injects `fault` in its middle, and checks and
    /// measures everything afterwards.
    async fn run(mut self, fault: Fault, scale: Scale) -> ChaosReport {
        let stop = Arc::new(AtomicBool::new(false));
        let clients = self.sign_up_clients(scale).await;
        let probes = self.sign_up_probes().await;
        let shared = Arc::new(Storm {
            client: self.client.clone(),
            instances: self.instances.iter().map(|i| i.url("")).collect(),
            stop: stop.clone(),
        });

        let keyed_tasks: Vec<_> = (0..clients.keyed.len())
            .map(|number| {
                let storm = shared.clone();
                let me = clients.keyed[number].clone();
                let to = clients.keyed[(number + 1) % clients.keyed.len()].wallet_id;
                tokio::spawn(async move { storm.keyed_client(number, me, to).await })
            })
            .collect();
        let keyless_tasks: Vec<_> = clients
            .keyless
            .iter()
            .enumerate()
            .map(|(number, me)| {
                let storm = shared.clone();
                let (me, to) = (me.clone(), clients.keyed[number % clients.keyed.len()].wallet_id);
                tokio::spawn(async move { storm.keyless_user(number, me, to).await })
            })
            .collect();

        tokio::time::sleep(scale.before_fault).await;
        self.begin_fault(fault).await;
        let fault_began = Instant::now();
        let mut readiness_seen = Vec::new();
        let mut readiness_sampled = false;
        while fault_began.elapsed() < scale.fault_length {
            if !readiness_sampled && fault_began.elapsed() >= scale.fault_length / 2 {
                for instance in 0..self.instances.len() {
                    readiness_seen.push((instance, self.readiness(instance).await));
                }
                readiness_sampled = true;
            }
            self.sustain_fault(fault);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let fault_ended = Instant::now();
        self.end_fault(fault).await;
        let recovery = self.recover(fault_ended, &probes, &shared).await;
        tokio::time::sleep(scale.after_fault).await;
        stop.store(true, Ordering::SeqCst);

        let mut keys = recovery.keys;
        for task in keyed_tasks {
            keys.extend(task.await.expect("a keyed client"));
        }
        let mut bursts = Vec::new();
        for task in keyless_tasks {
            bursts.extend(task.await.expect("a keyless user"));
        }
        let replies_lost = self.proxy.replies_lost();
        ChaosReport::check(
            fault,
            &self.db,
            Checked {
                keys,
                bursts,
                keyed_wallets: clients.keyed.iter().chain(&probes).map(|u| u.wallet_id).collect(),
                readiness_seen,
                recovery: recovery.took,
                recovered: recovery.recovered,
                replies_lost,
            },
            self.logs.path().to_path_buf(),
        )
        .await
    }

    async fn sign_up_clients(&self, scale: Scale) -> Clients {
        let mut keyed = Vec::new();
        for number in 0..scale.keyed_clients {
            keyed.push(self.sign_up(&format!("keyed{number}")).await);
        }
        let mut keyless = Vec::new();
        for number in 0..scale.keyless_users {
            keyless.push(self.sign_up(&format!("keyless{number}")).await);
        }
        Clients { keyed, keyless }
    }

    /// One user per instance, whose transfers prove that instance works.
    async fn sign_up_probes(&self) -> Vec<TestUser> {
        let mut probes = Vec::new();
        for number in 0..self.instances.len() {
            probes.push(self.sign_up(&format!("probe{number}")).await);
        }
        probes
    }

    /// Waits until every instance is ready and has made a transfer, each
    /// through itself, with one key per instance retried until settled.
    async fn recover(&self, fault_ended: Instant, probes: &[TestUser], storm: &Storm) -> Recovery {
        let deadline = fault_ended + Duration::from_secs(RECOVERY_SECONDS_MAX);
        let mut keys = Vec::new();
        let mut recovered = true;
        for (instance, probe) in probes.iter().enumerate() {
            while self.readiness(instance).await != Readiness::Ready && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let to = probes[(instance + 1) % probes.len()].wallet_id;
            let mut record = KeyRecord::new(probe.user_id);
            loop {
                let attempt = storm.send(instance, probe, to, 1, Some(&record.key)).await;
                let settled = attempt.outcome.settles();
                record.attempts.push(attempt);
                if settled || Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            recovered &= record
                .attempts
                .last()
                .is_some_and(|a| matches!(a.outcome, Outcome::Transferred { .. }));
            keys.push(record);
        }
        Recovery {
            keys,
            took: fault_ended.elapsed(),
            recovered,
        }
    }
}

/// The probes' keys, and how long after the fault every instance was
/// ready and had made a transfer.
struct Recovery {
    keys: Vec<KeyRecord>,
    took: Duration,
    recovered: bool,
}

struct Clients {
    keyed: Vec<TestUser>,
    keyless: Vec<TestUser>,
}

/// What the storm's clients share.
struct Storm {
    client: reqwest::Client,
    instances: Vec<String>,
    stop: Arc<AtomicBool>,
}

/// How one request ended, as the client saw it.
#[derive(Debug, Clone)]
enum Outcome {
    Transferred {
        id: Uuid,
        replayed: bool,
    },
    /// An answer that asks the client to come back: 409, 429, 503.
    RetryLater {
        status: u16,
        problem: String,
        retry_after: Duration,
    },
    /// Any other 4xx: the transfer will not happen.
    Refused {
        status: u16,
        problem: String,
    },
    /// A 5xx other than 503.
    ServerError {
        status: u16,
    },
    /// The connection failed or timed out: the client knows nothing.
    NoAnswer,
}

impl Outcome {
    fn settles(&self) -> bool {
        matches!(self, Outcome::Transferred { .. } | Outcome::Refused { .. })
    }

    /// Might this request have made the transfer? Only an answer that
    /// says so, or one that admits it cannot know, or none at all.
    fn may_have_transferred(&self) -> bool {
        match self {
            Outcome::Transferred { replayed, .. } => !replayed,
            Outcome::RetryLater { problem, .. } => problem.ends_with("/outcome-unknown"),
            Outcome::ServerError { .. } | Outcome::NoAnswer => true,
            Outcome::Refused { .. } => false,
        }
    }

    fn label(&self) -> String {
        match self {
            Outcome::Transferred { replayed: false, .. } => "201".into(),
            Outcome::Transferred { replayed: true, .. } => "201 replay".into(),
            Outcome::RetryLater { status, problem, .. } | Outcome::Refused { status, problem } => {
                format!("{status} {}", problem.rsplit('/').next().unwrap_or(problem))
            }
            Outcome::ServerError { status } => status.to_string(),
            Outcome::NoAnswer => "no answer".into(),
        }
    }
}

#[derive(Debug, Clone)]
struct Attempt {
    outcome: Outcome,
    took: Duration,
}

/// Every attempt a client made with one key, in order.
struct KeyRecord {
    user_id: Uuid,
    key: String,
    attempts: Vec<Attempt>,
}

impl KeyRecord {
    fn new(user_id: Uuid) -> Self {
        Self {
            user_id,
            key: Uuid::new_v4().to_string(),
            attempts: Vec::new(),
        }
    }
}

/// One double click: identical keyless requests fired at once.
struct Burst {
    wallet_id: Uuid,
    amount_minor: i64,
    outcomes: Vec<Attempt>,
}

impl Storm {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    async fn send(
        &self,
        instance: usize,
        user: &TestUser,
        to: Uuid,
        amount_minor: i64,
        key: Option<&str>,
    ) -> Attempt {
        let url = format!(
            "{}/api/v1/transfers",
            self.instances[instance % self.instances.len()]
        );
        let mut request = self.client.post(url).bearer_auth(&user.token).json(
            &json!({ "from_wallet_id": user.wallet_id, "to_wallet_id": to, "amount_minor": amount_minor }),
        );
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        let started = Instant::now();
        let outcome = match request.send().await {
            Err(_) => Outcome::NoAnswer,
            Ok(response) => read_outcome(response).await,
        };
        Attempt {
            outcome,
            took: started.elapsed(),
        }
    }

    /// New keys one after another until the storm stops; each key retried
    /// until settled.
    async fn keyed_client(&self, number: usize, me: TestUser, to: Uuid) -> Vec<KeyRecord> {
        let mut records = Vec::new();
        let mut instance = number;
        let amount_minor = 1 + (number as i64 % 50);
        while !self.stopped() {
            let mut record = KeyRecord::new(me.user_id);
            let settle_by = Instant::now() + Duration::from_secs(SETTLE_SECONDS_MAX);
            loop {
                let attempt = self
                    .send(instance, &me, to, amount_minor, Some(&record.key))
                    .await;
                // The next attempt, whatever it is, goes to the next
                // instance: a client behind a load balancer would.
                instance += 1;
                let wait = match &attempt.outcome {
                    Outcome::RetryLater { retry_after, .. } => *retry_after,
                    _ => Duration::from_millis(100),
                };
                let settled = attempt.outcome.settles();
                record.attempts.push(attempt);
                if settled || Instant::now() >= settle_by {
                    break;
                }
                tokio::time::sleep(wait).await;
            }
            records.push(record);
        }
        records
    }

    /// Double clicks, each with an amount of its own so that the database
    /// tells how many of its requests were charged.
    async fn keyless_user(&self, number: usize, me: TestUser, to: Uuid) -> Vec<Burst> {
        let mut bursts = Vec::new();
        let mut amount_minor = 0;
        while !self.stopped() {
            amount_minor += 1;
            let instance = number + amount_minor as usize;
            let requests =
                (0..KEYLESS_BURST_REQUESTS).map(|_| self.send(instance, &me, to, amount_minor, None));
            let outcomes = futures::future::join_all(requests).await;
            bursts.push(Burst {
                wallet_id: me.wallet_id,
                amount_minor,
                outcomes,
            });
            tokio::time::sleep(Duration::from_millis(CHAOS_COOLDOWN_TTL_MS + 100)).await;
        }
        bursts
    }
}

async fn read_outcome(response: reqwest::Response) -> Outcome {
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_millis(100));
    let Ok(body) = response.json::<Value>().await else {
        return Outcome::NoAnswer;
    };
    let problem = body["type"].as_str().unwrap_or_default().to_owned();
    match status {
        201 => match body["id"].as_str().and_then(|id| Uuid::parse_str(id).ok()) {
            Some(id) => Outcome::Transferred { id, replayed },
            None => Outcome::ServerError { status },
        },
        409 | 429 | 503 => Outcome::RetryLater {
            status,
            problem,
            retry_after,
        },
        400..=499 => Outcome::Refused { status, problem },
        _ => Outcome::ServerError { status },
    }
}

struct Checked {
    keys: Vec<KeyRecord>,
    bursts: Vec<Burst>,
    keyed_wallets: Vec<Uuid>,
    readiness_seen: Vec<(usize, Readiness)>,
    recovery: Duration,
    recovered: bool,
    replies_lost: u64,
}

/// What one fault did, measured, and what broke, if anything.
pub struct ChaosReport {
    pub fault: Fault,
    pub answers: BTreeMap<String, usize>,
    pub keys: usize,
    pub keyed_double_effects: usize,
    pub keyless_bursts: usize,
    pub keyless_double_charges: usize,
    pub server_errors: usize,
    pub false_nothing_changed: usize,
    pub slowest: Duration,
    pub recovery: Duration,
    pub replies_lost: u64,
    pub readiness: String,
    pub violations: Vec<String>,
    logs: PathBuf,
}

impl ChaosReport {
    async fn check(fault: Fault, db: &PgPool, run: Checked, logs: PathBuf) -> Self {
        let mut violations = Vec::new();
        let mut answers = BTreeMap::new();
        let all_attempts = run
            .keys
            .iter()
            .flat_map(|k| &k.attempts)
            .chain(run.bursts.iter().flat_map(|b| &b.outcomes));
        let mut slowest = Duration::ZERO;
        let mut server_errors = 0;
        for attempt in all_attempts {
            *answers.entry(attempt.outcome.label()).or_insert(0) += 1;
            slowest = slowest.max(attempt.took);
            server_errors += usize::from(matches!(attempt.outcome, Outcome::ServerError { .. }));
        }
        if server_errors > 0 {
            violations.push(format!("{server_errors} answers were 5xx other than 503"));
        }
        if slowest > Duration::from_secs(REQUEST_SECONDS_MAX) {
            violations.push(format!(
                "a request took {slowest:?}, over REQUEST_SECONDS_MAX ({REQUEST_SECONDS_MAX} s)"
            ));
        }

        // Keyed transfers: at most one per key, exactly the one every 201
        // names, and none that no request could have made.
        let made: BTreeMap<(Uuid, String), Option<Uuid>> = sqlx::query_as::<_, (Uuid, Uuid, Option<Uuid>)>(
            "SELECT user_id, key, transfer_id FROM idempotency_keys",
        )
        .fetch_all(db)
        .await
        .expect("read the idempotency keys")
        .into_iter()
        .map(|(user, key, transfer)| ((user, key.to_string()), transfer))
        .collect();
        let mut false_nothing_changed = 0;
        let mut unsettled = 0;
        for record in &run.keys {
            let in_database = made.get(&(record.user_id, record.key.clone())).copied().flatten();
            for attempt in &record.attempts {
                if let Outcome::Transferred { id, .. } = attempt.outcome
                    && in_database != Some(id)
                {
                    violations.push(format!(
                        "key {} was answered with transfer {id}, but the database holds {in_database:?}",
                        record.key
                    ));
                }
            }
            if in_database.is_some() && !record.attempts.iter().any(|a| a.outcome.may_have_transferred()) {
                false_nothing_changed += 1;
            }
            unsettled += usize::from(!record.attempts.last().is_some_and(|a| a.outcome.settles()));
        }
        if false_nothing_changed > 0 {
            violations.push(format!(
                "{false_nothing_changed} keys have a transfer although every answer said nothing was changed"
            ));
        }
        if unsettled > 0 {
            violations.push(format!(
                "{unsettled} keys were still unsettled {SETTLE_SECONDS_MAX} s after the storm"
            ));
        }
        let keyed_transfers: i64 =
            sqlx::query_scalar("SELECT count(*) FROM transfers WHERE from_wallet_id = ANY($1)")
                .bind(&run.keyed_wallets)
                .fetch_one(db)
                .await
                .expect("count keyed transfers");
        let keyed_claims = made.values().filter(|transfer| transfer.is_some()).count();
        let keyed_double_effects = usize::try_from(keyed_transfers)
            .unwrap_or(0)
            .saturating_sub(keyed_claims);
        if keyed_double_effects > 0 {
            violations.push(format!(
                "{keyed_double_effects} keyed transfers have no key of their own: a key took effect twice"
            ));
        }
        let dangling: i64 =
            sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE response_status IS NULL")
                .fetch_one(db)
                .await
                .expect("count dangling claims");
        if dangling > 0 {
            violations.push(format!("{dangling} idempotency claims dangle without a response"));
        }
        violations.extend(crate::money_invariant_violations(db).await);

        // Keyless double clicks: how many were charged more than once.
        let mut keyless_double_charges = 0;
        for burst in &run.bursts {
            let charged: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM transfers WHERE from_wallet_id = $1 AND amount_minor = $2",
            )
            .bind(burst.wallet_id)
            .bind(burst.amount_minor)
            .fetch_one(db)
            .await
            .expect("count a burst's transfers");
            keyless_double_charges += usize::from(charged > 1);
        }
        if keyless_double_charges > 0 && !fault.allows_keyless_double_charges() {
            violations.push(format!(
                "{keyless_double_charges} keyless double clicks were charged more than once"
            ));
        }

        let mut readiness = String::new();
        for (instance, seen) in &run.readiness_seen {
            let expected = fault.expected_readiness(*instance);
            if *seen != expected {
                violations.push(format!(
                    "instance {instance}'s /readyz was {seen:?} during the fault; it should be {expected:?}"
                ));
            }
        }
        let mut seen: Vec<_> = run.readiness_seen.iter().map(|(_, seen)| *seen).collect();
        seen.dedup();
        for (index, state) in seen.iter().enumerate() {
            let _ = write!(
                readiness,
                "{}{}",
                if index > 0 { ", " } else { "" },
                match state {
                    Readiness::Ready => "200 ready",
                    Readiness::Degraded => "200 degraded",
                    Readiness::NotReady => "503",
                    Readiness::NoAnswer => "no answer (killed)",
                }
            );
        }
        if !run.recovered || run.recovery > Duration::from_secs(RECOVERY_SECONDS_MAX) {
            violations.push(format!(
                "the instances were not all ready and transferring within RECOVERY_SECONDS_MAX \
                 ({RECOVERY_SECONDS_MAX} s) after the fault ended"
            ));
        }
        if fault == Fault::CommitRepliesLost && run.replies_lost == 0 {
            violations.push("the proxy never lost a reply: the fault did not happen".into());
        }

        Self {
            fault,
            answers,
            keys: run.keys.len(),
            keyed_double_effects,
            keyless_bursts: run.bursts.len(),
            keyless_double_charges,
            server_errors,
            false_nothing_changed,
            slowest,
            recovery: run.recovery,
            replies_lost: run.replies_lost,
            readiness,
            violations,
            logs,
        }
    }

    /// Panics with every violation found, and where the instances' logs are.
    pub fn assert_held(&self) {
        assert!(
            self.violations.is_empty(),
            "under {}:\n- {}\n{}\ninstance logs: {}",
            self.fault.describe(),
            self.violations.join("\n- "),
            self.markdown_row(),
            self.logs.display()
        );
    }

    /// One row of the table in `docs/reliability.md`.
    pub fn markdown_row(&self) -> String {
        let answers = self
            .answers
            .iter()
            .map(|(label, count)| format!("{count} × {label}"))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "| {} | {} | {} | {} | {} | {} of {} | {} | {:.2} s | {:.2} s |",
            self.fault.describe(),
            answers,
            self.keys,
            self.keyed_double_effects,
            self.false_nothing_changed,
            self.keyless_double_charges,
            self.keyless_bursts,
            self.readiness,
            self.slowest.as_secs_f64(),
            self.recovery.as_secs_f64(),
        )
    }

    /// Prints the row, and when `CHAOS_REPORT_DIR` is set writes it there
    /// as `row-<N>.md` (N: the fault's place in `Fault::ALL`) beside
    /// `header.md`, for `scripts/chaos` to gather into a table.
    pub fn publish(&self) {
        println!("{}", self.markdown_row());
        if let Some(dir) = std::env::var_os("CHAOS_REPORT_DIR") {
            let dir = PathBuf::from(dir);
            let place = Fault::ALL
                .iter()
                .position(|f| *f == self.fault)
                .unwrap_or(Fault::ALL.len());
            std::fs::create_dir_all(&dir).expect("create CHAOS_REPORT_DIR");
            std::fs::write(dir.join("header.md"), format!("{REPORT_HEADER}\n")).expect("write the header");
            std::fs::write(dir.join(format!("row-{place}.md")), self.markdown_row() + "\n")
                .expect("write the report row");
        }
    }
}

/// The table's header, matching `markdown_row`.
pub const REPORT_HEADER: &str = "| fault | answers | keys | keyed double effects | false \"nothing was changed\" | keyless double charges | /readyz during the fault | slowest request | recovery |\n|---|---|---|---|---|---|---|---|---|";
