//! The stores the tests run against: where the shared PostgreSQL and Redis
//! (and the local Redis Cluster) are, the check that they answer, and a
//! database of its own for each test.
//!
//! A store that does not answer is a panic with how to start it, never a
//! quietly skipped test.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use uuid::Uuid;

const HOW_TO_START: &str = "start them with ./scripts/services.sh, or run the tests with ./scripts/test";

/// The PostgreSQL server the tests create their databases on.
pub fn postgres_server_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .or_else(|_| std::env::var("DATABASE_URL"))
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
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

pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
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

/// A TCP port on which nothing listens: a store that is down, or the port
/// a server the test starts will bind.
///
/// It is drawn below the kernel's ephemeral range, and never twice in one
/// test process. A port the kernel hands out for port 0 lies inside that
/// range, where any outgoing connection of a busy suite (a burst opens a
/// thousand) may take it between this call and the server's bind: a private
/// Redis Cluster node then failed to start.
pub fn closed_port() -> u16 {
    use rand::Rng;
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let Some(below) = ephemeral_range_start().filter(|start| *start > PRIVATE_PORTS_START + 1_000) else {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        return listener.local_addr().expect("addr").port();
    };
    let mut rng = rand::thread_rng();
    loop {
        let port = rng.gen_range(PRIVATE_PORTS_START..below);
        let mut handed_out = HANDED_OUT
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if handed_out.contains(&port) || std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        handed_out.insert(port);
        return port;
    }
}

/// Where `closed_port` draws from, up to the ephemeral range.
const PRIVATE_PORTS_START: u16 = 20_000;

/// The first port of the kernel's ephemeral range, if it can be read.
fn ephemeral_range_start() -> Option<u16> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
