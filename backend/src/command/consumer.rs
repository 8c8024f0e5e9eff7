//! The stream transport of one partition: reading its entries as a member
//! of the consumer group, claiming those another consumer holds, and
//! acknowledging them.
//!
//! **Order.** A batch is this consumer's own pending entries first, oldest
//! first, then new ones. Every entry another consumer holds is claimed
//! (`XCLAIM`) before anything new is read: only the lease holder may work
//! the partition, so an entry held elsewhere belongs to a consumer that
//! lost the lease, and it still comes before the entries behind it. A read
//! that brought entries is followed by another claim: a consumer that
//! stalled may wake with a read it sent before (`XREADGROUP … BLOCK`),
//! which Redis answered with an entry older than those the holder just
//! read.
//!
//! **Acknowledged after the commit.** `XACK` (with `XDEL`: the outcome is
//! in PostgreSQL, so the stream keeps only what is still to be applied)
//! follows the transaction; a crash in between leaves the entry pending, to
//! be claimed and replayed by the inbox. The acknowledgement carries the
//! lease's renewal for the next entry in the same round trip: the stream
//! and its lease share a slot.

use std::collections::HashMap;
use std::time::Duration;

use super::{GROUP, Streams};
use crate::defense::partition_lease::{LeaseVerdict, PartitionLease};
use crate::feed::{RawEntry, XreadReply};
use crate::metrics::Metrics;
use crate::redis_store::StreamConnection;
use crate::settings::Config;

/// One entry as its partition's stream delivered it.
#[derive(Debug, Clone, Copy)]
pub struct Delivered<'a> {
    pub entry_id: &'a str,
    pub fields: &'a [(String, String)],
    /// How often it was delivered, attempts that failed included.
    pub deliveries: u64,
}

/// The entries to apply next, in order, with how often each was delivered
/// (when more than once).
#[derive(Debug, Default)]
pub struct Batch {
    pub entries: Vec<RawEntry>,
    pub deliveries: HashMap<String, u64>,
}

impl Batch {
    /// How often `entry_id` was delivered: once, unless it was pending.
    pub fn deliveries_of(&self, entry_id: &str) -> u64 {
        self.deliveries.get(entry_id).copied().unwrap_or(1)
    }
}

/// One partition's stream, as one consumer of the group reads it.
pub struct PartitionStream {
    stream: String,
    /// This consumer's name in the group.
    consumer: String,
    partition: u16,
    /// `commands_read_batch_entries_max`.
    batch_entries_max: usize,
    /// `commands_read_wait_ms`.
    read_wait: Duration,
    metrics: Metrics,
}

impl PartitionStream {
    pub fn new(
        streams: &Streams,
        partition: u16,
        consumer: String,
        config: &Config,
        metrics: Metrics,
    ) -> Self {
        Self {
            stream: streams.stream(partition),
            consumer,
            partition,
            batch_entries_max: config.commands.read_batch_entries_max,
            read_wait: config.commands.read_wait,
            metrics,
        }
    }

