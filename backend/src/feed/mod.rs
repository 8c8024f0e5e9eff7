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
//! A write never sends a stream more entries than its cap: of one user's
//! burst (a client hammering a window the cooldown holds), only the last
//! cap's worth in each write reaches Redis, since the cap would trim the
//! rest at once. So a storm of refusals costs Redis a bounded number of
//! appends per user and interval, not one per refusal.
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

mod drops;
mod expiry;
mod footprint;
mod pipelines;
pub mod stream_slots;
#[cfg(test)]
mod tests;
mod writer;

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::decision::{Layer, Outcome};
use crate::domain::UserId;
use crate::metrics::Metrics;
use crate::redis_store::{RedisStore, StreamClient, StreamConnection};
use drops::DropLog;
pub use drops::{DropReason, Drops};
use writer::write_batches;

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

/// How many entries a stream keeps at most (`XADD … MAXLEN ~`).
fn stream_cap(feed: &crate::settings::Feed, source: Source) -> u64 {
    match source {
        Source::Real => feed.entries_per_user_max,
        Source::Lab => feed.lab_entries_per_user_max,
    }
}

/// A stream's name: its user, and `lab` for the race lab's. Its key is the
/// name under the prefix; the footprint's keys list it by name.
fn stream_name(user: UserId, source: Source) -> String {
    stream_name_after(&[], user, source)
}

/// The parts of `before`, then the stream's name: joined rather than
/// formatted, since the writer names every stream it writes to, every
/// batch.
fn stream_name_after(before: &[&str], user: UserId, source: Source) -> String {
    let mut buffer = [0; uuid::fmt::Hyphenated::LENGTH];
    let user = user.written_in(&mut buffer);
    let suffix = match source {
        Source::Real => "",
        Source::Lab => ":lab",
    };
    let length = before.iter().map(|part| part.len()).sum::<usize>() + user.len() + suffix.len();
    let mut name = String::with_capacity(length);
    before.iter().for_each(|part| name.push_str(part));
    name.push_str(user);
    name.push_str(suffix);
    name
}

/// The stream a name names, if it names one.
fn parse_stream_name(name: &str) -> Option<(UserId, Source)> {
    let (user, source) = match name.strip_suffix(":lab") {
        Some(user) => (user, Source::Lab),
        None => (name, Source::Real),
    };
    Some((UserId(Uuid::try_parse(user).ok()?), source))
}

/// When each of a user's streams was last removed to keep the feed within
/// its budget, a hash of `real` and `lab` to a time in ms.
fn removed_key(prefix: &str, user: UserId) -> String {
    format!("{prefix}decisions:{user}:removed")
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
    stream_name_after(&[prefix, "decisions:"], user, source)
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
