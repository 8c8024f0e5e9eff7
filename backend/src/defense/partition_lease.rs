//! Layer 1 for broker commands: the lease on a stream partition.
//!
//! **Stops:** two consumers working one partition at once, and so one
//! wallet's commands applied out of the order they were published in. One
//! wallet's commands share a partition, and a consumer works a partition
//! only while it holds the partition's lease, a Redis key holding its name
//! for `commands_claim_idle_ms` (the visibility timeout). A consumer that
//! stalls or dies stops renewing it, and another takes the partition.
//!
//! **Does not guarantee** that a command runs once. A consumer slower than
//! the claim time over one entry loses the lease while it still works; the
//! next holder claims that entry before it reads anything new, so the entry
//! runs on two consumers at once (and still before the entries behind it).
//! Redis may also lose a lease (a failover). The inbox lets one of them
//! apply the command and the other only acknowledge it.
//!
//! **Bounds:** the lease lasts `commands_claim_idle_ms` and is renewed
//! before each entry (with the previous one's acknowledgement, in the same
//! round trip). Between batches it is held (taken if free, renewed if this
//! consumer's); within a batch it is only renewed, never taken again once
//! it lapsed: a lease that lapsed may have been taken and let go by another
//! consumer meanwhile, which applied entries behind this batch's, and
//! taking it again would apply this batch after them.
//!
//! **Sharing:** an instance holds at most its share of the partitions (the
//! partitions divided by the live consumers, rounded up, as the census
//! counts them): it takes a free lease only below its share, or when no
//! other consumer would, and gives one up while it holds more than its
//! share and another consumer holds less. So consumers scale out instead
//! of the first one to start keeping every partition.
//!
//! **When Redis fails:** the lease cannot be asked for, so the partition is
//! not worked: the caller connects again after `commands_retry_backoff_ms`,
//! and meanwhile the lease lapses and another consumer may take it. The
//! layer never lets an entry through without the lease.
//!
//! **Answers** with [`LeaseVerdict`]: whether this consumer works its
//! partition now, and if not, why.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use redis::Script;

use crate::redis_store::{RELEASE_IF_OWNER, StreamConnection};

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

/// Whether a consumer works its partition now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseVerdict {
    /// This consumer holds the lease: it works the partition.
    Held,
    /// Another consumer holds the lease, or it lapsed within a batch: this
    /// consumer stops working the partition.
    Lost,
    /// This instance held more than its share while another consumer held
    /// less: it let the lease go.
    GivenUp,
    /// This instance holds its share already: it does not ask for the lease.
    ShareFull,
}

impl LeaseVerdict {
    /// Whether the partition is this consumer's to work.
    pub fn is_held(self) -> bool {
        self == Self::Held
    }
}

/// How the partitions are shared now, as one consumer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FairShare {
    /// The partitions divided by the live consumers, rounded up.
    pub share: usize,
    /// Whether another live consumer holds fewer than its share.
    pub another_below_share: bool,
}

/// One partition's lease, as one consumer holds it.
pub struct PartitionLease {
    /// The lease's Redis key; it shares its stream's slot.
    key: String,
    /// The consumer's name, the lease's value while it holds it.
    holder: String,
    partition: u16,
    /// How long the lease lasts unrenewed: `commands_claim_idle_ms`.
    term: Duration,
    hold: Script,
    renew: Script,
    release: Script,
    /// Whether this consumer holds the lease, as far as it knows.
    holding: AtomicBool,
    /// How many partitions this instance's consumers hold: shared by them,
    /// so that no instance takes more than its share.
    held_here: Arc<AtomicUsize>,
}

impl PartitionLease {
    pub fn new(
        key: String,
        holder: String,
        partition: u16,
        term: Duration,
        held_here: Arc<AtomicUsize>,
    ) -> Self {
        Self {
            key,
            holder,
            partition,
            term,
            hold: Script::new(HOLD_LEASE),
            renew: Script::new(RENEW_LEASE),
            release: Script::new(RELEASE_IF_OWNER),
            holding: AtomicBool::new(false),
            held_here,
        }
    }

    /// How many partitions this instance holds now: what it tells the census.
    pub fn held_here(&self) -> usize {
        self.held_here.load(Ordering::SeqCst)
    }

    /// Decides, between batches, whether this consumer works its partition
    /// now, given the census's `fair` share: keeps (renews) a lease it
    /// holds unless it holds more than its share, and takes a free one only
    /// below its share or when no other consumer would (they all hold their
    /// share: the partition's last holder is stalled or dead).
    pub async fn keep(
        &self,
        connection: &mut StreamConnection,
        fair: FairShare,
    ) -> Result<LeaseVerdict, String> {
        let FairShare {
            share,
            another_below_share,
        } = fair;
        if self.holding.load(Ordering::SeqCst) {
            let above_share = another_below_share
                && self
                    .held_here
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                        (held > share).then(|| held - 1)
                    })
                    .is_ok();
            if above_share {
                return self.give_up(connection, share).await;
            }
            return self.run(&self.hold, connection).await;
        }
        // Reserve a place before asking for the lease.
        let reserved = self
            .held_here
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                (held < share || !another_below_share).then_some(held + 1)
            })
            .is_ok();
        if !reserved {
            return Ok(LeaseVerdict::ShareFull);
        }
        self.holding.store(true, Ordering::SeqCst);
        self.run(&self.hold, connection).await
    }

    /// Renews the lease within a batch; a lease that lapsed, even one
    /// nobody holds now, is lost.
    pub async fn renew(&self, connection: &mut StreamConnection) -> Result<LeaseVerdict, String> {
        self.run(&self.renew, connection).await
    }

    /// Adds the renewal to `pipeline` (an acknowledgement's), whose answer
    /// [`Self::renewed`] reads. The script's text rather than its hash: a
    /// pipeline does not load a script the server has lost (a restart, a
    /// failover).
    pub fn add_renewal(&self, pipeline: &mut redis::Pipeline) {
        pipeline
            .cmd("EVAL")
            .arg(RENEW_LEASE)
            .arg(1)
            .arg(&self.key)
            .arg(&self.holder)
            .arg(self.term.as_millis());
    }

    /// Reads a hold or a renewal's answer, and forgets a lease it lost.
    pub fn renewed(&self, answer: i64) -> LeaseVerdict {
        if answer == 1 {
            return LeaseVerdict::Held;
        }
        if self.holding.swap(false, Ordering::SeqCst) {
            self.held_here.fetch_sub(1, Ordering::SeqCst);
        }
        LeaseVerdict::Lost
    }

    /// Lets the lease go; its place among this instance's was given back
    /// already.
    async fn give_up(&self, connection: &mut StreamConnection, share: usize) -> Result<LeaseVerdict, String> {
        self.holding.store(false, Ordering::SeqCst);
        self.release
            .key(&self.key)
            .arg(&self.holder)
            .invoke_async::<i64>(connection)
            .await
            .map_err(|e| e.to_string())?;
        tracing::info!(
            commands.partition = self.partition,
            commands.share = share,
            "gave up a partition to a consumer holding less than its share"
        );
        Ok(LeaseVerdict::GivenUp)
    }

    /// Runs a hold or a renewal for this consumer, for the lease's term.
    async fn run(&self, script: &Script, connection: &mut StreamConnection) -> Result<LeaseVerdict, String> {
        let answer: i64 = script
            .key(&self.key)
            .arg(&self.holder)
            .arg(self.term.as_millis())
            .invoke_async(connection)
            .await
            .map_err(|e| e.to_string())?;
        Ok(self.renewed(answer))
    }
}
