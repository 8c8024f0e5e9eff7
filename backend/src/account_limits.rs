//! Rate limits on sign-up and sign-in, per client address and per name,
//! shared by every instance through Redis.
//!
//! Each limit is a GCRA (generic cell rate algorithm): at most N attempts at
//! once, refilled at N per period. One Lua script per limit reads and
//! advances the limit's "theoretical arrival time" atomically, on Redis's
//! clock, so instances with skewed clocks agree. One key per limit and
//! client address or name: a limit takes one hash slot, as the cooldown does.
//!
//! They bound password guessing per name and per address, and how fast
//! scripted sign-ups can collect the opening grant.
//!
//! **Sign-ins count failures only,** each against three limits: the client
//! address, the name from that address, and the name from anywhere
//! (looser). Before the password is checked, each is asked whether one more
//! failure would be allowed; only a wrong password takes one. The name's
//! own limit does not apply to an address the name has signed in from
//! before (`signin_known_address_days`): guesses from elsewhere, however
//! many addresses they rotate through, can then never lock the owner out at
//! their own address.
//!
//! **The client address** is the TCP peer, unless the peer is one of
//! `trusted_proxies`: then it is the right-most address in
//! `X-Forwarded-For` that is not itself a trusted proxy. A client cannot
//! choose its address by sending the header to an instance directly.
//!
//! **When Redis fails,** the cooldown's policy applies: `fail_open` lets the
//! attempt through (logged and counted), `fail_closed` answers 503.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use actix_web::HttpRequest;
use ipnet::IpNet;
use prometheus::IntCounter;
use redis::Script;
use sha2::{Digest, Sha256};

use crate::problem::{Problem, ProblemType};
use crate::redis_store::RedisStore;
use crate::settings::{Config, StoreErrorPolicy};

/// KEYS[1]: the limit's key. ARGV[1]: the interval between attempts at the
/// sustained rate (ms); ARGV[2]: the burst (how many at once); ARGV[3]:
/// `take` to count the attempt when allowed, `peek` only to ask.
/// Returns 0 when allowed, or the milliseconds until the next attempt is.
const GCRA: &str = r"
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local arrival = tonumber(redis.call('GET', KEYS[1]) or now)
if arrival < now then arrival = now end
local next_arrival = arrival + interval
local allowed_at = next_arrival - interval * burst
if allowed_at > now then
  return allowed_at - now
end
if ARGV[3] == 'take' then
  redis.call('SET', KEYS[1], next_arrival, 'PX', next_arrival - now)
end
return 0
";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccountAction {
    SignUp,
    SignIn,
}

impl AccountAction {
    fn as_str(self) -> &'static str {
        match self {
            AccountAction::SignUp => "signup",
            AccountAction::SignIn => "signin",
        }
    }
}

/// One limit: `attempts_max` at once, refilled at `attempts_max` per `period`.
#[derive(Debug, Clone, Copy)]
struct Limit {
    attempts_max: u32,
    period: Duration,
}

impl Limit {
    fn interval_ms(self) -> u64 {
        (self.period.as_millis() as u64 / u64::from(self.attempts_max)).max(1)
    }
}

pub struct AccountLimits {
    store: Option<RedisStore>,
    key_prefix: String,
    policy: StoreErrorPolicy,
    trusted_proxies: Arc<[IpNet]>,
    signup_per_address: Limit,
    signup_per_name: Limit,
    signin_per_address: Limit,
    signin_per_name: Limit,
    signin_per_name_and_address: Limit,
    /// How long an address a name signed in from stays exempt from the
    /// name's own limit.
    signin_known_address: Duration,
    script: Arc<Script>,
    fail_open_passes: IntCounter,
}

const HOUR: Duration = Duration::from_secs(3600);
const MINUTE: Duration = Duration::from_secs(60);

