//! The settings as the server uses them: one section per concern.
//!
//! `Settings` is what an operator writes, flat, with each unit in the name
//! (`cooldown_ttl_ms`); those names are the contract with config files and
//! `WALLET_*` variables. `Config` is what the code reads, built once at
//! start-up from settings whose bounds `declared.rs` has checked. Here are
//! only the conversions (times become `Duration`s, addresses are parsed)
//! and the rules a single bound cannot say: a string's format, one setting
//! against another. Nothing downstream re-checks or converts with a
//! fallback.
//!
//! The two waits and the retention that PostgreSQL takes as `int` stay
//! `u16` counts of PostgreSQL's unit, so that conversion is total
//! (`i32::from`). A getter gives each as a `Duration` for Rust-side use.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};

use super::checks::Checks;
use super::{
    CooldownScope, IdempotencyMode, InboxMode, LogFormat, PayoutMode, RowGuardMode,
    STATEMENT_TIMEOUT_MARGIN_MS, Settings, SettingsError, StoreErrorPolicy,
};

/// Everything the server reads, validated.
#[derive(Debug, Clone)]
pub struct Config {
    pub http: Http,
    pub database: Database,
    pub redis: Redis,
    pub cooldown: Cooldown,
    pub idempotency: Idempotency,
    pub row_guard: RowGuard,
    pub deposits: Deposits,
    pub commands: Commands,
    pub payouts: Payouts,
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
    pub connections_per_worker_max: usize,
    /// Each listener's backlog, for the kernel to queue new connections in.
    pub listen_backlog_connections: u32,
    /// `None`: each connection is closed after its response.
    pub keep_alive: Option<Duration>,
    pub request_head_wait_max: Duration,
    pub request_body_wait_max: Duration,
    pub request_body_bytes_max: usize,
    pub oversized_body_drain_bytes_max: usize,
    pub oversized_body_drain_max: Duration,
    pub shutdown_grace: Duration,
    pub shutdown_cleanup_max: Duration,
    /// Cookies carry `Secure`.
    pub cookies_secure: bool,
    pub readiness_cache: Duration,
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
    /// The demonstration alternatives' bounds.
    pub advisory_lock_waits: bool,
    pub redis_lock_ttl: Duration,
}

#[derive(Debug, Clone)]
pub struct RowGuard {
    pub mode: RowGuardMode,
}

#[derive(Debug, Clone)]
pub struct Deposits {
    /// Each at least 32 bytes; empty: every deposit is refused.
    pub provider_webhook_secrets: Vec<SecretString>,
    pub signature_tolerance: Duration,
    pub amount_minor_max: i64,
    /// In PostgreSQL's hours and milliseconds, as `int`.
    pub event_age_hours_max: u16,
    pub inbox_retention_hours: u16,
    pub inbox_wait_ms_max: u16,
    pub inbox_mode: InboxMode,
    pub event_lock_enabled: bool,
    pub event_lock_ttl: Duration,
    pub duplicate_wait_max: Duration,
    pub answer_poll: Duration,
    pub answer_cache: Duration,
}

#[derive(Debug, Clone)]
pub struct Commands {
    pub enabled: bool,
    /// Empty: the shared Redis.
    pub redis_url: SecretString,
    pub partitions: u16,
    pub claim_idle: Duration,
    pub deliveries_max: u32,
    pub read_batch_entries_max: usize,
    pub read_wait: Duration,
    pub retry_backoff: Duration,
    pub results_entries_max: u64,
    pub dead_letters_entries_max: u64,
    /// In PostgreSQL's hours, as `int`.
    pub age_hours_max: u16,
    pub future_tolerance: Duration,
}

#[derive(Debug, Clone)]
pub struct Payouts {
    /// Without a trailing slash; empty: no payouts.
    pub gateway_url: String,
    pub dispatcher_enabled: bool,
    pub mode: PayoutMode,
    pub lease: Duration,
    pub retry: wallet_client::RetryPolicy,
    pub batch_rows_max: u32,
    pub idle: Duration,
    pub census_interval: Duration,
    pub reconcile_quiet: Duration,
    /// How long the gateway remembers a key (`payout_gateway_key_retention_hours`).
    pub gateway_key_retention: Duration,
    pub amount_minor_max: i64,
}

