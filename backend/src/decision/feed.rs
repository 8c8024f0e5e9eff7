//! The live decision feed, shared by every instance.
//!
//! Each user's decisions go to Redis streams of their own: their real
//! transfers' to `{prefix}decisions:{user_id}`, capped at
//! `decision_feed_entries_per_user_max` entries (`XADD … MAXLEN ~`), and
//! their race-lab runs' to `{prefix}decisions:{user_id}:lab`, capped at
//! `decision_feed_lab_entries_per_user_max`, so that a lab burst never
//! pushes a real decision out. Each stream expires `decision_feed_retention_hours`
//! (up to two minutes more) after the last write. The expiry is refreshed
//! at most once per stream per minute, not with every entry: under steady
//! load a user has one entry per batch, so a per-batch `EXPIRE` was one
//! more Redis command for every transfer. Why Redis and not a table: the
//! feed is high-volume, disposable telemetry, and PostgreSQL is the resource the transfers
//! compete for; a capped stream bounds its own size, and `XREAD BLOCK`
//! pushes new entries to every instance's readers with no polling. Losing
//! the feed (Redis restart) loses no money.
//!
//! Writing never slows or breaks a transfer: `publish` only puts the entry
//! on a bounded in-process queue (`decision_feed_queue_entries_max`); a
//! background task writes batches to Redis. A full queue or a Redis error
//! drops entries and counts them (`wallet_decision_feed_dropped_total`).
//!
//! **The feed can never fill Redis.** Redis runs with `noeviction`, so a
//! full Redis would refuse the cooldown's `SET NX` too, and under
//! `fail_open` switch the first layer off for everyone. Besides each
//! stream's cap and expiry, the writer reads Redis's `used_memory` at most
//! every `decision_feed_memory_check_ms`, and while it is at or above
//! `decision_feed_redis_memory_bytes_max` it drops entries instead of
//! writing them (counted, and the `wallet_decision_feed_over_budget` gauge
//! is 1). Set the budget below `maxmemory` with room for the cooldown's
//! keys and for what the writer can add between two checks.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::decision::{Layer, Outcome};
use crate::domain::UserId;
use crate::metrics::Metrics;
use crate::redis_store::{RedisStore, StreamClient, StreamConnection};

/// How many entries the writer sends to Redis in one pipeline.
const WRITE_BATCH_ENTRIES_MAX: usize = 256;

/// How often, at most, the writer refreshes one stream's expiry.
const EXPIRY_REFRESH_INTERVAL: Duration = Duration::from_secs(60);

/// Streams whose expiry the writer remembers refreshing in one interval;
/// beyond this, streams are refreshed with every batch again, so the memo
/// stays bounded whatever the number of users.
const EXPIRY_MEMO_STREAMS_MAX: usize = 100_000;

/// Which streams had their expiry refreshed recently. Two generations, each
/// one interval long: a stream refreshed in either is skipped, so each is
/// refreshed at most once per interval and at least once every two while
/// it is written. The TTL set is the retention plus two intervals, so a
/// stream never expires sooner than the retention after its last entry.
struct ExpiryMemo {
    current: std::collections::HashSet<(UserId, Source)>,
    previous: std::collections::HashSet<(UserId, Source)>,
    generation_started: std::time::Instant,
}

impl ExpiryMemo {
    fn new() -> Self {
        Self {
            current: std::collections::HashSet::new(),
            previous: std::collections::HashSet::new(),
            generation_started: std::time::Instant::now(),
        }
    }

    /// True when `user`'s stream needs its expiry refreshed now; remembers
    /// that it was.
    fn needs_refresh(&mut self, stream: (UserId, Source), now: std::time::Instant) -> bool {
        if now.duration_since(self.generation_started) >= EXPIRY_REFRESH_INTERVAL {
            self.previous = std::mem::take(&mut self.current);
            self.generation_started = now;
        }
        if self.current.contains(&stream) || self.previous.contains(&stream) {
            return false;
        }
        if self.current.len() < EXPIRY_MEMO_STREAMS_MAX {
            self.current.insert(stream);
        }
        true
    }
}

/// One decision, as the feed and its readers see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FeedEntry {
    pub time: DateTime<Utc>,
    pub instance_id: String,
    pub request_id: String,
    pub trace_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<Uuid>,
    pub layer: Layer,
    pub outcome: Outcome,
    pub status: u16,
    pub latency_ms: f64,
    /// What was asked, when the request parsed that far.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amount_minor: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to_wallet_id: Option<Uuid>,
    /// The slug of a refusal's problem type: `/problems/{slug}` explains it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem_type: Option<String>,
    /// A request a race-lab run sent (lab money); kept in the lab stream.
    #[serde(default)]
    pub lab: bool,
    /// How the money moved: a client's transfer (left out when so), a
    /// provider's deposit, a broker's command, or a payout.
    #[serde(default, skip_serializing_if = "EntryPoint::is_transfer")]
    pub entry_point: EntryPoint,
}

