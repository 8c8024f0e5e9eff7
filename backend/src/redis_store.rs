//! The Redis behind the cooldown lock and the decision feed: one server, or
//! a Redis Cluster (`redis_cluster_urls`). Both give connections that the
//! rest of the code uses the same way (`redis::aio::ConnectionLike`).
//!
//! Every key the service writes names one user, so each command and each
//! pipeline touches one hash slot: nothing needs cross-slot support.

use std::time::Duration;

use deadpool_redis::{Runtime, Timeouts};
use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use secrecy::ExposeSecret;

use crate::settings::Settings;

#[derive(Clone)]
pub enum RedisPool {
    Single(deadpool_redis::Pool),
    Cluster(deadpool_redis::cluster::Pool),
}

pub enum RedisConnection {
    Single(deadpool_redis::Connection),
    Cluster(deadpool_redis::cluster::Connection),
}

/// A dedicated connection for a blocking read (a live decision stream).
pub enum StreamConnection {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

/// Pool occupancy, for the metrics.
pub struct PoolStatus {
    pub size: usize,
    pub available: usize,
    pub max_size: usize,
}

impl RedisPool {
    /// A pool with every limit explicit. Creating it does not connect.
    pub fn from_settings(settings: &Settings) -> anyhow::Result<Self> {
        let command_timeout = Duration::from_millis(settings.redis_command_timeout_ms);
        let pool_config = deadpool_redis::PoolConfig {
            max_size: settings.redis_pool_connections_max,
            timeouts: Timeouts {
                wait: Some(Duration::from_millis(settings.redis_pool_wait_ms_max)),
                create: Some(command_timeout),
                recycle: Some(command_timeout),
            },
            ..Default::default()
        };
        if settings.redis_cluster_urls.is_empty() {
            let mut config = deadpool_redis::Config::from_url(settings.redis_url.expose_secret());
            config.pool = Some(pool_config);
            let pool = config
                .create_pool(Some(Runtime::Tokio1))
                .map_err(|error| anyhow::anyhow!("invalid Redis configuration: {error}"))?;
            Ok(Self::Single(pool))
        } else {
            let urls: Vec<String> = settings
                .redis_cluster_urls
                .iter()
                .map(|url| url.expose_secret().to_owned())
                .collect();
            let mut config = deadpool_redis::cluster::Config::from_urls(urls);
            config.pool = Some(pool_config);
            let pool = config
                .create_pool(Some(deadpool_redis::cluster::Runtime::Tokio1))
                .map_err(|error| anyhow::anyhow!("invalid Redis Cluster configuration: {error}"))?;
            Ok(Self::Cluster(pool))
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisPool::Cluster(_))
    }

    pub async fn get(&self) -> Result<RedisConnection, String> {
        match self {
            RedisPool::Single(pool) => pool
                .get()
                .await
                .map(RedisConnection::Single)
                .map_err(|e| e.to_string()),
            RedisPool::Cluster(pool) => pool
                .get()
                .await
                .map(RedisConnection::Cluster)
                .map_err(|e| e.to_string()),
        }
    }

    pub fn status(&self) -> PoolStatus {
        let (size, available, max_size) = match self {
            RedisPool::Single(pool) => {
                let s = pool.status();
                (s.size, s.available, s.max_size)
            }
            RedisPool::Cluster(pool) => {
                let s = pool.status();
                (s.size, s.available, s.max_size)
            }
        };
        PoolStatus {
            size,
            available,
            max_size,
        }
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

delegate_connection_like!(RedisConnection);
delegate_connection_like!(StreamConnection);

/// Opens connections for live streams: one server or the cluster.
#[derive(Clone)]
pub enum StreamClient {
    Single(redis::Client),
    Cluster(Vec<String>),
}

impl StreamClient {
    pub fn from_settings(settings: &Settings) -> anyhow::Result<Self> {
        if settings.redis_cluster_urls.is_empty() {
            Ok(Self::Single(redis::Client::open(
                settings.redis_url.expose_secret(),
            )?))
        } else {
            Ok(Self::Cluster(
                settings
                    .redis_cluster_urls
                    .iter()
                    .map(|u| u.expose_secret().to_owned())
                    .collect(),
            ))
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