impl Payouts {
    /// Whether this deployment sends payouts at all.
    pub fn offered(&self) -> bool {
        !self.gateway_url.is_empty()
    }
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
    /// How long the page a wallet form leads to is kept; one per person.
    pub wallet_pages: crate::kept_pages::Bounds,
}

#[derive(Debug, Clone)]
pub struct RaceLab {
    pub switches_enabled: bool,
    pub requests_max: usize,
    pub runs_in_flight_max: usize,
    pub balance_minor: i64,
    pub run_max: Duration,
    pub naive_window: Duration,
    pub run_spacing: Duration,
    pub runs_per_user_per_minute_max: u32,
    pub requests_in_flight_max: usize,
    pub db_connections_max: usize,
    pub pass_lifetime: Duration,
    pub passes_held_max: usize,
    /// How long a run's results are kept at their address, and how many
    /// one visitor keeps.
    pub results: crate::kept_pages::Bounds,
}

#[derive(Debug, Clone)]
pub struct Feed {
    pub enabled: bool,
    pub queue_entries_max: usize,
    pub write_interval: Duration,
    pub entries_per_user_max: u64,
    pub lab_entries_per_user_max: u64,
    pub retention: Duration,
    pub entries_max: u64,
    pub drop_notice: Duration,
    pub page_entries_max: usize,
    pub streams_max: usize,
    pub stream_keepalive: Duration,
    pub stream_token_check: Duration,
    pub stream_lifetime: Duration,
    pub stream_idle: Duration,
    pub streams_per_user_max: usize,
    pub streams_per_address_max: usize,
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
    pub signin_per_name_and_address_per_minute_max: u32,
    pub signin_known_address: Duration,
}

impl Idempotency {
    pub fn wait_max(&self) -> Duration {
        Duration::from_millis(self.wait_ms_max.into())
    }
}

impl Config {
    /// Checks every declared bound, builds every section from the
    /// operator's settings and checks the rules between them, reporting
    /// every problem at once. The sections are built even when a bound
    /// fails, so that their own rules are reported too; such a `Config` is
    /// thrown away.
    pub fn from_settings(settings: &Settings) -> Result<Self, SettingsError> {
        let mut check = Checks::default();
        settings.check_bounds(&mut check);
        let config = Self {
            http: Http::checked(settings, &mut check),
            database: Database::checked(settings, &mut check),
            redis: Redis::from(settings),
            cooldown: Cooldown::from(settings),
            idempotency: Idempotency::from(settings),
            row_guard: RowGuard {
                mode: settings.row_guard_mode,
            },
            deposits: Deposits::checked(settings, &mut check),
            commands: Commands::checked(settings, &mut check),
            payouts: Payouts::checked(settings, &mut check),
            demo: Demo::from(settings),
            race_lab: RaceLab::from(settings),
            feed: Feed::from(settings),
            money: Money::checked(settings, &mut check),
            accounts: Accounts::checked(settings, &mut check),
        };
        config.check_across_sections(&mut check);
        check.finish(config)
    }

