//! The settings as the server uses them: one section per concern.
//!
//! `Settings` is what an operator writes, flat, with each unit in the name
//! (`cooldown_ttl_ms`); those names are the contract with config files and
//! `WALLET_*` variables. `Config` is what the code reads. Each section is
//! built by checking its own bounds, once, at start-up: each bound is
//! declared in one place and the message is made from it. Times are
//! `Duration`s, addresses are parsed. Nothing downstream re-checks or
//! converts with a fallback.
//!
//! The two waits and the retention that PostgreSQL takes as `int` stay
//! `u16` counts of PostgreSQL's unit, so that conversion is total
//! (`i32::from`). A getter gives each as a `Duration` for Rust-side use.

use std::fmt::Display;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};

use super::{
    CooldownScope, IdempotencyMode, LogFormat, RowGuardMode, STATEMENT_TIMEOUT_MARGIN_MS, Settings,
    SettingsError, StoreErrorPolicy,
};

const MIB: u64 = 1024 * 1024;

/// Everything the server reads, validated.
#[derive(Debug, Clone)]
pub struct Config {
    pub http: Http,
    pub database: Database,
    pub redis: Redis,
    pub cooldown: Cooldown,
    pub idempotency: Idempotency,
    pub row_guard: RowGuard,
    pub demo: Demo,
    pub race_lab: RaceLab,
    pub feed: Feed,
    pub money: Money,
    pub accounts: Accounts,
}

#[derive(Debug, Clone)]
pub struct Http {
    pub host: String,
    pub port: u16,
    pub admin_addr: String,
    pub workers: usize,
    pub request_body_bytes_max: usize,
    pub oversized_body_drain_bytes_max: usize,
    pub oversized_body_drain_max: Duration,
    pub shutdown_grace: Duration,
    pub log_format: LogFormat,
    /// Empty: the host name and a random suffix.
    pub instance_id: String,
    /// The load balancers whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<ipnet::IpNet>,
}

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
    /// PostgreSQL's `lock_timeout` for wallet rows, in its milliseconds.
    pub wallet_lock_wait_ms_max: u16,
    pub transfer_retries_max: u32,
    pub migrate_on_start: bool,
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

#[derive(Debug, Clone)]
pub struct Cooldown {
    pub enabled: bool,
    pub ttl: Duration,
    pub scope: CooldownScope,
    /// Also what the account limits do when Redis cannot be reached.
    pub on_store_error: StoreErrorPolicy,
}

#[derive(Debug, Clone)]
pub struct Idempotency {
    pub mode: IdempotencyMode,
    pub key_required: bool,
    /// How long a request waits for another holding its key, in
    /// PostgreSQL's milliseconds.
    pub wait_ms_max: u16,
    /// How long a key is remembered, in PostgreSQL's hours.
    pub retention_hours: u16,
    pub sweep_interval: Duration,
    pub sweep_batch_rows_max: i64,
}

#[derive(Debug, Clone)]
pub struct RowGuard {
    pub mode: RowGuardMode,
}

#[derive(Debug, Clone)]
pub struct Demo {
    pub allow_unsafe_modes: bool,
    /// The pause inside the naive variants' race windows.
    pub naive_window: Duration,
    /// A trace viewer's URL with `{trace_id}` in it; empty: no links.
    pub trace_ui_url: String,
    /// Empty: no demo recipient.
    pub recipient_name: String,
}

#[derive(Debug, Clone)]
pub struct RaceLab {
    pub switches_enabled: bool,
    pub requests_max: usize,
    pub runs_in_flight_max: usize,
    pub balance_minor: i64,
    pub run_max: Duration,
    pub naive_window: Duration,
}

#[derive(Debug, Clone)]
pub struct Feed {
    pub enabled: bool,
    pub queue_entries_max: usize,
    pub entries_per_user_max: u64,
    pub retention: Duration,
    pub redis_memory_bytes_max: u64,
    pub memory_check_interval: Duration,
    pub page_entries_max: usize,
    pub streams_max: usize,
    pub stream_keepalive: Duration,
    pub stream_token_check: Duration,
    pub stream_lifetime: Duration,
    pub streams_per_user_max: usize,
}

