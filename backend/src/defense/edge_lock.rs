//! Layer 1 for a deposit: the edge lock on the event.
//!
//! **Stops:** a burst of deliveries of one event (a provider retrying
//! while the first delivery runs, the same event sent to two instances)
//! from reaching PostgreSQL more than once. Of the deliveries that arrive
//! together, one wins `SET event-lock token NX PX event_lock_ttl_ms` and
//! goes on to the inbox; the others wait, at most
//! `event_duplicate_wait_ms_max`, for its answer, which the winner leaves
//! at the edge for `event_answer_cache_ms` after its transaction commits.
//! They answer with it: the same status and the same bytes as the winner.
//!
//! **Does not guarantee** anything about the money. A waiting duplicate
//! that runs out of time, a lock lost with Redis, a Redis that cannot be
//! reached: each goes on to the inbox, which alone decides whether the
//! event was applied. Only answers the inbox has committed are left at
//! the edge, and a duplicate whose contents differ from the answer's event
//! is refused as the inbox would refuse it.
//!
//! **Bounds:** each Redis call is bounded by `redis_command_timeout_ms`; a
//! waiting duplicate polls every `event_answer_poll_ms` until
//! `event_duplicate_wait_ms_max`. The lock lasts `event_lock_ttl_ms` at
//! most, so a winner that dies holding it delays the next delivery by no
//! more than that.
//!
//! **Lifecycle:** the winner leaves its committed answer and lets go of the
//! lock in one script; after a failure (nothing committed, or not known) it
//! only lets go, so that the next delivery goes to the inbox at once. Both
//! act only for the lock's owner (compare-and-delete), so a slow winner
//! whose lock expired never deletes a newer holder's.
//!
//! **When Redis fails:** the layer always fails open. The delivery goes on
//! to the inbox as if the layer were off ([`PassedOn::StoreUnavailable`]),
//! and an accepted deposit is reported degraded; a failure to leave an
//! answer or to let go is logged and otherwise ignored.
//!
//! **Answers** with [`EdgeVerdict`]: the lock held, an answer to repeat,
//! passed on to the inbox, or the layer off.

use std::sync::Arc;
use std::time::Duration;

use redis::Script;

use crate::domain::UserId;
use crate::redis_store::RedisStore;
use crate::redis_store::random_token;
use crate::settings::Config;

/// One round trip: the answer left at the edge (`KEYS[2]`) if there is
/// one, else the lock (`KEYS[1]`) if it is free. Both keys share the
/// event's hash tag, so a Redis Cluster keeps them in one slot.
const ANSWER_OR_LOCK: &str = r"
local answer = redis.call('GET', KEYS[2])
if answer then
    return {2, answer}
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return {1, ''}
end
return {0, ''}
";

/// The winner leaves its committed answer for `ARGV[3]` ms and lets go of
/// the lock, if it still holds it.
const LEAVE_ANSWER: &str = r"
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('DEL', KEYS[1])
end
return 1
";

/// A committed answer, as left at the edge: the event's fingerprint (so
/// that a changed payload is not answered with it), the status, the
/// wallet's owner (whose feed hears of the duplicates) and the exact body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeAnswer {
    pub fingerprint: [u8; 32],
    pub status: u16,
    pub owner: Option<UserId>,
    pub body: String,
}

impl EdgeAnswer {
    fn encode(&self) -> String {
        let owner = self.owner.map(|owner| owner.to_string()).unwrap_or_default();
        format!(
            "{}\n{}\n{owner}\n{}",
            hex::encode(self.fingerprint),
            self.status,
            self.body
        )
    }

    fn decode(text: &str) -> Option<Self> {
        let mut parts = text.splitn(4, '\n');
        let mut fingerprint = [0u8; 32];
        hex::decode_to_slice(parts.next()?, &mut fingerprint).ok()?;
        let status = parts.next()?.parse().ok()?;
        let owner = match parts.next()? {
            "" => None,
            owner => Some(UserId(uuid::Uuid::try_parse(owner).ok()?)),
        };
        Some(Self {
            fingerprint,
            status,
            owner,
            body: parts.next()?.to_owned(),
        })
    }
}

/// What the edge decided for one delivery.
#[derive(Debug)]
pub enum EdgeVerdict {
    /// This delivery holds the event's lock: it goes on to the inbox and
    /// leaves its answer (or lets go) when done.
    Holder(EventPermit),
    /// Another delivery of the event was answered: send the same.
    Answered(EdgeAnswer),
    /// The edge could not decide (Redis unreachable, or the first delivery
    /// did not answer within the wait): the inbox decides alone.
    PassedOn(PassedOn),
    /// The layer is off.
    Disabled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassedOn {
    StoreUnavailable,
    WaitedOut,
}

/// Proof of holding one event's lock.
#[derive(Debug)]
pub struct EventPermit {
    lock_key: String,
    answer_key: String,
    token: String,
}

#[derive(Clone)]
pub struct EventLock {
    store: Option<RedisStore>,
    key_prefix: String,
    lock_ttl: Duration,
    duplicate_wait_max: Duration,
    answer_poll: Duration,
    answer_cache: Duration,
    command_timeout: Duration,
    answer_or_lock: Arc<Script>,
    leave_answer: Arc<Script>,
    release: Arc<Script>,
}

impl EventLock {
    pub fn new(config: &Config, store: Option<RedisStore>) -> Self {
        let deposits = &config.deposits;
        Self {
            store: store.filter(|_| deposits.event_lock_enabled),
            key_prefix: config.redis.key_prefix.clone(),
            lock_ttl: deposits.event_lock_ttl,
            duplicate_wait_max: deposits.duplicate_wait_max,
            answer_poll: deposits.answer_poll,
            answer_cache: deposits.answer_cache,
            command_timeout: config.redis.command_timeout,
            answer_or_lock: Arc::new(Script::new(ANSWER_OR_LOCK)),
            leave_answer: Arc::new(Script::new(LEAVE_ANSWER)),
            release: Arc::new(Script::new(crate::redis_store::RELEASE_IF_OWNER)),
        }
    }

