//! Layer 1: the cooldown lock.
//!
//! **Stops:** a burst of simultaneous attempts at the same action by the same
//! user (double clicks, a client retrying in a tight loop, a script fired
//! twice). Of any number of attempts that arrive together, exactly one wins
//! the atomic `SET key token NX PX ttl`; the rest get 429 without a single
//! database query.
//!
//! **Does not guarantee** correctness. The lock expires after its TTL, Redis
//! may lose it (a failover, a restart), and it fails open when Redis is
//! unreachable. Everything it lets through is still decided by the
//! idempotency key and the row guard, which alone keep the money right.
//!
//! **Bounds:** the window is `cooldown_ttl_ms`; each Redis call is bounded by
//! `redis_command_timeout_ms` (connecting and waiting for a slot on the
//! thread's connection included).
//!
//! **Lifecycle:** the key is not released on success or on a business
//! refusal; it is a cooldown window, not a mutex. It is released after a
//! server-side failure, so that an honest retry after our crash is not
//! blocked, and only by its owner (compare-and-delete in Lua), so a slow
//! request whose window already expired can never delete a newer holder's
//! key.
//!
//! **Revoked tokens:** a token's MAC is checked without I/O, so a revoked
//! token still looks valid at the edge. Revoking one writes a revocation
//! entry to Redis that expires with the token, and the same script that
//! takes the window checks it first: a revoked token never takes its
//! owner's window, still in one round trip and with no PostgreSQL query.
//! The check inside the transfer's transaction stays the authority.
//!
//! **Windows this instance holds.** An instance remembers the windows its
//! own requests took (`held`, at most `cooldown_windows_remembered_max`) and
//! refuses a further attempt at one without a Redis round trip. It can
//! differ from Redis in two ways, both refusals before PostgreSQL: a window
//! Redis lost is still refused here until its TTL ends, and a token revoked
//! through another instance gets this 429 rather than the 401 until then.
//!
//! **When Redis fails:** `fail_open` (default) logs a warning, counts the
//! pass and lets the request through; `fail_closed` answers 503. An
//! infrastructure error is never reported as 429.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::IntCounter;
use redis::Script;
use sha2::{Digest, Sha256};

use super::Refusal;
use crate::auth::VerifiedToken;
use crate::decision::{Layer, Outcome};
use crate::domain::UserId;
use crate::problem::Problem;
use crate::redis_store::{RedisStore, random_token};
use crate::settings::{Config, CooldownScope, StoreErrorPolicy};

mod held;
mod refusal;
mod revocation;

use held::HeldWindows;

/// The window, in one atomic script: refuse a revoked token (KEYS[2]
/// exists), else `SET KEYS[1] ARGV[1] NX PX ARGV[2]`; on refusal, the
/// window's remaining time and whether its holder was refused (its value
/// ends in `ARGV[3]`). Both keys carry the user as a hash tag, so a
/// Redis Cluster keeps them in one slot.
const ACQUIRE: &str = r"
if redis.call('EXISTS', KEYS[2]) == 1 then
    return {2, 0, 0}
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return {1, 0, 0}
end
local holder = redis.call('GET', KEYS[1])
local refused = 0
if holder and string.sub(holder, -string.len(ARGV[3])) == ARGV[3] then
    refused = 1
end
return {0, redis.call('PTTL', KEYS[1]), refused}
";

/// Marks the window of a request that was refused after it took the
/// window (insufficient funds, a reused key): the window stays, so that a
/// burst of the same refused request still meets the edge, but the next
/// 429 can say that the last attempt was refused rather than sent. Only
/// the holder may mark it; the time left is kept.
const MARK_REFUSED_IF_OWNER: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('SET', KEYS[1], ARGV[1] .. ARGV[2], 'KEEPTTL')
    return 1
end
return 0
";

/// What a refused holder's token is followed by in its window's key
/// (`ARGV[3]` of `ACQUIRE`, `ARGV[2]` of `MARK_REFUSED_IF_OWNER`).
const REFUSED_SUFFIX: &str = ":refused";

