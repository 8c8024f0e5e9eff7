//! `wallet-sim broker`: an issuer publishing transfer commands, with
//! duplicates and a few unreadable entries, to instances this program
//! starts, while it kills consumers mid-message (`SIGKILL`, then a restart)
//! and stalls others past the claim time (`SIGSTOP`, then `SIGCONT`, so the
//! stalled one wakes up still holding a command someone else claimed).
//! Then the database's and the streams' verdict.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use layered_wallet::command::{Command, GROUP, Streams, new_command_id};
use layered_wallet::domain::WalletId;
use rand::Rng;
use rand::seq::SliceRandom;
use serde::Serialize;
use sqlx::PgPool;
use tokio::sync::Mutex;
use uuid::Uuid;

use crate::accounts::{self, Account};
use crate::checks::Checks;
use crate::instances::{Instances, Stores};

#[derive(Debug, Clone, clap::Args)]
pub struct BrokerArgs {
    #[command(flatten)]
    pub stores: Stores,
    #[arg(long, default_value_t = 3)]
    pub instances: usize,
    #[arg(long, default_value_t = 20)]
    pub accounts: usize,
    /// What each account holds when the run starts.
    #[arg(long, default_value_t = 50_000)]
    pub grant_minor: i64,
    #[arg(long, default_value_t = 2_000)]
    pub commands: usize,
    /// Every n-th command is published twice.
    #[arg(long, default_value_t = 5)]
    pub duplicate_every: usize,
    /// Entries that are not commands, which must be dead-lettered without
    /// blocking their partition.
    #[arg(long, default_value_t = 3)]
    pub unreadable: usize,
    #[arg(long, default_value_t = 4)]
    pub partitions: u16,
    /// The instances' visibility timeout (`commands_claim_idle_ms`).
    #[arg(long, default_value_t = 1_000)]
    pub claim_idle_ms: u64,
    /// Commands published per second.
    #[arg(long, default_value_t = 400)]
    pub publish_per_s: u64,
    /// Consumers killed (`SIGKILL`) and started again during the run.
    #[arg(long, default_value_t = 3)]
    pub kills: usize,
    /// Consumers stalled (`SIGSTOP`) for twice the claim time, then resumed.
    #[arg(long, default_value_t = 3)]
    pub stalls: usize,
    /// How long to wait, after the last publication, for every command's
    /// outcome.
    #[arg(long, default_value_t = 120)]
    pub settle_s: u64,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub instances: usize,
    pub partitions: u16,
    pub commands: usize,
    pub publications: usize,
    pub kills: usize,
    pub stalls: usize,
    /// Outcomes stored in the inbox, by verdict.
    pub outcomes: Vec<(String, i64)>,
    pub dead_letters: i64,
    /// Entries published that are not commands.
    pub unreadable: usize,
    /// Entries claimed from a consumer whose claim time ran out, and
    /// deliveries of a command the inbox had already decided, as the
    /// instances counted them (a killed instance's counts are read just
    /// before it is killed).
    pub claims: f64,
    pub inbox_replays: f64,
    pub seconds_to_settle: f64,
    pub checks: Checks,
}

/// A command as the issuer remembers it: its place in its wallet's order.
#[derive(Debug, Clone)]
pub struct Published {
    pub command: Command,
    /// The partition stream entry id of its first publication.
    pub first_entry: String,
}