#[derive(Debug, Clone)]
pub struct Money {
    /// Three upper-case letters.
    pub currency: String,
    pub signup_grant_minor: i64,
    pub transfer_amount_minor_max: i64,
    pub transfers_page_rows_max: i64,
}

#[derive(Debug, Clone)]
pub struct Accounts {
    pub user_name_chars_max: usize,
    pub password_chars_min: usize,
    pub password_chars_max: usize,
    /// Empty, or at least 32 bytes.
    pub token_signing_key: SecretString,
    /// chrono's, because token expiry is a wall-clock time.
    pub api_token_ttl: chrono::TimeDelta,
    pub password_hash_threads: usize,
    pub password_hash_queue_max: usize,
    pub limits_enabled: bool,
    pub signup_per_address_per_hour_max: u32,
    pub signup_per_name_per_hour_max: u32,
    pub signin_per_address_per_minute_max: u32,
    pub signin_per_name_per_minute_max: u32,
}

impl Idempotency {
    pub fn wait_max(&self) -> Duration {
        Duration::from_millis(self.wait_ms_max.into())
    }
}

impl Config {
    /// Builds every section from the operator's settings, reporting every
    /// problem at once so an operator fixes a file in one pass.
    pub fn from_settings(settings: &Settings) -> Result<Self, SettingsError> {
        let mut check = Checks::default();
        let config = Self {
            http: Http::checked(settings, &mut check),
            database: Database::checked(settings, &mut check),
            redis: Redis::checked(settings, &mut check),
            cooldown: Cooldown::checked(settings, &mut check),
            idempotency: Idempotency::checked(settings, &mut check),
            row_guard: RowGuard {
                mode: settings.row_guard_mode,
            },
            demo: Demo::checked(settings, &mut check),
            race_lab: RaceLab::checked(settings, &mut check),
            feed: Feed::checked(settings, &mut check),
            money: Money::checked(settings, &mut check),
            accounts: Accounts::checked(settings, &mut check),
        };
        config.check_across_sections(&mut check);
        check.finish(config)
    }

    /// The rules that tie one section to another.
    fn check_across_sections(&self, check: &mut Checks) {
        let enclosed = self.idempotency.wait_max()
            + Duration::from_millis(self.database.wallet_lock_wait_ms_max.into())
            + Duration::from_millis(STATEMENT_TIMEOUT_MARGIN_MS);
        check.require(
            self.database.statement_timeout >= enclosed,
            format!(
                "db_statement_timeout_ms ({}) must be at least idempotency_wait_ms_max + wallet_lock_wait_ms_max + \
                 {STATEMENT_TIMEOUT_MARGIN_MS} ms = {}, so that each wait ends in its own answer",
                self.database.statement_timeout.as_millis(),
                enclosed.as_millis()
            ),
        );
        let unsafe_modes = self.unsafe_modes();
        check.require(
            unsafe_modes.is_empty() || self.demo.allow_unsafe_modes,
            format!(
                "unsafe demonstration modes ({}) need allow_unsafe_demo_modes = true; never use them in production",
                unsafe_modes.join(", ")
            ),
        );
    }

    /// The process-wide switches that make this deployment unsafe, by
    /// name; empty for the safe configuration.
    pub fn unsafe_modes(&self) -> Vec<&'static str> {
        let mut modes = Vec::new();
        if !self.cooldown.enabled {
            modes.push("cooldown off");
        }
        match self.idempotency.mode {
            IdempotencyMode::Atomic => {}
            IdempotencyMode::CheckThenInsert => modes.push("idempotency check-then-insert"),
            IdempotencyMode::Off => modes.push("idempotency off"),
        }
        if self.row_guard.mode == RowGuardMode::ReadDecideWrite {
            modes.push("row guard off (read-decide-write)");
        }
        modes
    }

    /// Whether any part of the server talks to Redis.
    pub fn uses_redis(&self) -> bool {
        self.cooldown.enabled || self.feed.enabled || self.accounts.limits_enabled
    }
}

