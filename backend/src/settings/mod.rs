//! Typed settings: defaults in code, then an optional TOML file, then
//! environment variables.
//!
//! Every limit is a named setting with its unit last in the name
//! (`cooldown_ttl_ms`, `request_body_bytes_max`) and a default that suits one
//! small machine. `Settings` is the operator's flat format; the server reads
//! `Config` (`sections.rs`), one section per concern, which
//! `Settings::validate` builds at start-up, so a bad value stops the server
//! before it accepts a request instead of misbehaving under load.
//!
//! Environment variables: `WALLET_<SETTING>` for any setting (for example
//! `WALLET_COOLDOWN_TTL_MS=2000`), plus the conventional `DATABASE_URL`,
//! `REDIS_URL`, `PORT` and `LOG_FORMAT`, which win over everything else.

mod sections;

use std::path::Path;

use secrecy::SecretString;

pub use sections::{
    Accounts, Config, Cooldown, Database, Demo, Feed, Http, Idempotency, Money, RaceLab, Redis, RowGuard,
};
use serde::Deserialize;

/// What a transfer statement's timeout must leave beyond the waits it
/// encloses: time for the work itself once the locks are held.
pub const STATEMENT_TIMEOUT_MARGIN_MS: u64 = 500;

/// What the cooldown lock is keyed on besides the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CooldownScope {
    /// One window per user and action: any second transfer inside the window
    /// is refused, whatever its body.
    UserAction,
    /// One window per user, action and request body: only an identical
    /// transfer is refused, a different one goes through.
    UserActionBody,
}

/// What the cooldown layer does when Redis cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreErrorPolicy {
    /// Let the request through; the PostgreSQL layers alone keep correctness.
    FailOpen,
    /// Answer 503: for deployments that would rather refuse than lose the
    /// edge's load shedding.
    FailClosed,
}

/// How the idempotency layer claims a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum IdempotencyMode {
    /// The claim is an insert under a unique key, in the transfer's
    /// transaction. The only safe mode.
    Atomic,
    /// DEMO ONLY: look the key up, do the transfer, record the key
    /// afterwards. Two requests that look at once both see no key.
    CheckThenInsert,
    /// DEMO ONLY: keys are ignored.
    Off,
}