pub async fn run(args: &BrokerArgs) -> anyhow::Result<Report> {
    let spec = args
        .stores
        .spec("sim-broker")?
        .with("WALLET_COMMANDS_ENABLED", true)
        .with("WALLET_COMMANDS_PARTITIONS", args.partitions)
        .with("WALLET_COMMANDS_CLAIM_IDLE_MS", args.claim_idle_ms)
        .with("WALLET_COMMANDS_READ_WAIT_MS", 100)
        .with("WALLET_COMMANDS_RETRY_BACKOFF_MS", 100)
        .with("WALLET_SIGNUP_GRANT_MINOR", args.grant_minor);
    let streams = Streams::new(&spec.redis_prefix, args.partitions);
    let servers = Mutex::new(Instances::start(spec, args.instances).await?);
    let urls = servers.lock().await.urls();
    let db = PgPool::connect(&args.stores.database_url).await?;
    let accounts = accounts::sign_up(&urls, args.accounts.max(2)).await?;
    let opening = accounts::balances(&db, &accounts).await?;
    let mut redis = redis::Client::open(args.stores.redis_url.as_str())?
        .get_multiplexed_async_connection()
        .await?;

    let plan = plan(args, &accounts);
    let started = Instant::now();
    let publishing = publish(&mut redis, &streams, &plan, args);
    let faults = faults(&servers, args);
    let (published, counted_before_kills) = tokio::join!(publishing, faults);
    let Publications {
        published,
        publications,
        unreadable,
    } = published?;
    let counted_before_kills = counted_before_kills?;
    let settled = settle(&db, &mut redis, &streams, &published, args.settle_s).await;
    let seconds_to_settle = started.elapsed().as_secs_f64();
    settled?;

    let mut report = Report {
        instances: args.instances,
        partitions: args.partitions,
        commands: published.len(),
        publications,
        kills: args.kills,
        stalls: args.stalls,
        unreadable,
        seconds_to_settle,
        ..Report::default()
    };
    let counted_now = Counted::read(&*servers.lock().await, None).await;
    report.claims = counted_before_kills.claims + counted_now.claims;
    report.inbox_replays = counted_before_kills.inbox_replays + counted_now.inbox_replays;
    let settled = check_commands(
        &db,
        &mut redis,
        &streams,
        &accounts,
        &opening,
        &published,
        report.unreadable,
        &mut report.checks,
    )
    .await?;
    report.outcomes = settled.outcomes;
    report.dead_letters = settled.dead_letters;
    Ok(report)
}

/// The commands to publish, in order. Every `duplicate_every`-th command is
/// published again one to twenty entries later, as an issuer does that
/// retries a publication whose answer it lost.
fn plan(args: &BrokerArgs, accounts: &[Account]) -> Vec<Command> {
    let mut rng = rand::thread_rng();
    let mut placed: Vec<(f64, Command)> = Vec::new();
    for n in 0..args.commands {
        let pair: Vec<&Account> = accounts.choose_multiple(&mut rng, 2).collect();
        let command = Command {
            command_id: new_command_id(),
            issuer: "sim-payroll".into(),
            from: WalletId(pair[0].wallet_id),
            to: WalletId(pair[1].wallet_id),
            // Large enough that some are refused for want of funds: a
            // result, not a poison message.
            amount_minor: rng.gen_range(1..=args.grant_minor / 4),
        };
        if args.duplicate_every > 0 && n % args.duplicate_every == 0 {
            placed.push((n as f64 + rng.gen_range(1..=20) as f64 + 0.5, command.clone()));
        }
        placed.push((n as f64, command));
    }
    placed.sort_by(|a, b| a.0.total_cmp(&b.0));
    placed.into_iter().map(|(_, command)| command).collect()
}

/// What was published: each command once, and the counts.
struct Publications {
    published: Vec<Published>,
    publications: usize,
    unreadable: usize,
}