impl AccountLimits {
    /// `store` is None when `account_limits_enabled` is off: every attempt
    /// passes.
    pub fn new(config: &Config, store: Option<RedisStore>, fail_open_passes: IntCounter) -> Self {
        Self {
            store: store.filter(|_| config.accounts.limits_enabled),
            key_prefix: config.redis.key_prefix.clone(),
            policy: config.cooldown.on_store_error,
            trusted_proxies: config.http.trusted_proxies.clone().into(),
            signup_per_address: Limit {
                attempts_max: config.accounts.signup_per_address_per_hour_max,
                period: HOUR,
            },
            signup_per_name: Limit {
                attempts_max: config.accounts.signup_per_name_per_hour_max,
                period: HOUR,
            },
            signin_per_address: Limit {
                attempts_max: config.accounts.signin_per_address_per_minute_max,
                period: MINUTE,
            },
            signin_per_name: Limit {
                attempts_max: config.accounts.signin_per_name_per_minute_max,
                period: MINUTE,
            },
            signin_per_name_and_address: Limit {
                attempts_max: config.accounts.signin_per_name_and_address_per_minute_max,
                period: MINUTE,
            },
            signin_known_address: config.accounts.signin_known_address,
            script: Arc::new(Script::new(GCRA)),
            fail_open_passes,
        }
    }

    /// The client's address, as far as it can be trusted.
    pub fn client_address(&self, request: &HttpRequest) -> Option<IpAddr> {
        let peer = request.peer_addr()?.ip();
        if !self.is_trusted(peer) {
            return Some(peer);
        }
        let forwarded = request
            .headers()
            .get_all("x-forwarded-for")
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .map(str::trim)
            .collect::<Vec<_>>();
        // Right to left: each trusted proxy appended the address it saw.
        for hop in forwarded.iter().rev() {
            match hop.parse::<IpAddr>() {
                Ok(address) if self.is_trusted(address) => continue,
                Ok(address) => return Some(address),
                // A hop we cannot read: what lies left of it is the
                // client's to invent, so the proxy's view is what we have.
                Err(_) => return Some(peer),
            }
        }
        Some(peer)
    }

    fn is_trusted(&self, address: IpAddr) -> bool {
        let address = match address {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(address),
            v4 => v4,
        };
        self.trusted_proxies
            .iter()
            .any(|network| network.contains(&address))
    }