    /// Creates the group (and the stream) unless it exists.
    pub async fn join_the_group(&self, connection: &mut StreamConnection) -> Result<(), String> {
        let created = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.stream)
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query_async::<()>(connection)
            .await;
        match created {
            Ok(()) => Ok(()),
            Err(error) if error.code() == Some("BUSYGROUP") => Ok(()),
            Err(error) => Err(error.to_string()),
        }
    }

    /// The entries to apply next, in order; none when there is nothing to
    /// apply (or not yet).
    pub async fn next_batch(&self, connection: &mut StreamConnection) -> Result<Batch, String> {
        self.claim_entries_of_others(connection).await?;
        let pending = self.own_pending(connection).await?;
        if !pending.entries.is_empty() {
            return Ok(pending);
        }
        let entries = self.read_new(connection).await?;
        // A consumer that lost the lease may still have had a read waiting
        // (`BLOCK`), sent before it stalled: Redis gave it an entry older
        // than these after the claims above. Claimed now, it is applied
        // first: the next round takes this consumer's pending entries,
        // those just read among them, oldest first. One claimed later was
        // delivered after these, so it is newer.
        if !entries.is_empty() && self.claim_entries_of_others(connection).await? > 0 {
            return Ok(Batch::default());
        }
        Ok(Batch {
            entries,
            deliveries: HashMap::new(),
        })
    }

    /// Moves to this consumer every entry another consumer holds, however
    /// recently it was delivered: only the lease holder may work the
    /// partition, so an entry held elsewhere belongs to a consumer that lost
    /// the lease (stalled past the claim time, or dead). Claiming them all
    /// before reading anything new keeps the partition in order. Returns
    /// how many; each claim counts a delivery.
    async fn claim_entries_of_others(&self, connection: &mut StreamConnection) -> Result<u64, String> {
        let batch = self.batch_entries_max;
        let mut start = "-".to_owned();
        let mut claimed = 0u64;
        loop {
            let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
                .arg(&self.stream)
                .arg(GROUP)
                .arg(&start)
                .arg("+")
                .arg(batch)
                .query_async(connection)
                .await
                .map_err(|e| e.to_string())?;
            let others: Vec<&str> = pending
                .iter()
                .filter(|(_, consumer, _, _)| *consumer != self.consumer)
                .map(|(entry_id, _, _, _)| entry_id.as_str())
                .collect();
            if !others.is_empty() {
                redis::cmd("XCLAIM")
                    .arg(&self.stream)
                    .arg(GROUP)
                    .arg(&self.consumer)
                    .arg(0)
                    .arg(&others)
                    .query_async::<redis::Value>(connection)
                    .await
                    .map_err(|e| e.to_string())?;
                claimed += others.len() as u64;
            }
            match pending.last() {
                Some((last, _, _, _)) if pending.len() >= batch => start = format!("({last}"),
                _ => break,
            }
        }
        if claimed > 0 {
            self.metrics.commands_claimed.inc_by(claimed);
            tracing::info!(
                commands.partition = self.partition,
                commands.claimed = claimed,
                "claimed commands whose consumer ran out of time"
            );
        }
        Ok(claimed)
    }

    /// This consumer's pending entries, oldest first, with how often each
    /// was delivered.
    async fn own_pending(&self, connection: &mut StreamConnection) -> Result<Batch, String> {
        let batch = self.batch_entries_max;
        let reply: XreadReply = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(GROUP)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(batch)
            .arg("STREAMS")
            .arg(&self.stream)
            .arg("0")
            .query_async(connection)
            .await
            .map_err(|e| e.to_string())?;
        let entries = entries_of(reply);
        if entries.is_empty() {
            return Ok(Batch::default());
        }
        let counts: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
            .arg(&self.stream)
            .arg(GROUP)
            .arg("-")
            .arg("+")
            .arg(batch)
            .arg(&self.consumer)
            .query_async(connection)
            .await
            .map_err(|e| e.to_string())?;
        let deliveries = counts
            .into_iter()
            .map(|(id, _consumer, _idle_ms, delivered)| (id, delivered))
            .collect();
        Ok(Batch { entries, deliveries })
    }

    /// New entries, waiting at most `commands_read_wait_ms` for some.
    async fn read_new(&self, connection: &mut StreamConnection) -> Result<Vec<RawEntry>, String> {
        let reply: XreadReply = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(GROUP)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(self.batch_entries_max)
            .arg("BLOCK")
            .arg(self.read_wait.as_millis())
            .arg("STREAMS")
            .arg(&self.stream)
            .arg(">")
            .query_async(connection)
            .await
            .map_err(|e| e.to_string())?;
        Ok(entries_of(reply))
    }

    /// Acknowledges the entry and deletes it from its stream (its outcome is
    /// in PostgreSQL now, so the stream keeps only what is still to be
    /// applied), and renews `lease` for the next entry, in one round trip.
    pub async fn acknowledge(
        &self,
        connection: &mut StreamConnection,
        entry_id: &str,
        lease: &PartitionLease,
    ) -> Result<LeaseVerdict, String> {
        self.acknowledge_all(connection, &[entry_id], lease).await
    }

    /// Acknowledges and deletes every one of `entry_ids` (a batch's, each
    /// with its outcome stored), and renews `lease`, in one round trip.
    pub async fn acknowledge_all(
        &self,
        connection: &mut StreamConnection,
        entry_ids: &[&str],
        lease: &PartitionLease,
    ) -> Result<LeaseVerdict, String> {
        let mut pipeline = redis::pipe();
        pipeline
            .cmd("XACK")
            .arg(&self.stream)
            .arg(GROUP)
            .arg(entry_ids)
            .ignore()
            .cmd("XDEL")
            .arg(&self.stream)
            .arg(entry_ids)
            .ignore();
        lease.add_renewal(&mut pipeline);
        let (renewed,): (i64,) = pipeline
            .query_async(connection)
            .await
            .map_err(|e| e.to_string())?;
        Ok(lease.renewed(renewed))
    }

    /// Pending entries and the group's lag (entries not yet delivered to
    /// any consumer), for the metrics. Best effort: read while idle, never
    /// in the way of an entry.
    pub async fn refresh_gauges(&self, connection: &mut StreamConnection) {
        let partition = self.partition.to_string();
        let summary: Result<(u64, Option<String>, Option<String>, redis::Value), _> = redis::cmd("XPENDING")
            .arg(&self.stream)
            .arg(GROUP)
            .query_async(connection)
            .await;
        if let Ok((pending, ..)) = summary {
            self.metrics
                .commands_pending
                .with_label_values(&[partition.as_str()])
                .set(i64::try_from(pending).unwrap_or(i64::MAX));
        }
        let groups: Result<Vec<HashMap<String, redis::Value>>, _> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&self.stream)
            .query_async(connection)
            .await;
        let lag = groups.ok().and_then(|groups| {
            groups
                .into_iter()
                .find(|group| matches!(group.get("name"), Some(redis::Value::BulkString(name)) if name == GROUP.as_bytes()))
                .and_then(|group| match group.get("lag") {
                    Some(redis::Value::Int(lag)) => Some(*lag),
                    _ => None,
                })
        });
        if let Some(lag) = lag {
            self.metrics
                .commands_lag
                .with_label_values(&[partition.as_str()])
                .set(lag);
        }
    }
}

fn entries_of(reply: XreadReply) -> Vec<RawEntry> {
    reply
        .into_iter()
        .flatten()
        .flat_map(|(_stream, entries)| entries)
        .collect()
}