async fn publish(
    redis: &mut redis::aio::MultiplexedConnection,
    streams: &Streams,
    plan: &[Command],
    args: &BrokerArgs,
) -> anyhow::Result<Publications> {
    let pause = Duration::from_secs_f64(1.0 / args.publish_per_s.max(1) as f64);
    let mut published: Vec<Published> = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    // The unreadable entries, spread evenly among the commands.
    let unreadable_after: Vec<usize> = (1..=args.unreadable)
        .map(|k| k * plan.len() / (args.unreadable + 1))
        .collect();
    let mut publications = 0;
    let mut unreadable = 0;
    for (n, command) in plan.iter().enumerate() {
        let entry: String = command.publication(streams).query_async(redis).await?;
        publications += 1;
        if !seen.contains_key(&command.command_id) {
            seen.insert(command.command_id.clone(), published.len());
            published.push(Published {
                command: command.clone(),
                first_entry: entry,
            });
        }
        if unreadable_after.contains(&n) {
            // An entry no consumer can read: the amount is not a number.
            let _: String = redis::cmd("XADD")
                .arg(streams.stream_for(command.from))
                .arg("*")
                .arg("command_id")
                .arg(new_command_id())
                .arg("issuer")
                .arg("sim-payroll")
                .arg("from_wallet_id")
                .arg(command.from.0.to_string())
                .arg("to_wallet_id")
                .arg(command.to.0.to_string())
                .arg("amount_minor")
                .arg("ten")
                .query_async(redis)
                .await?;
            publications += 1;
            unreadable += 1;
        }
        tokio::time::sleep(pause).await;
    }
    Ok(Publications {
        published,
        publications,
        unreadable,
    })
}

/// What the instances counted of the layers' work.
#[derive(Default)]
struct Counted {
    claims: f64,
    inbox_replays: f64,
}

impl Counted {
    const CLAIMS: &str = "wallet_commands_claimed_total";
    const INBOX_REPLAYS: &str =
        "wallet_decisions_total{entry_point=\"command\",layer=\"inbox\",outcome=\"replayed\"}";

    /// One instance's counts, or (`None`) all of theirs.
    async fn read(servers: &Instances, instance: Option<usize>) -> Self {
        match instance {
            Some(index) => Self {
                claims: servers.counter_of(index, Self::CLAIMS).await,
                inbox_replays: servers.counter_of(index, Self::INBOX_REPLAYS).await,
            },
            None => Self {
                claims: servers.counter(Self::CLAIMS).await,
                inbox_replays: servers.counter(Self::INBOX_REPLAYS).await,
            },
        }
    }
}

/// Kills and stalls, spread over the publishing time; returns what the
/// killed instances had counted.
async fn faults(servers: &Mutex<Instances>, args: &BrokerArgs) -> anyhow::Result<Counted> {
    let mut counted = Counted::default();
    let publishing = Duration::from_secs_f64(args.commands as f64 / args.publish_per_s.max(1) as f64);
    let faults = args.kills + args.stalls;
    if faults == 0 {
        return Ok(counted);
    }
    let spacing = publishing / u32::try_from(faults + 1)?;
    let stall = Duration::from_millis(2 * args.claim_idle_ms);
    // Kills and stalls take turns while both last.
    let turns = (0..args.kills.max(args.stalls)).flat_map(|n| {
        [
            (n < args.kills).then_some(true),
            (n < args.stalls).then_some(false),
        ]
        .into_iter()
        .flatten()
    });
    for kill in turns {
        tokio::time::sleep(spacing).await;
        let mut servers = servers.lock().await;
        let victim = rand::thread_rng().gen_range(0..servers.len());
        if kill {
            eprintln!("kill -9 instance {victim}, then start it again");
            let before = Counted::read(&servers, Some(victim)).await;
            counted.claims += before.claims;
            counted.inbox_replays += before.inbox_replays;
            servers.kill(victim)?;
            servers.restart(victim).await?;
        } else {
            eprintln!("stall instance {victim} for {} ms", stall.as_millis());
            servers.stall(victim)?;
            tokio::time::sleep(stall).await;
            servers.resume(victim)?;
        }
    }
    Ok(counted)
}