    /// The lock's and the answer's keys for one event of `source`; the
    /// event is the hash tag. Event ids are `[A-Za-z0-9_.:-]`, so they
    /// cannot break out of the tag.
    fn keys(&self, source: &str, event_id: &str) -> (String, String) {
        let tag = format!("{}event:{{{source}:{event_id}}}", self.key_prefix);
        (format!("{tag}:lock"), format!("{tag}:answer"))
    }

    /// Layer 1 for one delivery: hold the lock, take the answer another
    /// delivery left, or wait (bounded) for one.
    #[tracing::instrument(
        name = "defense.edge_lock",
        skip_all,
        fields(defense.layer = "edge_lock", defense.outcome = tracing::field::Empty)
    )]
    pub async fn pass(&self, source: &str, event_id: &str) -> EdgeVerdict {
        let Some(store) = &self.store else {
            return EdgeVerdict::Disabled;
        };
        let (lock_key, answer_key) = self.keys(source, event_id);
        let token = random_token();
        let deadline = tokio::time::Instant::now() + self.duplicate_wait_max;
        let verdict = loop {
            match self.ask(store, &lock_key, &answer_key, &token).await {
                Err(error) => {
                    tracing::warn!(
                        error,
                        "the event lock's store is unreachable; the inbox decides alone"
                    );
                    break EdgeVerdict::PassedOn(PassedOn::StoreUnavailable);
                }
                Ok((1, _)) => {
                    break EdgeVerdict::Holder(EventPermit {
                        lock_key,
                        answer_key,
                        token,
                    });
                }
                Ok((2, answer)) => match EdgeAnswer::decode(&answer) {
                    Some(answer) => break EdgeVerdict::Answered(answer),
                    None => {
                        tracing::warn!("an answer at the edge could not be read; the inbox decides");
                        break EdgeVerdict::PassedOn(PassedOn::StoreUnavailable);
                    }
                },
                Ok(_) if tokio::time::Instant::now() + self.answer_poll > deadline => {
                    break EdgeVerdict::PassedOn(PassedOn::WaitedOut);
                }
                Ok(_) => tokio::time::sleep(self.answer_poll).await,
            }
        };
        let outcome = match &verdict {
            EdgeVerdict::Holder(_) => "accepted",
            EdgeVerdict::Answered(_) => "replayed",
            EdgeVerdict::PassedOn(PassedOn::StoreUnavailable) => "degraded",
            EdgeVerdict::PassedOn(PassedOn::WaitedOut) => "in_flight",
            EdgeVerdict::Disabled => "disabled",
        };
        tracing::Span::current().record("defense.outcome", outcome);
        verdict
    }

    async fn ask(
        &self,
        store: &RedisStore,
        lock_key: &str,
        answer_key: &str,
        token: &str,
    ) -> Result<(i64, String), String> {
        let attempt = async {
            let mut conn = store.get().await?;
            self.answer_or_lock
                .key(lock_key)
                .key(answer_key)
                .arg(token)
                .arg(self.lock_ttl.as_millis())
                .invoke_async::<(i64, String)>(&mut conn)
                .await
                .map_err(|e| e.to_string())
        };
        tokio::time::timeout(self.command_timeout, attempt)
            .await
            .unwrap_or_else(|_| Err("timed out".to_owned()))
    }

    /// Leaves a committed answer for the duplicates and lets go of the
    /// lock. Best effort: without it, duplicates go on to the inbox, which
    /// answers the same.
    pub async fn leave_answer(&self, permit: &EventPermit, answer: &EdgeAnswer) {
        let mut script = self.leave_answer.key(&permit.lock_key);
        script
            .key(&permit.answer_key)
            .arg(&permit.token)
            .arg(answer.encode())
            .arg(self.answer_cache.as_millis());
        self.as_holder(script, "leave its answer").await;
    }

    /// Lets go of the lock without an answer (nothing was committed, or
    /// what was is unknown), so that the next delivery goes to the inbox
    /// at once instead of waiting out the lock.
    pub async fn release(&self, permit: &EventPermit) {
        let mut script = self.release.key(&permit.lock_key);
        script.arg(&permit.token);
        self.as_holder(script, "release").await;
    }

    async fn as_holder(&self, script: redis::ScriptInvocation<'_>, step: &'static str) {
        let Some(store) = &self.store else {
            return;
        };
        let attempt = async {
            let mut conn = store.get().await?;
            script
                .invoke_async::<i64>(&mut conn)
                .await
                .map_err(|e| e.to_string())
        };
        match tokio::time::timeout(self.command_timeout, attempt).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::warn!(error, event_lock.step = step, "could not change an event lock"),
            Err(_elapsed) => tracing::warn!(event_lock.step = step, "changing an event lock timed out"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_reads_back_as_it_was_left() {
        let answer = EdgeAnswer {
            fingerprint: [7; 32],
            status: 422,
            owner: None,
            body: "{\"detail\":\"two\nlines\"}".to_owned(),
        };
        assert_eq!(EdgeAnswer::decode(&answer.encode()), Some(answer.clone()));
        let owned = EdgeAnswer {
            owner: Some(UserId(uuid::Uuid::now_v7())),
            ..answer
        };
        assert_eq!(EdgeAnswer::decode(&owned.encode()), Some(owned));
        assert_eq!(EdgeAnswer::decode("zz\n200\n{}"), None);
    }
}