impl Http {
    fn checked(s: &Settings, check: &mut Checks) -> Self {
        let trusted_proxies = s
            .trusted_proxies
            .iter()
            .filter_map(|entry| {
                let network = super::parse_network(entry);
                check.require(
                    network.is_some(),
                    format!("trusted_proxies: {entry:?} is not an IP address or a CIDR network"),
                );
                network
            })
            .collect();
        Self {
            host: s.http_host.clone(),
            port: s.http_port,
            admin_addr: s.admin_http_addr.clone(),
            workers: check.within("http_workers", s.http_workers, 1, 256),
            request_body_bytes_max: check.within(
                "request_body_bytes_max",
                s.request_body_bytes_max,
                256,
                MIB as usize,
            ),
            oversized_body_drain_bytes_max: check.within(
                "oversized_body_drain_bytes_max",
                s.oversized_body_drain_bytes_max,
                0,
                256 * MIB as usize,
            ),
            oversized_body_drain_max: check.millis(
                "oversized_body_drain_ms_max",
                s.oversized_body_drain_ms_max,
                0,
                60_000,
            ),
            shutdown_grace: check.seconds("shutdown_grace_s", s.shutdown_grace_s, 0, 3_600),
            log_format: s.log_format,
            instance_id: s.instance_id.clone(),
            trusted_proxies,
        }
    }
}

impl Database {
    fn checked(s: &Settings, check: &mut Checks) -> Self {
        let pool_connections_max =
            check.within("db_pool_connections_max", s.db_pool_connections_max, 1, 1_000);
        let pool_connections_min =
            check.within("db_pool_connections_min", s.db_pool_connections_min, 0, 1_000);
        check.require(
            pool_connections_min <= pool_connections_max,
            "db_pool_connections_min must not exceed db_pool_connections_max",
        );
        Self {
            url: s.database_url.clone(),
            migration_url: s.database_migration_url.clone(),
            pool_connections_max,
            pool_connections_min,
            acquire_wait_max: check.millis("db_acquire_wait_ms_max", s.db_acquire_wait_ms_max, 1, 60_000),
            idle_check_after: check.millis("db_idle_check_after_ms", s.db_idle_check_after_ms, 0, 3_600_000),
            statement_timeout: check.millis("db_statement_timeout_ms", s.db_statement_timeout_ms, 1, 600_000),
            wallet_lock_wait_ms_max: check.within(
                "wallet_lock_wait_ms_max",
                s.wallet_lock_wait_ms_max,
                1,
                60_000,
            ),
            transfer_retries_max: check.within("transfer_retries_max", s.transfer_retries_max, 0, 10),
            migrate_on_start: s.migrate_on_start,
        }
    }
}

impl Redis {
    fn checked(s: &Settings, check: &mut Checks) -> Self {
        Self {
            url: s.redis_url.clone(),
            cluster_urls: s.redis_cluster_urls.clone(),
            commands_in_flight_max: check.within(
                "redis_commands_in_flight_max",
                s.redis_commands_in_flight_max,
                1,
                100_000,
            ),
            command_timeout: check.millis("redis_command_timeout_ms", s.redis_command_timeout_ms, 1, 60_000),
            key_prefix: s.redis_key_prefix.clone(),
        }
    }
}

impl Cooldown {
    fn checked(s: &Settings, check: &mut Checks) -> Self {
        Self {
            enabled: s.cooldown_enabled,
            ttl: check.millis("cooldown_ttl_ms", s.cooldown_ttl_ms, 1, 86_400_000),
            scope: s.cooldown_scope,
            on_store_error: s.cooldown_on_store_error,
        }
    }
}

impl Idempotency {
    fn checked(s: &Settings, check: &mut Checks) -> Self {
        Self {
            mode: s.idempotency_mode,
            key_required: s.idempotency_key_required,
            wait_ms_max: check.within("idempotency_wait_ms_max", s.idempotency_wait_ms_max, 1, 60_000),
            retention_hours: check.within(
                "idempotency_retention_hours",
                s.idempotency_retention_hours,
                1,
                8_760,
            ),
            sweep_interval: check.seconds(
                "idempotency_sweep_interval_s",
                s.idempotency_sweep_interval_s,
                1,
                86_400,
            ),
            sweep_batch_rows_max: check.within(
                "idempotency_sweep_batch_rows_max",
                s.idempotency_sweep_batch_rows_max,
                1,
                100_000,
            ),
        }
    }
}