/// Waits, `settle_s` at most, until every command has an outcome and the
/// streams hold nothing.
pub async fn settle(
    db: &PgPool,
    redis: &mut redis::aio::MultiplexedConnection,
    streams: &Streams,
    published: &[Published],
    settle_s: u64,
) -> anyhow::Result<()> {
    let ids: Vec<&str> = published.iter().map(|p| p.command.command_id.as_str()).collect();
    let deadline = Instant::now() + Duration::from_secs(settle_s);
    loop {
        let decided: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM inbox WHERE source = 'broker' AND event_id = ANY($1) AND verdict IS NOT NULL",
        )
        .bind(&ids)
        .fetch_one(db)
        .await?;
        let (left, pending) = stream_backlog(redis, streams).await?;
        if decided == i64::try_from(ids.len())? && left == 0 && pending == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "after {} s, {} of {} commands have an outcome; {left} entries are left in the streams, {pending} \
                 of them delivered and not acknowledged",
                settle_s,
                decided,
                ids.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Entries still in the partition streams, and those delivered but not
/// acknowledged.
async fn stream_backlog(
    redis: &mut redis::aio::MultiplexedConnection,
    streams: &Streams,
) -> anyhow::Result<(i64, i64)> {
    let (mut left, mut pending) = (0, 0);
    for partition in 0..streams.partitions() {
        let stream = streams.stream(partition);
        left += redis::cmd("XLEN").arg(&stream).query_async::<i64>(redis).await?;
        let summary: redis::Value = redis::cmd("XPENDING")
            .arg(&stream)
            .arg(GROUP)
            .query_async(redis)
            .await
            .unwrap_or(redis::Value::Nil);
        if let redis::Value::Array(fields) = summary
            && let Some(redis::Value::Int(count)) = fields.first()
        {
            pending += count;
        }
    }
    Ok((left, pending))
}

/// What the commands came to, besides the checks.
#[derive(Debug, Default)]
pub struct Settled {
    /// Outcomes stored in the inbox, by verdict.
    pub outcomes: Vec<(String, i64)>,
    pub dead_letters: i64,
}

/// The checks of the commands `published` (and `unreadable` entries that
/// are not commands) among `accounts`, whose balances were `opening`
/// before the first and which no other money reached since.
#[allow(clippy::too_many_arguments)]
pub async fn check_commands(
    db: &PgPool,
    redis: &mut redis::aio::MultiplexedConnection,
    streams: &Streams,
    accounts: &[Account],
    opening: &[i64],
    published: &[Published],
    unreadable: usize,
    checks: &mut Checks,
) -> anyhow::Result<Settled> {
    let ids: Vec<&str> = published.iter().map(|p| p.command.command_id.as_str()).collect();
    let froms: Vec<Uuid> = published.iter().map(|p| p.command.from.0).collect();
    let tos: Vec<Uuid> = published.iter().map(|p| p.command.to.0).collect();
    let amounts: Vec<i64> = published.iter().map(|p| p.command.amount_minor).collect();
    let entries: Vec<&str> = published.iter().map(|p| p.first_entry.as_str()).collect();
    let outcomes = sqlx::query_as(
        "SELECT verdict, count(*) FROM inbox WHERE source = 'broker' AND event_id = ANY($1)
         GROUP BY verdict ORDER BY verdict",
    )
    .bind(&ids)
    .fetch_all(db)
    .await?;

    // Each command against its inbox row and the transfer the row names.
    let (missing, wrong_transfer, applied_without_transfer, dead_lettered): (i64, i64, i64, i64) =
        sqlx::query_as(
            "SELECT count(*) FILTER (WHERE i.verdict IS NULL),
                    count(*) FILTER (WHERE i.transfer_id IS NOT NULL AND (t.id IS NULL OR t.from_wallet_id <> c.source
                        OR t.to_wallet_id <> c.target OR t.amount_minor <> c.amount)),
                    count(*) FILTER (WHERE i.verdict = 'applied' AND i.transfer_id IS NULL),
                    count(*) FILTER (WHERE i.verdict = 'dead_lettered')
             FROM unnest($1::text[], $2::uuid[], $3::uuid[], $4::bigint[])
                  AS c(command_id, source, target, amount)
             LEFT JOIN inbox i ON i.source = 'broker' AND i.event_id = c.command_id
             LEFT JOIN transfers t ON t.id = i.transfer_id",
        )
        .bind(&ids)
        .bind(&froms)
        .bind(&tos)
        .bind(&amounts)
        .fetch_one(db)
        .await?;
    checks.add("commands without an outcome", missing);
    checks.add("transfers that are not their command's", wrong_transfer);
    checks.add("commands applied without a transfer", applied_without_transfer);
    checks.add("readable commands dead-lettered", dead_lettered);

    // Every transfer between the run's wallets, against the applied commands.
    let wallets: Vec<Uuid> = accounts.iter().map(|account| account.wallet_id).collect();
    let (transfers, applied): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM transfers WHERE from_wallet_id = ANY($1) AND to_wallet_id = ANY($1)),
                (SELECT count(*) FROM inbox WHERE source = 'broker' AND event_id = ANY($2) AND verdict = 'applied')",
    )
    .bind(&wallets)
    .bind(&ids)
    .fetch_one(db)
    .await?;
    checks.add("transfers beyond one per applied command", transfers - applied);

    // One wallet's commands apply in the order they were published.
    let order: Vec<(Uuid, String, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT c.source, c.entry, t.created_at
         FROM unnest($1::text[], $2::uuid[], $3::text[]) AS c(command_id, source, entry)
         JOIN inbox i ON i.source = 'broker' AND i.event_id = c.command_id
         JOIN transfers t ON t.id = i.transfer_id",
    )
    .bind(&ids)
    .bind(&froms)
    .bind(&entries)
    .fetch_all(db)
    .await?;
    checks.add(
        "commands of one wallet applied out of publication order",
        out_of_order(order),
    );

    let (left, pending) = stream_backlog(redis, streams).await?;
    checks.add("entries left in the partition streams", left);
    checks.add("entries delivered and never acknowledged", pending);
    let settled = Settled {
        outcomes,
        dead_letters: redis::cmd("XLEN")
            .arg(streams.dead_letters())
            .query_async::<i64>(redis)
            .await?,
    };
    checks.add(
        "unreadable entries not dead-lettered",
        i64::try_from(unreadable)? - settled.dead_letters,
    );

    let now = accounts::balances(db, accounts).await?;
    checks.add(
        "money created or destroyed among the run's wallets (minor units)",
        now.iter().sum::<i64>() - opening.iter().sum::<i64>(),
    );
    let users: Vec<Uuid> = accounts.iter().map(|account| account.user_id).collect();
    checks.money_invariants(db, &users).await?;
    Ok(settled)
}

