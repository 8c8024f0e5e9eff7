//! What the ways money comes in and goes out besides a client's transfer
//! read: deposits from a provider, commands from a broker, payouts through
//! a gateway, and the inbox that keeps the first two once.

use std::time::Duration;

use base64::Engine;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use secrecy::{ExposeSecret, SecretSlice, SecretString};

use crate::settings::checks::Checks;
use crate::settings::{InboxMode, PayoutMode, Settings};

/// How a Standard Webhooks secret begins; the base64 of its key follows.
pub const STANDARD_WEBHOOKS_SECRET_PREFIX: &str = "whsec_";

/// What one of `provider_webhook_secrets` is, by its form.
pub enum ProviderSecret {
    /// At least 32 bytes: our `Provider-Signature` scheme's, used as it is.
    Ours,
    /// `whsec_` and base64: Standard Webhooks', with the 24 to 64 bytes of
    /// key it encodes, as the specification has them.
    StandardWebhooks(SecretSlice<u8>),
    /// Neither.
    Unusable,
}

/// Base64 with or without its padding, as the specification's libraries
/// read a secret.
const SECRET_BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The form of one provider secret: the one rule for what a secret is.
pub fn provider_secret(secret: &SecretString) -> ProviderSecret {
    let text = secret.expose_secret();
    match text.strip_prefix(STANDARD_WEBHOOKS_SECRET_PREFIX) {
        Some(encoded) => match SECRET_BASE64.decode(encoded) {
            Ok(key) if (24..=64).contains(&key.len()) => {
                ProviderSecret::StandardWebhooks(SecretSlice::from(key))
            }
            _ => ProviderSecret::Unusable,
        },
        None if text.len() >= 32 => ProviderSecret::Ours,
        None => ProviderSecret::Unusable,
    }
}

#[derive(Debug, Clone)]
pub struct Deposits {
    /// Each of a form `provider_secret` takes; empty: every deposit is
    /// refused.
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

impl Deposits {
    pub(super) fn checked(s: &Settings, check: &mut Checks) -> Self {
        check.require(
            s.provider_webhook_secrets
                .iter()
                .all(|secret| !matches!(provider_secret(secret), ProviderSecret::Unusable)),
            "each of provider_webhook_secrets must be at least 32 bytes, or whsec_ and the base64 of 24 to 64 bytes",
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

#[derive(Debug, Clone)]
pub struct Commands {
    pub enabled: bool,
    /// Empty: the shared Redis.
    pub redis_url: SecretString,
    pub partitions: u16,
    pub claim_idle: Duration,
    pub deliveries_max: u32,
    pub read_batch_entries_max: usize,
    /// At most 32: two subtransactions a command within PostgreSQL's 64.
    pub apply_batch_max: usize,
    pub read_wait: Duration,
    pub retry_backoff: Duration,
    pub results_entries_max: u64,
    pub dead_letters_entries_max: u64,
    /// In PostgreSQL's hours, as `int`.
    pub age_hours_max: u16,
    pub future_tolerance: Duration,
}

impl Commands {
    pub(super) fn checked(s: &Settings, check: &mut Checks) -> Self {
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
            apply_batch_max: s.commands_apply_batch_max,
            read_wait: Duration::from_millis(s.commands_read_wait_ms),
            retry_backoff: Duration::from_millis(s.commands_retry_backoff_ms),
            results_entries_max: s.commands_results_entries_max,
            dead_letters_entries_max: s.commands_dead_letters_entries_max,
            age_hours_max: s.commands_age_hours_max,
            future_tolerance: Duration::from_secs(s.commands_future_tolerance_s),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Payouts {
    /// Without a trailing slash; empty: no payouts.
    pub gateway_url: String,
    pub dispatcher_enabled: bool,
    pub mode: PayoutMode,
    pub lease: Duration,
    pub retry: wallet_client::RetryPolicy,
    pub calls_in_flight_max: u32,
    pub batch_rows_max: u32,
    pub take_rows_min: u32,
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

impl Payouts {
    pub(super) fn checked(s: &Settings, check: &mut Checks) -> Self {
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
            s.payout_take_rows_min <= s.payout_gateway_calls_in_flight_max,
            "payout_take_rows_min must be at most payout_gateway_calls_in_flight_max, or a busy dispatcher would \
             wait for every call to come back before taking more",
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
            calls_in_flight_max: s.payout_gateway_calls_in_flight_max,
            batch_rows_max: s.payout_dispatch_batch_rows_max,
            take_rows_min: s.payout_take_rows_min,
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
