//! The feed's writer task: drains the queue in batches, appends each batch
//! to its users' streams, then keeps the feed within its budget
//! (`footprint`).

use std::collections::HashMap;

use tokio::sync::mpsc;

use super::drops::{DropLog, DropReason};
use super::expiry::{ExpiryMemo, stream_lifetime};
use super::footprint::Footprint;
use super::pipelines::Pipelines;
use super::{FeedEntry, Source, WriterSettings, stream_cap, stream_key};
use crate::domain::UserId;
use crate::metrics::Metrics;
use crate::redis_store::RedisStore;

/// How many queued entries the writer takes at once, at most. Larger than
/// a stream's cap, so that a burst for one stream within one interval is
/// cut to its cap before it is written (`Writer::write`), and bounded by
/// the queue (`decision_feed_queue_entries_max`), which it drains.
const WRITE_BATCH_ENTRIES_MAX: usize = 4_096;

/// The writer: drains the queue in batches, sends each batch to Redis in
/// one pipeline, then keeps the feed within its budget. Ends when every
/// sender is gone (the app stopped).
pub(super) async fn write_batches(
    mut receiver: mpsc::Receiver<(UserId, FeedEntry)>,
    store: RedisStore,
    settings: WriterSettings,
    metrics: Metrics,
    drops: std::sync::Arc<DropLog>,
) {
    let mut writer = Writer {
        retention_s: stream_lifetime(settings.feed.retention).as_secs(),
        expiry: ExpiryMemo::new(),
        footprint: Footprint::new(),
        json: Vec::new(),
        store,
        settings,
    };
    let mut batch = Vec::new();
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
                writer
                    .footprint
                    .keep_within_budget(&writer.store, &writer.settings, added, &metrics)
                    .await;
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
    footprint: Footprint,
    /// One entry's JSON, written here and copied into the pipeline; kept
    /// between entries so that each does not allocate its own.
    json: Vec<u8>,
}

impl Writer {
    /// Appends the batch to its streams; returns how many entries each
    /// stream got. A stream keeps only its last `stream_cap` entries, so of
    /// a batch holding more than that for one stream (one user's burst,
    /// most of it refused at the edge) only the last `stream_cap` are
    /// written: `MAXLEN` would trim the older ones in the same pipeline,
    /// and writing them cost Redis and this writer as much as the burst.
    async fn write(
        &mut self,
        batch: &[(UserId, FeedEntry)],
    ) -> Result<HashMap<(UserId, Source), u64>, String> {
        let mut streams: HashMap<(UserId, Source), BatchStream> = HashMap::with_capacity(batch.len());
        for (user, entry) in batch {
            streams
                .entry((*user, Source::of(entry)))
                .or_insert_with(|| BatchStream::new(&self.settings, *user, Source::of(entry)))
                .queued += 1;
        }
        let mut pipes = Pipelines::new(self.store.is_cluster());
        for (user, entry) in batch {
            let Some(stream) = streams.get_mut(&(*user, Source::of(entry))) else {
                continue;
            };
            stream.seen += 1;
            if stream.seen + stream.cap <= stream.queued {
                continue;
            }
            self.json.clear();
            if serde_json::to_writer(&mut self.json, entry).is_err() {
                continue;
            }
            pipes
                .for_key(&stream.key)
                .cmd("XADD")
                .arg(&stream.key)
                .arg("MAXLEN")
                .arg("~")
                .arg(stream.cap)
                .arg("*")
                .arg("d")
                .arg(&self.json[..])
                .ignore();
        }
        // At most one EXPIRE per stream and interval, not per entry.
        let now = std::time::Instant::now();
        for (stream, written) in &streams {
            if self.expiry.needs_refresh(*stream, now) {
                pipes
                    .for_key(&written.key)
                    .cmd("EXPIRE")
                    .arg(&written.key)
                    .arg(self.retention_s)
                    .ignore();
            }
        }
        pipes.send(&self.store).await?;
        Ok(streams
            .into_iter()
            .map(|(stream, written)| (stream, written.queued.min(written.cap)))
            .collect())
    }
}

/// One stream's share of a batch.
struct BatchStream {
    key: String,
    cap: u64,
    /// Its entries in the batch, and how many of them were looked at.
    queued: u64,
    seen: u64,
}

impl BatchStream {
    fn new(settings: &WriterSettings, user: UserId, source: Source) -> Self {
        Self {
            key: stream_key(&settings.key_prefix, user, source),
            cap: stream_cap(&settings.feed, source),
            queued: 0,
            seen: 0,
        }
    }
}