impl Demo {
    fn checked(s: &Settings, check: &mut Checks) -> Self {
        Self {
            allow_unsafe_modes: s.allow_unsafe_demo_modes,
            naive_window: check.millis("naive_window_ms", s.naive_window_ms, 0, 10_000),
            trace_ui_url: s.trace_ui_url.clone(),
            recipient_name: s.demo_recipient_name.trim().to_owned(),
        }
    }
}

impl RaceLab {
    fn checked(s: &Settings, check: &mut Checks) -> Self {
        Self {
            switches_enabled: s.race_lab_switches_enabled,
            requests_max: check.within("race_lab_requests_max", s.race_lab_requests_max, 2, 1_000),
            runs_in_flight_max: check.within(
                "race_lab_runs_in_flight_max",
                s.race_lab_runs_in_flight_max,
                1,
                64,
            ),
            balance_minor: check.within(
                "race_lab_balance_minor",
                s.race_lab_balance_minor,
                100,
                1_000_000_000,
            ),
            run_max: check.millis("race_lab_run_ms_max", s.race_lab_run_ms_max, 1_000, 600_000),
            naive_window: check.millis("race_lab_naive_window_ms", s.race_lab_naive_window_ms, 0, 1_000),
        }
    }
}

impl Feed {
    fn checked(s: &Settings, check: &mut Checks) -> Self {
        Self {
            enabled: s.decision_feed_enabled,
            queue_entries_max: check.within(
                "decision_feed_queue_entries_max",
                s.decision_feed_queue_entries_max,
                1,
                1_000_000,
            ),
            entries_per_user_max: check.within(
                "decision_feed_entries_per_user_max",
                s.decision_feed_entries_per_user_max,
                1,
                100_000,
            ),
            retention: check.hours(
                "decision_feed_retention_hours",
                s.decision_feed_retention_hours,
                1,
                720,
            ),
            redis_memory_bytes_max: check.within(
                "decision_feed_redis_memory_bytes_max",
                s.decision_feed_redis_memory_bytes_max,
                MIB,
                1024 * 1024 * MIB,
            ),
            memory_check_interval: check.millis(
                "decision_feed_memory_check_ms",
                s.decision_feed_memory_check_ms,
                10,
                60_000,
            ),
            page_entries_max: check.within(
                "decisions_page_entries_max",
                s.decisions_page_entries_max,
                1,
                1_000,
            ),
            streams_max: check.within("decision_streams_max", s.decision_streams_max, 1, 10_000),
            stream_keepalive: check.millis(
                "decision_stream_keepalive_ms",
                s.decision_stream_keepalive_ms,
                100,
                300_000,
            ),
            stream_token_check: check.seconds(
                "decision_stream_token_check_s",
                s.decision_stream_token_check_s,
                1,
                300,
            ),
            stream_lifetime: check.seconds(
                "decision_stream_lifetime_s",
                s.decision_stream_lifetime_s,
                1,
                86_400,
            ),
            streams_per_user_max: check.within(
                "decision_streams_per_user_max",
                s.decision_streams_per_user_max,
                1,
                1_000,
            ),
        }
    }
}

impl Money {
    fn checked(s: &Settings, check: &mut Checks) -> Self {
        check.require(
            s.currency.len() == 3 && s.currency.bytes().all(|b| b.is_ascii_uppercase()),
            "currency must be three upper-case letters, e.g. USD",
        );
        check.require(
            s.currency != crate::race_lab::LAB_CURRENCY,
            "currency must not be LAB: that code marks the race lab's sandbox money",
        );
        Self {
            currency: s.currency.clone(),
            signup_grant_minor: check.within(
                "signup_grant_minor",
                s.signup_grant_minor,
                0,
                1_000_000_000_000_000,
            ),
            transfer_amount_minor_max: check.within(
                "transfer_amount_minor_max",
                s.transfer_amount_minor_max,
                1,
                1_000_000_000_000_000,
            ),
            transfers_page_rows_max: check.within(
                "transfers_page_rows_max",
                s.transfers_page_rows_max,
                1,
                1_000,
            ),
        }
    }
}

