//! The faults the chaos suite injects, and what each one allows and
//! expects of the instances while it lasts.

use layered_wallet::settings::StoreErrorPolicy;

use crate::replicated_postgres::Replication;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Redis is killed (SIGKILL) and started again, empty, on its port.
    RedisKilled(StoreErrorPolicy),
    /// `pg_ctl stop -m fast`, then start: open transactions roll back.
    PostgresFastRestart,
    /// `pg_ctl stop -m immediate`, then start: a crash and WAL recovery.
    PostgresCrash,
    /// One instance gets SIGKILL and is started again.
    InstanceKilled,
    /// The proxy drops every open database connection, every 200 ms.
    ConnectionsCut,
    /// The proxy lets each `transfer()` or `transfer_batch()` call
    /// commit, then drops the connection before the reply reaches the
    /// instance: every transfer of a lost batch is an unknown outcome.
    CommitRepliesLost,
    /// On a primary with a standby under Patroni: the standby falls
    /// `STANDBY_PAUSE_MS` behind, then the primary's node dies (`kill -9`
    /// of its Patroni agent and its PostgreSQL), and Patroni promotes the
    /// standby. The instances find it through a URL that names both.
    PrimaryFailover(Replication),
}

impl Fault {
    /// Every fault, in the order `docs/reliability.md` lists them.
    pub const ALL: [Fault; 7] = [
        Fault::RedisKilled(StoreErrorPolicy::FailOpen),
        Fault::RedisKilled(StoreErrorPolicy::FailClosed),
        Fault::PostgresFastRestart,
        Fault::PostgresCrash,
        Fault::InstanceKilled,
        Fault::ConnectionsCut,
        Fault::CommitRepliesLost,
    ];

    /// The failovers, in the order `docs/reliability.md` lists them.
    pub const FAILOVERS: [Fault; 2] = [
        Fault::PrimaryFailover(Replication::Asynchronous),
        Fault::PrimaryFailover(Replication::Synchronous),
    ];

    pub fn describe(self) -> &'static str {
        match self {
            Fault::RedisKilled(StoreErrorPolicy::FailOpen) => "Redis killed and restarted, `fail_open`",
            Fault::RedisKilled(StoreErrorPolicy::FailClosed) => "Redis killed and restarted, `fail_closed`",
            Fault::PostgresFastRestart => "PostgreSQL `stop -m fast`, then start",
            Fault::PostgresCrash => "PostgreSQL `stop -m immediate` (a crash), then start",
            Fault::InstanceKilled => "one instance `kill -9`, then start",
            Fault::ConnectionsCut => "every database connection cut, every 200 ms",
            Fault::CommitRepliesLost => "each committed transfer's reply lost",
            Fault::PrimaryFailover(Replication::Asynchronous) => {
                "primary `kill -9`, standby promoted, asynchronous replication"
            }
            Fault::PrimaryFailover(Replication::Synchronous) => {
                "primary `kill -9`, standby promoted, synchronous replication"
            }
        }
    }

    pub(super) fn policy(self) -> StoreErrorPolicy {
        match self {
            Fault::RedisKilled(policy) => policy,
            _ => StoreErrorPolicy::FailOpen,
        }
    }

    /// Keyless double clicks may be charged twice only when the cooldown,
    /// their one defense, lets everything through.
    pub(super) fn allows_keyless_double_charges(self) -> bool {
        self == Fault::RedisKilled(StoreErrorPolicy::FailOpen)
    }

    /// The replication a failover runs on; none for the other faults.
    pub(super) fn replication(self) -> Option<Replication> {
        match self {
            Fault::PrimaryFailover(replication) => Some(replication),
            _ => None,
        }
    }

    /// Commits the primary answered but its standby never got are gone
    /// once the standby is promoted: the cost of asynchronous replication.
    pub(super) fn loses_answered_commits(self) -> bool {
        self == Fault::PrimaryFailover(Replication::Asynchronous)
    }

    /// What `/readyz` must answer during the fault, per instance.
    pub(super) fn expected_readiness(self, instance: usize) -> Readiness {
        match self {
            Fault::RedisKilled(StoreErrorPolicy::FailOpen) => Readiness::Degraded,
            Fault::RedisKilled(StoreErrorPolicy::FailClosed) => Readiness::NotReady,
            Fault::PostgresFastRestart | Fault::PostgresCrash | Fault::PrimaryFailover(_) => {
                Readiness::NotReady
            }
            Fault::InstanceKilled if instance == 0 => Readiness::NoAnswer,
            Fault::InstanceKilled | Fault::ConnectionsCut | Fault::CommitRepliesLost => Readiness::Ready,
        }
    }
}

/// What an instance's `/readyz` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Readiness {
    Ready,
    Degraded,
    NotReady,
    NoAnswer,
}
