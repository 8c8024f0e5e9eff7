//! The census of the live consumers: every consumer notes, between
//! batches, that it is alive and how many partitions its instance holds,
//! and reads the same of the others. From it each one computes its fair
//! share of the partitions, which the partition's lease keeps to.
//!
//! A consumer counts as alive for the claim time after it last noted it:
//! one that dies or stalls stops counting then, and the others take its
//! share.

use std::collections::HashMap;
use std::time::Duration;

use chrono::Utc;

use super::Streams;
use crate::defense::partition_lease::FairShare;
use crate::redis_store::StreamConnection;

/// One consumer's view of the census.
pub struct Census {
    /// The sorted set of live consumers, each scored with when it stops
    /// counting as alive.
    consumers: String,
    /// How many partitions each live consumer holds; the same hash tag as
    /// `consumers`, so one pipeline reads and writes both.
    consumers_held: String,
    /// This consumer's name.
    consumer: String,
    partitions: u16,
    /// How long a consumer counts as alive: `commands_claim_idle_ms`.
    alive_for: Duration,
}

impl Census {
    pub fn new(streams: &Streams, consumer: String, alive_for: Duration) -> Self {
        Self {
            consumers: streams.consumers(),
            consumers_held: streams.consumers_held(),
            consumer,
            partitions: streams.partitions(),
            alive_for,
        }
    }

    /// Notes that this consumer is alive and that its instance holds
    /// `held_here` partitions, reads the same of the others (those that
    /// noted it within the claim time), and forgets those gone.
    pub async fn take(
        &self,
        connection: &mut StreamConnection,
        held_here: usize,
    ) -> Result<FairShare, String> {
        let now_ms = Utc::now().timestamp_millis();
        let alive_ms = i64::try_from(self.alive_for.as_millis()).unwrap_or(i64::MAX);
        let (live, holdings): (Vec<String>, HashMap<String, usize>) = redis::pipe()
            .cmd("ZADD")
            .arg(&self.consumers)
            .arg(now_ms.saturating_add(alive_ms))
            .arg(&self.consumer)
            .ignore()
            .cmd("ZREMRANGEBYSCORE")
            .arg(&self.consumers)
            .arg("-inf")
            .arg(now_ms)
            .ignore()
            .cmd("HSET")
            .arg(&self.consumers_held)
            .arg(&self.consumer)
            .arg(held_here)
            .ignore()
            .cmd("ZRANGE")
            .arg(&self.consumers)
            .arg(0)
            .arg(-1)
            .cmd("HGETALL")
            .arg(&self.consumers_held)
            .query_async(connection)
            .await
            .map_err(|e| e.to_string())?;
        let gone: Vec<&String> = holdings.keys().filter(|name| !live.contains(name)).collect();
        if !gone.is_empty() {
            redis::cmd("HDEL")
                .arg(&self.consumers_held)
                .arg(&gone)
                .query_async::<()>(connection)
                .await
                .map_err(|e| e.to_string())?;
        }
        let share = usize::from(self.partitions).div_ceil(live.len().max(1));
        let another_below_share = live
            .iter()
            .filter(|name| **name != self.consumer)
            .any(|name| holdings.get(name).copied().unwrap_or(0) < share);
        Ok(FairShare {
            share,
            another_below_share,
        })
    }
}
