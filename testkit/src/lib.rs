//! The test harness: each test gets its own server on a random port, its own
//! PostgreSQL database and its own Redis key prefix, so tests run in
//! parallel against the real stores. Nothing is mocked.
//!
//! If PostgreSQL or Redis is not reachable the harness panics with how to
//! start them; a test never quietly skips.

pub mod chaos;
pub mod nginx;
pub mod private_stores;
pub mod proxy;
pub mod server_process;
pub mod visitor;

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::OnceLock;
use std::time::Duration;

use layered_wallet::settings::Settings;
use layered_wallet::startup::Application;
use opentelemetry_sdk::trace::InMemorySpanExporter;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, PgConnection, PgPool};
use uuid::Uuid;

pub const SIGNING_KEY: &str = "test-signing-key-test-signing-key-0123456789";
const HOW_TO_START: &str = "start them with ./scripts/services.sh, or run the tests with ./scripts/test";

/// The PostgreSQL server the tests create their databases on.
pub fn postgres_server_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .or_else(|_| std::env::var("DATABASE_URL"))
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// The local Redis Cluster the cluster tests use (`./scripts/test` starts
/// it on 127.0.0.1:7101-7103).
pub fn redis_cluster_urls() -> Vec<String> {
    std::env::var("REDIS_CLUSTER_URLS")
        .unwrap_or_else(|_| "redis://127.0.0.1:7101,redis://127.0.0.1:7102,redis://127.0.0.1:7103".into())
        .split(',')
        .map(str::to_owned)
        .collect()
}

pub async fn assert_redis_cluster_reachable() {
    let urls = redis_cluster_urls();
    let client = redis::cluster::ClusterClient::new(urls.clone()).expect("cluster URLs");
    let reachable = tokio::time::timeout(Duration::from_secs(3), async {
        let mut conn = client.get_async_connection().await?;
        redis::cmd("SET")
            .arg("lw:cluster-probe")
            .arg("1")
            .query_async::<()>(&mut conn)
            .await
    })
    .await;
    if !matches!(reachable, Ok(Ok(()))) {
        panic!(
            "the Redis Cluster is not reachable at {urls:?}; start it with ./scripts/test \
             (which runs ensure_redis_cluster from scripts/lib/services.sh)"
        );
    }
}

pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A database of its own for one test, migrated by the app on start.
pub async fn create_database() -> (String, PgConnectOptions) {
    let server = PgConnectOptions::from_str(&postgres_server_url())
        .expect("TEST_DATABASE_URL must be a PostgreSQL URL");
    let mut admin = PgConnection::connect_with(&server.clone().database("postgres"))
        .await
        .unwrap_or_else(|error| {
            panic!(
                "PostgreSQL is not reachable at {} ({error}); {HOW_TO_START}",
                postgres_server_url()
            )
        });
    let name = format!("lw_test_{}", Uuid::new_v4().simple());
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await
        .expect("the test role must be allowed to create databases");
    let options = server.database(&name);
    (name, options)
}

pub async fn assert_redis_reachable() {
    let client = redis::Client::open(redis_url()).expect("REDIS_URL must be a Redis URL");
    let reachable = tokio::time::timeout(Duration::from_secs(3), async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await
    })
    .await;
    if !matches!(reachable, Ok(Ok(_))) {
        panic!("Redis is not reachable at {}; {HOW_TO_START}", redis_url());
    }
}

/// A TCP port on which nothing listens: a store that is down.
pub fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

