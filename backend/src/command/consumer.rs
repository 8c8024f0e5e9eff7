//! The consumer every instance runs: one task per partition stream, each
//! working its partition only while it holds the partition's lease.
//!
//! **Order.** One wallet's commands share a partition (`Streams::partition_of`),
//! and a partition is worked by one consumer at a time, entry after entry:
//! its own pending entries first, oldest first, then new ones. An entry
//! that cannot be applied yet (the database is down, another consumer
//! still holds it) is retried in place until it can, so nothing overtakes
//! it, and an outage does not count against it.
//!
//! **Sharing.** Every consumer notes that it is alive in a sorted set, and
//! an instance holds at most its share of the partitions (the partitions
//! divided by the live consumers, rounded up): it takes a free lease only
//! below its share and gives one up above it. A consumer that starts takes
//! partitions from those that held them all; one that dies or stalls
//! stops counting after the claim time, and the others take its share.
//!
//! **The visibility timeout.** The lease lasts `commands_claim_idle_ms` and
//! is renewed before each entry. A consumer that takes longer over one
//! entry loses the partition; the next holder claims every entry another
//! consumer holds (`XCLAIM`) before it reads anything new, so the slow
//! consumer's entry runs on two consumers at once, and still before the
//! entries behind it. The inbox lets one of them apply it and the other
//! only acknowledge it. Within a batch the lease is only renewed, never
//! taken again once it lapsed, and a read that brought entries is followed
//! by another claim: a consumer that stalled may wake with a read it sent
//! before (`XREADGROUP … BLOCK`), which Redis answered with an entry older
//! than those the holder just read.
//!
//! **Acknowledged after the commit.** `XACK` (with `XDEL`: the outcome is
//! in PostgreSQL, so the stream keeps only what is still to be applied)
//! follows the transaction; a
//! crash in between leaves the entry pending, to be claimed and replayed
//! by the inbox. The result is published before the acknowledgement, so an
//! issuer may read a result twice, never miss one. The acknowledgement
//! carries the lease's renewal for the next entry in the same round trip.
//!
//! **One connection a batch.** The commands of a read batch run one after
//! another on one PostgreSQL connection, taken at the first and given back
//! at the end or when one is not applied: the pool's checks before and
//! after a checkout are paid once a batch, not on every command.
//!
//! **Poison.** An entry that is not a command is dead-lettered at once. One
//! that reached `commands_deliveries_max` deliveries without an outcome
//! (consumers that died or stalled holding it, and attempts the database
//! refused outright) is recorded
//! as dead-lettered in the inbox and moved to the dead-letter stream, so it
//! never blocks its partition. A refusal (insufficient funds) is an
//! outcome, not poison.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use chrono::Utc;
use redis::Script;
use sqlx::Postgres;
use sqlx::pool::PoolConnection;

use super::transaction::{self, NotApplied};
use super::{Command, GROUP, Streams, published_at};
use crate::feed::{EntryPoint, FeedEntry};
use crate::feed::{RawEntry, XreadReply};
use crate::problem::DatabaseFailure;
use crate::redis_store::{StreamClient, StreamConnection};
use crate::state::AppState;

/// Takes or renews the lease (`KEYS[1]`) for `ARGV[1]` for `ARGV[2]` ms,
/// unless another consumer holds it. Only between batches: a consumer that
/// takes a lease claims the entries of others before it applies anything.
const HOLD_LEASE: &str = r"
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return 1
end
return 0
";

/// Renews the lease (`KEYS[1]`) for `ARGV[1]` for `ARGV[2]` ms if `ARGV[1]`
/// still holds it. Within a batch: a lease that lapsed may have been taken
/// and let go by another consumer meanwhile, which applied entries behind
/// this batch's; taking it again here would apply this batch after them.
const RENEW_LEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return 1
end
return 0
";

/// Gives up the lease (`KEYS[1]`) if `ARGV[1]` holds it.
const RELEASE_LEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
";

