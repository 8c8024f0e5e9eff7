//! The chaos suite's machinery. A deployment of its own (a private
//! PostgreSQL cluster and Redis, a TCP proxy between the instances and
//! PostgreSQL, several `wallet-server` processes), a storm of clients
//! against it, one fault injected in the middle of the storm, and the
//! checks made on the database afterwards.
//!
//! The clients behave as careful clients should: a keyed client retries
//! with the same Idempotency-Key, on the next instance, after Retry-After,
//! until it gets an answer that settles the transfer; keyless clients
//! double-click (several identical requests at once) and never retry.

mod arrivals;
mod checks;
mod departures;
mod deployment;
mod failover;
mod fault;
mod redis_failover;
mod report;
mod scale;
mod storm;
mod timeline;

use std::path::PathBuf;

pub use arrivals::{ARRIVALS_REPORT_HEADER, ArrivalFault, ArrivalsReport, run_arrivals};
pub use departures::{DEPARTURES_REPORT_HEADER, DepartureFault, DeparturesReport, run_departures};
pub use failover::{FAILOVER_REPORT_HEADER, FailoverMeasures};
pub use fault::Fault;
pub use redis_failover::{
    REDIS_FAILOVER_REPORT_HEADER, RedisFailoverReport, run_commands_failover, run_cooldown_failover,
};
pub use report::{ChaosReport, REPORT_HEADER};
pub use scale::Scale;

use deployment::{Deployment, Extras};

/// No request may take longer than this, whatever the fault: the longest
/// wait the service allows itself (`db_statement_timeout_ms`, 6 s by
/// default) plus a margin.
pub const REQUEST_SECONDS_MAX: u64 = 10;
/// Every instance must be ready and transferring again this soon after a
/// fault ends.
pub const RECOVERY_SECONDS_MAX: u64 = 10;
/// After the storm, keys still unsettled get this long to settle.
pub const SETTLE_SECONDS_MAX: u64 = 30;
/// Identical keyless requests fired at once: one double click and then some.
pub const KEYLESS_BURST_REQUESTS: usize = 4;
/// The instances' cooldown window, short so that clients cycle quickly.
pub const CHAOS_COOLDOWN_TTL_MS: u64 = 300;

/// Starts a deployment of `binary` (`wallet-server`) configured for
/// `fault`, runs a storm through it with `fault` in the middle, and reports.
pub async fn run(binary: PathBuf, fault: Fault, scale: Scale) -> ChaosReport {
    let extras = Extras {
        replicated: fault.replication(),
        ..Extras::default()
    };
    Deployment::start_with(binary, scale.instances, fault.policy(), extras)
        .await
        .run(fault, scale)
        .await
}
