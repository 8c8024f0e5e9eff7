//! The consumer every instance runs: one worker per partition stream, each
//! working its partition only while it holds the partition's lease
//! (`defense::partition_lease`), with its share of the partitions counted
//! by the census (`census`).
//!
//! **Order.** One wallet's commands share a partition (`Streams::partition_of`),
//! and a partition is worked by one consumer at a time, entry after entry,
//! in the order the stream transport (`consumer`) gives them. An entry that
//! cannot be applied yet (the database is down, another consumer still
//! holds it) is retried in place until it can, so nothing overtakes it,
//! and an outage does not count against it.
//!
//! **Commands together.** The commands of a read batch go to PostgreSQL
//! together, in calls of at most `commands_apply_batch_max` (`batch`),
//! each decided exactly as alone and in order, then their outcomes are
//! published and they are acknowledged, one round trip each per call.
//! The bound keeps a call within PostgreSQL's cache of subtransactions
//! (`broker_command_batch()` says why). What a call leaves (an
//! entry that is no command, the first command it could not decide, or
//! all of them when PostgreSQL refused the call as a whole) goes alone
//! (`pipeline`), in order, retried in place as above. All of a read
//! batch's calls run on one PostgreSQL connection, taken at the first and
//! given back at the end or when a call fails: the pool's checks before
//! and after a checkout are paid once a batch.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use sqlx::Postgres;
use sqlx::pool::PoolConnection;

use super::Streams;
use super::batch::{self, Ended, Together};
use super::census::Census;
use super::consumer::{Batch, Delivered, PartitionStream};
use super::dead_letter::DeadLetters;
use super::pipeline::{self, Handled, Outlets};
use super::results::ResultStream;
use crate::defense::partition_lease::{LeaseVerdict, PartitionLease};
use crate::redis_store::{StreamClient, StreamConnection};
use crate::state::AppState;

/// Starts one worker per partition. They run until aborted (at shutdown);
/// a worker that loses Redis waits `commands_retry_backoff_ms` and
/// connects again.
pub fn spawn(state: AppState, client: StreamClient) -> Vec<tokio::task::JoinHandle<()>> {
    let partitions = state.config.commands.partitions;
    let held_here = Arc::new(AtomicUsize::new(0));
    (0..partitions)
        .map(|partition| {
            let worker = PartitionWorker::new(state.clone(), client.clone(), partition, held_here.clone());
            tokio::spawn(worker.run())
        })
        .collect()
}

struct PartitionWorker {
    state: AppState,
    client: StreamClient,
    partition: u16,
    stream: PartitionStream,
    lease: PartitionLease,
    census: Census,
    outlets: Outlets,
}

