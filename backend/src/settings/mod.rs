//! Typed settings: defaults in code, then an optional TOML file, then
//! environment variables.
//!
//! Every setting is declared once, in `declared.rs`: its name, type,
//! default, bounds with their unit, and doc. `Settings` (the operator's
//! flat format), its `Default`, the bound checks and `docs/settings.md`
//! follow from that declaration. Every limit is a named setting with its
//! unit last in the name (`cooldown_ttl_ms`, `request_body_bytes_max`) and
//! a default that suits one small machine. The server reads `Config`
//! (`sections.rs`), one section per concern, which `Settings::validate`
//! builds at start-up, so a bad value stops the server before it accepts a
//! request instead of misbehaving under load.
//!
//! Environment variables: `WALLET_<SETTING>` for any setting (for example
//! `WALLET_COOLDOWN_TTL_MS=2000`), plus the `CONVENTIONAL_VARIABLES`, which
//! win over everything else.

mod checks;
mod choices;
mod declare;
mod declared;
mod doc;
mod sections;

use std::path::Path;

pub use choices::{
    CooldownScope, IdempotencyMode, InboxMode, LogFormat, PayoutMode, RowGuardMode, StoreErrorPolicy,
};
pub use declare::{Bounds, SettingDoc, SettingValue, Shown, choice_name, parse_choice};
pub use declared::{SETTINGS_DOC, Settings};
pub use doc::render_settings_doc;
pub use sections::{
    Accounts, Config, Cooldown, Database, Demo, Feed, Http, Idempotency, Money, ProviderSecret, RaceLab,
    Redis, RowGuard, STANDARD_WEBHOOKS_SECRET_PREFIX, provider_secret,
};

/// What a transfer statement's timeout must leave beyond the waits it
/// encloses: time for the work itself once the locks are held.
pub const STATEMENT_TIMEOUT_MARGIN_MS: u64 = 500;

/// Variables that platforms and tools set by convention, each standing for
/// one setting and winning over every other source.
pub const CONVENTIONAL_VARIABLES: &[(&str, &str)] = &[
    ("DATABASE_URL", "database_url"),
    ("DATABASE_MIGRATION_URL", "database_migration_url"),
    ("REDIS_URL", "redis_url"),
    ("PORT", "http_port"),
    ("LOG_FORMAT", "log_format"),
];

impl Settings {
    /// Defaults, then the TOML file at `path` if given, then the environment.
    pub fn load(path: Option<&Path>) -> anyhow::Result<Self> {
        let mut builder = config::Config::builder();
        if let Some(path) = path {
            builder = builder.add_source(config::File::from(path).required(true));
        }
        let mut environment = config::Environment::with_prefix("WALLET")
            .prefix_separator("_")
            .try_parsing(true)
            .list_separator(",");
        for list in SETTINGS_DOC.iter().filter(|setting| setting.is_list) {
            environment = environment.with_list_parse_key(list.name);
        }
        builder = builder.add_source(environment);
        // A list set to nothing (`WALLET_TRUSTED_PROXIES=`, as a compose
        // file writes an unset variable) is the empty list, not a list of
        // one empty entry.
        for list in SETTINGS_DOC.iter().filter(|setting| setting.is_list) {
            let variable = format!("WALLET_{}", list.name.to_uppercase());
            if std::env::var(&variable).is_ok_and(|value| value.trim().is_empty()) {
                builder = builder.set_override(list.name, Vec::<String>::new())?;
            }
        }
        for &(variable, setting) in CONVENTIONAL_VARIABLES {
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

#[cfg(test)]
mod tests {
    use secrecy::SecretString;

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
    fn payouts_need_a_gateway_url_bounds_that_fit_together_and_the_switch_for_unsafe_modes() {
        let payouts = |url: &str| Settings {
            payout_gateway_url: url.into(),
            ..Settings::default()
        };
        assert!(
            payouts("")
                .validate()
                .is_ok_and(|config| !config.payouts.offered())
        );
        let offered = payouts("http://127.0.0.1:8090/").validate().expect("a gateway");
        assert_eq!(offered.payouts.gateway_url, "http://127.0.0.1:8090");
        for wrong in ["127.0.0.1:8090", "ftp://bank", "http://"] {
            let error = payouts(wrong).validate().expect_err(wrong);
            assert!(error.to_string().contains("payout_gateway_url"), "{error}");
        }
        let lease_too_short = Settings {
            payout_lease_ms: 5_000,
            payout_call_timeout_ms: 5_000,
            ..payouts("http://bank")
        };
        let error = lease_too_short
            .validate()
            .expect_err("a lease no longer than a call");
        assert!(error.to_string().contains("payout_lease_ms"), "{error}");
        let take_above_the_slots = Settings {
            payout_take_rows_min: 33,
            payout_gateway_calls_in_flight_max: 32,
            ..payouts("http://bank")
        };
        let error = take_above_the_slots
            .validate()
            .expect_err("a take larger than the slots");
        assert!(error.to_string().contains("payout_take_rows_min"), "{error}");
        let unsafe_mode = Settings {
            payout_mode: PayoutMode::NewKeyPerAttempt,
            ..payouts("http://bank")
        };
        assert!(unsafe_mode.validate().is_err());
        let allowed = Settings {
            allow_unsafe_demo_modes: true,
            ..unsafe_mode
        };
        assert_eq!(
            allowed.validate().expect("allowed").unsafe_modes(),
            vec!["payouts send a new key per attempt"]
        );
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
    fn broker_commands_are_off_unless_configured() {
        let config = Settings::default().validate().expect("the defaults are valid");
        assert!(
            !config.commands.enabled,
            "whoever can write to the streams can move any wallet's money"
        );
    }

    #[test]
    fn the_inbox_keeps_a_claim_longer_than_any_event_it_accepts() {
        let settings = Settings {
            deposit_event_age_hours_max: 720,
            provider_signature_tolerance_s: 300,
            inbox_retention_hours: 720,
            ..Settings::default()
        };
        let error = settings
            .validate()
            .expect_err("a claim swept while its event is still accepted");
        assert!(error.to_string().contains("inbox_retention_hours"), "{error}");
        Settings {
            inbox_retention_hours: 721,
            ..settings
        }
        .validate()
        .expect("an hour past the oldest event and the tolerance");
        let defaults = Settings::default();
        assert!(
            u64::from(defaults.inbox_retention_hours) * 3_600
                > u64::from(defaults.deposit_event_age_hours_max) * 3_600
                    + defaults.provider_signature_tolerance_s
        );
    }

    #[test]
    fn the_inbox_keeps_a_claim_longer_than_any_command_it_accepts() {
        let settings = Settings {
            commands_age_hours_max: 720,
            commands_future_tolerance_s: 300,
            deposit_event_age_hours_max: 1,
            inbox_retention_hours: 720,
            ..Settings::default()
        };
        let error = settings
            .validate()
            .expect_err("a claim swept while its command is still accepted");
        assert!(
            error.to_string().contains("commands_future_tolerance_s"),
            "{error}"
        );
        Settings {
            inbox_retention_hours: 721,
            ..settings
        }
        .validate()
        .expect("an hour past the oldest command and the tolerance");
        let defaults = Settings::default();
        assert!(
            u64::from(defaults.inbox_retention_hours) * 3_600
                > u64::from(defaults.commands_age_hours_max) * 3_600 + defaults.commands_future_tolerance_s
        );
    }

    #[test]
    fn every_number_has_a_ceiling() {
        let settings = Settings {
            api_token_ttl_hours: u64::MAX,
            decisions_page_entries_max: 100_000,
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
