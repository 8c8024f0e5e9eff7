//! What money and accounts read: the currency, sign-up grants, sign-in
//! and the per-account rate limits.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};

use crate::settings::Settings;
use crate::settings::checks::Checks;

#[derive(Debug, Clone)]
pub struct Money {
    /// Three upper-case letters.
    pub currency: String,
    pub signup_grant_minor: i64,
    pub transfer_amount_minor_max: i64,
    pub transfers_page_rows_max: i64,
}

impl Money {
    pub(super) fn checked(s: &Settings, check: &mut Checks) -> Self {
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

impl Accounts {
    pub(super) fn checked(s: &Settings, check: &mut Checks) -> Self {
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