/// How the debit checks the balance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RowGuardMode {
    /// Check and write in one guarded `UPDATE`, wallets locked in id order.
    /// The only safe mode.
    Guarded,
    /// DEMO ONLY (the row guard switched off): read the balance, compare in
    /// Rust, write the computed balance back, with no lock: a
    /// time-of-check-to-time-of-use race and lost updates.
    ReadDecideWrite,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    // --- HTTP ---
    pub http_host: String,
    pub http_port: u16,
    /// `host:port` of the admin listener: `/metrics` and the detailed
    /// `/readyz`. Keep it off the public network; port 0 picks a free one.
    pub admin_http_addr: String,
    /// actix worker threads; one per core is enough for an I/O-bound service.
    pub http_workers: usize,
    pub request_body_bytes_max: usize,
    /// An oversized body is read and thrown away up to this many bytes
    /// before the 413 is sent and the connection closed, so that a client
    /// still sending its body reads the answer instead of a reset.
    pub oversized_body_drain_bytes_max: usize,
    /// ...and for at most this long.
    pub oversized_body_drain_ms_max: u64,
    /// How long in-flight requests get to finish after SIGTERM.
    pub shutdown_grace_s: u64,
    pub log_format: LogFormat,
    /// Names this process in the decision feed and the logs. Empty: the
    /// host name and a random suffix.
    pub instance_id: String,

    // --- PostgreSQL ---
    pub database_url: SecretString,
    /// The database as its owning role, for migrations only
    /// (`wallet-server migrate`, `migrate_on_start`). Empty: `database_url`.
    /// The server itself should connect as a role that may only read and
    /// write rows and call functions (`deploy/postgres/roles.sql`).
    pub database_migration_url: SecretString,
    pub db_pool_connections_max: u32,
    pub db_pool_connections_min: u32,
    /// How long a request waits for a free connection before answering 503.
    pub db_acquire_wait_ms_max: u64,
    /// A pooled connection idle at least this long is pinged before use;
    /// one used more recently is not. 0 (the default) pings on every
    /// checkout: a round trip per transfer, but a connection that broke
    /// while idle is replaced before a transfer is sent down it, so the
    /// client gets a clean answer instead of "outcome unknown".
    pub db_idle_check_after_ms: u64,
    /// PostgreSQL `statement_timeout`. It must exceed the waits a transfer
    /// statement encloses (`idempotency_wait_ms_max` +
    /// `wallet_lock_wait_ms_max` + `STATEMENT_TIMEOUT_MARGIN_MS`), so that
    /// each wait ends in its own answer (409, 503) rather than the timeout.
    pub db_statement_timeout_ms: u64,
    /// Longest wait for a wallet row lock held by another transfer. This
    /// and the idempotency wait and retention are `u16`: they go to
    /// PostgreSQL as `int`, and the type makes that conversion total.
    pub wallet_lock_wait_ms_max: u16,
    /// Retries of a transfer transaction that failed on a serialization
    /// failure or a deadlock; never surfaced to the client as a 500.
    pub transfer_retries_max: u32,
    /// Run pending migrations when the server starts.
    pub migrate_on_start: bool,

    // --- Redis ---
    pub redis_url: SecretString,
    /// Commands in flight at once on the shared Redis connection; further
    /// ones wait (within `redis_command_timeout_ms`).
    pub redis_commands_in_flight_max: usize,
    /// Upper bound on one Redis command, connecting included. A slow Redis is
    /// treated like an unreachable one.
    pub redis_command_timeout_ms: u64,
    /// Nodes of a Redis Cluster to use instead of `redis_url` (any subset;
    /// the rest are discovered). Empty: one Redis server at `redis_url`.
    pub redis_cluster_urls: Vec<SecretString>,
    /// Prepended to every Redis key, so several deployments (or tests) can
    /// share one Redis.
    pub redis_key_prefix: String,

    // --- Layer 1: cooldown lock ---
    pub cooldown_enabled: bool,
    pub cooldown_ttl_ms: u64,
    pub cooldown_scope: CooldownScope,
    pub cooldown_on_store_error: StoreErrorPolicy,

    // --- Layer 2: idempotency key ---
    pub idempotency_mode: IdempotencyMode,
    pub idempotency_key_required: bool,
    /// How long a request waits for a concurrent request with the same key
    /// to finish before answering 409.
    pub idempotency_wait_ms_max: u16,
    pub idempotency_retention_hours: u16,
    pub idempotency_sweep_interval_s: u64,
    pub idempotency_sweep_batch_rows_max: i64,

    // --- Layer 3: row guard ---
    pub row_guard_mode: RowGuardMode,

    // --- Unsafe demonstration modes ---
    /// Must be on for the server to start with any layer disabled or in a
    /// naive mode. Never in production.
    pub allow_unsafe_demo_modes: bool,
    /// A pause inside the naive variants' race windows (between check and
    /// insert, between read and write), so that demonstrations of the races
    /// they allow are reliable rather than lucky.
    pub naive_window_ms: u64,

    // --- Race lab ---
    /// Lets a race-lab run switch layers off for its own lab wallets; real
    /// wallets refuse the switches whatever this says. Off: every run goes
    /// through all three layers.
    pub race_lab_switches_enabled: bool,
    /// Requests one race-lab run fires at once.
    pub race_lab_requests_max: usize,
    /// Race-lab runs one instance fires at once; a further one is refused.
    pub race_lab_runs_in_flight_max: usize,
    /// What each of a visitor's two lab wallets holds when a run starts.
    pub race_lab_balance_minor: i64,
    /// A run's requests are given up after this long (the retry preset
    /// waits out the cooldown window inside it).
    pub race_lab_run_ms_max: u64,
    /// The pause inside a lab run's naive race windows (check-then-insert,
    /// read-decide-write), so that the race a switched-off layer allows
    /// shows on every run rather than by luck.
    pub race_lab_naive_window_ms: u64,

    // --- Browser demo ---
    /// An account made at start-up (after migrations) that anyone can send
    /// to and nobody can sign in as, so that a lone visitor has a
    /// recipient. Empty: none.
    pub demo_recipient_name: String,
    /// A trace viewer's URL with `{trace_id}` in it, e.g.
    /// `http://127.0.0.1:16686/trace/{trace_id}` for Jaeger; the race lab
    /// links each request to its trace. Empty: no links.
    pub trace_ui_url: String,

    // --- Decision feed ---
    pub decision_feed_enabled: bool,
    /// In-process queue between requests and the feed writer; entries
    /// beyond it are dropped (and counted), never waited for.
    pub decision_feed_queue_entries_max: usize,
    pub decision_feed_entries_per_user_max: u64,
    pub decision_feed_retention_hours: u64,
    /// The feed stops writing while Redis's `used_memory` is at or above
    /// this, so that it can never fill Redis and refuse the cooldown.
    pub decision_feed_redis_memory_bytes_max: u64,
    /// How often the feed writer reads `used_memory`, at most.
    pub decision_feed_memory_check_ms: u64,
    pub decisions_page_entries_max: usize,
    /// Concurrent live streams (`/api/v1/decisions/stream`) per instance;
    /// each holds one Redis connection.
    pub decision_streams_max: usize,
    /// How long one blocking read of a live stream waits before sending a
    /// keep-alive comment.
    pub decision_stream_keepalive_ms: u64,
    /// How often a live stream re-checks that its token is still valid; it
    /// ends when the token is revoked or expires.
    pub decision_stream_token_check_s: u64,
    /// A live stream ends after this long; the client reconnects.
    pub decision_stream_lifetime_s: u64,
    /// Live streams one user may hold on one instance at once.
    pub decision_streams_per_user_max: usize,

    // --- Money and accounts ---
    pub currency: String,
    pub signup_grant_minor: i64,
    pub transfer_amount_minor_max: i64,
    pub transfers_page_rows_max: i64,
    pub user_name_chars_max: usize,
    pub password_chars_min: usize,
    pub password_chars_max: usize,

    // --- Authentication ---
    /// Key for the MAC on bearer tokens; at least 32 bytes. Every instance
    /// of one deployment needs the same key. Left empty, a random key is made
    /// at start-up (tokens then die with the process: fine for a demo only).
    pub token_signing_key: SecretString,
    pub api_token_ttl_hours: u64,
    /// Threads that hash and verify passwords (argon2id: CPU and 19 MiB
    /// each, by design); they bound what sign-ins can take.
    pub password_hash_threads: usize,
    /// Sign-ins waiting for a password thread before further ones get 503.
    pub password_hash_queue_max: usize,

    // --- Account rate limits (`account_limits`) ---
    /// Off only for load tests that sign up thousands of users from one
    /// address.
    pub account_limits_enabled: bool,
    /// Each limit allows that many attempts at once, refilled at that many
    /// per period, counted in Redis across every instance.
    pub signup_per_address_per_hour_max: u32,
    pub signup_per_name_per_hour_max: u32,
    pub signin_per_address_per_minute_max: u32,
    pub signin_per_name_per_minute_max: u32,
    /// Addresses or networks (CIDR) of the load balancers in front of the
    /// instances. Only from these is `X-Forwarded-For` believed.
    pub trusted_proxies: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            http_host: "127.0.0.1".into(),
            admin_http_addr: "127.0.0.1:9090".into(),
            http_port: 8080,
            http_workers: 2,
            request_body_bytes_max: 16 * 1024,
            oversized_body_drain_bytes_max: 8 * 1024 * 1024,
            oversized_body_drain_ms_max: 2_000,
            shutdown_grace_s: 10,
            log_format: LogFormat::Text,
            instance_id: String::new(),

            database_url: SecretString::from("postgres://postgres@127.0.0.1:5432/layered_wallet"),
            database_migration_url: SecretString::from(""),
            db_pool_connections_max: 16,
            db_pool_connections_min: 2,
            db_acquire_wait_ms_max: 2_000,
            db_idle_check_after_ms: 0,
            db_statement_timeout_ms: 6_000,
            wallet_lock_wait_ms_max: 3_000,
            transfer_retries_max: 3,
            migrate_on_start: true,

            redis_url: SecretString::from("redis://127.0.0.1:6379"),
            redis_commands_in_flight_max: 1_024,
            redis_command_timeout_ms: 250,
            redis_cluster_urls: Vec::new(),
            redis_key_prefix: "lw:".into(),

            cooldown_enabled: true,
            cooldown_ttl_ms: 5_000,
            cooldown_scope: CooldownScope::UserAction,
            cooldown_on_store_error: StoreErrorPolicy::FailOpen,

            idempotency_mode: IdempotencyMode::Atomic,
            idempotency_key_required: false,
            idempotency_wait_ms_max: 2_000,
            idempotency_retention_hours: 24,
            idempotency_sweep_interval_s: 900,
            idempotency_sweep_batch_rows_max: 10_000,

            row_guard_mode: RowGuardMode::Guarded,
            allow_unsafe_demo_modes: false,
            naive_window_ms: 0,

            race_lab_switches_enabled: true,
            race_lab_requests_max: 200,
            race_lab_runs_in_flight_max: 2,
            race_lab_balance_minor: 10_000,
            race_lab_run_ms_max: 30_000,
            race_lab_naive_window_ms: 50,

            trace_ui_url: String::new(),
            demo_recipient_name: "demo".into(),

            decision_feed_enabled: true,
            decision_feed_queue_entries_max: 10_000,
            decision_feed_entries_per_user_max: 500,
            decision_feed_retention_hours: 1,
            decision_feed_redis_memory_bytes_max: 64 * 1024 * 1024,
            decision_feed_memory_check_ms: 250,
            decisions_page_entries_max: 200,
            decision_streams_max: 64,
            decision_stream_keepalive_ms: 15_000,
            decision_stream_token_check_s: 5,
            decision_stream_lifetime_s: 3_600,
            decision_streams_per_user_max: 4,

            currency: "USD".into(),
            signup_grant_minor: 100_000,
            transfer_amount_minor_max: 10_000_000,
            transfers_page_rows_max: 100,
            user_name_chars_max: 64,
            password_chars_min: 8,
            password_chars_max: 128,

            token_signing_key: SecretString::from(""),
            api_token_ttl_hours: 24,
            password_hash_threads: 2,
            password_hash_queue_max: 64,
            account_limits_enabled: true,
            signup_per_address_per_hour_max: 20,
            signup_per_name_per_hour_max: 5,
            signin_per_address_per_minute_max: 30,
            signin_per_name_per_minute_max: 10,
            trusted_proxies: Vec::new(),
        }
    }
}

