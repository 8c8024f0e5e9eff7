//! The settings as the server uses them: one section per concern, each
//! in the sibling module of its group.
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

use super::checks::Checks;
use super::{
    IdempotencyMode, InboxMode, PayoutMode, RowGuardMode, STATEMENT_TIMEOUT_MARGIN_MS, Settings,
    SettingsError,
};

mod accounts;
mod demos;
mod feed;
mod flows;
mod layers;
mod serving;
mod stores;

pub use accounts::{Accounts, Money};
pub use demos::{Demo, RaceLab};
pub use feed::Feed;
pub use flows::{
    Commands, Deposits, Payouts, ProviderSecret, STANDARD_WEBHOOKS_SECRET_PREFIX, provider_secret,
};
pub use layers::{Cooldown, Idempotency, RowGuard};
pub use serving::Http;
pub use stores::{Database, Redis};

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