/// Starts one consumer task per partition. They run until aborted (at
/// shutdown); a task that loses Redis waits `commands_retry_backoff_ms`
/// and connects again.
pub fn spawn(state: AppState, client: StreamClient) -> Vec<tokio::task::JoinHandle<()>> {
    let partitions = state.config.commands.partitions;
    let held = Arc::new(AtomicUsize::new(0));
    (0..partitions)
        .map(|partition| {
            let worker = PartitionWorker::new(state.clone(), client.clone(), partition, held.clone());
            tokio::spawn(worker.run())
        })
        .collect()
}

struct PartitionWorker {
    state: AppState,
    client: StreamClient,
    partition: u16,
    stream: String,
    lease: String,
    streams: Streams,
    consumer: String,
    hold_lease: Script,
    renew_lease: Script,
    release_lease: Script,
    /// Whether this task holds its partition's lease, as far as it knows.
    holding: AtomicBool,
    /// How many partitions this instance's tasks hold: shared by them, so
    /// that no instance takes more than its fair share.
    held: Arc<AtomicUsize>,
}

/// How the partitions are shared now, as one consumer sees it.
struct Census {
    /// The partitions divided by the live consumers, rounded up.
    share: usize,
    /// Whether another live consumer holds fewer than its share.
    another_below_share: bool,
}

/// What became of one entry.
enum Handled {
    /// An outcome is stored (or the entry was dead-lettered): acknowledge.
    Done,
    /// Not yet, for a reason that passes (the database is unavailable,
    /// another consumer still holds the command): try again, for as long
    /// as it takes.
    NotYet(String),
    /// Not applied, for a reason that may not pass (the database refused it,
    /// or answered what it never should): try again, counting the attempt
    /// as a delivery, so that it is dead-lettered in the end.
    Failed(String),
}

impl PartitionWorker {
    fn new(state: AppState, client: StreamClient, partition: u16, held: Arc<AtomicUsize>) -> Self {
        let streams = Streams::new(&state.config.redis.key_prefix, state.config.commands.partitions);
        Self {
            stream: streams.stream(partition),
            lease: streams.lease(partition),
            consumer: state.instance_id.to_string(),
            streams,
            state,
            client,
            partition,
            hold_lease: Script::new(HOLD_LEASE),
            renew_lease: Script::new(RENEW_LEASE),
            release_lease: Script::new(RELEASE_LEASE),
            holding: AtomicBool::new(false),
            held,
        }
    }

    async fn run(self) {
        let settings = &self.state.config.commands;
        let command_timeout = self.state.config.redis.command_timeout;
        loop {
            let connection = self
                .client
                .connect(command_timeout, settings.read_wait + command_timeout)
                .await;
            let ended = match connection {
                Ok(mut connection) => self.serve(&mut connection).await,
                Err(error) => Err(error),
            };
            if let Err(error) = ended {
                tracing::warn!(
                    error,
                    commands.partition = self.partition,
                    "a command consumer lost Redis; it connects again"
                );
            }
            tokio::time::sleep(settings.retry_backoff).await;
        }
    }