impl Settings {
    /// Defaults, then the TOML file at `path` if given, then the environment.
    pub fn load(path: Option<&Path>) -> anyhow::Result<Self> {
        let mut builder = config::Config::builder();
        if let Some(path) = path {
            builder = builder.add_source(config::File::from(path).required(true));
        }
        builder = builder.add_source(
            config::Environment::with_prefix("WALLET")
                .prefix_separator("_")
                .try_parsing(true)
                .list_separator(",")
                .with_list_parse_key("redis_cluster_urls")
                .with_list_parse_key("trusted_proxies"),
        );
        for (variable, setting) in [
            ("DATABASE_URL", "database_url"),
            ("DATABASE_MIGRATION_URL", "database_migration_url"),
            ("REDIS_URL", "redis_url"),
            ("PORT", "http_port"),
            ("LOG_FORMAT", "log_format"),
        ] {
            if let Ok(value) = std::env::var(variable) {
                builder = builder.set_override(setting, value)?;
            }
        }
        let settings: Settings = builder.build()?.try_deserialize()?;
        Ok(settings)
    }

    /// Checks every limit once, at start-up, and builds the sections the
    /// server reads. Returns all problems at once.
    pub fn validate(&self) -> Result<Config, SettingsError> {
        Config::from_settings(self)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("invalid settings: {}", .0.join("; "))]
pub struct SettingsError(pub Vec<String>);

/// An address (a network of one) or a CIDR network.
fn parse_network(entry: &str) -> Option<ipnet::IpNet> {
    let entry = entry.trim();
    entry
        .parse::<ipnet::IpNet>()
        .ok()
        .or_else(|| entry.parse::<std::net::IpAddr>().ok().map(ipnet::IpNet::from))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid() {
        Settings::default().validate().expect("defaults must validate");
    }

    #[test]
    fn unsafe_modes_need_the_explicit_switch() {
        let naive = Settings {
            row_guard_mode: RowGuardMode::ReadDecideWrite,
            ..Settings::default()
        };
        assert!(naive.validate().is_err());
        let allowed = Settings {
            allow_unsafe_demo_modes: true,
            ..naive
        };
        let config = allowed.validate().expect("allowed explicitly");
        assert_eq!(config.unsafe_modes(), vec!["row guard off (read-decide-write)"]);
    }

    #[test]
    fn the_statement_timeout_must_outlast_the_waits_it_encloses() {
        let settings = Settings {
            idempotency_wait_ms_max: 2_000,
            wallet_lock_wait_ms_max: 3_000,
            db_statement_timeout_ms: 5_000,
            ..Settings::default()
        };
        let error = settings.validate().expect_err("no margin left");
        assert!(error.to_string().contains("db_statement_timeout_ms"), "{error}");
        Settings {
            db_statement_timeout_ms: 5_500,
            ..settings
        }
        .validate()
        .expect("waits plus the margin fit");
    }

    #[test]
    fn every_number_has_a_ceiling() {
        let settings = Settings {
            api_token_ttl_hours: u64::MAX,
            http_workers: 100_000,
            decision_feed_retention_hours: u64::MAX,
            ..Settings::default()
        };
        let error = settings.validate().expect_err("must be refused");
        assert_eq!(error.0.len(), 3, "{error}");
        assert!(
            error
                .to_string()
                .contains("api_token_ttl_hours must be between 1 and 8760"),
            "{error}"
        );
    }

    #[test]
    fn the_sections_hold_typed_durations() {
        let config = Settings {
            cooldown_ttl_ms: 2_500,
            decision_stream_token_check_s: 7,
            decision_feed_retention_hours: 3,
            api_token_ttl_hours: 48,
            idempotency_wait_ms_max: 1_200,
            ..Settings::default()
        }
        .validate()
        .expect("valid");
        assert_eq!(config.cooldown.ttl, std::time::Duration::from_millis(2_500));
        assert_eq!(config.feed.stream_token_check, std::time::Duration::from_secs(7));
        assert_eq!(config.feed.retention, std::time::Duration::from_secs(3 * 3_600));
        assert_eq!(config.accounts.api_token_ttl, chrono::TimeDelta::hours(48));
        assert_eq!(
            config.idempotency.wait_max(),
            std::time::Duration::from_millis(1_200)
        );
    }

    #[test]
    fn every_bad_limit_is_reported_at_once() {
        let settings = Settings {
            cooldown_ttl_ms: 0,
            currency: "usd".into(),
            token_signing_key: SecretString::from("short"),
            ..Settings::default()
        };
        let error = settings.validate().expect_err("must be refused");
        assert_eq!(error.0.len(), 3, "{error}");
    }
}

#[cfg(test)]
mod example_file {
    use super::Settings;

    #[test]
    fn the_example_settings_file_loads_and_validates() {
        let path = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/example.toml"));
        let settings = Settings::load(Some(path)).expect("config/example.toml must load");
        settings.validate().expect("and validate");
        assert_eq!(settings.cooldown_ttl_ms, 5_000);
    }
}
