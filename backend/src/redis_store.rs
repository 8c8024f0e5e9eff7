//! The Redis behind the cooldown lock, the account limits and the decision
//! feed: one server, or a Redis Cluster (`redis_cluster_urls`). Both give
//! connections that the rest of the code uses the same way
//! (`redis::aio::ConnectionLike`).
//!
//! Every key the service writes names one user, so each command and each
//! pipeline touches one hash slot: nothing needs cross-slot support.
//!
//! **One multiplexed connection per thread that uses it.** Concurrent
//! requests' commands are pipelined on it, so a request's command costs
//! exactly its own round trip. A pool would buy nothing (each of its
//! connections is itself multiplexed) and would cost a health check,
//! `UNWATCH` + `PING`, on every checkout: a second round trip on every
//! transfer. Why per thread: a connection's reader and writer run as a task
//! on the runtime of the thread that first used it. Shared by the whole
//! process, that task ran on one thread while the requests ran on the
//! HTTP workers' threads, and every command woke the other thread twice,
//! once to send and once to hand the reply back. A worker's own connection
//! is driven by the worker's own loop, which is awake anyway, and the
//! commands of the requests it serves together go out in one write. Each
//! connection is made on first use, so the server starts without Redis, and
//! remade after a failure; a command that meets a broken connection fails
//! (the cooldown's policy decides what that means) and the next one
//! reconnects. Commands in flight at once on one connection are bounded by
//! `redis_commands_in_flight_max`.

use std::sync::{Arc, Weak};
use std::time::Duration;

use prometheus::IntCounter;
use rand::RngCore;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use secrecy::ExposeSecret;
use tokio::sync::OnceCell;

use crate::settings::Redis;

/// Compare-and-delete: only the holder of the token `ARGV[1]` may remove
/// the lock `KEYS[1]`; a lock that expired and was taken by another is left
/// alone. Every owner-checked lock here lets go with it: the cooldown's
/// window given back, a deposit event's lock without an answer to leave,
/// the demonstration's lock on an idempotency key. (A script given more
/// arguments ignores the rest.)
pub const RELEASE_IF_OWNER: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
";

/// The process's Redis: cheap to clone, every clone shares the connections.
#[derive(Clone)]
pub struct RedisStore {
    shared: Shared,
    round_trips: IntCounter,
}

#[derive(Clone)]
enum Shared {
    Single(Arc<PerThread>),
    Cluster(Arc<LazyCluster>),
}

/// How to make one server's connection, for each thread that asks.
pub struct PerThread {
    client: redis::Client,
    config: ConnectionManagerConfig,
}

thread_local! {
    /// This thread's connection to each live store, by the store's address.
    /// An entry whose store is gone is dropped when the next one is added.
    static CONNECTIONS: std::cell::RefCell<Vec<(Weak<PerThread>, ConnectionManager)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

impl PerThread {
    /// This thread's connection, made (without connecting) on first use.
    fn connection(self: &Arc<Self>) -> Result<ConnectionManager, String> {
        CONNECTIONS.with(|connections| {
            let mut connections = connections.borrow_mut();
            // An entry's `Weak` keeps its store's allocation, dropped or
            // not, so no other store can have that address.
            if let Some((_, manager)) = connections
                .iter()
                .find(|(store, _)| std::ptr::eq(store.as_ptr(), Arc::as_ptr(self)))
            {
                return Ok(manager.clone());
            }
            connections.retain(|(store, _)| store.strong_count() > 0);
            let manager = ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone())
                .map_err(|error| error.to_string())?;
            connections.push((Arc::downgrade(self), manager.clone()));
            Ok(manager)
        })
    }
}

/// A cluster connection made on first use.
pub struct LazyCluster {
    client: ClusterClient,
    connection: OnceCell<ClusterConnection>,
}

/// A handle on the shared connection, for one caller's commands; each
/// command or pipeline it sends is counted as one round trip.
pub struct RedisConnection {
    connection: SharedConnection,
    round_trips: IntCounter,
}

enum SharedConnection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// A dedicated connection for a blocking read (a live decision stream),
/// which must not hold up the shared connection's other commands.
pub enum StreamConnection {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl RedisStore {
    /// The shared connection with every limit explicit. Creating it does
    /// not connect.
    pub fn connect(config: &Redis) -> anyhow::Result<Self> {
        let command_timeout = config.command_timeout;
        if config.cluster_urls.is_empty() {
            let client = redis::Client::open(config.url.expose_secret())
                .map_err(|error| anyhow::anyhow!("invalid Redis configuration: {error}"))?;
            let manager_config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(command_timeout))
                .set_response_timeout(Some(command_timeout))
                .set_concurrency_limit(config.commands_in_flight_max)
                // One attempt per use: a request never waits out a backoff;
                // the next request tries again.
                .set_number_of_retries(1)
                .set_max_delay(command_timeout);
            // Checked here, so that a bad configuration stops the start.
            ConnectionManager::new_lazy_with_config(client.clone(), manager_config.clone())
                .map_err(|error| anyhow::anyhow!("invalid Redis configuration: {error}"))?;
            Ok(Self::new(Shared::Single(Arc::new(PerThread {
                client,
                config: manager_config,
            }))))
        } else {
            let urls = cluster_urls(config);
            let client = redis::cluster::ClusterClientBuilder::new(urls)
                .connection_timeout(command_timeout)
                .response_timeout(command_timeout)
                .build()
                .map_err(|error| anyhow::anyhow!("invalid Redis Cluster configuration: {error}"))?;
            Ok(Self::new(Shared::Cluster(Arc::new(LazyCluster {
                client,
                connection: OnceCell::new(),
            }))))
        }
    }