    /// Takes one sign-up from the client address's limit and then from the
    /// name's. `name_key` is the name as compared (NFKC, case-folded).
    pub async fn check_sign_up(&self, request: &HttpRequest, name_key: &str) -> Result<(), Problem> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        let attempt = self.attempt(AccountAction::SignUp, request, name_key);
        for (key, limit) in [
            (attempt.key(Scope::Address), self.signup_per_address),
            (attempt.key(Scope::Name), self.signup_per_name),
        ] {
            match self.gcra(store, &key, limit, "take").await {
                Ok(0) => {}
                Ok(wait_ms) => return Err(too_many_attempts(wait_ms)),
                Err(error) => return self.on_store_error(AccountAction::SignUp, &error),
            }
        }
        Ok(())
    }

    /// Asks, before a password is checked, whether one more failed sign-in
    /// would still be allowed: from this address, to this name from this
    /// address, and to this name from anywhere unless the name has signed
    /// in from this address before. Nothing is counted here.
    pub async fn sign_in_may_try(&self, request: &HttpRequest, name_key: &str) -> Result<Attempt, Problem> {
        let attempt = self.attempt(AccountAction::SignIn, request, name_key);
        let Some(store) = &self.store else {
            return Ok(attempt);
        };
        let known = match self.is_known(store, &attempt).await {
            Ok(known) => known,
            Err(error) => {
                return self
                    .on_store_error(AccountAction::SignIn, &error)
                    .map(|()| attempt);
            }
        };
        for (key, limit) in self.sign_in_limits(&attempt, known) {
            match self.gcra(store, &key, limit, "peek").await {
                Ok(0) => {}
                Ok(wait_ms) => return Err(too_many_attempts(wait_ms)),
                Err(error) => {
                    return self
                        .on_store_error(AccountAction::SignIn, &error)
                        .map(|()| attempt);
                }
            }
        }
        Ok(attempt)
    }

    /// Counts a wrong password against each of the attempt's limits.
    pub async fn sign_in_failed(&self, attempt: &Attempt) {
        let Some(store) = &self.store else {
            return;
        };
        let known = self.is_known(store, attempt).await.unwrap_or(false);
        for (key, limit) in self.sign_in_limits(attempt, known) {
            if let Err(error) = self.gcra(store, &key, limit, "take").await {
                tracing::warn!(error, "Redis unreachable; a failed sign-in was not counted");
            }
        }
    }

    /// Remembers the address a name signed in from, so that the name's own
    /// limit never refuses it.
    pub async fn sign_in_succeeded(&self, attempt: &Attempt) {
        let Some(store) = &self.store else {
            return;
        };
        let remembered = async {
            let mut conn = store.get().await?;
            redis::cmd("SET")
                .arg(attempt.key(Scope::KnownAddress))
                .arg(1)
                .arg("EX")
                .arg(self.signin_known_address.as_secs().max(1))
                .query_async::<()>(&mut conn)
                .await
                .map_err(|error| error.to_string())
        };
        if let Err(error) = remembered.await {
            tracing::warn!(
                error,
                "Redis unreachable; the address a name signed in from was not remembered"
            );
        }
    }

    fn sign_in_limits(&self, attempt: &Attempt, known: bool) -> Vec<(String, Limit)> {
        let mut limits = vec![
            (attempt.key(Scope::Address), self.signin_per_address),
            (
                attempt.key(Scope::NameFromAddress),
                self.signin_per_name_and_address,
            ),
        ];
        if !known {
            limits.push((attempt.key(Scope::Name), self.signin_per_name));
        }
        limits
    }

    async fn is_known(&self, store: &RedisStore, attempt: &Attempt) -> Result<bool, String> {
        let mut conn = store.get().await?;
        redis::cmd("EXISTS")
            .arg(attempt.key(Scope::KnownAddress))
            .query_async::<bool>(&mut conn)
            .await
            .map_err(|error| error.to_string())
    }

    fn attempt(&self, action: AccountAction, request: &HttpRequest, name_key: &str) -> Attempt {
        let address = self
            .client_address(request)
            .map(|address| address.to_string())
            .unwrap_or_else(|| "unknown".to_owned());
        Attempt {
            key_prefix: format!("{}limit:{}", self.key_prefix, action.as_str()),
            address,
            // Names are hashed: the key's size does not depend on the
            // client, and no name appears in Redis.
            name_hash: hex::encode(Sha256::digest(name_key.as_bytes())),
        }
    }

    async fn gcra(&self, store: &RedisStore, key: &str, limit: Limit, mode: &str) -> Result<u64, String> {
        let mut conn = store.get().await?;
        self.script
            .key(key)
            .arg(limit.interval_ms())
            .arg(limit.attempts_max)
            .arg(mode)
            .invoke_async::<u64>(&mut conn)
            .await
            .map_err(|error| error.to_string())
    }

    fn on_store_error(&self, action: AccountAction, error: &str) -> Result<(), Problem> {
        match self.policy {
            StoreErrorPolicy::FailOpen => {
                self.fail_open_passes.inc();
                tracing::warn!(
                    action = action.as_str(),
                    error,
                    "Redis unreachable; account limit not applied (fail_open)"
                );
                Ok(())
            }
            StoreErrorPolicy::FailClosed => {
                tracing::warn!(
                    action = action.as_str(),
                    error,
                    "Redis unreachable; attempt refused (fail_closed)"
                );
                Err(Problem::unavailable(
                    "The service cannot check its sign-in limits right now. Nothing was changed; retry shortly.",
                ))
            }
        }
    }
}

/// Who is trying, for the limits' keys: the client address and the hashed
/// name.
pub struct Attempt {
    key_prefix: String,
    address: String,
    name_hash: String,
}

/// What a key counts.
#[derive(Clone, Copy)]
enum Scope {
    Address,
    Name,
    NameFromAddress,
    /// Not a limit: the mark of an address a name signed in from.
    KnownAddress,
}

impl Attempt {
    /// The key of one scope; a name's keys share the name's hash slot.
    fn key(&self, scope: Scope) -> String {
        let Self {
            key_prefix,
            address,
            name_hash,
        } = self;
        match scope {
            Scope::Address => format!("{key_prefix}:address:{{{address}}}"),
            Scope::Name => format!("{key_prefix}:name:{{{name_hash}}}"),
            Scope::NameFromAddress => format!("{key_prefix}:name-address:{{{name_hash}}}:{address}"),
            Scope::KnownAddress => format!("{key_prefix}:known:{{{name_hash}}}:{address}"),
        }
    }
}

fn too_many_attempts(wait_ms: u64) -> Problem {
    let seconds = wait_ms.div_ceil(1000).max(1);
    Problem::new(
        ProblemType::TooManyAttempts,
        format!(
            "There have been too many attempts. Please wait {seconds} s and try again; nothing was changed."
        ),
    )
    .detail_is_for_people()
    .with_retry_after_s(seconds)
}
