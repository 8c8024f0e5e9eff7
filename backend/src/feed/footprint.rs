//! The feed's budget: after each batch, one script counts the entries the
//! feed holds under this deployment's key prefix and names the streams to
//! remove, written least recently first; they go, and each owner's marker
//! says when.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use super::expiry::stream_lifetime;
use super::pipelines::Pipelines;
use super::{
    Source, WriterSettings, parse_stream_name, removed_key, stream_cap, stream_key, stream_name, time_delta,
};
use crate::domain::UserId;
use crate::metrics::Metrics;
use crate::redis_store::RedisStore;

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

/// The footprint's two keys. The hash tag keeps them in one slot of a
/// cluster, as the script needs.
fn footprint_keys(prefix: &str) -> [String; 2] {
    [
        format!("{prefix}{{decision-feed}}:streams"),
        format!("{prefix}{{decision-feed}}:entries"),
    ]
}

/// The feed's count of its footprint, and the removals it calls for.
pub(super) struct Footprint {
    count: redis::Script,
}

impl Footprint {
    pub(super) fn new() -> Self {
        Self {
            count: redis::Script::new(COUNT_FOOTPRINT),
        }
    }

    /// Counts what the batch added and removes the streams written least
    /// recently while the feed is past its budget. A failure here loses
    /// nothing: the next batch counts again.
    pub(super) async fn keep_within_budget(
        &self,
        store: &RedisStore,
        settings: &WriterSettings,
        added: HashMap<(UserId, Source), u64>,
        metrics: &Metrics,
    ) {
        let now = Utc::now();
        let invocation = self.count_invocation(settings, &added, now);
        let removed = async {
            let mut conn = store.get().await?;
            let (total, removed) = invocation
                .invoke_async::<(i64, Vec<String>)>(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            metrics.feed_entries.set(total);
            remove_streams(store, settings, &removed, now).await?;
            Ok::<_, String>(removed.len())
        };
        match tokio::time::timeout(settings.command_timeout, removed).await {
            Ok(Ok(0)) => {}
            Ok(Ok(streams)) => {
                metrics.feed_streams_removed.inc_by(streams as u64);
                tracing::info!(
                    streams,
                    budget_entries = settings.feed.entries_max,
                    "the decision feed reached its budget; the streams written least recently were removed"
                );
            }
            Ok(Err(error)) => tracing::warn!(error, "the decision feed could not count its footprint"),
            Err(_) => tracing::warn!("the decision feed's count of its footprint timed out"),
        }
    }

    /// The count of the batch's streams (`COUNT_FOOTPRINT`), as of `now`.
    fn count_invocation(
        &self,
        settings: &WriterSettings,
        added: &HashMap<(UserId, Source), u64>,
        now: DateTime<Utc>,
    ) -> redis::ScriptInvocation<'_> {
        let lifetime = stream_lifetime(settings.feed.retention);
        let surely_expired = now - time_delta(lifetime);
        let [streams_key, entries_key] = footprint_keys(&settings.key_prefix);
        let mut invocation = self.count.prepare_invoke();
        invocation
            .key(streams_key)
            .key(entries_key)
            .arg(now.timestamp_millis())
            .arg(surely_expired.timestamp_millis())
            .arg(settings.feed.entries_max)
            .arg(EXPIRED_FORGOTTEN_PER_BATCH_MAX)
            .arg(lifetime.as_secs());
        for ((user, source), entries) in added {
            invocation
                .arg(stream_name(*user, *source))
                .arg(*entries)
                .arg(stream_cap(&settings.feed, *source));
        }
        invocation
    }
}

/// Deletes the streams the count named, and marks on each owner's marker
/// when their stream went.
async fn remove_streams(
    store: &RedisStore,
    settings: &WriterSettings,
    removed: &[String],
    now: DateTime<Utc>,
) -> Result<(), String> {
    let prefix = &settings.key_prefix;
    let marker_lifetime_s = stream_lifetime(settings.feed.retention).as_secs();
    let mut pipes = Pipelines::new(store.is_cluster());
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
            .arg(marker_lifetime_s)
            .ignore();
    }
    pipes.send(store).await
}
