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
//! background task writes what is queued every `decision_feed_write_interval_ms`,
//! so that no request wakes it. A full queue or a Redis error
//! drops entries and counts them (`wallet_decision_feed_dropped_total`).
//!
//! **The feed can never fill Redis, and no one's burst silences anyone
//! else's feed.** Redis runs with `noeviction`, so a full Redis would refuse
//! the cooldown's `SET NX` too, and under `fail_open` switch the first layer
//! off for everyone. So the feed budgets its own footprint, not Redis's
//! memory, which other tenants share: after each batch, one script counts the
//! entries it holds under this deployment's key prefix (each stream at most its
//! cap) and, past `decision_feed_entries_max`, removes whole streams, written
//! least recently first. New decisions are always written; what goes is the
//! oldest, and its owner's feed page says when and why.

pub mod stream_slots;

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

    /// As the API's `source` parameter and the removal marker's fields
    /// spell it.
    fn as_str(self) -> &'static str {
        match self {
            Source::Real => "real",
            Source::Lab => "lab",
        }
    }

    fn named(name: &str) -> Option<Self> {
        [Source::Real, Source::Lab]
            .into_iter()
            .find(|source| source.as_str() == name)
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
    drops: std::sync::Arc<DropLog>,
    drop_notice: Duration,
}

/// What the writer task needs: the feed's section, and where and how
/// long to talk to Redis.
struct WriterSettings {
    feed: crate::settings::Feed,
    key_prefix: String,
    command_timeout: Duration,
}

/// Counts a batch against the feed's budget and picks the streams to
/// remove, atomically, so that writers on every instance share one count.
///
/// KEYS[1]: the feed's streams by last write, a sorted set. KEYS[2]: the
/// entries each stream holds (at most its cap), and under `total` their sum.
/// ARGV: now in ms; the last write before which a stream has surely expired,
/// in ms; the budget; how many expired streams to forget at most; the two
/// keys' lifetime in s; then, per stream written, its name, the entries
/// added and its cap. Returns the total, then the names of the streams to
/// remove, least recently written first.
const COUNT_FOOTPRINT: &str = r"
local streams, entries = KEYS[1], KEYS[2]
local total = tonumber(redis.call('HGET', entries, 'total') or '0')
local function forget(name)
  total = total - tonumber(redis.call('HGET', entries, name) or '0')
  redis.call('HDEL', entries, name)
  redis.call('ZREM', streams, name)
end
for i = 6, #ARGV, 3 do
  local name = ARGV[i]
  local before = tonumber(redis.call('HGET', entries, name) or '0')
  local after = math.min(before + tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]))
  redis.call('HSET', entries, name, after)
  redis.call('ZADD', streams, ARGV[1], name)
  total = total + after - before
end
for _, name in ipairs(redis.call('ZRANGEBYSCORE', streams, '-inf', '(' .. ARGV[2], 'LIMIT', 0, ARGV[4])) do
  forget(name)
end
local removed = {}
while total > tonumber(ARGV[3]) do
  local oldest = redis.call('ZRANGE', streams, 0, 0)
  if #oldest == 0 then break end
  forget(oldest[1])
  removed[#removed + 1] = oldest[1]
end
if total < 0 then total = 0 end
redis.call('HSET', entries, 'total', total)
redis.call('EXPIRE', streams, ARGV[5])
redis.call('EXPIRE', entries, ARGV[5])
return {total, removed}
";

/// Expired streams the count forgets per batch, at most, so that one batch
/// never does unbounded work after a quiet hour.
const EXPIRED_FORGOTTEN_PER_BATCH_MAX: usize = 1_000;

/// A stream's name: its user, and `lab` for the race lab's. Its key is the
/// name under the prefix; the footprint's keys list it by name.
fn stream_name(user: UserId, source: Source) -> String {
    match source {
        Source::Real => user.to_string(),
        Source::Lab => format!("{user}:lab"),
    }
}

fn parse_stream_name(name: &str) -> Option<(UserId, Source)> {
    let (user, source) = match name.strip_suffix(":lab") {
        Some(user) => (user, Source::Lab),
        None => (name, Source::Real),
    };
    Some((UserId(Uuid::try_parse(user).ok()?), source))
}

/// The footprint's two keys. The hash tag keeps them in one slot of a
/// cluster, as the script needs.
fn footprint_keys(prefix: &str) -> [String; 2] {
    [
        format!("{prefix}{{decision-feed}}:streams"),
        format!("{prefix}{{decision-feed}}:entries"),
    ]
}

/// When each of a user's streams was last removed to keep the feed within
/// its budget, a hash of `real` and `lab` to a time in ms.
fn removed_key(prefix: &str, user: UserId) -> String {
    format!("{prefix}decisions:{user}:removed")
}

/// Why this server dropped entries instead of writing them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Decisions came faster than the writer could send them.
    QueueFull,
    /// Redis failed or did not answer in time.
    RedisFailed,
}