/// The way into the service a decision was made at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EntryPoint {
    #[default]
    Transfer,
    Deposit,
    /// A broker's transfer command.
    Command,
    /// A payout: the request that held the money, then the gateway's
    /// answer the dispatcher recorded.
    Payout,
}

impl EntryPoint {
    fn is_transfer(&self) -> bool {
        *self == EntryPoint::Transfer
    }
}

/// Which of a user's two streams: real transfers, or race-lab runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    #[default]
    Real,
    Lab,
}

impl Source {
    fn of(entry: &FeedEntry) -> Self {
        if entry.lab { Source::Lab } else { Source::Real }
    }
}

/// An entry with its position in the stream (the cursor for `after`).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct StoredEntry {
    pub id: String,
    #[serde(flatten)]
    pub entry: FeedEntry,
}

#[derive(Clone)]
pub struct DecisionFeed {
    /// `None` when the feed is off (no Redis configured).
    queue: Option<mpsc::Sender<(UserId, FeedEntry)>>,
    store: Option<RedisStore>,
    /// For the live streams, each of which needs a connection of its own
    /// (a blocking `XREAD` would stall the shared one).
    client: Option<StreamClient>,
    key_prefix: String,
    command_timeout: Duration,
    metrics: Metrics,
}

/// What the writer task needs: the feed's section, and where and how
/// long to talk to Redis.
struct WriterSettings {
    feed: crate::settings::Feed,
    key_prefix: String,
    command_timeout: Duration,
}

/// The feed's share of Redis memory, checked now and then.
struct MemoryBudget {
    bytes_max: u64,
    check_every: Duration,
    last_checked: Option<std::time::Instant>,
    over: bool,
}

impl MemoryBudget {
    /// Whether Redis is at or above the budget, asking it when the last
    /// answer is older than the check interval. If Redis cannot say, the
    /// last answer stands (the write itself will then fail and be counted).
    async fn is_exceeded(&mut self, store: &RedisStore, timeout: Duration, metrics: &Metrics) -> bool {
        if self
            .last_checked
            .is_some_and(|at| at.elapsed() < self.check_every)
        {
            return self.over;
        }
        self.last_checked = Some(std::time::Instant::now());
        let info = async {
            let mut conn = store.get().await?;
            redis::cmd("INFO")
                .arg("memory")
                .query_async::<redis::Value>(&mut conn)
                .await
                .map_err(|e| e.to_string())
        };
        if let Ok(Ok(reply)) = tokio::time::timeout(timeout, info).await
            && let Some(used) = used_memory(&reply)
        {
            let over = used >= self.bytes_max;
            if over && !self.over {
                tracing::warn!(
                    used_bytes = used,
                    budget_bytes = self.bytes_max,
                    "Redis memory is at the decision feed's budget; feed entries are dropped until it is not"
                );
            }
            self.over = over;
            metrics.feed_over_budget.set(i64::from(over));
        }
        self.over
    }
}

/// The largest `used_memory` in an `INFO memory` reply: one server's text,
/// or, from a cluster, one text per node.
fn used_memory(reply: &redis::Value) -> Option<u64> {
    use redis::Value;
    match reply {
        Value::BulkString(bytes) => used_memory_in(&String::from_utf8_lossy(bytes)),
        Value::VerbatimString { text, .. } | Value::SimpleString(text) => used_memory_in(text),
        Value::Array(items) | Value::Set(items) => items.iter().filter_map(used_memory).max(),
        Value::Map(pairs) => pairs.iter().filter_map(|(_, value)| used_memory(value)).max(),
        _ => None,
    }
}

fn used_memory_in(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .and_then(|value| value.trim().parse().ok())
}

impl DecisionFeed {
    /// Starts the writer task. With no Redis the feed is off: entries
    /// are discarded and reads return nothing.
    pub fn start(
        store: Option<RedisStore>,
        client: Option<StreamClient>,
        feed: &crate::settings::Feed,
        redis: &crate::settings::Redis,
        metrics: Metrics,
    ) -> Self {
        let queue = store.clone().map(|store| {
            let (sender, receiver) = mpsc::channel(feed.queue_entries_max);
            let settings = WriterSettings {
                feed: feed.clone(),
                key_prefix: redis.key_prefix.clone(),
                command_timeout: redis.command_timeout,
            };
            tokio::spawn(write_batches(receiver, store, settings, metrics.clone()));
            sender
        });
        Self {
            queue,
            store,
            client,
            key_prefix: redis.key_prefix.clone(),
            command_timeout: redis.command_timeout,
            metrics,
        }
    }