/// Applied commands whose transfer is older than that of a command from
/// the same wallet published before them.
fn out_of_order(mut applied: Vec<(Uuid, String, chrono::DateTime<chrono::Utc>)>) -> i64 {
    let entry_order = |entry: &str| -> (u64, u64) {
        let (ms, seq) = entry.split_once('-').unwrap_or((entry, "0"));
        (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
    };
    applied.sort_by(|a, b| a.0.cmp(&b.0).then(entry_order(&a.1).cmp(&entry_order(&b.1))));
    applied
        .windows(2)
        .filter(|pair| pair[0].0 == pair[1].0 && pair[1].2 < pair[0].2)
        .count() as i64
}

pub fn print(report: &Report) {
    println!();
    println!(
        "Broker run: {} commands ({} publications with duplicates and unreadable entries) over {} partitions and \
         {} instances; {} consumers killed, {} stalled past the claim time; settled in {:.1} s",
        report.commands,
        report.publications,
        report.partitions,
        report.instances,
        report.kills,
        report.stalls,
        report.seconds_to_settle
    );
    println!();
    println!("| outcome | commands |");
    println!("|---|---|");
    for (verdict, count) in &report.outcomes {
        println!("| {verdict} | {count} |");
    }
    println!(
        "| dead-lettered (entries that are not commands) | {} of {} |",
        report.dead_letters, report.unreadable
    );
    println!();
    println!(
        "Entries claimed from a consumer past its claim time: {}; deliveries of a command already decided, \
         answered by the inbox: {}.",
        report.claims, report.inbox_replays
    );
    println!();
    report.checks.print();
}