/// Entries this server dropped for one reason, recently.
#[derive(Debug, Clone, PartialEq)]
pub struct Drops {
    pub reason: DropReason,
    pub entries: u64,
    pub first: DateTime<Utc>,
    pub last: DateTime<Utc>,
}

/// This server's recent drops, one record per reason, for the feed page.
#[derive(Default)]
struct DropLog {
    by_reason: std::sync::Mutex<Vec<Drops>>,
}

impl DropLog {
    /// Adds `entries` to the reason's record, or starts a new one when the
    /// last is older than `notice`.
    fn record(&self, reason: DropReason, entries: u64, notice: Duration) {
        let now = Utc::now();
        let mut by_reason = self
            .by_reason
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match by_reason.iter_mut().find(|drops| drops.reason == reason) {
            Some(drops) if now - drops.last <= time_delta(notice) => {
                drops.entries += entries;
                drops.last = now;
            }
            Some(drops) => {
                *drops = Drops {
                    reason,
                    entries,
                    first: now,
                    last: now,
                };
            }
            None => by_reason.push(Drops {
                reason,
                entries,
                first: now,
                last: now,
            }),
        }
    }

    fn recent(&self, notice: Duration) -> Vec<Drops> {
        let now = Utc::now();
        let by_reason = self
            .by_reason
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        by_reason
            .iter()
            .filter(|drops| now - drops.last <= time_delta(notice))
            .cloned()
            .collect()
    }
}

fn time_delta(span: Duration) -> chrono::TimeDelta {
    chrono::TimeDelta::from_std(span).unwrap_or(chrono::TimeDelta::MAX)
}

