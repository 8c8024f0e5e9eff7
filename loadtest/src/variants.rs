//! `wallet-loadtest variants`: the common alternatives to each layer, side
//! by side. Starts instances with each alternative in turn, fires the same
//! bursts and the same contention at each, and prints the damage each let
//! through and what each cost.
//!
//! Each alternative runs twice: once for the bursts, with the demonstration
//! modes' gap (`naive_window_ms`) widened so that a race that can happen
//! does, and once under load, with no gap, so that its cost is its own.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use wallet_sim::instances::{Instances, Spec};

use crate::demo::demonstration_spec;
use crate::scenarios::Scenario;
use crate::{RunArgs, RunReport, report};

#[derive(clap::Args)]
pub struct VariantsArgs {
    /// The wallet-server binary (default: next to this one).
    #[arg(long)]
    server_bin: Option<std::path::PathBuf>,
    /// The database the instances use (they migrate it); also read for the
    /// invariants and the write transactions, so nothing else should write
    /// to its server during the run.
    #[arg(long, env = "LOADTEST_DATABASE_URL")]
    database_url: String,
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// Instances per alternative.
    #[arg(long, default_value_t = 2)]
    instances: usize,
    /// Bursts: rounds of each, each with a fresh pair of users.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Bursts: simultaneous requests per round.
    #[arg(long, default_value_t = 20)]
    copies: usize,
    /// Under load: closed-loop workers.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Under load: users taking part.
    #[arg(long, default_value_t = 32)]
    users: usize,
    /// Under load: how long each scenario runs.
    #[arg(long, default_value_t = 5.0)]
    duration_s: f64,
    /// Attempts per request, as the client library retries (409, 429, 503).
    #[arg(long, default_value_t = 6)]
    attempts_max: u32,
    /// Print the tables as JSON.
    #[arg(long)]
    json: bool,
}

/// One way to do a layer, with the others as the service does them.
struct Variant {
    name: &'static str,
    cooldown: bool,
    idempotency: &'static str,
    row_guard: &'static str,
    /// `transfers_batch_max`: how many waiting transfers one call may
    /// carry (the demonstration modes run one at a time whatever it is).
    batch_max: u32,
    /// A naive mode, expected to let damage through.
    naive: bool,
}

/// The service's default `transfers_batch_max`.
const BATCHED: u32 = 16;

const VARIANTS: [Variant; 9] = [
    Variant {
        name: "conditional UPDATE, insert-first claim (the service's, no cooldown)",
        cooldown: false,
        idempotency: "atomic",
        row_guard: "guarded",
        batch_max: BATCHED,
        naive: false,
    },
    Variant {
        name: "the same, one transfer per call (transfers_batch_max = 1)",
        cooldown: false,
        idempotency: "atomic",
        row_guard: "guarded",
        batch_max: 1,
        naive: false,
    },
    Variant {
        name: "balance: SELECT … FOR UPDATE",
        cooldown: false,
        idempotency: "atomic",
        row_guard: "for_update",
        batch_max: BATCHED,
        naive: false,
    },
    Variant {
        name: "balance: optimistic version",
        cooldown: false,
        idempotency: "atomic",
        row_guard: "optimistic_version",
        batch_max: BATCHED,
        naive: false,
    },
    Variant {
        name: "balance: read-decide-write (naive)",
        cooldown: false,
        idempotency: "atomic",
        row_guard: "read_decide_write",
        batch_max: BATCHED,
        naive: true,
    },
    Variant {
        name: "key: advisory lock on its hash",
        cooldown: false,
        idempotency: "advisory_lock",
        row_guard: "guarded",
        batch_max: BATCHED,
        naive: false,
    },
    Variant {
        name: "key: Redis lock",
        cooldown: false,
        idempotency: "redis_key_lock",
        row_guard: "guarded",
        batch_max: BATCHED,
        naive: false,
    },
    Variant {
        name: "key: check-then-insert (naive)",
        cooldown: false,
        idempotency: "check_then_insert",
        row_guard: "guarded",
        batch_max: BATCHED,
        naive: true,
    },
    Variant {
        name: "edge: + cooldown (all three layers)",
        cooldown: true,
        idempotency: "atomic",
        row_guard: "guarded",
        batch_max: BATCHED,
        naive: false,
    },
];

const BURSTS: [Scenario; 5] = [
    Scenario::Storm,
    Scenario::BuggyClient,
    Scenario::NoKey,
    Scenario::Overdraw,
    Scenario::Cross,
];

const UNDER_LOAD: [Scenario; 2] = [Scenario::HotWallet, Scenario::HotPayer];

/// Each user's grant: enough for a hot payer's run.
const GRANT_MINOR: i64 = 1_000_000;

/// How many of an `overdraw` burst the grant covers: each of its transfers
/// sends this share of it.
const OVERDRAW_PAYS_MAX: i64 = 4;