/// Settings for a test app on `database_url`, with short, test-friendly
/// limits and a Redis prefix of its own.
pub fn test_settings(database_url: &str, redis_prefix: &str) -> Settings {
    Settings {
        http_port: 0,
        http_workers: 2,
        database_url: SecretString::from(database_url.to_owned()),
        db_pool_connections_max: 10,
        db_pool_connections_min: 0,
        redis_url: SecretString::from(redis_url()),
        redis_key_prefix: redis_prefix.to_owned(),
        token_signing_key: SecretString::from(SIGNING_KEY),
        signup_grant_minor: 100_000,
        idempotency_sweep_interval_s: 3600,
        shutdown_grace_s: 1,
        admin_http_addr: "127.0.0.1:0".into(),
        // Tests sign up many users from 127.0.0.1; the limits' own tests
        // switch them on.
        account_limits_enabled: false,
        // The shared Redis holds every test's keys; the budget's own test
        // runs on a Redis of its own.
        decision_feed_redis_memory_bytes_max: 1024 * 1024 * 1024,
        // Tests count users and wallets; the demo recipient's own test
        // names one.
        demo_recipient_name: String::new(),
        ..Settings::default()
    }
}

/// Every span the apps in this test process finished, for tests that
/// assert on traces. TEST_LOG=1 also prints the servers' logs.
pub fn spans() -> &'static InMemorySpanExporter {
    install_telemetry()
}

fn install_telemetry() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let guard = layered_wallet::telemetry::init_with_exporter(
            layered_wallet::settings::LogFormat::Text,
            std::env::var_os("TEST_LOG").is_some(),
            exporter.clone(),
        );
        // The provider lives as long as the test process.
        std::mem::forget(guard);
        exporter
    })
}

/// Switches the cooldown off, which counts as an unsafe demonstration mode.
pub fn without_cooldown(settings: &mut Settings) {
    settings.cooldown_enabled = false;
    settings.allow_unsafe_demo_modes = true;
}

pub struct TestApp {
    pub address: String,
    /// The admin listener: `/metrics` and the detailed `/readyz`.
    pub admin_address: String,
    /// The test's own pool on the app's database, for asserting on state.
    pub db: PgPool,
    pub db_options: PgConnectOptions,
    pub redis_prefix: String,
    pub client: reqwest::Client,
    pub settings: Settings,
    server: Option<(actix_web::dev::ServerHandle, std::thread::JoinHandle<()>)>,
    /// Shares its database with another TestApp, which drops it.
    second_instance: bool,
}

#[derive(Clone)]
pub struct TestUser {
    pub name: String,
    pub user_id: Uuid,
    pub wallet_id: Uuid,
    pub token: String,
}

/// A fresh database and Redis prefix, and an app on them with `adjust`
/// applied to the settings.
pub async fn spawn_app(adjust: impl FnOnce(&mut Settings)) -> TestApp {
    assert_redis_reachable().await;
    let (_, options) = create_database().await;
    let prefix = format!("test:{}:", Uuid::new_v4().simple());
    let mut settings = test_settings(&database_url_of(&options), &prefix);
    adjust(&mut settings);
    spawn_with(settings, options).await
}

/// Like `spawn_app`, with a counting proxy between the app and PostgreSQL.
pub async fn spawn_app_behind_proxy(adjust: impl FnOnce(&mut Settings)) -> (TestApp, proxy::CountingProxy) {
    assert_redis_reachable().await;
    let (_, options) = create_database().await;
    let upstream = format!("127.0.0.1:{}", options.get_port())
        .parse()
        .expect("address");
    let proxy = proxy::CountingProxy::start(upstream).await;
    let prefix = format!("test:{}:", Uuid::new_v4().simple());
    let mut settings = test_settings(&database_url_via(&options, proxy.port), &prefix);
    adjust(&mut settings);
    (spawn_with(settings, options).await, proxy)
}

/// The server URL (password and all) pointed at the test's database.
pub fn database_url_of(options: &PgConnectOptions) -> String {
    let mut url = url::Url::parse(&postgres_server_url()).expect("valid URL");
    url.set_path(options.get_database().unwrap_or("postgres"));
    url.to_string()
}

/// The same URL with another host and port: through a proxy, or to a
/// closed port. Without TLS, so that the proxy can read the protocol.
pub fn database_url_via(options: &PgConnectOptions, port: u16) -> String {
    let mut url = url::Url::parse(&database_url_of(options)).expect("valid URL");
    url.set_host(Some("127.0.0.1")).expect("host");
    url.set_port(Some(port)).expect("port");
    url.query_pairs_mut().append_pair("sslmode", "disable");
    url.to_string()
}