impl Accounts {
    fn checked(s: &Settings, check: &mut Checks) -> Self {
        let password_chars_min = check.within("password_chars_min", s.password_chars_min, 1, 1_024);
        let password_chars_max = check.within("password_chars_max", s.password_chars_max, 1, 1_024);
        check.require(
            password_chars_min <= password_chars_max,
            "password_chars_min must not exceed password_chars_max",
        );
        let key_len = s.token_signing_key.expose_secret().len();
        check.require(
            key_len == 0 || key_len >= 32,
            "token_signing_key must be empty (random per process) or at least 32 bytes",
        );
        let per_period = |check: &mut Checks, name: &str, value: u32| check.within(name, value, 1, 1_000_000);
        Self {
            user_name_chars_max: check.within("user_name_chars_max", s.user_name_chars_max, 1, 64),
            password_chars_min,
            password_chars_max,
            token_signing_key: s.token_signing_key.clone(),
            // An hour count out of bounds is reported and the `Config`
            // thrown away; zero stands in meanwhile.
            api_token_ttl: i64::try_from(check.within(
                "api_token_ttl_hours",
                s.api_token_ttl_hours,
                1,
                8_760,
            ))
            .ok()
            .and_then(chrono::TimeDelta::try_hours)
            .unwrap_or_default(),
            password_hash_threads: check.within("password_hash_threads", s.password_hash_threads, 1, 64),
            password_hash_queue_max: check.within(
                "password_hash_queue_max",
                s.password_hash_queue_max,
                1,
                100_000,
            ),
            limits_enabled: s.account_limits_enabled,
            signup_per_address_per_hour_max: per_period(
                check,
                "signup_per_address_per_hour_max",
                s.signup_per_address_per_hour_max,
            ),
            signup_per_name_per_hour_max: per_period(
                check,
                "signup_per_name_per_hour_max",
                s.signup_per_name_per_hour_max,
            ),
            signin_per_address_per_minute_max: per_period(
                check,
                "signin_per_address_per_minute_max",
                s.signin_per_address_per_minute_max,
            ),
            signin_per_name_per_minute_max: per_period(
                check,
                "signin_per_name_per_minute_max",
                s.signin_per_name_per_minute_max,
            ),
        }
    }
}

/// Collects what is wrong while the sections are built. Every number has
/// a floor and a ceiling, declared once where the section reads it: a typo
/// such as an extra zero is refused at start-up rather than met at run
/// time (a token lifetime that overflows, a pool PostgreSQL cannot serve).
#[derive(Default)]
struct Checks {
    problems: Vec<String>,
}

impl Checks {
    fn require(&mut self, ok: bool, message: impl Into<String>) {
        if !ok {
            self.problems.push(message.into());
        }
    }

    /// `value`, noting a problem if it lies outside `floor..=ceiling`.
    fn within<T: PartialOrd + Display + Copy>(&mut self, name: &str, value: T, floor: T, ceiling: T) -> T {
        self.require(
            floor <= value && value <= ceiling,
            format!("{name} must be between {floor} and {ceiling} (it is {value})"),
        );
        value
    }

    fn millis(&mut self, name: &str, value: u64, floor: u64, ceiling: u64) -> Duration {
        Duration::from_millis(self.within(name, value, floor, ceiling))
    }

    fn seconds(&mut self, name: &str, value: u64, floor: u64, ceiling: u64) -> Duration {
        Duration::from_secs(self.within(name, value, floor, ceiling))
    }

    /// An hour count out of bounds is reported and the `Config` thrown
    /// away; saturating keeps it from overflowing meanwhile.
    fn hours(&mut self, name: &str, value: u64, floor: u64, ceiling: u64) -> Duration {
        Duration::from_secs(self.within(name, value, floor, ceiling).saturating_mul(3_600))
    }

    fn finish(self, config: Config) -> Result<Config, SettingsError> {
        if self.problems.is_empty() {
            Ok(config)
        } else {
            Err(SettingsError(self.problems))
        }
    }
}
