//! What the connections to PostgreSQL and Redis read: pools, waits,
//! timeouts and URLs.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};

use crate::settings::Settings;
use crate::settings::checks::Checks;

#[derive(Debug, Clone)]
pub struct Database {
    pub url: SecretString,
    /// Empty: `url`.
    pub migration_url: SecretString,
    pub pool_connections_max: u32,
    pub pool_connections_min: u32,
    pub acquire_wait_max: Duration,
    /// Zero: ping on every checkout.
    pub idle_check_after: Duration,
    pub statement_timeout: Duration,
    /// How the pool follows the server that takes writes, when
    /// `url` names several.
    pub host_watch: crate::database_hosts::WatchTimings,
    /// PostgreSQL's `lock_timeout` for wallet rows, in its milliseconds.
    pub wallet_lock_wait_ms_max: u16,
    pub transfer_retries_max: u32,
    /// Transfers that may run at once, how many may queue for a place,
    /// and how long one waits in that queue before it is refused as
    /// overloaded.
    pub transfers_in_flight_max: u32,
    pub transfers_admission_queue_max: u32,
    pub transfers_admission_wait: Duration,
    /// The transfer executors' connections, batch and idle check.
    pub transfer_executors: crate::executors::Bounds,
    pub migrate_on_start: bool,
}

impl Database {
    pub(super) fn checked(s: &Settings, check: &mut Checks) -> Self {
        check.require(
            s.db_pool_connections_min <= s.db_pool_connections_max,
            "db_pool_connections_min must not exceed db_pool_connections_max",
        );
        check.require(
            s.transfers_admission_wait_ms_max < s.db_acquire_wait_ms_max,
            "transfers_admission_wait_ms_max must be under db_acquire_wait_ms_max: overload is refused before a \
             transfer would wait for a connection that long",
        );
        check.require(
            s.transfers_connections < s.db_pool_connections_max,
            "transfers_connections must be under db_pool_connections_max: the transfer executors keep theirs, \
             and every other path needs the rest",
        );
        check.require(
            s.transfers_connections as usize >= s.http_workers,
            "transfers_connections must be at least http_workers: each HTTP worker runs transfer executors of \
             its own, each holding one of these connections",
        );
        for (setting, url) in [
            ("database_url", &s.database_url),
            ("database_migration_url", &s.database_migration_url),
        ] {
            let url = url.expose_secret();
            if setting == "database_url" || !url.is_empty() {
                if let Err(why) = crate::database_hosts::DatabaseHosts::parse(url) {
                    check.require(false, format!("{setting} is not a valid PostgreSQL URL: {why}"));
                }
            }
        }
        Self {
            url: s.database_url.clone(),
            migration_url: s.database_migration_url.clone(),
            pool_connections_max: s.db_pool_connections_max,
            pool_connections_min: s.db_pool_connections_min,
            acquire_wait_max: Duration::from_millis(s.db_acquire_wait_ms_max),
            idle_check_after: Duration::from_millis(s.db_idle_check_after_ms),
            statement_timeout: Duration::from_millis(s.db_statement_timeout_ms),
            host_watch: crate::database_hosts::WatchTimings {
                check_interval: Duration::from_millis(s.db_host_check_interval_ms),
                connect_wait_max: Duration::from_millis(s.db_host_connect_wait_ms_max),
            },
            wallet_lock_wait_ms_max: s.wallet_lock_wait_ms_max,
            transfer_retries_max: s.transfer_retries_max,
            transfers_in_flight_max: s.transfers_in_flight_max,
            transfers_admission_queue_max: s.transfers_admission_queue_max,
            transfers_admission_wait: Duration::from_millis(s.transfers_admission_wait_ms_max),
            transfer_executors: crate::executors::Bounds {
                connections: s.transfers_connections,
                threads: u32::try_from(s.http_workers).unwrap_or(u32::MAX),
                batch_max: s.transfers_batch_max as usize,
                idle_check_after: Duration::from_millis(s.transfers_idle_check_after_ms),
                // Only transfers holding one of admission's places run, so no
                // more than that many ever wait for an executor.
                queue_max: s.transfers_in_flight_max as usize,
            },
            migrate_on_start: s.migrate_on_start,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Redis {
    pub url: SecretString,
    /// Empty: one server at `url`.
    pub cluster_urls: Vec<SecretString>,
    pub commands_in_flight_max: usize,
    pub command_timeout: Duration,
    pub key_prefix: String,
}

impl From<&Settings> for Redis {
    fn from(s: &Settings) -> Self {
        Self {
            url: s.redis_url.clone(),
            cluster_urls: s.redis_cluster_urls.clone(),
            commands_in_flight_max: s.redis_commands_in_flight_max,
            command_timeout: Duration::from_millis(s.redis_command_timeout_ms),
            key_prefix: s.redis_key_prefix.clone(),
        }
    }
}