/// The test database's URL as another role.
pub fn database_url_as(options: &PgConnectOptions, role: &str, password: &str) -> String {
    let mut url = url::Url::parse(&database_url_of(options)).expect("valid URL");
    url.set_username(role).expect("user");
    url.set_password(Some(password)).expect("password");
    url.to_string()
}

/// A second app on the same database and Redis prefix as `first`: another
/// instance of one deployment, with its own pools.
pub async fn spawn_second_instance(first: &TestApp) -> TestApp {
    let mut settings = first.settings.clone();
    settings.http_port = 0;
    let mut second = spawn_with(settings, first.db_options.clone()).await;
    second.mark_second_instance();
    second
}

pub async fn spawn_with(settings: Settings, db_options: PgConnectOptions) -> TestApp {
    install_telemetry();
    // The server runs on a thread and runtime of its own, so that it outlives
    // nothing it should not: dropping the TestApp stops it and closes its
    // pools, and the test's database is dropped after it.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let server_settings = settings.clone();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("server runtime");
        runtime.block_on(async move {
            let app = Application::build(server_settings)
                .await
                .expect("the app must start");
            let _ = started_tx.send((app.port(), app.admin_port(), app.handle()));
            let _ = app.run_until_stopped().await;
        });
    });
    let (port, admin_port, handle) = started_rx.await.expect("the app started");
    let db = PgPoolOptions::new()
        .max_connections(3)
        .connect_with(db_options.clone())
        .await
        .expect("the test connects to its database");
    TestApp {
        address: format!("http://127.0.0.1:{port}"),
        admin_address: format!("http://127.0.0.1:{admin_port}"),
        db,
        db_options,
        redis_prefix: settings.redis_key_prefix.clone(),
        client: reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .build()
            .expect("client"),
        settings,
        server: Some((handle, thread)),
        second_instance: false,
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        let Some((handle, thread)) = self.server.take() else {
            return;
        };
        let database = self.db_options.get_database().map(str::to_owned);
        let second_instance = self.second_instance;
        // Blocking here is fine: the server lives on its own thread.
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                handle.stop(false).await;
                let _ = thread.join();
                if let (Some(database), false) = (database, second_instance) {
                    drop_database(&database).await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

/// Drops a database `create_database` made, whoever is still connected.
pub async fn drop_database(name: &str) {
    let server = PgConnectOptions::from_str(&postgres_server_url()).expect("URL");
    if let Ok(mut admin) = PgConnection::connect_with(&server.database("postgres")).await {
        let _ = sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .execute(&mut admin)
        .await;
    }
}

impl TestApp {
    /// Stops the server at once, as a crash would: open connections are
    /// dropped, in-flight requests fail.
    pub async fn kill(&mut self) {
        if let Some((handle, thread)) = self.server.take() {
            handle.stop(false).await;
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }

    pub fn port(&self) -> u16 {
        self.address
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0)
    }

    /// This app shares its database with another, which drops it.
    pub fn mark_second_instance(&mut self) {
        self.second_instance = true;
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    pub async fn sign_up(&self, name: &str) -> TestUser {
        sign_up_at(&self.client, &self.address, name).await
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("{}{path}", self.admin_address)
    }

    /// The admin listener's detailed `/readyz`: status code and body.
    pub async fn admin_readiness(&self) -> (u16, Value) {
        let response = self
            .client
            .get(self.admin_url("/readyz"))
            .send()
            .await
            .expect("send");
        let status = response.status().as_u16();
        (status, response.json().await.expect("a JSON body"))
    }

    /// The Prometheus text at the admin listener's `/metrics`.
    pub async fn metrics(&self) -> String {
        self.client
            .get(self.admin_url("/metrics"))
            .send()
            .await
            .expect("send")
            .text()
            .await
            .expect("metrics text")
    }

    /// Two fresh users, the cast of most tests.
    pub async fn alice_and_bob(&self) -> (TestUser, TestUser) {
        (self.sign_up("alice").await, self.sign_up("bob").await)
    }

    /// Sends `POST /api/v1/transfers` from `user`'s wallet.
    pub async fn transfer(
        &self,
        user: &TestUser,
        to: Uuid,
        amount_minor: i64,
        key: Option<&str>,
    ) -> reqwest::Response {
        self.transfer_request(user, to, amount_minor, key)
            .send()
            .await
            .expect("the transfer request was sent")
    }

    /// `POST /api/v1/transfers` from `user`'s wallet, to send later.
    pub fn transfer_request(
        &self,
        user: &TestUser,
        to: Uuid,
        amount_minor: i64,
        key: Option<&str>,
    ) -> reqwest::RequestBuilder {
        self.transfer_request_from(user, user.wallet_id, to, amount_minor, key)
    }

    pub fn transfer_request_from(
        &self,
        user: &TestUser,
        from: Uuid,
        to: Uuid,
        amount_minor: i64,
        key: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let mut request = self
            .client
            .post(self.url("/api/v1/transfers"))
            .bearer_auth(&user.token)
            .json(&json!({ "from_wallet_id": from, "to_wallet_id": to, "amount_minor": amount_minor }));
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        request
    }

    /// GETs `path` as `user` (or anonymously) and parses the JSON body.
    pub async fn get_json(&self, path: &str, user: Option<&TestUser>) -> Value {
        let mut request = self.client.get(self.url(path));
        if let Some(user) = user {
            request = request.bearer_auth(&user.token);
        }
        request
            .send()
            .await
            .expect("send")
            .json()
            .await
            .expect("a JSON body")
    }

    /// The wallet of the user called `name`.
    pub async fn wallet_of(&self, name: &str) -> Uuid {
        sqlx::query_scalar("SELECT w.id FROM wallets w JOIN users u ON u.id = w.user_id WHERE u.name = $1 AND w.lab_slot IS NULL")
            .bind(name)
            .fetch_one(&self.db)
            .await
            .expect("the user's wallet")
    }

    pub async fn balance(&self, wallet: Uuid) -> i64 {
        sqlx::query_scalar("SELECT balance_minor FROM wallets WHERE id = $1")
            .bind(wallet)
            .fetch_one(&self.db)
            .await
            .expect("wallet balance")
    }

    pub async fn count(&self, sql: &'static str) -> i64 {
        sqlx::query_scalar(sql)
            .fetch_one(&self.db)
            .await
            .expect("count query")
    }

    pub async fn transfer_count(&self) -> i64 {
        self.count("SELECT count(*) FROM transfers").await
    }

    /// Everything a refusal must leave untouched.
    pub async fn snapshot(&self) -> StateSnapshot {
        let balances = sqlx::query_as::<_, (Uuid, i64)>("SELECT id, balance_minor FROM wallets")
            .fetch_all(&self.db)
            .await
            .expect("balances")
            .into_iter()
            .collect();
        StateSnapshot {
            balances,
            transfers: self.transfer_count().await,
            ledger_entries: self.count("SELECT count(*) FROM ledger_entries").await,
            idempotency_keys: self.count("SELECT count(*) FROM idempotency_keys").await,
        }
    }

    /// The money invariants, checked on the database after every
    /// concurrency test.
    pub async fn assert_invariants(&self) {
        let violations = money_invariant_violations(&self.db).await;
        assert!(violations.is_empty(), "{}", violations.join("; "));
    }

    pub async fn cooldown_keys(&self) -> Vec<String> {
        let client = redis::Client::open(redis_url()).expect("redis url");
        let mut conn = client.get_multiplexed_async_connection().await.expect("redis");
        redis::cmd("KEYS")
            .arg(format!("{}cooldown:*", self.redis_prefix))
            .query_async(&mut conn)
            .await
            .expect("KEYS")
    }
}

/// Signs `name` up through the server at `base_url`.
pub async fn sign_up_at(client: &reqwest::Client, base_url: &str, name: &str) -> TestUser {
    let response = client
        .post(format!("{base_url}/api/v1/users"))
        .json(&json!({ "name": name, "password": "correct horse battery" }))
        .send()
        .await
        .expect("sign-up request");
    assert_eq!(response.status(), 201, "sign-up of {name}");
    let body: Value = response.json().await.expect("json");
    let id = |field: &str| Uuid::parse_str(body[field].as_str().expect("an id")).expect("uuid");
    TestUser {
        name: name.to_owned(),
        user_id: id("user_id"),
        wallet_id: id("wallet_id"),
        token: body["token"].as_str().expect("token").to_owned(),
    }
}

/// The money invariants (the SQL function `money_invariants()`, the one
/// definition the load test uses too): no money created or destroyed, no
/// negative balance, every balance explained by its ledger, every transfer
/// recorded as exactly two entries that sum to zero. Returns what broke.
pub async fn money_invariant_violations(db: &PgPool) -> Vec<String> {
    let (created, negative, unexplained, unbalanced): (i64, i64, i64, i64) =
        sqlx::query_as("SELECT * FROM money_invariants()")
            .fetch_one(db)
            .await
            .expect("money_invariants()");
    let mut violations = Vec::new();
    if created != 0 {
        violations.push(format!("money was created or destroyed: {created} minor units"));
    }
    if negative > 0 {
        violations.push(format!("{negative} balances went negative"));
    }
    if unexplained > 0 {
        violations.push(format!("{unexplained} balances do not match their ledger"));
    }
    if unbalanced > 0 {
        violations.push(format!(
            "{unbalanced} transfers are not recorded as two entries summing to zero"
        ));
    }
    violations
}

#[derive(Debug, PartialEq, Eq)]
pub struct StateSnapshot {
    pub balances: HashMap<Uuid, i64>,
    pub transfers: i64,
    pub ledger_entries: i64,
    pub idempotency_keys: i64,
}

/// Reads a problem+json response, checking its media type and shape.
pub async fn problem(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert_eq!(content_type, "application/problem+json", "status {status}");
    let body: Value = response.json().await.expect("problem body is JSON");
    assert_eq!(body["status"], status, "{body}");
    for field in ["type", "title", "detail"] {
        assert!(body[field].is_string(), "problem lacks {field}: {body}");
    }
    (status, body)
}

/// Fires all requests at once and waits for every response.
pub async fn fire_together(requests: Vec<reqwest::RequestBuilder>) -> Vec<reqwest::Response> {
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(requests.len()));
    let tasks: Vec<_> = requests
        .into_iter()
        .map(|request| {
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                request.send().await.expect("request sent")
            })
        })
        .collect();
    let mut responses = Vec::with_capacity(tasks.len());
    for task in tasks {
        responses.push(task.await.expect("request task"));
    }
    responses
}

/// Responses that made a transfer: 201 and not a replay.
pub fn fresh_transfers(responses: &[reqwest::Response]) -> usize {
    responses
        .iter()
        .filter(|r| r.status() == 201 && r.headers().get("idempotent-replayed").is_none())
        .count()
}

pub fn new_key() -> String {
    Uuid::new_v4().to_string()
}

pub fn expose(secret: &SecretString) -> &str {
    secret.expose_secret()
}

/// A verified token for `user`, signed with the tests' key: what the
/// cooldown lock is given for a request, for tests that call it directly.
pub fn verified_token_for(user: layered_wallet::domain::UserId) -> layered_wallet::auth::VerifiedToken {
    let signer = layered_wallet::auth::TokenSigner::new(&SecretString::from(SIGNING_KEY));
    let issued = signer.issue(user, chrono::Duration::hours(1));
    signer
        .verify(issued.token.expose_secret())
        .expect("a fresh token verifies")
}