/// The outcome of asking for the cooldown window.
#[derive(Debug)]
pub enum CooldownVerdict {
    /// This request holds the window.
    Acquired(CooldownPermit),
    /// Another request holds it; refuse with 429.
    Active {
        /// Until the window ends.
        retry_after: Duration,
        /// Since the window began: since the transfer that holds it.
        elapsed: Duration,
        /// The request that took the window was refused (and moved
        /// nothing).
        last_refused: bool,
    },
    /// The token was revoked: refused before it could take the window.
    TokenRevoked,
    /// Redis could not be asked and the policy is fail-open: the lower
    /// layers decide alone.
    PassedWithoutStore,
    /// The layer is switched off by configuration.
    Disabled,
}

/// Proof of holding a cooldown window: the key and the random token that
/// only this request knows.
#[derive(Debug)]
pub struct CooldownPermit {
    key: String,
    token: String,
}

/// A request the cooldown let through, and what it holds.
#[derive(Debug)]
pub struct CooldownPass {
    /// The window this request holds; `None` when the layer is off or
    /// Redis could not be asked.
    pub permit: Option<CooldownPermit>,
    /// Redis could not be asked and the policy is fail-open: the lower
    /// layers decide alone, and an accepted transfer is reported degraded.
    pub without_store: bool,
}

impl CooldownPass {
    /// The layer is off, for the deployment or for one race-lab run.
    pub const OFF: CooldownPass = CooldownPass {
        permit: None,
        without_store: false,
    };
}

/// Redis could not be asked and the policy is fail-closed.
#[derive(Debug, thiserror::Error)]
#[error("the cooldown store is unavailable")]
pub struct CooldownUnavailable;

/// The Redis key of the window `user` takes for `action` under
/// `key_prefix`: the one definition, for the lock and for what inspects
/// its windows from outside (the chaos runs find the node that holds one).
pub fn window_key(
    key_prefix: &str,
    scope: CooldownScope,
    user: UserId,
    action: &str,
    canonical_body: &str,
) -> String {
    // Joined rather than formatted: this key is made for every transfer.
    let mut buffer = [0; uuid::fmt::Hyphenated::LENGTH];
    let user = user.written_in(&mut buffer);
    match scope {
        CooldownScope::UserAction => [key_prefix, "cooldown:{", user, "}:", action].concat(),
        CooldownScope::UserActionBody => {
            let digest = Sha256::digest(canonical_body.as_bytes());
            format!(
                "{key_prefix}cooldown:{{{user}}}:{action}:{}",
                hex::encode(&digest[..16])
            )
        }
    }
}

#[derive(Clone)]
pub struct CooldownLock {
    /// `None` when the layer is disabled; no Redis connection is made then.
    store: Option<RedisStore>,
    ttl: Duration,
    scope: CooldownScope,
    on_store_error: StoreErrorPolicy,
    key_prefix: String,
    command_timeout: Duration,
    acquire_script: Arc<Script>,
    release_script: Arc<Script>,
    mark_refused_script: Arc<Script>,
    /// The windows this instance's requests took and still hold.
    held: Arc<HeldWindows>,
    /// Requests let through because Redis could not be asked.
    fail_open_passes: IntCounter,
}

impl CooldownLock {
    /// `store` is the shared Redis connection; the layer is disabled when
    /// `cooldown_enabled` is off. Nothing connects here: the server starts
    /// (and fails open) even while Redis is down.
    pub fn new(config: &Config, store: Option<RedisStore>, fail_open_passes: IntCounter) -> Self {
        Self {
            store: store.filter(|_| config.cooldown.enabled),
            ttl: config.cooldown.ttl,
            scope: config.cooldown.scope,
            on_store_error: config.cooldown.on_store_error,
            key_prefix: config.redis.key_prefix.clone(),
            command_timeout: config.redis.command_timeout,
            acquire_script: Arc::new(Script::new(ACQUIRE)),
            release_script: Arc::new(Script::new(crate::redis_store::RELEASE_IF_OWNER)),
            mark_refused_script: Arc::new(Script::new(MARK_REFUSED_IF_OWNER)),
            held: Arc::new(HeldWindows::new(config.cooldown.windows_remembered_max)),
            fail_open_passes,
        }
    }