    /// The rules that tie one section to another.
    fn check_across_sections(&self, check: &mut Checks) {
        // A transfer's and a deposit's statement each enclose a claim's wait
        // and a wallet lock's.
        let claim_waits = [
            ("idempotency_wait_ms_max", self.idempotency.wait_ms_max),
            ("inbox_wait_ms_max", self.deposits.inbox_wait_ms_max),
        ];
        for (claim_wait_name, claim_wait_ms) in claim_waits {
            let enclosed = Duration::from_millis(claim_wait_ms.into())
                + Duration::from_millis(self.database.wallet_lock_wait_ms_max.into())
                + Duration::from_millis(STATEMENT_TIMEOUT_MARGIN_MS);
            check.require(
                self.database.statement_timeout >= enclosed,
                format!(
                    "db_statement_timeout_ms ({}) must be at least {claim_wait_name} + wallet_lock_wait_ms_max + \
                     {STATEMENT_TIMEOUT_MARGIN_MS} ms = {}, so that each wait ends in its own answer",
                    self.database.statement_timeout.as_millis(),
                    enclosed.as_millis()
                ),
            );
        }
        check.require(
            self.race_lab.requests_in_flight_max >= self.race_lab.requests_max,
            "race_lab_requests_in_flight_max must be at least race_lab_requests_max, or no full run could start",
        );
        check.require(
            self.feed.entries_max >= self.feed.entries_per_user_max + self.feed.lab_entries_per_user_max,
            "decision_feed_entries_max must be at least decision_feed_entries_per_user_max + \
             decision_feed_lab_entries_per_user_max, or one user's streams could remove themselves",
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
            IdempotencyMode::AdvisoryLock => modes.push("idempotency key claimed under an advisory lock"),
            IdempotencyMode::RedisKeyLock => modes.push("idempotency key claimed under a Redis lock"),
            IdempotencyMode::CheckThenInsert => modes.push("idempotency check-then-insert"),
            IdempotencyMode::Off => modes.push("idempotency off"),
        }
        match self.row_guard.mode {
            RowGuardMode::Guarded => {}
            RowGuardMode::ForUpdate => modes.push("row guard replaced by SELECT … FOR UPDATE"),
            RowGuardMode::OptimisticVersion => modes.push("row guard replaced by optimistic versions"),
            RowGuardMode::ReadDecideWrite => modes.push("row guard off (read-decide-write)"),
        }
        if self.deposits.inbox_mode == InboxMode::CheckThenInsert {
            modes.push("inbox check-then-insert");
        }
        match self.payouts.mode {
            PayoutMode::Outbox => {}
            PayoutMode::CallInTransaction => modes.push("payouts call the gateway inside the transaction"),
            PayoutMode::NewKeyPerAttempt => modes.push("payouts send a new key per attempt"),
        }
        modes
    }

    /// Whether any part of the server talks to Redis.
    pub fn uses_redis(&self) -> bool {
        self.cooldown.enabled
            || self.feed.enabled
            || self.accounts.limits_enabled
            || self.deposits.event_lock_enabled
            || self.commands.enabled
            || self.idempotency.mode == IdempotencyMode::RedisKeyLock
    }
}