    fn new(shared: Shared) -> Self {
        Self {
            shared,
            // Counted but not exported until `count_round_trips_in`.
            round_trips: IntCounter::new("redis_round_trips_total", "unregistered")
                .expect("static metric definition"),
        }
    }

    /// Counts this store's round trips in `counter` (the app's metric).
    pub fn count_round_trips_in(mut self, counter: IntCounter) -> Self {
        self.round_trips = counter;
        self
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.shared, Shared::Cluster(_))
    }

    /// A handle on this thread's connection, or the cluster's; a cluster's
    /// is made on first use (and tried again by the next caller if that
    /// fails).
    pub async fn get(&self) -> Result<RedisConnection, String> {
        let connection = match &self.shared {
            Shared::Single(per_thread) => SharedConnection::Single(per_thread.connection()?),
            Shared::Cluster(cluster) => cluster
                .connection
                .get_or_try_init(|| cluster.client.get_async_connection())
                .await
                .map(|connection| SharedConnection::Cluster(connection.clone()))
                .map_err(|e| e.to_string())?,
        };
        Ok(RedisConnection {
            connection,
            round_trips: self.round_trips.clone(),
        })
    }
}

/// Both connection enums pass every command to the connection they hold.
macro_rules! delegate_connection_like {
    ($name:ident) => {
        impl ConnectionLike for $name {
            fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
                match self {
                    $name::Single(conn) => conn.req_packed_command(cmd),
                    $name::Cluster(conn) => conn.req_packed_command(cmd),
                }
            }

            fn req_packed_commands<'a>(
                &'a mut self,
                cmd: &'a Pipeline,
                offset: usize,
                count: usize,
            ) -> RedisFuture<'a, Vec<Value>> {
                match self {
                    $name::Single(conn) => conn.req_packed_commands(cmd, offset, count),
                    $name::Cluster(conn) => conn.req_packed_commands(cmd, offset, count),
                }
            }

            fn get_db(&self) -> i64 {
                match self {
                    $name::Single(conn) => conn.get_db(),
                    $name::Cluster(conn) => conn.get_db(),
                }
            }
        }
    };
}

delegate_connection_like!(SharedConnection);
delegate_connection_like!(StreamConnection);

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.round_trips.inc();
        self.connection.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.round_trips.inc();
        self.connection.req_packed_commands(cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.connection.get_db()
    }
}

/// Opens connections for live streams: one server or the cluster.
#[derive(Clone)]
pub enum StreamClient {
    Single(redis::Client),
    Cluster(Vec<String>),
}

impl StreamClient {
    pub fn for_config(config: &Redis) -> anyhow::Result<Self> {
        if config.cluster_urls.is_empty() {
            Ok(Self::Single(redis::Client::open(config.url.expose_secret())?))
        } else {
            Ok(Self::Cluster(cluster_urls(config)))
        }
    }

    /// A dedicated connection whose replies may take up to
    /// `response_timeout` (a blocking read's wait, plus slack).
    pub async fn connect(
        &self,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<StreamConnection, String> {
        match self {
            StreamClient::Single(client) => {
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_response_timeout(Some(response_timeout));
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map(StreamConnection::Single)
                    .map_err(|e| e.to_string())
            }
            StreamClient::Cluster(urls) => {
                let client = redis::cluster::ClusterClientBuilder::new(urls.clone())
                    .connection_timeout(connect_timeout)
                    .response_timeout(response_timeout)
                    .build()
                    .map_err(|e| e.to_string())?;
                client
                    .get_async_connection()
                    .await
                    .map(StreamConnection::Cluster)
                    .map_err(|e| e.to_string())
            }
        }
    }
}

/// The cluster's seed nodes, as the client takes them.
fn cluster_urls(config: &Redis) -> Vec<String> {
    config
        .cluster_urls
        .iter()
        .map(|url| url.expose_secret().to_owned())
        .collect()
}

/// 128 random bits: unguessable, so no other request can release our key
/// (the cooldown's windows, the deposits' event locks).
pub fn random_token() -> String {
    let mut bytes = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}
