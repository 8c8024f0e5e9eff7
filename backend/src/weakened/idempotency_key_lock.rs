//! DEMO ONLY (`idempotency_mode = redis_key_lock`, or the race lab's
//! switch): a Redis lock on each idempotency key, the common alternative to
//! claiming the key by an insert in the transfer's transaction.
//!
//! `SET idempotency:{user}:<key> <token> NX PX idempotency_redis_lock_ttl_ms`
//! before the transaction; a second request with the key finds it held
//! and is answered 409. The holder looks the key up, runs the transaction
//! with the claim, commits, and lets go with an owner-checked
//! compare-and-delete (`redis_store::RELEASE_IF_OWNER`).
//!
//! **Does not guarantee** that one request runs at a time: a holder paused
//! past the lock's lifetime, or a Redis failover that loses the lock, lets a
//! second request in. The claim in PostgreSQL is then what decides, so the
//! lock saves work and guarantees nothing.

use std::time::Duration;

use redis::Script;

use crate::defense::idempotency::IdempotencyKey;
use crate::domain::UserId;
use crate::redis_store::random_token;
use crate::redis_store::{RELEASE_IF_OWNER, RedisStore};
use crate::settings::Config;

pub struct KeyLock {
    store: RedisStore,
    key_prefix: String,
    ttl: Duration,
    command_timeout: Duration,
}

/// Proof of holding one key's lock.
#[derive(Debug)]
pub struct KeyLockPermit {
    lock_key: String,
    token: String,
}

impl KeyLock {
    pub fn new(config: &Config, store: RedisStore) -> Self {
        Self {
            store,
            key_prefix: config.redis.key_prefix.clone(),
            ttl: config.idempotency.redis_lock_ttl,
            command_timeout: config.redis.command_timeout,
        }
    }

    /// Takes the key's lock: the permit, `None` when another request holds
    /// it, or the store's error.
    pub async fn acquire(&self, user: UserId, key: IdempotencyKey) -> Result<Option<KeyLockPermit>, String> {
        let lock_key = format!("{}idempotency:{{{user}}}:{}", self.key_prefix, key.as_uuid());
        let token = random_token();
        let attempt = async {
            let mut conn = self.store.get().await?;
            redis::cmd("SET")
                .arg(&lock_key)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(self.ttl.as_millis() as u64)
                .query_async::<Option<String>>(&mut conn)
                .await
                .map_err(|error| error.to_string())
        };
        match tokio::time::timeout(self.command_timeout, attempt).await {
            Ok(Ok(Some(_))) => Ok(Some(KeyLockPermit { lock_key, token })),
            Ok(Ok(None)) => Ok(None),
            Ok(Err(error)) => Err(error),
            Err(_elapsed) => Err("timed out".to_owned()),
        }
    }

    /// Lets go, if the lock is still ours. Best effort: if Redis is gone,
    /// the lock expires.
    pub async fn release(&self, permit: KeyLockPermit) {
        let attempt = async {
            let mut conn = self.store.get().await?;
            Script::new(RELEASE_IF_OWNER)
                .key(&permit.lock_key)
                .arg(&permit.token)
                .invoke_async::<i64>(&mut conn)
                .await
                .map_err(|error| error.to_string())
        };
        if !matches!(
            tokio::time::timeout(self.command_timeout, attempt).await,
            Ok(Ok(_))
        ) {
            tracing::warn!("could not let go of an idempotency key's Redis lock; it expires on its own");
        }
    }
}
