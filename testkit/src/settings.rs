//! The settings a test app starts with, and the signing key the tests
//! share with it.

use layered_wallet::settings::Settings;
use secrecy::{ExposeSecret, SecretString};

use crate::redis_url;

pub const SIGNING_KEY: &str = "test-signing-key-test-signing-key-0123456789";

/// Settings for a test app on `database_url`, with short, test-friendly
/// limits and a Redis prefix of its own.
pub fn test_settings(database_url: &str, redis_prefix: &str) -> Settings {
    Settings {
        http_port: 0,
        // Two workers with two executors each: the storms and the batch
        // races then cross threads, executors and calls, as a larger
        // deployment's do.
        http_workers: 2,
        transfers_connections: 4,
        database_url: SecretString::from(database_url.to_owned()),
        db_pool_connections_max: 10,
        // The storms fire hundreds of transfers at once to prove the
        // layers decide each; refusing some as overloaded would hide that.
        // The admission limit's own tests (tests/overload.rs) set it.
        transfers_in_flight_max: 10_000,
        db_pool_connections_min: 0,
        redis_url: SecretString::from(redis_url()),
        redis_key_prefix: redis_prefix.to_owned(),
        token_signing_key: SecretString::from(SIGNING_KEY),
        signup_grant_minor: 100_000,
        idempotency_sweep_interval_s: 3600,
        shutdown_grace_s: 1,
        admin_http_addr: "127.0.0.1:0".into(),
        // Tests sign up many users from 127.0.0.1; the limits' own tests
        // switch them on.
        account_limits_enabled: false,
        // Tests count users and wallets; the demo recipient's own test
        // names one.
        demo_recipient_name: String::new(),
        // Tests fire run after run as one visitor; the quota's own test
        // sets it.
        race_lab_run_spacing_ms: 0,
        race_lab_runs_per_user_per_minute_max: 1_000,
        // Each consumer holds connections and creates streams in the shared
        // Redis; the commands' own tests switch them on.
        commands_enabled: false,
        // Fewer partitions than a deployment's, so that each test's
        // consumers make fewer connections; the issuer's side of every test
        // reads the same setting.
        commands_partitions: 2,
        ..Settings::default()
    }
}

/// Accepts deposits signed with the tests' provider secret. Off by
/// default, as in a deployment without a provider: tests count users, and a
/// provider brings its clearing account.
pub fn with_deposits(settings: &mut Settings) {
    settings.provider_webhook_secrets = vec![SecretString::from(crate::PROVIDER_SECRET)];
}

/// Switches the cooldown off, which counts as an unsafe demonstration mode.
pub fn without_cooldown(settings: &mut Settings) {
    settings.cooldown_enabled = false;
    settings.allow_unsafe_demo_modes = true;
}

pub fn expose(secret: &SecretString) -> &str {
    secret.expose_secret()
}

/// A verified token for `user`, signed with the tests' key: what the
/// cooldown lock is given for a request, for tests that call it directly.
pub fn verified_token_for(user: layered_wallet::domain::UserId) -> layered_wallet::auth::VerifiedToken {
    let signer = layered_wallet::auth::TokenSigner::new(&SecretString::from(SIGNING_KEY));
    let issued = signer.issue(user, chrono::Duration::hours(1));
    signer
        .verify(issued.token.expose_secret())
        .expect("a fresh token verifies")
}

/// Sends payouts through the gateway at `gateway_url`, with waits short
/// enough for a test: a call times out after 1 s, a lease lasts 3 s, an
/// unknown outcome is retried within 50 to 200 ms, 4 times at most, and
/// `reconcile` does not wait for a quiet period.
pub fn with_payouts(gateway_url: &str) -> impl FnOnce(&mut Settings) + use<> {
    let gateway_url = gateway_url.to_owned();
    move |settings| {
        settings.payout_gateway_url = gateway_url;
        settings.payout_call_timeout_ms = 1_000;
        settings.payout_lease_ms = 3_000;
        settings.payout_retry_base_ms = 50;
        settings.payout_retry_cap_ms = 200;
        settings.payout_attempts_max = 4;
        settings.payout_dispatch_idle_ms = 20;
        settings.payout_census_interval_ms = 100;
        settings.payout_reconcile_quiet_ms = 0;
    }
}

/// Points the app's Redis at the cluster of `urls`, with the single
/// server's URL on a closed port, so that nothing silently falls back to it.
pub fn on_redis_cluster(settings: &mut Settings, urls: Vec<String>) {
    settings.redis_cluster_urls = urls.into_iter().map(SecretString::from).collect();
    settings.redis_url = SecretString::from(format!("redis://127.0.0.1:{}", crate::closed_port()));
}