    /// Works the partition whenever it holds the lease. Returns only on a
    /// Redis error.
    async fn serve(&self, connection: &mut StreamConnection) -> Result<(), String> {
        self.join_the_group(connection).await?;
        let settings = &self.state.config.commands;
        loop {
            if !self.keep_partition(connection).await? {
                tokio::time::sleep(settings.read_wait).await;
                continue;
            }
            let (entries, deliveries) = self.next_batch(connection).await?;
            if entries.is_empty() {
                self.refresh_gauges(connection).await;
                continue;
            }
            // One PostgreSQL connection for the batch: its commands run one
            // after another, so the pool's checks around a checkout (a round
            // trip each) are paid once a batch rather than twice a command.
            // Given back when a command is not applied: the next attempt takes
            // a fresh one.
            let mut database: Option<PoolConnection<Postgres>> = None;
            // Whether the lease was renewed with the last acknowledgement.
            let mut lease_renewed = false;
            'entries: for (entry_id, fields) in entries {
                let delivered = deliveries.get(&entry_id).copied().unwrap_or(1);
                // Failures of the command itself, retried here: each counts
                // like a delivery towards the dead-letter stream.
                let mut failed = 0;
                loop {
                    // Renewed before each attempt (with the previous
                    // entry's acknowledgement, when it just came): a
                    // consumer slower than the claim time over the last one
                    // no longer owns the partition, and stops here.
                    if !std::mem::take(&mut lease_renewed) && !self.renew_lease(connection).await? {
                        break 'entries;
                    }
                    let why = match self
                        .handle(connection, &mut database, &entry_id, &fields, delivered + failed)
                        .await?
                    {
                        Handled::Done => {
                            if !self.acknowledge(connection, &entry_id).await? {
                                break 'entries;
                            }
                            lease_renewed = true;
                            break;
                        }
                        Handled::NotYet(why) => why,
                        Handled::Failed(why) => {
                            failed += 1;
                            why
                        }
                    };
                    tracing::warn!(
                        commands.partition = self.partition,
                        commands.entry_id = %entry_id,
                        why,
                        "a command could not be applied yet; its partition waits"
                    );
                    // Retried in place, not read again: nothing behind it
                    // overtakes it, and an outage of the database does not
                    // count as deliveries that would make it poison.
                    tokio::time::sleep(settings.retry_backoff).await;
                }
            }
        }
    }

    /// The entries to apply next, in order, with how often each was
    /// delivered; none when there is nothing to apply (or not yet).
    async fn next_batch(
        &self,
        connection: &mut StreamConnection,
    ) -> Result<(Vec<RawEntry>, HashMap<String, u64>), String> {
        self.claim_entries_of_others(connection).await?;
        let (pending, deliveries) = self.own_pending(connection).await?;
        if !pending.is_empty() {
            return Ok((pending, deliveries));
        }
        let new = self.read_new(connection).await?;
        // A consumer that lost the lease may still have had a read waiting
        // (`BLOCK`), sent before it stalled: Redis gave it an entry older
        // than these after the claims above. Claimed now, it is applied
        // first: the next round takes this consumer's pending entries,
        // those just read among them, oldest first. One claimed later was
        // delivered after these, so it is newer.
        if !new.is_empty() && self.claim_entries_of_others(connection).await? > 0 {
            return Ok((Vec::new(), HashMap::new()));
        }
        Ok((new, HashMap::new()))
    }

    async fn join_the_group(&self, connection: &mut StreamConnection) -> Result<(), String> {
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

    /// Decides, between batches, whether this task works its partition
    /// now. The partitions are shared fairly among the live consumers, so
    /// that consumers scale out instead of the first one to start keeping
    /// every partition: an instance gives a partition up while it holds
    /// more than its share and another consumer holds less, and takes a
    /// free one while it holds less than its share, or when no other
    /// consumer would (they all hold their share: the partition's last
    /// holder is stalled or dead).
    async fn keep_partition(&self, connection: &mut StreamConnection) -> Result<bool, String> {
        let census = self.census(connection).await?;
        let share = census.share;
        if self.holding.load(Ordering::SeqCst) {
            let give_up = census.another_below_share
                && self
                    .held
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                        (held > share).then(|| held - 1)
                    })
                    .is_ok();
            if !give_up {
                return self.hold_lease(connection).await;
            }
            self.holding.store(false, Ordering::SeqCst);
            self.release_lease
                .key(&self.lease)
                .arg(&self.consumer)
                .invoke_async::<i64>(connection)
                .await
                .map_err(|e| e.to_string())?;
            tracing::info!(
                commands.partition = self.partition,
                commands.share = share,
                "gave up a partition to a consumer holding less than its share"
            );
            return Ok(false);
        }
        // Reserve a place before asking for the lease.
        let reserved = self
            .held
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                (held < share || !census.another_below_share).then_some(held + 1)
            })
            .is_ok();
        if !reserved {
            return Ok(false);
        }
        self.holding.store(true, Ordering::SeqCst);
        self.hold_lease(connection).await
    }

    /// Notes that this consumer is alive and how many partitions it holds,
    /// and reads the same of the others: those that noted it within the
    /// claim time.
    async fn census(&self, connection: &mut StreamConnection) -> Result<Census, String> {
        let now_ms = Utc::now().timestamp_millis();
        let claim_idle_ms =
            i64::try_from(self.state.config.commands.claim_idle.as_millis()).unwrap_or(i64::MAX);
        let (consumers, held) = (self.streams.consumers(), self.streams.consumers_held());
        let (live, holdings): (Vec<String>, HashMap<String, usize>) = redis::pipe()
            .cmd("ZADD")
            .arg(&consumers)
            .arg(now_ms.saturating_add(claim_idle_ms))
            .arg(&self.consumer)
            .ignore()
            .cmd("ZREMRANGEBYSCORE")
            .arg(&consumers)
            .arg("-inf")
            .arg(now_ms)
            .ignore()
            .cmd("HSET")
            .arg(&held)
            .arg(&self.consumer)
            .arg(self.held.load(Ordering::SeqCst))
            .ignore()
            .cmd("ZRANGE")
            .arg(&consumers)
            .arg(0)
            .arg(-1)
            .cmd("HGETALL")
            .arg(&held)
            .query_async(connection)
            .await
            .map_err(|e| e.to_string())?;
        let gone: Vec<&String> = holdings.keys().filter(|name| !live.contains(name)).collect();
        if !gone.is_empty() {
            redis::cmd("HDEL")
                .arg(&held)
                .arg(&gone)
                .query_async::<()>(connection)
                .await
                .map_err(|e| e.to_string())?;
        }
        let share = usize::from(self.partitions()).div_ceil(live.len().max(1));
        let another_below_share = live
            .iter()
            .filter(|name| **name != self.consumer)
            .any(|name| holdings.get(name).copied().unwrap_or(0) < share);
        Ok(Census {
            share,
            another_below_share,
        })
    }

    fn partitions(&self) -> u16 {
        self.streams.partitions()
    }

    /// Takes or renews this task's lease, between batches; a lease another
    /// consumer holds means this one lost the partition.
    async fn hold_lease(&self, connection: &mut StreamConnection) -> Result<bool, String> {
        self.run_lease_script(&self.hold_lease, connection).await
    }

    /// Renews this task's lease within a batch; a lease that lapsed, even
    /// one nobody holds now, means this one lost the partition.
    async fn renew_lease(&self, connection: &mut StreamConnection) -> Result<bool, String> {
        self.run_lease_script(&self.renew_lease, connection).await
    }

    /// Runs a lease script for this task, for `commands_claim_idle_ms`.
    async fn run_lease_script(
        &self,
        script: &Script,
        connection: &mut StreamConnection,
    ) -> Result<bool, String> {
        let held: i64 = script
            .key(&self.lease)
            .arg(&self.consumer)
            .arg(self.state.config.commands.claim_idle.as_millis())
            .invoke_async(connection)
            .await
            .map_err(|e| e.to_string())?;
        Ok(self.lease_still_held(held))
    }

    /// Reads `HOLD_LEASE`'s answer: whether this task still holds the lease.
    fn lease_still_held(&self, answer: i64) -> bool {
        if answer == 1 {
            return true;
        }
        if self.holding.swap(false, Ordering::SeqCst) {
            self.held.fetch_sub(1, Ordering::SeqCst);
        }
        false
    }

    /// Moves to this consumer every entry another consumer holds, however
    /// recently it was delivered: only the lease holder may work the
    /// partition, so an entry held elsewhere belongs to a consumer that lost
    /// the lease (stalled past the claim time, or dead). Claiming them all
    /// before reading anything new keeps the partition in order. Returns
    /// how many; each claim counts a delivery.
    async fn claim_entries_of_others(&self, connection: &mut StreamConnection) -> Result<u64, String> {
        let batch = self.state.config.commands.read_batch_entries_max;
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
            self.state.metrics.commands_claimed.inc_by(claimed);
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
    async fn own_pending(
        &self,
        connection: &mut StreamConnection,
    ) -> Result<(Vec<RawEntry>, HashMap<String, u64>), String> {
        let batch = self.state.config.commands.read_batch_entries_max;
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
            return Ok((entries, HashMap::new()));
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
        Ok((entries, deliveries))
    }

    /// New entries, waiting at most `commands_read_wait_ms` for some.
    async fn read_new(&self, connection: &mut StreamConnection) -> Result<Vec<RawEntry>, String> {
        let reply: XreadReply = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(GROUP)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(self.state.config.commands.read_batch_entries_max)
            .arg("BLOCK")
            .arg(self.state.config.commands.read_wait.as_millis())
            .arg("STREAMS")
            .arg(&self.stream)
            .arg(">")
            .query_async(connection)
            .await
            .map_err(|e| e.to_string())?;
        Ok(entries_of(reply))
    }

    /// Applies one entry, dead-letters it, or says why not yet.
    async fn handle(
        &self,
        connection: &mut StreamConnection,
        database: &mut Option<PoolConnection<Postgres>>,
        entry_id: &str,
        fields: &[(String, String)],
        delivered: u64,
    ) -> Result<Handled, String> {
        let started = std::time::Instant::now();
        let command = match Command::parse(fields) {
            Ok(command) => command,
            Err(unreadable) => {
                self.dead_letter(connection, entry_id, fields, &unreadable.0, delivered)
                    .await?;
                let result = serde_json::json!({
                    "entry_id": entry_id,
                    "outcome": "dead_lettered",
                    "reason": unreadable.0,
                });
                self.publish_result(connection, None, "dead_lettered", &result.to_string())
                    .await?;
                return Ok(Handled::Done);
            }
        };
        let Some(published) = published_at(entry_id) else {
            return Ok(Handled::Failed(format!("{entry_id} is not a stream id")));
        };
        let deliveries_max = u64::from(self.state.config.commands.deliveries_max);
        let dead_letter_reason =
            (delivered > deliveries_max).then(|| format!("delivered {delivered} times without an outcome"));
        let db = match database {
            Some(held) => held,
            None => match self.state.db.acquire().await {
                Ok(taken) => database.insert(taken),
                Err(error) => return Ok(Handled::NotYet(error.to_string())),
            },
        };
        let applied = transaction::apply(
            db,
            &self.state.config,
            &command,
            published,
            dead_letter_reason.as_deref(),
        )
        .await;
        if applied.is_err() {
            // Broken, or about to wait out a retry: either way not held.
            *database = None;
        }
        let applied = match applied {
            Ok(applied) => applied,
            Err(NotApplied::Protocol(what)) => {
                tracing::error!(what, "the database's answer to a command broke the protocol");
                return Ok(Handled::Failed(what));
            }
            Err(NotApplied::Database(error))
                if DatabaseFailure::of(&error) == DatabaseFailure::RolledBackBug =>
            {
                tracing::error!(error = %error, "the database refused a command");
                return Ok(Handled::Failed(error.to_string()));
            }
            Err(not_yet) => return Ok(Handled::NotYet(not_yet.to_string())),
        };
        if applied.verdict == "dead_lettered" {
            let reason = dead_letter_reason.unwrap_or_else(|| "dead-lettered before".to_owned());
            self.dead_letter(connection, entry_id, fields, &reason, delivered)
                .await?;
        }
        if applied.verdict == "payload_changed" {
            tracing::warn!(
                commands.command_id = %command.command_id,
                commands.issuer = %command.issuer,
                issuer.error = "payload_changed",
                "a command id was published again for another command; refused"
            );
        }
        self.publish_result(
            connection,
            Some(&command.command_id),
            &applied.verdict,
            &applied.result,
        )
        .await?;
        self.report(&command, &applied, started.elapsed());
        Ok(Handled::Done)
    }

    /// Acknowledges the entry and deletes it from its stream (its outcome is
    /// in PostgreSQL now, so the stream keeps only what is still to be
    /// applied), and renews the lease for the next entry, in one round trip:
    /// the stream and its lease share a slot. Returns whether this task
    /// still holds the lease.
    async fn acknowledge(&self, connection: &mut StreamConnection, entry_id: &str) -> Result<bool, String> {
        let (held,): (i64,) = redis::pipe()
            .cmd("XACK")
            .arg(&self.stream)
            .arg(GROUP)
            .arg(entry_id)
            .ignore()
            .cmd("XDEL")
            .arg(&self.stream)
            .arg(entry_id)
            .ignore()
            // The script's text rather than its hash: a pipeline does not
            // load a script the server has lost (a restart, a failover).
            .cmd("EVAL")
            .arg(RENEW_LEASE)
            .arg(1)
            .arg(&self.lease)
            .arg(&self.consumer)
            .arg(self.state.config.commands.claim_idle.as_millis())
            .query_async(connection)
            .await
            .map_err(|e| e.to_string())?;
        Ok(self.lease_still_held(held))
    }

    async fn dead_letter(
        &self,
        connection: &mut StreamConnection,
        entry_id: &str,
        fields: &[(String, String)],
        reason: &str,
        delivered: u64,
    ) -> Result<(), String> {
        let mut add = redis::cmd("XADD");
        add.arg(self.streams.dead_letters())
            .arg("MAXLEN")
            .arg("~")
            .arg(self.state.config.commands.dead_letters_entries_max)
            .arg("*")
            .arg("entry_id")
            .arg(entry_id)
            .arg("partition")
            .arg(self.partition)
            .arg("reason")
            .arg(reason)
            .arg("deliveries")
            .arg(delivered);
        for (name, value) in fields {
            add.arg(format!("command.{name}")).arg(value);
        }
        add.query_async::<String>(connection)
            .await
            .map_err(|e| e.to_string())?;
        self.state.metrics.commands_dead_lettered.inc();
        tracing::warn!(
            commands.partition = self.partition,
            commands.entry_id = %entry_id,
            reason,
            "a command was dead-lettered"
        );
        Ok(())
    }

    async fn publish_result(
        &self,
        connection: &mut StreamConnection,
        command_id: Option<&str>,
        outcome: &str,
        result: &str,
    ) -> Result<(), String> {
        redis::cmd("XADD")
            .arg(self.streams.results())
            .arg("MAXLEN")
            .arg("~")
            .arg(self.state.config.commands.results_entries_max)
            .arg("*")
            .arg("command_id")
            .arg(command_id.unwrap_or(""))
            .arg("outcome")
            .arg(outcome)
            .arg("result")
            .arg(result)
            .query_async::<String>(connection)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// The decision, reported as a transfer's or a deposit's is: metrics,
    /// one log line, the source wallet owner's feed.
    fn report(&self, command: &Command, applied: &transaction::Applied, took: Duration) {
        let decision = applied.decision;
        self.state.metrics.count_command_decision(decision);
        tracing::info!(
            decision.layer = decision.layer.as_str(),
            decision.outcome = decision.outcome.as_str(),
            commands.command_id = %command.command_id,
            commands.issuer = %command.issuer,
            commands.verdict = %applied.verdict,
            commands.partition = self.partition,
            instance.id = %self.state.instance_id,
            "command decided"
        );
        if let Some(owner) = applied.owner {
            self.state.feed.publish(
                owner,
                FeedEntry {
                    time: Utc::now(),
                    instance_id: self.state.instance_id.to_string(),
                    request_id: command.command_id.clone(),
                    trace_id: String::new(),
                    idempotency_key: None,
                    layer: decision.layer,
                    outcome: decision.outcome,
                    status: if applied.verdict == "applied" { 200 } else { 422 },
                    latency_ms: took.as_secs_f64() * 1000.0,
                    amount_minor: Some(command.amount_minor),
                    to_wallet_id: Some(command.to.0),
                    problem_type: None,
                    lab: false,
                    entry_point: EntryPoint::Command,
                },
            );
        }
    }

    /// Pending entries and the group's lag (entries not yet delivered to
    /// any consumer), for the metrics. Best effort:
    /// read while idle, never in the way of an entry.
    async fn refresh_gauges(&self, connection: &mut StreamConnection) {
        let summary: Result<(u64, Option<String>, Option<String>, redis::Value), _> = redis::cmd("XPENDING")
            .arg(&self.stream)
            .arg(GROUP)
            .query_async(connection)
            .await;
        if let Ok((pending, ..)) = summary {
            let partition = self.partition.to_string();
            self.state
                .metrics
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
            let partition = self.partition.to_string();
            self.state
                .metrics
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