/// The cooldown's window in these runs: short, so that the retries it
/// sends back (after `Retry-After`) fit in a run.
const COOLDOWN_TTL_MS: u64 = 1_000;

/// The gap the demonstration modes widen in the bursts (a pause between a
/// read and the write it decides): long enough that every race that can
/// happen does.
const BURST_GAP_MS: u64 = 50;

/// What an alternative let through, from the database, over all its runs.
#[derive(Serialize, Default)]
struct Damage {
    variant: &'static str,
    /// Keys that paid more than once (`storm`).
    keys_paid_twice: i64,
    /// Transfers beyond one per round when every copy has its own key
    /// (`buggy-client`): only the cooldown can tell these apart.
    buggy_client_double_pays: i64,
    /// Transfers beyond one per round of keyless copies (`no-key`).
    keyless_double_pays: i64,
    /// Transfers beyond what the balance allowed (`overdraw`).
    overdrafts: i64,
    /// Money created or destroyed, every run.
    money_created_minor: i64,
    /// Wallets whose balance is not their grant plus their ledger: a write
    /// that overwrote another's.
    lost_updates: i64,
    /// Attempts answered 5xx, every run.
    server_errors: u64,
}

impl Damage {
    /// Damage that no layer of this alternative's kind may let through:
    /// everything but the duplicates that only the cooldown can catch.
    fn beyond_what_only_the_cooldown_stops(&self) -> i64 {
        self.keys_paid_twice
            + self.overdrafts
            + self.money_created_minor.abs()
            + self.lost_updates
            + self.server_errors as i64
    }
}

/// What an alternative cost in one run, or over its bursts.
#[derive(Serialize)]
struct Cost {
    variant: &'static str,
    scenario: String,
    requests: u64,
    accepted_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// Attempts answered 409: a key in flight or a version conflict.
    conflict_answers: u64,
    retries_per_request: f64,
    /// Requests that ended without a final answer: still in flight, in
    /// conflict or early after their last attempt (keyless ones are never
    /// retried), or unanswered.
    gave_up: u64,
    /// PostgreSQL transaction ids handed out: one per transaction that
    /// wrote, committed or rolled back, and one per subtransaction that
    /// wrote (a PL/pgSQL block that catches an error).
    transaction_ids_per_request: f64,
}

pub async fn run(args: &VariantsArgs) -> anyhow::Result<bool> {
    let server = wallet_sim::instances::server_binary(args.server_bin.as_deref())?;
    let mut damages = Vec::new();
    let mut costs = Vec::new();
    for variant in &VARIANTS {
        if !args.json {
            eprintln!("alternative: {}", variant.name);
        }
        let mut damage = Damage {
            variant: variant.name,
            ..Damage::default()
        };
        let instances = Instances::start(spec(&server, args, variant, BURST_GAP_MS), args.instances).await?;
        let mut bursts = Vec::new();
        for scenario in BURSTS {
            let report = crate::run(&burst_args(scenario, &instances.urls(), args)).await?;
            count_damage(&mut damage, scenario, &report, args)?;
            bursts.push(report);
        }
        drop(instances);
        costs.push(cost_of(variant.name, "bursts".to_owned(), &bursts));

        let instances = Instances::start(spec(&server, args, variant, 0), args.instances).await?;
        for scenario in UNDER_LOAD {
            let report = crate::run(&load_args(scenario, &instances.urls(), args)).await?;
            count_damage(&mut damage, scenario, &report, args)?;
            costs.push(cost_of(
                variant.name,
                scenario.name(),
                std::slice::from_ref(&report),
            ));
        }
        damages.push(damage);
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "damage": damages, "costs": costs }))?
        );
    } else {
        print_damage(&damages, args);
        print_costs(&costs, args);
    }
    // The run shows what it should when every alternative that claims a
    // guarantee kept it, and each naive one let damage through.
    Ok(VARIANTS.iter().zip(&damages).all(|(variant, damage)| {
        let beyond = damage.beyond_what_only_the_cooldown_stops();
        match variant.naive {
            true => beyond > 0,
            false => beyond == 0,
        }
    }))
}

fn count_damage(
    damage: &mut Damage,
    scenario: Scenario,
    report: &RunReport,
    args: &VariantsArgs,
) -> anyhow::Result<()> {
    let findings = report
        .invariants
        .as_ref()
        .context("every run checks the invariants")?;
    let beyond = |allowed: usize| (findings.new_transfers - allowed as i64).max(0);
    match scenario {
        Scenario::Storm => damage.keys_paid_twice += findings.keys_paid_more_than_once,
        Scenario::BuggyClient => damage.buggy_client_double_pays += beyond(args.rounds),
        Scenario::NoKey => damage.keyless_double_pays += beyond(args.rounds),
        Scenario::Overdraw => damage.overdrafts += beyond(OVERDRAW_PAYS_MAX as usize * args.rounds),
        _ => {}
    }
    damage.money_created_minor += findings.money_created_minor;
    damage.lost_updates += findings.unexplained_balances;
    damage.server_errors += report.summary.server_error_answers;
    Ok(())
}