impl PartitionWorker {
    /// `held_here` counts the partitions this instance's workers hold.
    fn new(state: AppState, client: StreamClient, partition: u16, held_here: Arc<AtomicUsize>) -> Self {
        let settings = &state.config.commands;
        let streams = Streams::new(&state.config.redis.key_prefix, settings.partitions);
        let consumer = state.instance_id.to_string();
        Self {
            stream: PartitionStream::new(
                &streams,
                partition,
                consumer.clone(),
                &state.config,
                state.metrics.clone(),
            ),
            lease: PartitionLease::new(
                streams.lease(partition),
                consumer.clone(),
                partition,
                settings.claim_idle,
                held_here,
            ),
            census: Census::new(&streams, consumer, settings.claim_idle),
            outlets: Outlets {
                partition,
                dead_letters: DeadLetters::new(
                    &streams,
                    partition,
                    &state.config,
                    state.metrics.commands_dead_lettered.clone(),
                ),
                results: ResultStream::new(&streams, &state.config),
            },
            partition,
            client,
            state,
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
        self.stream.join_the_group(connection).await?;
        loop {
            let fair = self.census.take(connection, self.lease.held_here()).await?;
            if !self.lease.keep(connection, fair).await?.is_held() {
                tokio::time::sleep(self.state.config.commands.read_wait).await;
                continue;
            }
            let batch = self.stream.next_batch(connection).await?;
            if batch.entries.is_empty() {
                self.stream.refresh_gauges(connection).await;
                continue;
            }
            self.work(connection, batch).await?;
        }
    }

    /// Applies a batch's entries in order, each until it is done, while the
    /// lease holds: the leading commands together, in one PostgreSQL call
    /// (`batch`), and what that leaves alone, one by one (`pipeline`).
    async fn work(&self, connection: &mut StreamConnection, batch: Batch) -> Result<(), String> {
        // One PostgreSQL connection for the batch: its calls run one after
        // another, so the pool's checks around a checkout (a round trip
        // each) are paid once a batch rather than on every call.
        let mut database: Option<PoolConnection<Postgres>> = None;
        // The lease as the last acknowledgement renewed it, if one did.
        let mut renewed_with_ack = None;
        // Set when the next entry goes alone: the batch stopped at it, or
        // PostgreSQL refused the batch as a whole (then the rest go alone).
        let mut next_alone = false;
        let mut refused = false;
        let mut next = 0;
        while next < batch.entries.len() {
            // Renewed before each attempt (with the last acknowledgement,
            // when it just came): a consumer slower than the claim time
            // over the last one no longer owns the partition, and stops.
            let lease = match renewed_with_ack.take() {
                Some(lease) => lease,
                None => self.lease.renew(connection).await?,
            };
            if !lease.is_held() {
                return Ok(());
            }
            let entries = batch.entries[next..].iter().map(|(entry_id, fields)| Delivered {
                entry_id,
                fields,
                deliveries: batch.deliveries_of(entry_id),
            });
            let together =
                Together::leading(entries, &self.outlets, self.state.config.commands.apply_batch_max);
            // A single command goes alone: a batch of one saves nothing.
            if !(next_alone || refused || together.len() < 2) {
                let (renewed, ended) = self.apply_together(connection, &mut database, &together).await?;
                renewed_with_ack = renewed;
                match ended {
                    Ended::Decided(done) => {
                        next += done;
                        next_alone = done < together.len();
                    }
                    Ended::Refused(_) => refused = true,
                    Ended::NotYet(_) => {}
                }
                continue;
            }
            let (entry_id, fields) = &batch.entries[next];
            let Some(renewed) = self
                .apply_alone(
                    connection,
                    &mut database,
                    entry_id,
                    fields,
                    batch.deliveries_of(entry_id),
                    lease,
                )
                .await?
            else {
                return Ok(());
            };
            renewed_with_ack = Some(renewed);
            next += 1;
            next_alone = false;
        }
        Ok(())
    }

    /// The leading commands together (`batch`): acknowledges those done,
    /// and answers the lease as that acknowledgement renewed it, with how
    /// the batch ended. One the database could not take yet waits here
    /// before it is tried again.
    async fn apply_together(
        &self,
        connection: &mut StreamConnection,
        database: &mut Option<PoolConnection<Postgres>>,
        together: &Together<'_>,
    ) -> Result<(Option<LeaseVerdict>, Ended), String> {
        let ended =
            batch::through_the_layers(&self.state, &self.outlets, connection, database, together).await?;
        let mut renewed = None;
        match &ended {
            Ended::Decided(done) if *done > 0 => {
                let done_ids = together.entry_ids(*done);
                renewed = Some(
                    self.stream
                        .acknowledge_all(connection, &done_ids, &self.lease)
                        .await?,
                );
            }
            Ended::NotYet(why) => self.wait_before_retrying(together.entry_ids(1)[0], why).await,
            _ => {}
        }
        Ok((renewed, ended))
    }

    /// Applies one entry alone until it is done, while the lease holds
    /// (`lease`, renewed just before); answers the lease as its
    /// acknowledgement renewed it, or `None` once the lease is lost.
    async fn apply_alone(
        &self,
        connection: &mut StreamConnection,
        database: &mut Option<PoolConnection<Postgres>>,
        entry_id: &str,
        fields: &[(String, String)],
        delivered: u64,
        mut lease: LeaseVerdict,
    ) -> Result<Option<LeaseVerdict>, String> {
        // Failures of the command itself, retried here: each counts like a
        // delivery towards the dead-letter stream.
        let mut failed = 0;
        loop {
            if !lease.is_held() {
                return Ok(None);
            }
            let entry = Delivered {
                entry_id,
                fields,
                deliveries: delivered + failed,
            };
            let why =
                match pipeline::through_the_layers(&self.state, &self.outlets, connection, database, entry)
                    .await?
                {
                    Handled::Done => {
                        return Ok(Some(
                            self.stream.acknowledge(connection, entry_id, &self.lease).await?,
                        ));
                    }
                    Handled::NotYet(why) => why,
                    Handled::Failed(why) => {
                        failed += 1;
                        why
                    }
                };
            self.wait_before_retrying(entry_id, &why).await;
            // Renewed before each attempt after a wait.
            lease = self.lease.renew(connection).await?;
        }
    }

    /// Retried in place, not read again: nothing behind the entry overtakes
    /// it, and an outage of the database does not count as deliveries that
    /// would make it poison.
    async fn wait_before_retrying(&self, entry_id: &str, why: &str) {
        tracing::warn!(
            commands.partition = self.partition,
            commands.entry_id = %entry_id,
            why,
            "a command could not be applied yet; its partition waits"
        );
        tokio::time::sleep(self.state.config.commands.retry_backoff).await;
    }
}