    /// Queues an entry without waiting. Never fails the caller.
    pub fn publish(&self, user: UserId, entry: FeedEntry) {
        let Some(queue) = &self.queue else { return };
        if queue.try_send((user, entry)).is_err() {
            self.metrics.feed_dropped.inc();
        }
    }

    pub fn stream_key(&self, user: UserId, source: Source) -> String {
        stream_key(&self.key_prefix, user, source)
    }

    /// A dedicated connection for one live stream, whose replies may take
    /// up to `response_timeout` (the blocking read's wait, plus slack).
    pub async fn stream_connection(&self, response_timeout: Duration) -> Result<StreamConnection, String> {
        let client = self.client.as_ref().ok_or("the decision feed is disabled")?;
        client.connect(self.command_timeout, response_timeout).await
    }

    /// The user's entries in `source` after stream id `after` (exclusive),
    /// oldest first, at most `count`.
    pub async fn read_after(
        &self,
        user: UserId,
        source: Source,
        after: Option<&str>,
        count: usize,
    ) -> Result<Vec<StoredEntry>, String> {
        let Some(store) = &self.store else {
            return Ok(Vec::new());
        };
        let start = after.map_or_else(|| "-".to_owned(), |id| format!("({id}"));
        let read = async {
            let mut conn = store.get().await?;
            redis::cmd("XRANGE")
                .arg(self.stream_key(user, source))
                .arg(start)
                .arg("+")
                .arg("COUNT")
                .arg(count)
                .query_async::<Vec<RawEntry>>(&mut conn)
                .await
                .map_err(|e| e.to_string())
        };
        let rows = tokio::time::timeout(self.command_timeout, read)
            .await
            .map_err(|_| "timed out".to_owned())??;
        Ok(rows.into_iter().filter_map(decode).collect())
    }
}

pub fn stream_key(prefix: &str, user: UserId, source: Source) -> String {
    match source {
        Source::Real => format!("{prefix}decisions:{user}"),
        Source::Lab => format!("{prefix}decisions:{user}:lab"),
    }
}