/// The costs of one or more runs of one alternative, taken together.
fn cost_of(variant: &'static str, scenario: String, reports: &[RunReport]) -> Cost {
    let samples: Vec<_> = reports.iter().flat_map(|r| r.samples.iter().cloned()).collect();
    let elapsed = reports.iter().map(|r| r.summary.elapsed_s).sum::<f64>();
    let summary = report::summarize(&samples, Duration::from_secs_f64(elapsed));
    let requests = summary.requests.max(1) as f64;
    let written: i64 = reports
        .iter()
        .filter_map(|r| r.costs.as_ref()?.pg_transaction_ids)
        .sum();
    Cost {
        variant,
        scenario,
        requests: summary.requests,
        accepted_per_s: summary.accepted_per_s,
        p50_ms: summary.p50_ms,
        p99_ms: summary.p99_ms,
        conflict_answers: summary.conflict_answers,
        retries_per_request: (summary.attempts - summary.requests) as f64 / requests,
        gave_up: summary.gave_up,
        transaction_ids_per_request: written as f64 / requests,
    }
}

fn burst_args(scenario: Scenario, targets: &[String], args: &VariantsArgs) -> RunArgs {
    RunArgs {
        rounds: args.rounds,
        copies: args.copies,
        amount_minor: (scenario == Scenario::Overdraw).then_some(GRANT_MINOR / OVERDRAW_PAYS_MAX),
        ..common_args(scenario, targets, args)
    }
}

fn load_args(scenario: Scenario, targets: &[String], args: &VariantsArgs) -> RunArgs {
    RunArgs {
        users: args.users,
        concurrency: args.concurrency,
        duration_s: args.duration_s,
        ..common_args(scenario, targets, args)
    }
}

fn common_args(scenario: Scenario, targets: &[String], args: &VariantsArgs) -> RunArgs {
    RunArgs {
        signup_grant_minor: GRANT_MINOR,
        attempts_max: args.attempts_max,
        count_transaction_ids: true,
        ..RunArgs::new(scenario, targets.to_vec(), Some(args.database_url.clone()))
    }
}

/// An alternative's instances, with the demonstration modes' gap.
fn spec(server: &Path, args: &VariantsArgs, variant: &Variant, gap_ms: u64) -> Spec {
    demonstration_spec(
        Spec::new(server.to_owned(), &args.database_url, &args.redis_url, "variants"),
        GRANT_MINOR,
    )
    .with("WALLET_COOLDOWN_ENABLED", variant.cooldown)
    .with("WALLET_COOLDOWN_TTL_MS", COOLDOWN_TTL_MS)
    .with("WALLET_IDEMPOTENCY_MODE", variant.idempotency)
    .with("WALLET_ROW_GUARD_MODE", variant.row_guard)
    .with("WALLET_NAIVE_WINDOW_MS", gap_ms)
    .with("WALLET_TRANSFERS_BATCH_MAX", variant.batch_max)
}

fn print_damage(rows: &[Damage], args: &VariantsArgs) {
    println!();
    println!(
        "What each alternative let through: {} instances; per burst {} rounds of {} simultaneous requests; \
         then {} workers for {} s on one hot wallet and on one hot payer",
        args.instances, args.rounds, args.copies, args.concurrency, args.duration_s
    );
    println!();
    println!(
        "| variant | keys paid twice (storm) | double pays, a new key per copy (buggy-client) | double pays, no key (no-key) | overdrafts (overdraw) | money created (minor units) | lost updates (wallets off their ledger) | 5xx answers |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for row in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            row.variant,
            row.keys_paid_twice,
            row.buggy_client_double_pays,
            row.keyless_double_pays,
            row.overdrafts,
            row.money_created_minor,
            row.lost_updates,
            row.server_errors
        );
    }
}

fn print_costs(rows: &[Cost], args: &VariantsArgs) {
    println!();
    println!(
        "What each alternative cost: every request's whole time, retries included (at most {} attempts)",
        args.attempts_max
    );
    println!();
    println!(
        "| alternative | run | requests | accepted per s | p50 ms | p99 ms | 409 answers | retries per request | gave up | PostgreSQL transaction ids per request |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        println!(
            "| {} | {} | {} | {:.0} | {:.1} | {:.1} | {} | {:.2} | {} | {:.2} |",
            row.variant,
            row.scenario,
            row.requests,
            row.accepted_per_s,
            row.p50_ms,
            row.p99_ms,
            row.conflict_answers,
            row.retries_per_request,
            row.gave_up,
            row.transaction_ids_per_request
        );
    }
}
