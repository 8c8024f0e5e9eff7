//! The deployment a run goes through: a private PostgreSQL and Redis, a
//! counting proxy between the instances and PostgreSQL, and several
//! `wallet-server` processes; how each fault is injected into it, and how
//! its instances' `/readyz` reads.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use layered_wallet::settings::StoreErrorPolicy;
use serde_json::Value;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use super::fault::{Fault, Readiness};
use super::{CHAOS_COOLDOWN_TTL_MS, REQUEST_SECONDS_MAX};
use crate::TestUser;
use crate::private_stores::{PgStopMode, PrivatePostgres, PrivateRedis, ScratchDir};
use crate::proxy::CountingProxy;
use crate::replicated_postgres::{ReplicatedPostgres, Replication};
use crate::server_process::ServerProcess;

/// What every client user is given on sign-up: enough that no transfer in
/// a storm is refused for want of funds.
const CHAOS_GRANT_MINOR: i64 = 100_000_000;
/// How far the standby falls behind before its primary dies: the
/// primary's WAL sender is paused this long, as a slow link would hold
/// replication back.
/// Well under `db_statement_timeout_ms`, so that a synchronous commit
/// waits for the standby rather than being cancelled by the timeout
/// (which PostgreSQL answers as committed, replicated or not).
pub(super) const STANDBY_PAUSE_MS: u64 = 1_000;
const CHAOS_SIGNING_KEY: &str = "chaos-signing-key-chaos-signing-key-0123456789";

/// The deployment's PostgreSQL.
pub(super) enum Postgres {
    /// One server, reached through a counting proxy that can cut
    /// connections and lose replies.
    Single {
        server: PrivatePostgres,
        proxy: CountingProxy,
    },
    /// A primary and a standby under Patroni, reached directly through a
    /// URL that names both.
    Replicated(ReplicatedPostgres),
}

/// What a failover measured.
#[derive(Debug, Clone, Copy)]
pub(super) struct FailoverSeen {
    pub(super) dead: usize,
    pub(super) killed_at: Instant,
    /// From the `kill -9` to the standby taking writes.
    pub(super) took: Option<Duration>,
}

/// A deployment of the chaos suite's own.
pub(super) struct Deployment {
    pub(super) postgres: Postgres,
    pub(super) redis: PrivateRedis,
    pub(super) failover: Option<FailoverSeen>,
    pub(super) instances: Vec<ServerProcess>,
    /// Straight to PostgreSQL, not through the proxy: for the checks.
    pub(super) db: PgPool,
    pub(super) client: reqwest::Client,
    pub(super) logs: ScratchDir,
}

/// What a deployment runs beyond the transfer path's needs.
#[derive(Debug, Clone, Default)]
pub(super) struct Extras {
    /// More settings for every instance.
    pub(super) env: Vec<(String, String)>,
    /// `redis-server` arguments, e.g. the append-only file.
    pub(super) redis_args: Vec<&'static str>,
    /// A primary and a standby under Patroni, replicating so, instead of
    /// one server behind the proxy.
    pub(super) replicated: Option<Replication>,
}

