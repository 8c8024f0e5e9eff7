//! `wallet-loadtest commands`: how fast the instances' consumers apply a
//! backlog of transfer commands. It publishes `commands` commands between
//! the users' wallets to the command streams at once, as an issuer's batch
//! would arrive, then waits until the inbox holds every outcome. The rate
//! is the commands over the seconds from the first claim to the last
//! transfer's commit: the consumers' sustained rate while they had a
//! backlog. Consumers work a partition one batch at a time, in order (the
//! commands of a read in one PostgreSQL call), so the partitions are the
//! concurrency to compare with.

use std::time::{Duration, Instant};

use anyhow::Context;
use layered_wallet::command::{Command, Streams, new_command_id};
use layered_wallet::domain::WalletId;
use serde::Serialize;
use sqlx::PgPool;

use crate::closed_loop;

#[derive(clap::Args, Clone)]
pub struct CommandArgs {
    /// Base URL of an instance, to sign the users up through.
    #[arg(long = "target", default_value = "http://127.0.0.1:8080")]
    pub targets: Vec<String>,
    /// The instances' database, read for each command's outcome.
    #[arg(long, env = "LOADTEST_DATABASE_URL")]
    pub database_url: String,
    /// The Redis holding the command streams.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    /// The instances' `redis_key_prefix`.
    #[arg(long)]
    pub redis_prefix: String,
    /// The instances' `commands_partitions`.
    #[arg(long, default_value_t = 4)]
    pub partitions: u16,
    #[arg(long, default_value_t = 64)]
    pub users: usize,
    #[arg(long, default_value_t = 10_000)]
    pub commands: usize,
    /// Commands per pipelined batch of `XADD`s.
    #[arg(long, default_value_t = 500)]
    pub publish_batch_commands: usize,
    /// How long to wait for every command's outcome.
    #[arg(long, default_value_t = 300)]
    pub drain_s_max: u64,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub struct CommandReport {
    pub published: usize,
    pub publish_seconds: f64,
    /// Outcomes in the inbox by verdict (`applied`, or why not).
    pub verdicts: Vec<(String, i64)>,
    /// From the first claim to the last transfer's commit.
    pub consume_seconds: f64,
    pub applied_per_s: f64,
    /// Commands without an outcome when the wait ended.
    pub left: i64,
}

pub async fn run(args: &CommandArgs) -> anyhow::Result<CommandReport> {
    let db = PgPool::connect(&args.database_url).await?;
    let people = closed_loop::sign_up(&args.targets, args.users.max(2)).await?;
    let streams = Streams::new(&args.redis_prefix, args.partitions);
    let plan: Vec<Command> = (0..args.commands)
        .map(|n| Command {
            command_id: new_command_id(),
            issuer: "bench".into(),
            from: WalletId(people[n % people.len()].wallet_id),
            to: WalletId(people[(n + 1) % people.len()].wallet_id),
            amount_minor: 1,
        })
        .collect();
    let ids: Vec<String> = plan.iter().map(|command| command.command_id.clone()).collect();

    let mut redis = redis::Client::open(args.redis_url.as_str())
        .context("invalid --redis-url")?
        .get_multiplexed_async_connection()
        .await
        .context("cannot reach the commands' Redis")?;
    let started = Instant::now();
    for batch in plan.chunks(args.publish_batch_commands.max(1)) {
        let mut pipe = redis::pipe();
        for command in batch {
            pipe.add_command(command.publication(&streams));
        }
        let _: Vec<String> = pipe.query_async(&mut redis).await?;
    }
    let publish_seconds = started.elapsed().as_secs_f64();

    let deadline = Instant::now() + Duration::from_secs(args.drain_s_max);
    loop {
        let (done, seconds): (i64, Option<f64>) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE i.verdict IS NOT NULL),
                    extract(epoch FROM max(t.created_at) - min(i.received_at))::double precision
               FROM inbox i LEFT JOIN transfers t ON t.id = i.transfer_id
              WHERE i.source = 'broker' AND i.event_id = ANY($1)",
        )
        .bind(&ids)
        .fetch_one(&db)
        .await?;
        let left = ids.len() as i64 - done;
        if left == 0 || Instant::now() > deadline {
            let verdicts: Vec<(String, i64)> = sqlx::query_as(
                "SELECT verdict, count(*) FROM inbox
                  WHERE source = 'broker' AND event_id = ANY($1) AND verdict IS NOT NULL
                  GROUP BY verdict ORDER BY verdict",
            )
            .bind(&ids)
            .fetch_all(&db)
            .await?;
            let applied = verdicts
                .iter()
                .find(|(verdict, _)| verdict == "applied")
                .map_or(0, |(_, count)| *count);
            let consume_seconds = seconds.unwrap_or(0.0);
            return Ok(CommandReport {
                published: ids.len(),
                publish_seconds,
                verdicts,
                consume_seconds,
                applied_per_s: applied as f64 / consume_seconds.max(f64::EPSILON),
                left,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn print(report: &CommandReport) {
    println!(
        "commands published: {} in {:.2} s; applied {:.0}/s over {:.1} s; outcomes {:?}; {} without an outcome",
        report.published,
        report.publish_seconds,
        report.applied_per_s,
        report.consume_seconds,
        report.verdicts,
        report.left
    );
}