/// What a user's feed page says is missing, and why.
#[derive(Debug, Default)]
pub struct Gaps {
    /// The user's streams removed to keep the feed within its budget, and
    /// when: entries before that time are gone.
    pub removed: Vec<(Source, DateTime<Utc>)>,
    /// Entries this server dropped lately, anyone's.
    pub dropped: Vec<Drops>,
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
        let drops = std::sync::Arc::new(DropLog::default());
        let queue = store.clone().map(|store| {
            let (sender, receiver) = mpsc::channel(feed.queue_entries_max);
            let settings = WriterSettings {
                feed: feed.clone(),
                key_prefix: redis.key_prefix.clone(),
                command_timeout: redis.command_timeout,
            };
            tokio::spawn(write_batches(
                receiver,
                store,
                settings,
                metrics.clone(),
                drops.clone(),
            ));
            sender
        });
        Self {
            queue,
            store,
            client,
            key_prefix: redis.key_prefix.clone(),
            command_timeout: redis.command_timeout,
            metrics,
            drops,
            drop_notice: feed.drop_notice,
        }
    }

    /// Queues an entry without waiting. Never fails the caller.
    pub fn publish(&self, user: UserId, entry: FeedEntry) {
        let Some(queue) = &self.queue else { return };
        if queue.try_send((user, entry)).is_err() {
            self.metrics.feed_dropped.inc();
            self.drops.record(DropReason::QueueFull, 1, self.drop_notice);
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

impl DecisionFeed {
    /// What is missing from `user`'s feed, and why: their streams removed
    /// to keep the feed within its budget, and what this server dropped
    /// lately. If Redis cannot say, only the latter.
    pub async fn gaps(&self, user: UserId) -> Gaps {
        let mut gaps = Gaps {
            removed: Vec::new(),
            dropped: self.drops.recent(self.drop_notice),
        };
        let Some(store) = &self.store else { return gaps };
        let read = async {
            let mut conn = store.get().await?;
            redis::cmd("HGETALL")
                .arg(removed_key(&self.key_prefix, user))
                .query_async::<Vec<(String, i64)>>(&mut conn)
                .await
                .map_err(|e| e.to_string())
        };
        if let Ok(Ok(fields)) = tokio::time::timeout(self.command_timeout, read).await {
            for (source, at_ms) in fields {
                if let (Some(source), Some(at)) =
                    (Source::named(&source), DateTime::from_timestamp_millis(at_ms))
                {
                    gaps.removed.push((source, at));
                }
            }
            gaps.removed.sort_by_key(|(source, _)| *source == Source::Lab);
        }
        gaps
    }
}

pub fn stream_key(prefix: &str, user: UserId, source: Source) -> String {
    format!("{prefix}decisions:{}", stream_name(user, source))
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

/// The writer: drains the queue in batches, sends each batch to Redis in
/// one pipeline, then keeps the feed within its budget. Ends when every
/// sender is gone (the app stopped).
async fn write_batches(
    mut receiver: mpsc::Receiver<(UserId, FeedEntry)>,
    store: RedisStore,
    settings: WriterSettings,
    metrics: Metrics,
    drops: std::sync::Arc<DropLog>,
) {
    let mut writer = Writer {
        retention_s: (settings.feed.retention + 2 * EXPIRY_REFRESH_INTERVAL).as_secs(),
        expiry: ExpiryMemo::new(),
        count_footprint: redis::Script::new(COUNT_FOOTPRINT),
        store,
        settings,
    };
    let mut batch = Vec::with_capacity(WRITE_BATCH_ENTRIES_MAX);
    // A tick, not a wake-up per entry: a request's `try_send` wakes a task
    // parked in `recv`, which under load was one more thread wake-up for
    // every transfer. A task asleep on its timer is not woken by senders.
    let mut ticks = tokio::time::interval(writer.settings.feed.write_interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut backlog = false;
    while let Some(()) = next_batch(&mut receiver, &mut batch, &mut ticks, backlog).await {
        backlog = batch.len() == WRITE_BATCH_ENTRIES_MAX;
        let timeout = writer.settings.command_timeout;
        let failure = match tokio::time::timeout(timeout, writer.write(&batch)).await {
            Ok(Ok(added)) => {
                writer.keep_within_budget(added, &metrics).await;
                None
            }
            Ok(Err(error)) => Some(error),
            Err(_) => Some("timed out".to_owned()),
        };
        if let Some(error) = failure {
            metrics.feed_dropped.inc_by(batch.len() as u64);
            drops.record(
                DropReason::RedisFailed,
                batch.len() as u64,
                writer.settings.feed.drop_notice,
            );
            tracing::warn!(
                error,
                entries = batch.len(),
                "decision feed write failed; entries dropped"
            );
        }
        batch.clear();
    }
}

/// Takes what is queued, at most a batch: at once after a full batch (a
/// backlog), otherwise at the next tick; when nothing was queued at a tick,
/// waits for an entry and gathers for one more interval. `None` once every
/// sender is gone and the queue is empty.
async fn next_batch(
    receiver: &mut mpsc::Receiver<(UserId, FeedEntry)>,
    batch: &mut Vec<(UserId, FeedEntry)>,
    ticks: &mut tokio::time::Interval,
    mut backlog: bool,
) -> Option<()> {
    loop {
        if !backlog {
            ticks.tick().await;
        }
        while batch.len() < WRITE_BATCH_ENTRIES_MAX {
            match receiver.try_recv() {
                Ok(entry) => batch.push(entry),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) if batch.is_empty() => return None,
                Err(mpsc::error::TryRecvError::Disconnected) => break,
            }
        }
        if !batch.is_empty() {
            return Some(());
        }
        // Idle: park until an entry comes, rather than tick for nothing;
        // then gather for one interval.
        batch.push(receiver.recv().await?);
        ticks.reset();
        backlog = false;
    }
}

struct Writer {
    store: RedisStore,
    settings: WriterSettings,
    /// Each stream's (and the footprint keys') lifetime after a write.
    retention_s: u64,
    expiry: ExpiryMemo,
    count_footprint: redis::Script,
}

impl Writer {
    /// Appends the batch to its streams; returns how many entries each
    /// stream got.
    async fn write(
        &mut self,
        batch: &[(UserId, FeedEntry)],
    ) -> Result<std::collections::HashMap<(UserId, Source), u64>, String> {
        let mut pipes = Pipelines::new(self.store.is_cluster());
        let mut added: std::collections::HashMap<(UserId, Source), u64> = std::collections::HashMap::new();
        for (user, entry) in batch {
            let stream = (*user, Source::of(entry));
            let key = stream_key(&self.settings.key_prefix, *user, stream.1);
            let cap = self.cap(stream.1);
            let json = serde_json::to_string(entry).unwrap_or_default();
            pipes
                .for_key(&key)
                .cmd("XADD")
                .arg(&key)
                .arg("MAXLEN")
                .arg("~")
                .arg(cap)
                .arg("*")
                .arg("d")
                .arg(json)
                .ignore();
            *added.entry(stream).or_default() += 1;
        }
        // At most one EXPIRE per stream and interval, not per entry.
        let now = std::time::Instant::now();
        for stream in added.keys() {
            if self.expiry.needs_refresh(*stream, now) {
                let key = stream_key(&self.settings.key_prefix, stream.0, stream.1);
                pipes
                    .for_key(&key)
                    .cmd("EXPIRE")
                    .arg(&key)
                    .arg(self.retention_s)
                    .ignore();
            }
        }
        pipes.send(&self.store).await?;
        Ok(added)
    }

    fn cap(&self, source: Source) -> u64 {
        match source {
            Source::Real => self.settings.feed.entries_per_user_max,
            Source::Lab => self.settings.feed.lab_entries_per_user_max,
        }
    }

    /// Counts what the batch added and removes the streams written least
    /// recently while the feed is past its budget. A failure here loses
    /// nothing: the next batch counts again.
    async fn keep_within_budget(
        &self,
        added: std::collections::HashMap<(UserId, Source), u64>,
        metrics: &Metrics,
    ) {
        let prefix = &self.settings.key_prefix;
        let now = Utc::now();
        let surely_expired = now - time_delta(self.settings.feed.retention + 2 * EXPIRY_REFRESH_INTERVAL);
        let [streams_key, entries_key] = footprint_keys(prefix);
        let mut invocation = self.count_footprint.prepare_invoke();
        invocation
            .key(streams_key)
            .key(entries_key)
            .arg(now.timestamp_millis())
            .arg(surely_expired.timestamp_millis())
            .arg(self.settings.feed.entries_max)
            .arg(EXPIRED_FORGOTTEN_PER_BATCH_MAX)
            .arg(self.retention_s);
        for ((user, source), entries) in &added {
            invocation
                .arg(stream_name(*user, *source))
                .arg(*entries)
                .arg(self.cap(*source));
        }
        let removed = async {
            let mut conn = self.store.get().await?;
            let (total, removed) = invocation
                .invoke_async::<(i64, Vec<String>)>(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            metrics.feed_entries.set(total);
            let mut pipes = Pipelines::new(self.store.is_cluster());
            for (user, source) in removed.iter().filter_map(|name| parse_stream_name(name)) {
                let stream = stream_key(prefix, user, source);
                pipes.for_key(&stream).cmd("DEL").arg(&stream).ignore();
                let marker = removed_key(prefix, user);
                pipes
                    .for_key(&marker)
                    .cmd("HSET")
                    .arg(&marker)
                    .arg(source.as_str())
                    .arg(now.timestamp_millis())
                    .ignore()
                    .cmd("EXPIRE")
                    .arg(&marker)
                    .arg(self.retention_s)
                    .ignore();
            }
            pipes.send(&self.store).await?;
            Ok::<_, String>(removed.len())
        };
        match tokio::time::timeout(self.settings.command_timeout, removed).await {
            Ok(Ok(0)) => {}
            Ok(Ok(streams)) => {
                metrics.feed_streams_removed.inc_by(streams as u64);
                tracing::info!(
                    streams,
                    budget_entries = self.settings.feed.entries_max,
                    "the decision feed reached its budget; the streams written least recently were removed"
                );
            }
            Ok(Err(error)) => tracing::warn!(error, "the decision feed could not count its footprint"),
            Err(_) => tracing::warn!("the decision feed's count of its footprint timed out"),
        }
    }
}

/// Commands on several keys: one pipeline on a single server; on a
/// cluster, one per key, so that each pipeline's keys live in one slot.
struct Pipelines {
    cluster: bool,
    pipes: Vec<redis::Pipeline>,
    by_key: std::collections::HashMap<String, usize>,
}

impl Pipelines {
    fn new(cluster: bool) -> Self {
        Self {
            cluster,
            pipes: Vec::new(),
            by_key: std::collections::HashMap::new(),
        }
    }

    fn for_key(&mut self, key: &str) -> &mut redis::Pipeline {
        let index = if self.cluster {
            match self.by_key.get(key) {
                Some(index) => *index,
                None => {
                    self.pipes.push(redis::pipe());
                    self.by_key.insert(key.to_owned(), self.pipes.len() - 1);
                    self.pipes.len() - 1
                }
            }
        } else {
            if self.pipes.is_empty() {
                self.pipes.push(redis::pipe());
            }
            0
        };
        &mut self.pipes[index]
    }

    async fn send(&self, store: &RedisStore) -> Result<(), String> {
        if self.pipes.is_empty() {
            return Ok(());
        }
        let mut conn = store.get().await?;
        for pipe in &self.pipes {
            pipe.query_async::<()>(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{EXPIRY_REFRESH_INTERVAL, ExpiryMemo, Source, is_stream_id, parse_stream_name, stream_name};
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
    fn a_stream_name_is_read_back_as_its_stream() {
        let user = UserId(uuid::Uuid::new_v4());
        for source in [Source::Real, Source::Lab] {
            assert_eq!(
                parse_stream_name(&stream_name(user, source)),
                Some((user, source))
            );
        }
        assert_eq!(parse_stream_name("total"), None);
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