impl Http {
    fn checked(s: &Settings, check: &mut Checks) -> Self {
        let trusted_proxies = s
            .trusted_proxies
            .iter()
            .filter_map(|entry| {
                let network = parse_network(entry);
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
            workers: s.http_workers,
            connections_per_worker_max: s.http_connections_per_worker_max,
            listen_backlog_connections: s.http_listen_backlog_connections,
            keep_alive: (s.http_keep_alive_s > 0).then(|| Duration::from_secs(s.http_keep_alive_s)),
            request_head_wait_max: Duration::from_millis(s.http_request_head_wait_ms_max),
            request_body_wait_max: Duration::from_millis(s.http_request_body_wait_ms_max),
            request_body_bytes_max: s.request_body_bytes_max,
            oversized_body_drain_bytes_max: s.oversized_body_drain_bytes_max,
            oversized_body_drain_max: Duration::from_millis(s.oversized_body_drain_ms_max),
            shutdown_grace: Duration::from_secs(s.shutdown_grace_s),
            shutdown_cleanup_max: Duration::from_millis(s.shutdown_cleanup_ms_max),
            cookies_secure: s.cookies_secure,
            readiness_cache: Duration::from_millis(s.readiness_cache_ms),
            log_format: s.log_format,
            instance_id: s.instance_id.clone(),
            trusted_proxies,
        }
    }
}

/// An address (a network of one) or a CIDR network.
fn parse_network(entry: &str) -> Option<ipnet::IpNet> {
    let entry = entry.trim();
    entry
        .parse::<ipnet::IpNet>()
        .ok()
        .or_else(|| entry.parse::<std::net::IpAddr>().ok().map(ipnet::IpNet::from))
}

impl Database {
    fn checked(s: &Settings, check: &mut Checks) -> Self {
        check.require(
            s.db_pool_connections_min <= s.db_pool_connections_max,
            "db_pool_connections_min must not exceed db_pool_connections_max",
        );
        check.require(
            s.transfers_admission_wait_ms_max < s.db_acquire_wait_ms_max,
            "transfers_admission_wait_ms_max must be under db_acquire_wait_ms_max: overload is refused before a \
             transfer would wait for a connection that long",
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
            migrate_on_start: s.migrate_on_start,
        }
    }
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

impl From<&Settings> for Cooldown {
    fn from(s: &Settings) -> Self {
        Self {
            enabled: s.cooldown_enabled,
            ttl: Duration::from_millis(s.cooldown_ttl_ms),
            scope: s.cooldown_scope,
            on_store_error: s.cooldown_on_store_error,
        }
    }
}

impl From<&Settings> for Idempotency {
    fn from(s: &Settings) -> Self {
        Self {
            mode: s.idempotency_mode,
            key_required: s.idempotency_key_required,
            wait_ms_max: s.idempotency_wait_ms_max,
            retention_hours: s.idempotency_retention_hours,
            sweep_interval: Duration::from_secs(s.idempotency_sweep_interval_s),
            sweep_batch_rows_max: s.idempotency_sweep_batch_rows_max,
            advisory_lock_waits: s.idempotency_advisory_lock_waits,
            redis_lock_ttl: Duration::from_millis(s.idempotency_redis_lock_ttl_ms),
        }
    }
}

impl Deposits {
    fn checked(s: &Settings, check: &mut Checks) -> Self {
        check.require(
            s.provider_webhook_secrets
                .iter()
                .all(|secret| secret.expose_secret().len() >= 32),
            "each of provider_webhook_secrets must be at least 32 bytes",
        );
        require_the_inbox_to_outlast(
            s,
            check,
            ("deposit_event_age_hours_max", s.deposit_event_age_hours_max),
            ("provider_signature_tolerance_s", s.provider_signature_tolerance_s),
            "a swept event could be credited twice",
        );
        Self {
            provider_webhook_secrets: s.provider_webhook_secrets.clone(),
            signature_tolerance: Duration::from_secs(s.provider_signature_tolerance_s),
            amount_minor_max: s.deposit_amount_minor_max,
            event_age_hours_max: s.deposit_event_age_hours_max,
            inbox_retention_hours: s.inbox_retention_hours,
            inbox_wait_ms_max: s.inbox_wait_ms_max,
            inbox_mode: s.inbox_mode,
            event_lock_enabled: s.event_lock_enabled,
            event_lock_ttl: Duration::from_millis(s.event_lock_ttl_ms),
            duplicate_wait_max: Duration::from_millis(s.event_duplicate_wait_ms_max),
            answer_poll: Duration::from_millis(s.event_answer_poll_ms),
            answer_cache: Duration::from_millis(s.event_answer_cache_ms),
        }
    }
}

/// The inbox must keep a claim for longer than any message it stands for
/// can still be accepted, or a redelivery after the sweep would be taken
/// as new. A message's own time lies at most the future tolerance ahead of
/// its claim's, and it is accepted until the age limit after that.
fn require_the_inbox_to_outlast(
    s: &Settings,
    check: &mut Checks,
    (age_setting, age_hours_max): (&str, u16),
    (tolerance_setting, future_tolerance_s): (&str, u64),
    otherwise: &str,
) {
    let accepted_s = u64::from(age_hours_max) * 3_600 + future_tolerance_s;
    check.require(
        u64::from(s.inbox_retention_hours) * 3_600 > accepted_s,
        format!(
            "inbox_retention_hours ({} h) must exceed {age_setting} + {tolerance_setting} ({accepted_s} s), \
             or {otherwise}",
            s.inbox_retention_hours
        ),
    );
}

impl Commands {
    fn checked(s: &Settings, check: &mut Checks) -> Self {
        require_the_inbox_to_outlast(
            s,
            check,
            ("commands_age_hours_max", s.commands_age_hours_max),
            ("commands_future_tolerance_s", s.commands_future_tolerance_s),
            "a swept command could be applied twice",
        );
        Self {
            enabled: s.commands_enabled,
            redis_url: s.commands_redis_url.clone(),
            partitions: s.commands_partitions,
            claim_idle: Duration::from_millis(s.commands_claim_idle_ms),
            deliveries_max: s.commands_deliveries_max,
            read_batch_entries_max: s.commands_read_batch_entries_max,
            read_wait: Duration::from_millis(s.commands_read_wait_ms),
            retry_backoff: Duration::from_millis(s.commands_retry_backoff_ms),
            results_entries_max: s.commands_results_entries_max,
            dead_letters_entries_max: s.commands_dead_letters_entries_max,
            age_hours_max: s.commands_age_hours_max,
            future_tolerance: Duration::from_secs(s.commands_future_tolerance_s),
        }
    }
}

impl Payouts {
    fn checked(s: &Settings, check: &mut Checks) -> Self {
        let gateway_url = s.payout_gateway_url.trim().trim_end_matches('/').to_owned();
        check.require(
            gateway_url.is_empty()
                || reqwest::Url::parse(&gateway_url)
                    .is_ok_and(|url| url.has_host() && matches!(url.scheme(), "http" | "https")),
            "payout_gateway_url must be empty or an http(s) URL, e.g. http://127.0.0.1:8090",
        );
        check.require(
            s.payout_lease_ms > s.payout_call_timeout_ms,
            "payout_lease_ms must be longer than payout_call_timeout_ms, or another instance would take a row \
             over while its call may still be sending",
        );
        check.require(
            s.payout_retry_cap_ms >= s.payout_retry_base_ms,
            "payout_retry_cap_ms must be at least payout_retry_base_ms",
        );
        // Each attempt after the first waits at most a lease (a dispatcher
        // that died) and a capped backoff; a later one would reach a
        // gateway that may have forgotten the key, and send again.
        let attempts_span_ms = u128::from(s.payout_attempts_max.saturating_sub(1))
            * u128::from(s.payout_lease_ms + s.payout_retry_cap_ms);
        check.require(
            attempts_span_ms < u128::from(s.payout_gateway_key_retention_hours) * 3_600_000,
            "(payout_attempts_max - 1) × (payout_lease_ms + payout_retry_cap_ms) must stay under \
             payout_gateway_key_retention_hours, or a late attempt could reach a gateway that forgot its key",
        );
        Self {
            gateway_url,
            dispatcher_enabled: s.payout_dispatcher_enabled,
            mode: s.payout_mode,
            lease: Duration::from_millis(s.payout_lease_ms),
            retry: wallet_client::RetryPolicy {
                base: Duration::from_millis(s.payout_retry_base_ms),
                cap: Duration::from_millis(s.payout_retry_cap_ms),
                attempts_max: s.payout_attempts_max,
                request_timeout: Duration::from_millis(s.payout_call_timeout_ms),
                // A payout's attempts are spread over dispatcher passes and
                // bounded by their count, not by one call's time.
                call_time_max: Duration::MAX,
                jitter: true,
            },
            batch_rows_max: s.payout_dispatch_batch_rows_max,
            idle: Duration::from_millis(s.payout_dispatch_idle_ms),
            census_interval: Duration::from_millis(s.payout_census_interval_ms),
            reconcile_quiet: Duration::from_millis(s.payout_reconcile_quiet_ms),
            gateway_key_retention: Duration::from_secs(
                u64::from(s.payout_gateway_key_retention_hours) * 3_600,
            ),
            amount_minor_max: s.payout_amount_minor_max,
        }
    }
}

impl From<&Settings> for Demo {
    fn from(s: &Settings) -> Self {
        Self {
            allow_unsafe_modes: s.allow_unsafe_demo_modes,
            naive_window: Duration::from_millis(s.naive_window_ms),
            trace_ui_url: s.trace_ui_url.clone(),
            recipient_name: s.demo_recipient_name.trim().to_owned(),
            // One per person: their next form replaces it.
            wallet_pages: crate::kept_pages::Bounds {
                retention: Duration::from_secs(s.wallet_page_retention_s),
                per_user_max: 1,
            },
        }
    }
}

impl From<&Settings> for RaceLab {
    fn from(s: &Settings) -> Self {
        Self {
            switches_enabled: s.race_lab_switches_enabled,
            requests_max: s.race_lab_requests_max,
            runs_in_flight_max: s.race_lab_runs_in_flight_max,
            balance_minor: s.race_lab_balance_minor,
            run_max: Duration::from_millis(s.race_lab_run_ms_max),
            naive_window: Duration::from_millis(s.race_lab_naive_window_ms),
            run_spacing: Duration::from_millis(s.race_lab_run_spacing_ms),
            runs_per_user_per_minute_max: s.race_lab_runs_per_user_per_minute_max,
            requests_in_flight_max: s.race_lab_requests_in_flight_max,
            pass_lifetime: Duration::from_millis(s.race_lab_pass_lifetime_ms),
            passes_held_max: s.race_lab_passes_held_max,
            results: crate::kept_pages::Bounds {
                retention: Duration::from_secs(s.race_lab_result_retention_hours * 3_600),
                per_user_max: s.race_lab_results_per_user_max,
            },
            // At most all but one of the pool's connections (at least one),
            // so that real transfers always have one to take.
            db_connections_max: (s.race_lab_db_connections_max as usize)
                .min((s.db_pool_connections_max as usize).saturating_sub(1).max(1)),
        }
    }
}

impl From<&Settings> for Feed {
    fn from(s: &Settings) -> Self {
        Self {
            enabled: s.decision_feed_enabled,
            queue_entries_max: s.decision_feed_queue_entries_max,
            write_interval: Duration::from_millis(s.decision_feed_write_interval_ms),
            entries_per_user_max: s.decision_feed_entries_per_user_max,
            lab_entries_per_user_max: s.decision_feed_lab_entries_per_user_max,
            // An hour count out of bounds is reported and the `Config`
            // thrown away; saturating keeps it from overflowing meanwhile.
            retention: Duration::from_secs(s.decision_feed_retention_hours.saturating_mul(3_600)),
            entries_max: s.decision_feed_entries_max,
            drop_notice: Duration::from_secs(s.decision_feed_drop_notice_s),
            page_entries_max: s.decisions_page_entries_max,
            streams_max: s.decision_streams_max,
            stream_keepalive: Duration::from_millis(s.decision_stream_keepalive_ms),
            stream_token_check: Duration::from_secs(s.decision_stream_token_check_s),
            stream_lifetime: Duration::from_secs(s.decision_stream_lifetime_s),
            stream_idle: Duration::from_secs(s.decision_stream_idle_s),
            streams_per_user_max: s.decision_streams_per_user_max,
            streams_per_address_max: s.decision_streams_per_address_max,
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
            s.currency != crate::domain::LAB_CURRENCY,
            "currency must not be LAB: that code marks the race lab's sandbox money",
        );
        Self {
            currency: s.currency.clone(),
            signup_grant_minor: s.signup_grant_minor,
            transfer_amount_minor_max: s.transfer_amount_minor_max,
            transfers_page_rows_max: s.transfers_page_rows_max,
        }
    }
}

impl Accounts {
    fn checked(s: &Settings, check: &mut Checks) -> Self {
        check.require(
            s.password_chars_min <= s.password_chars_max,
            "password_chars_min must not exceed password_chars_max",
        );
        let key_len = s.token_signing_key.expose_secret().len();
        check.require(
            key_len == 0 || key_len >= 32,
            "token_signing_key must be empty (random per process) or at least 32 bytes",
        );
        Self {
            user_name_chars_max: s.user_name_chars_max,
            password_chars_min: s.password_chars_min,
            password_chars_max: s.password_chars_max,
            token_signing_key: s.token_signing_key.clone(),
            // An hour count out of bounds is reported and the `Config`
            // thrown away; zero stands in meanwhile.
            api_token_ttl: i64::try_from(s.api_token_ttl_hours)
                .ok()
                .and_then(chrono::TimeDelta::try_hours)
                .unwrap_or_default(),
            password_hash_threads: s.password_hash_threads,
            password_hash_queue_max: s.password_hash_queue_max,
            limits_enabled: s.account_limits_enabled,
            signup_per_address_per_hour_max: s.signup_per_address_per_hour_max,
            signup_per_name_per_hour_max: s.signup_per_name_per_hour_max,
            signin_per_address_per_minute_max: s.signin_per_address_per_minute_max,
            signin_per_name_per_minute_max: s.signin_per_name_per_minute_max,
            signin_per_name_and_address_per_minute_max: s.signin_per_name_and_address_per_minute_max,
            signin_known_address: Duration::from_secs(s.signin_known_address_days * 86_400),
        }
    }
}