    pub fn fail_open_passes(&self) -> u64 {
        self.fail_open_passes.get()
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    pub fn scope(&self) -> CooldownScope {
        self.scope
    }

    /// The Redis key for `user` doing `action`; with the body scope, a
    /// digest of the canonical body narrows it to identical requests. The
    /// user is a hash tag (`{…}`), shared with the revocation entries.
    pub fn key(&self, user: UserId, action: &str, canonical_body: &str) -> String {
        window_key(&self.key_prefix, self.scope, user, action, canonical_body)
    }

    /// Layer 1 for one request: through, holding the window, or refused
    /// with the layer's own answer. At most one Redis round trip (none for
    /// a window this instance holds); a refusal here touches no database.
    pub async fn pass(
        &self,
        caller: &VerifiedToken,
        action: &str,
        canonical_body: &str,
    ) -> Result<CooldownPass, Refusal> {
        match self.try_acquire(caller, action, canonical_body).await {
            Ok(CooldownVerdict::Acquired(permit)) => Ok(CooldownPass {
                permit: Some(permit),
                without_store: false,
            }),
            Ok(CooldownVerdict::PassedWithoutStore) => Ok(CooldownPass {
                permit: None,
                without_store: true,
            }),
            Ok(CooldownVerdict::Disabled) => Ok(CooldownPass::OFF),
            Ok(CooldownVerdict::Active {
                retry_after,
                elapsed,
                last_refused,
            }) => Err(Refusal::new(
                self.window_still_open(retry_after, elapsed, last_refused),
                Layer::Cooldown,
                Outcome::Rejected,
            )),
            // A dead token speaks for nobody: no window, no feed entry.
            Ok(CooldownVerdict::TokenRevoked) => Err(Refusal::token_not_live()),
            Err(CooldownUnavailable) => Err(Refusal::new(
                Problem::unavailable(
                    "The cooldown store is unavailable and this deployment fails closed. Retry shortly.",
                ),
                Layer::Cooldown,
                Outcome::Error,
            )),
        }
    }

    #[tracing::instrument(
        name = "defense.cooldown",
        skip_all,
        fields(
            defense.layer = "cooldown",
            defense.outcome = tracing::field::Empty,
            cooldown.decided_by = tracing::field::Empty,
            user.id = %caller.user_id
        )
    )]
    pub async fn try_acquire(
        &self,
        caller: &VerifiedToken,
        action: &str,
        canonical_body: &str,
    ) -> Result<CooldownVerdict, CooldownUnavailable> {
        let Some(store) = &self.store else {
            return Ok(CooldownVerdict::Disabled);
        };
        let key = self.key(caller.user_id, action, canonical_body);
        let (decided, decided_by) = match self.held.still_open(&key, Instant::now()) {
            Some(open) => (
                Ok(self.active(open.retry_after, open.last_refused)),
                "this instance",
            ),
            None => (self.ask_redis(store, caller, key).await, "redis"),
        };
        let outcome = match &decided {
            Ok(CooldownVerdict::Acquired(_)) => "accepted",
            Ok(CooldownVerdict::Active { .. }) => "rejected",
            Ok(CooldownVerdict::TokenRevoked) => "unauthorized",
            Ok(CooldownVerdict::PassedWithoutStore) => "degraded",
            Ok(CooldownVerdict::Disabled) => "disabled",
            Err(CooldownUnavailable) => "error",
        };
        let span = tracing::Span::current();
        span.record("defense.outcome", outcome);
        span.record("cooldown.decided_by", decided_by);
        decided
    }

    /// A window that another request holds, with `retry_after` left.
    fn active(&self, retry_after: Duration, last_refused: bool) -> CooldownVerdict {
        let retry_after = retry_after.min(self.ttl);
        CooldownVerdict::Active {
            retry_after,
            elapsed: self.ttl - retry_after,
            last_refused,
        }
    }

    async fn ask_redis(
        &self,
        store: &RedisStore,
        caller: &VerifiedToken,
        key: String,
    ) -> Result<CooldownVerdict, CooldownUnavailable> {
        let token = random_token();
        let sent = Instant::now();
        let attempt = async {
            let mut conn = store.get().await?;
            self.acquire_script
                .key(&key)
                .key(self.revocation_key(caller))
                .arg(&token)
                .arg(self.ttl.as_millis())
                .arg(REFUSED_SUFFIX)
                .invoke_async::<(i64, i64, i64)>(&mut conn)
                .await
                .map_err(|e| e.to_string())
        };
        // redis-rs bounds each round trip; this bounds the attempt, three round
        // trips when Redis lost the script (EVALSHA, SCRIPT LOAD, EVALSHA).
        match tokio::time::timeout(self.command_timeout, attempt).await {
            Ok(Ok((1, _, _))) => {
                self.held.took(caller.user_id, &key, &token, sent, self.ttl);
                Ok(CooldownVerdict::Acquired(CooldownPermit { key, token }))
            }
            Ok(Ok((2, _, _))) => Ok(CooldownVerdict::TokenRevoked),
            // A window always has a TTL (the script sets none without one),
            // so a negative PTTL cannot happen; clamp it anyway.
            Ok(Ok((_, remaining_ms, refused))) => Ok(self.active(
                Duration::from_millis(u64::try_from(remaining_ms).unwrap_or(0)),
                refused == 1,
            )),
            Ok(Err(error)) => self.store_failed(&error),
            Err(_elapsed) => self.store_failed("timed out"),
        }
    }

    fn store_failed(&self, error: &str) -> Result<CooldownVerdict, CooldownUnavailable> {
        match self.on_store_error {
            StoreErrorPolicy::FailOpen => {
                self.fail_open_passes.inc();
                let passes = self.fail_open_passes.get();
                tracing::warn!(
                    error,
                    cooldown.fail_open_passes = passes,
                    "cooldown store unreachable; failing open, the PostgreSQL layers decide alone"
                );
                Ok(CooldownVerdict::PassedWithoutStore)
            }
            StoreErrorPolicy::FailClosed => {
                tracing::error!(error, "cooldown store unreachable; failing closed");
                Err(CooldownUnavailable)
            }
        }
    }

    /// Marks the window as held by a refused attempt, if we still own it,
    /// so that the next 429 says "tried" rather than "sent". Best effort:
    /// if Redis is gone, the next 429 says "sent", and the window expires
    /// as usual.
    pub async fn mark_refused(&self, permit: &CooldownPermit) {
        self.held.refused(&permit.key, &permit.token);
        self.as_holder(&self.mark_refused_script, permit, "mark as refused")
            .await;
    }

    /// Gives the window back after a server-side failure, if we still own
    /// it. Best effort: if Redis is gone too, the window simply expires.
    pub async fn release(&self, permit: &CooldownPermit) -> bool {
        self.held.given_back(&permit.key, &permit.token);
        self.as_holder(&self.release_script, permit, "release").await == Some(1)
    }

    /// Runs an owner-checked script on the permit's window (`KEYS[1]` the
    /// window, `ARGV[1]` the holder's token, `ARGV[2]` the refused suffix),
    /// within `command_timeout`: the script's answer, or `None`, logged,
    /// when Redis could not be asked.
    async fn as_holder(&self, script: &Script, permit: &CooldownPermit, step: &'static str) -> Option<i64> {
        let store = self.store.as_ref()?;
        let attempt = async {
            let mut conn = store.get().await?;
            script
                .key(&permit.key)
                .arg(&permit.token)
                .arg(REFUSED_SUFFIX)
                .invoke_async::<i64>(&mut conn)
                .await
                .map_err(|e| e.to_string())
        };
        match tokio::time::timeout(self.command_timeout, attempt).await {
            Ok(Ok(answer)) => Some(answer),
            Ok(Err(error)) => {
                tracing::warn!(
                    error,
                    cooldown.step = step,
                    "could not change the cooldown window"
                );
                None
            }
            Err(_elapsed) => {
                tracing::warn!(cooldown.step = step, "changing the cooldown window timed out");
                None
            }
        }
    }
}

impl CooldownPermit {
    /// A permit for an arbitrary key and token; lets tests prove that only
    /// the owner's token releases a window.
    pub fn for_key(key: String, token: String) -> Self {
        Self { key, token }
    }

    pub fn key(&self) -> &str {
        &self.key
    }
}