/// Accepts stream ids only (`<ms>-<seq>`, each a number Redis can hold),
/// so a cursor cannot smuggle in another argument, and one Redis would
/// reject is refused here, as the client's mistake.
pub fn is_stream_id(id: &str) -> bool {
    let mut parts = id.split('-');
    let (Some(ms), Some(seq), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    // At most 19 digits: every such number fits Redis's 64 bits, and the
    // OpenAPI document can say it as a pattern.
    [ms, seq]
        .iter()
        .all(|part| (1..=19).contains(&part.len()) && part.bytes().all(|b| b.is_ascii_digit()))
}

/// A stream entry as Redis returns it: its id and its field-value pairs.
pub type RawEntry = (String, Vec<(String, String)>);
/// An `XREAD` reply: for each stream, its key and its new entries.
pub type XreadReply = Option<Vec<(String, Vec<RawEntry>)>>;

pub fn decode((id, fields): RawEntry) -> Option<StoredEntry> {
    let (_, json) = fields.into_iter().find(|(name, _)| name == "d")?;
    let entry = serde_json::from_str(&json).ok()?;
    Some(StoredEntry { id, entry })
}

/// The writer: drains the queue in batches and sends each batch to Redis
/// in one pipeline. Ends when every sender is gone (the app stopped).
async fn write_batches(
    mut receiver: mpsc::Receiver<(UserId, FeedEntry)>,
    store: RedisStore,
    settings: WriterSettings,
    metrics: Metrics,
) {
    let retention_s = (settings.feed.retention + 2 * EXPIRY_REFRESH_INTERVAL).as_secs();
    let mut expiry = ExpiryMemo::new();
    let mut budget = MemoryBudget {
        bytes_max: settings.feed.redis_memory_bytes_max,
        check_every: settings.feed.memory_check_interval,
        last_checked: None,
        over: false,
    };
    let mut batch = Vec::with_capacity(WRITE_BATCH_ENTRIES_MAX);
    while receiver.recv_many(&mut batch, WRITE_BATCH_ENTRIES_MAX).await > 0 {
        if budget
            .is_exceeded(&store, settings.command_timeout, &metrics)
            .await
        {
            metrics.feed_dropped.inc_by(batch.len() as u64);
            batch.clear();
            continue;
        }
        // One pipeline for the batch; on a cluster, one per stream, so
        // that each pipeline's keys live in one hash slot.
        let mut pipes: Vec<redis::Pipeline> = Vec::new();
        let mut per_stream: std::collections::HashMap<(UserId, Source), usize> =
            std::collections::HashMap::new();
        let mut expiring: std::collections::HashMap<(UserId, Source), (usize, String)> =
            std::collections::HashMap::new();
        for (user, entry) in &batch {
            let stream = (*user, Source::of(entry));
            let index = if store.is_cluster() {
                *per_stream.entry(stream).or_insert_with(|| {
                    pipes.push(redis::pipe());
                    pipes.len() - 1
                })
            } else {
                if pipes.is_empty() {
                    pipes.push(redis::pipe());
                }
                0
            };
            let key = stream_key(&settings.key_prefix, *user, stream.1);
            let cap = match stream.1 {
                Source::Real => settings.feed.entries_per_user_max,
                Source::Lab => settings.feed.lab_entries_per_user_max,
            };
            let json = serde_json::to_string(entry).unwrap_or_default();
            pipes[index]
                .cmd("XADD")
                .arg(&key)
                .arg("MAXLEN")
                .arg("~")
                .arg(cap)
                .arg("*")
                .arg("d")
                .arg(json)
                .ignore();
            expiring.insert(stream, (index, key));
        }
        // At most one EXPIRE per stream and interval, not per entry.
        let now = std::time::Instant::now();
        expiring.retain(|stream, _| expiry.needs_refresh(*stream, now));
        for (index, key) in expiring.values() {
            pipes[*index].cmd("EXPIRE").arg(key).arg(retention_s).ignore();
        }
        let write = async {
            let mut conn = store.get().await?;
            for pipe in &pipes {
                pipe.query_async::<()>(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Ok::<_, String>(())
        };
        match tokio::time::timeout(settings.command_timeout, write).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                metrics.feed_dropped.inc_by(batch.len() as u64);
                tracing::warn!(
                    error,
                    entries = batch.len(),
                    "decision feed write failed; entries dropped"
                );
            }
            Err(_) => {
                metrics.feed_dropped.inc_by(batch.len() as u64);
                tracing::warn!(
                    entries = batch.len(),
                    "decision feed write timed out; entries dropped"
                );
            }
        }
        batch.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::{EXPIRY_REFRESH_INTERVAL, ExpiryMemo, Source, is_stream_id, used_memory};
    use crate::domain::UserId;

    #[test]
    fn a_streams_expiry_is_refreshed_at_most_once_per_interval_and_at_least_once_per_two() {
        let mut memo = ExpiryMemo::new();
        let alice = (UserId(uuid::Uuid::new_v4()), Source::Real);
        let bob = (UserId(uuid::Uuid::new_v4()), Source::Real);
        let start = memo.generation_started;
        assert!(memo.needs_refresh(alice, start));
        assert!(!memo.needs_refresh(alice, start));
        assert!(memo.needs_refresh(bob, start));
        // Alice's lab stream is a stream of its own.
        assert!(memo.needs_refresh((alice.0, Source::Lab), start));
        // Within the next interval, still remembered (the previous generation).
        let next = start + EXPIRY_REFRESH_INTERVAL;
        assert!(!memo.needs_refresh(alice, next));
        // Two intervals on, refreshed again.
        let after_two = next + EXPIRY_REFRESH_INTERVAL;
        assert!(memo.needs_refresh(alice, after_two));
        assert!(!memo.needs_refresh(alice, after_two));
    }

    #[test]
    fn used_memory_is_read_from_one_server_or_a_cluster() {
        use redis::Value;
        let node = |bytes: u64| {
            Value::BulkString(
                format!("# Memory\r\nused_memory:{bytes}\r\nused_memory_human:1M\r\n").into_bytes(),
            )
        };
        assert_eq!(used_memory(&node(1_048_576)), Some(1_048_576));
        let cluster = Value::Map(vec![
            (Value::SimpleString("a:7101".into()), node(10)),
            (Value::SimpleString("b:7102".into()), node(30)),
        ]);
        assert_eq!(used_memory(&cluster), Some(30));
        assert_eq!(used_memory(&Value::Nil), None);
    }

    #[test]
    fn only_stream_ids_are_cursors() {
        assert!(is_stream_id("1700000000000-0"));
        assert!(!is_stream_id("1700000000000"));
        assert!(!is_stream_id("+"));
        assert!(!is_stream_id("1-2-3"));
        assert!(!is_stream_id("1-x"));
        assert!(!is_stream_id("+1-0"), "u64 parsing alone would take a sign");
        assert!(is_stream_id("9999999999999999999-9999999999999999999"));
        assert!(
            !is_stream_id("99999999999999999999-0"),
            "past u64: Redis rejects it"
        );
    }
}