impl Deployment {
    /// Starts everything, with the cooldown policy `policy` and `extras`,
    /// and migrates.
    pub(super) async fn start_with(
        binary: PathBuf,
        instances: usize,
        policy: StoreErrorPolicy,
        extras: Extras,
    ) -> Self {
        let (postgres, database_url) = match extras.replicated {
            None => {
                let server = tokio::task::spawn_blocking(PrivatePostgres::start)
                    .await
                    .expect("start the private PostgreSQL");
                server.create_database("wallet").await;
                let upstream = format!("127.0.0.1:{}", server.port).parse().expect("address");
                let proxy = CountingProxy::start(upstream).await;
                // Without TLS, so that the proxy can read the protocol.
                let url = format!(
                    "postgres://postgres@127.0.0.1:{}/wallet?sslmode=disable",
                    proxy.port
                );
                (Postgres::Single { server, proxy }, url)
            }
            Some(replication) => {
                let cluster = ReplicatedPostgres::start(replication, 1).await;
                cluster.create_database("wallet").await;
                let url = cluster.url("wallet");
                (Postgres::Replicated(cluster), url)
            }
        };
        let redis_args = extras.redis_args.clone();
        let redis = tokio::task::spawn_blocking(move || PrivateRedis::start_with(&redis_args))
            .await
            .expect("start the private Redis");
        let logs = ScratchDir::for_logs("chaos-logs");
        let policy_name = match policy {
            StoreErrorPolicy::FailOpen => "fail_open",
            StoreErrorPolicy::FailClosed => "fail_closed",
        };
        let env: Vec<(String, String)> = [
            ("DATABASE_URL", database_url),
            ("REDIS_URL", redis.url()),
            ("WALLET_TOKEN_SIGNING_KEY", CHAOS_SIGNING_KEY.to_owned()),
            ("WALLET_REDIS_KEY_PREFIX", "chaos:".to_owned()),
            ("WALLET_COOLDOWN_ON_STORE_ERROR", policy_name.to_owned()),
            ("WALLET_COOLDOWN_TTL_MS", CHAOS_COOLDOWN_TTL_MS.to_string()),
            ("WALLET_SIGNUP_GRANT_MINOR", CHAOS_GRANT_MINOR.to_string()),
            ("WALLET_HTTP_WORKERS", "2".to_owned()),
            ("WALLET_TRANSFERS_CONNECTIONS", "4".to_owned()),
            ("WALLET_ADMIN_HTTP_ADDR", "127.0.0.1:0".to_owned()),
            ("WALLET_ACCOUNT_LIMITS_ENABLED", "false".to_owned()),
            ("WALLET_MIGRATE_ON_START", "false".to_owned()),
            ("WALLET_SHUTDOWN_GRACE_S", "1".to_owned()),
            ("WALLET_IDEMPOTENCY_SWEEP_INTERVAL_S", "3600".to_owned()),
            ("RUST_LOG", "warn".to_owned()),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .chain(extras.env)
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
        let direct_url = match &postgres {
            Postgres::Single { server, .. } => server.url("wallet"),
            Postgres::Replicated(cluster) => cluster.primary_url("wallet").await,
        };
        let db = PgPoolOptions::new()
            .max_connections(3)
            .connect(&direct_url)
            .await
            .expect("connect to the private PostgreSQL");
        Self {
            postgres,
            redis,
            failover: None,
            instances: processes,
            db,
            // Idle connections are let go before the instances' keep-alive
            // closes them, as every client of the service must: a request
            // sent on a connection being closed gets a reset, not an answer.
            client: wallet_client::http_client_builder()
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

    pub(super) async fn sign_up(&self, name: &str) -> TestUser {
        crate::sign_up_at(&self.client, &self.url(0, ""), name).await
    }

    /// The one server behind the proxy, for the faults made to it.
    pub(super) fn server(&self) -> &PrivatePostgres {
        match &self.postgres {
            Postgres::Single { server, .. } => server,
            Postgres::Replicated(_) => panic!("a single server's fault on a replicated deployment"),
        }
    }

    pub(super) fn proxy(&self) -> &CountingProxy {
        match &self.postgres {
            Postgres::Single { proxy, .. } => proxy,
            Postgres::Replicated(_) => panic!("the proxy's fault on a replicated deployment"),
        }
    }

    fn cluster(&mut self) -> &mut ReplicatedPostgres {
        match &mut self.postgres {
            Postgres::Replicated(cluster) => cluster,
            Postgres::Single { .. } => panic!("a failover on a single server"),
        }
    }

    /// How many replies the proxy lost; none without a proxy.
    pub(super) fn replies_lost(&self) -> u64 {
        match &self.postgres {
            Postgres::Single { proxy, .. } => proxy.replies_lost(),
            Postgres::Replicated(_) => 0,
        }
    }

    /// Starts the fault; `end_fault` ends it.
    pub(super) async fn begin_fault(&mut self, fault: Fault) {
        match fault {
            Fault::RedisKilled(_) => self.redis.kill(),
            Fault::PostgresFastRestart => {
                tokio::task::block_in_place(|| self.server().stop(PgStopMode::Fast))
            }
            Fault::PostgresCrash => tokio::task::block_in_place(|| self.server().stop(PgStopMode::Immediate)),
            Fault::InstanceKilled => self.instances[0].kill_9(),
            Fault::ConnectionsCut => self.proxy().cut_connections(),
            Fault::CommitRepliesLost => self
                .proxy()
                .keep_losing_replies_to(&["FROM transfer(", "FROM transfer_batch("]),
            Fault::PrimaryFailover(_) => {
                let cluster = self.cluster();
                let primary = cluster.leader().await.expect("a primary before the failover");
                cluster.pause_replication(primary);
                tokio::time::sleep(Duration::from_millis(STANDBY_PAUSE_MS)).await;
                let killed_at = Instant::now();
                cluster.kill_node(primary);
                self.failover = Some(FailoverSeen {
                    dead: primary,
                    killed_at,
                    took: None,
                });
            }
        }
    }

    /// Keeps a fault going that has to be repeated.
    pub(super) fn sustain_fault(&self, fault: Fault) {
        if fault == Fault::ConnectionsCut {
            self.proxy().cut_connections();
        }
    }

    pub(super) async fn end_fault(&mut self, fault: Fault) {
        match fault {
            Fault::RedisKilled(_) => tokio::task::block_in_place(|| self.redis.start_again()),
            Fault::PostgresFastRestart | Fault::PostgresCrash => {
                tokio::task::block_in_place(|| self.server().start_again())
            }
            Fault::InstanceKilled => self.instances[0].start_again().await,
            Fault::ConnectionsCut => {}
            Fault::CommitRepliesLost => self.proxy().stop_losing_replies(),
            // The fault ends when Patroni has promoted the standby: the
            // checks read the database there.
            Fault::PrimaryFailover(_) => {
                let mut seen = self.failover.expect("the failover began");
                let cluster = self.cluster();
                let (_, took) = cluster.wait_for_promotion(seen.dead, seen.killed_at).await;
                let promoted: PgConnectOptions = cluster
                    .primary_url("wallet")
                    .await
                    .parse()
                    .expect("the promoted server's URL");
                seen.took = Some(took);
                self.failover = Some(seen);
                self.db.set_connect_options(promoted);
            }
        }
    }

    pub(super) async fn readiness(&self, instance: usize) -> Readiness {
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
}
