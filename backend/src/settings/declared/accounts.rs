//! The settings of money and accounts: the currency and grants,
//! authentication, and the per-account rate limits.
//!
//! Declared as `declared.rs` says: this file's macro adds its sections to
//! those gathered before it. The types it names are in scope where the
//! declaration expands, in `declared.rs`.

/// Adds this file's sections to the declaration (`declare_settings!`'s
/// `@gather`).
macro_rules! accounts_settings {
    ([$($files:ident)*] $($sections:tt)*) => {
        $crate::settings::declare::declare_settings! { @gather [$($files)*] $($sections)*
            section "Money and accounts" {
                /// The deployment's one currency: three upper-case letters, not `LAB`
                /// (the race lab's sandbox money).
                currency: String = "USD".into();
                /// Opening balance of a new wallet.
                signup_grant_minor: i64 = 100_000, within 0..=1_000_000_000_000_000 "minor units";
                /// Largest single transfer.
                transfer_amount_minor_max: i64 = 10_000_000, within 1..=1_000_000_000_000_000 "minor units";
                /// Largest `limit` on the transfer history.
                transfers_page_rows_max: i64 = 100, within 1..=1_000 "rows";
                /// Longest user name.
                user_name_chars_max: usize = 64, within 1..=64 "chars";
                /// Shortest password; at most `password_chars_max`.
                password_chars_min: usize = 8, within 1..=1_024 "chars";
                /// Longest password.
                password_chars_max: usize = 128, within 1..=1_024 "chars";
            }

            section "Authentication" {
                /// Key for the MAC on bearer tokens; at least 32 bytes. Every instance
                /// of one deployment needs the same key. Left empty, a random key is made
                /// at start-up (tokens then die with the process: fine for a demo only).
                token_signing_key: SecretString = SecretString::from(""),
                    empty "a random key per process, for a demo only";
                /// How long a bearer token stays valid.
                api_token_ttl_hours: u64 = 24, within 1..=8_760 "hours";
                /// Threads that hash and verify passwords (argon2id: CPU and 9 MiB
                /// each, by design); they bound what sign-ins can take.
                password_hash_threads: usize = 2, within 1..=64 "threads";
                /// Sign-ins waiting for a password thread before further ones get 503.
                password_hash_queue_max: usize = 64, within 1..=100_000 "sign-ins";
            }

            section "Account rate limits" {
                /// The sign-up and sign-in limits below. Off only for load tests that
                /// sign up thousands of users from one address.
                account_limits_enabled: bool = true;
                /// Sign-ups one client address may make at once, refilled at this many
                /// per hour. Each of these four limits is counted in Redis across every
                /// instance.
                signup_per_address_per_hour_max: u32 = 20, within 1..=1_000_000 "attempts";
                /// Sign-ups under one name at once, refilled at this many per hour.
                signup_per_name_per_hour_max: u32 = 5, within 1..=1_000_000 "attempts";
                /// Failed sign-ins from one client address at once, refilled at this
                /// many per minute. Sign-ins count only when the password is wrong,
                /// and a refusal is 429 with `Retry-After`.
                signin_per_address_per_minute_max: u32 = 30, within 1..=1_000_000 "attempts";
                /// Failed sign-ins to one name from one client address at once,
                /// refilled at this many per minute.
                signin_per_name_and_address_per_minute_max: u32 = 10, within 1..=1_000_000 "attempts";
                /// Failed sign-ins to one name from all addresses at once, refilled at
                /// this many per minute. It does not apply at an address the name
                /// signed in from within `signin_known_address_days`, so guesses from
                /// elsewhere never lock the owner out there.
                signin_per_name_per_minute_max: u32 = 60, within 1..=1_000_000 "attempts";
                /// How long an address a name signed in from stays exempt from the
                /// name's own limit.
                signin_known_address_days: u64 = 30, within 1..=3_650 "days";
                /// Addresses or networks (CIDR) of the load balancers in front of the
                /// instances. Only from these is `X-Forwarded-For` believed.
                trusted_proxies: Vec<String> = Vec::new(),
                    empty "no proxy; the client address is always the TCP peer";
            }
        }
    };
}

pub(super) use accounts_settings;
