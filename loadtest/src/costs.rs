//! What a run costs the server outside PostgreSQL, sampled around the
//! measured phase only (after the sign-ups, whose password hashing would
//! otherwise dominate): the server's CPU time, Redis's commands by name, the
//! server's own count of Redis round trips, and PostgreSQL's transactions.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

/// Where to read each figure; any may be absent.
pub struct Probes {
    pub server_pids: Vec<u32>,
    pub redis_url: Option<String>,
    pub metrics_url: Option<String>,
    /// A `pg-wire` counter between the server and PostgreSQL.
    pub pg_wire_url: Option<String>,
    pub database_url: Option<String>,
    /// Read the transaction ids handed out from `database_url` too.
    pub count_transaction_ids: bool,
    /// A pause before each sample, so that PostgreSQL has flushed its
    /// statistics (it does so at most every second, and within ten seconds
    /// of a backend going idle).
    pub settle: Duration,
}

/// The run's costs, summed over the measured phase.
#[derive(Debug, Default, Serialize)]
pub struct Costs {
    /// New transfers the run saw accepted: the divisor of every figure.
    pub accepted: u64,
    pub server_cpu_us: u64,
    /// The load generator's own CPU time over the same phase: on a machine
    /// it shares with the server, what it takes is not the server's.
    pub load_generator_cpu_us: u64,
    /// `INFO commandstats` deltas; commands run by scripts count too.
    pub redis_commands: BTreeMap<String, u64>,
    pub redis_round_trips: u64,
    /// Round trips to PostgreSQL counted on the wire, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pg_round_trips: Option<u64>,
    /// Messages that carry or run a statement, on the wire, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pg_query_messages: Option<u64>,
    pub pg_transactions: i64,
    /// Transaction ids handed out, server-wide, when asked for: one per
    /// transaction that wrote, committed or rolled back, and one per
    /// subtransaction that wrote.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pg_transaction_ids: Option<i64>,
}

#[derive(Default)]
pub struct Sample {
    cpu_us: u64,
    own_cpu_us: u64,
    redis_commands: BTreeMap<String, u64>,
    redis_round_trips: u64,
    pg_wire: Option<crate::pg_wire::WireCounts>,
    pg_transactions: i64,
    pg_transaction_ids: Option<i64>,
}

impl Probes {
    pub fn any(&self) -> bool {
        !self.server_pids.is_empty()
            || self.redis_url.is_some()
            || self.metrics_url.is_some()
            || self.pg_wire_url.is_some()
            || self.count_transaction_ids
    }

    pub async fn sample(&self) -> anyhow::Result<Sample> {
        tokio::time::sleep(self.settle).await;
        let mut sample = Sample {
            own_cpu_us: cpu_us(std::process::id())?,
            ..Sample::default()
        };
        for pid in &self.server_pids {
            sample.cpu_us += cpu_us(*pid)?;
        }
        if let Some(url) = &self.redis_url {
            sample.redis_commands = redis_commands(url).await?;
        }
        if let Some(url) = &self.metrics_url {
            sample.redis_round_trips = metric(url, "wallet_redis_round_trips_total").await?;
        }
        if let Some(url) = &self.pg_wire_url {
            sample.pg_wire = Some(crate::pg_wire::counts(url).await?);
        }
        if let Some(url) = &self.database_url {
            sample.pg_transactions = pg_transactions(url).await?;
            if self.count_transaction_ids {
                sample.pg_transaction_ids = Some(pg_transaction_ids(url).await?);
            }
        }
        Ok(sample)
    }
}

impl Costs {
    pub fn between(before: &Sample, after: &Sample, accepted: u64) -> Self {
        let redis_commands = after
            .redis_commands
            .iter()
            .filter_map(|(name, calls)| {
                let delta = calls.saturating_sub(before.redis_commands.get(name).copied().unwrap_or(0));
                (delta > 0).then(|| (name.clone(), delta))
            })
            .collect();
        let wire = after
            .pg_wire
            .zip(before.pg_wire)
            .map(|(after, before)| after.since(&before));
        Self {
            accepted,
            server_cpu_us: after.cpu_us.saturating_sub(before.cpu_us),
            load_generator_cpu_us: after.own_cpu_us.saturating_sub(before.own_cpu_us),
            redis_commands,
            redis_round_trips: after.redis_round_trips.saturating_sub(before.redis_round_trips),
            pg_round_trips: wire.map(|wire| wire.round_trips),
            pg_query_messages: wire.map(|wire| wire.query_messages),
            pg_transactions: after.pg_transactions - before.pg_transactions,
            pg_transaction_ids: after
                .pg_transaction_ids
                .zip(before.pg_transaction_ids)
                .map(|(after, before)| after - before),
        }
    }
}

/// User plus system CPU time of a process, all threads, from
/// `/proc/PID/stat` (fields 14 and 15, in clock ticks of 1/100 s: Linux
/// fixes USER_HZ at 100 for user space).
fn cpu_us(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("no process {pid} to measure"))?;
    // The command name, in parentheses, may hold spaces: count from after it.
    let after_name = stat.rsplit_once(") ").map(|(_, rest)| rest).unwrap_or_default();
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |index: usize| -> anyhow::Result<u64> {
        fields
            .get(index)
            .and_then(|field| field.parse::<u64>().ok())
            .with_context(|| format!("unreadable /proc/{pid}/stat"))
    };
    // Field 3 (the state) is index 0 here, so fields 14 and 15 are 11, 12.
    Ok((ticks(11)? + ticks(12)?) * 10_000)
}

async fn redis_commands(url: &str) -> anyhow::Result<BTreeMap<String, u64>> {
    let client = redis::Client::open(url).context("invalid --redis-url")?;
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .context("cannot reach --redis-url")?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut connection)
        .await?;
    // cmdstat_set:calls=12,usec=34,...
    Ok(info
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|field| field.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect())
}

async fn metric(url: &str, name: &str) -> anyhow::Result<u64> {
    let text = reqwest::get(url).await?.error_for_status()?.text().await?;
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse::<f64>().ok())
        .map(|value| value as u64)
        .with_context(|| format!("{url} has no {name}"))
}

async fn pg_transactions(url: &str) -> anyhow::Result<i64> {
    pg_count(
        url,
        "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = current_database()",
    )
    .await
}

/// The next transaction id PostgreSQL will hand out: every transaction that
/// writes takes one, at once, so the difference of two readings counts
/// them exactly, with no statistics to wait for. Reading it takes none.
async fn pg_transaction_ids(url: &str) -> anyhow::Result<i64> {
    pg_count(
        url,
        "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint",
    )
    .await
}

async fn pg_count(url: &str, query: &'static str) -> anyhow::Result<i64> {
    use sqlx::Connection;
    let mut connection = sqlx::PgConnection::connect(url).await?;
    let count: i64 = sqlx::query_scalar(query).fetch_one(&mut connection).await?;
    connection.close().await?;
    Ok(count)
}
