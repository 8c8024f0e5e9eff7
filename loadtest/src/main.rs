//! `wallet-loadtest run <scenario>` and `wallet-loadtest demo`; see the
//! library's documentation and `--help`.

use clap::{Parser, Subcommand};
use wallet_loadtest::{
    RunArgs, commands, demo, deposits, payouts, pg_wire, print_findings, report, run, variants, verdict,
};

#[derive(Parser)]
#[command(
    name = "wallet-loadtest",
    version,
    about = "Prove Layered Wallet's invariants under load, and measure it"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one scenario against running instances.
    Run(RunArgs),
    /// Start instances in each configuration of the defense ladder, run the
    /// duplicate and race scenarios against each, and print what went wrong.
    Demo(demo::DemoArgs),
    /// Start instances with each common alternative to a layer in turn
    /// (`SELECT … FOR UPDATE`, optimistic versions, an advisory lock, a
    /// Redis lock, the naive ones, the cooldown), fire the same bursts and
    /// contention at each, and print the damage and the cost side by side.
    Variants(variants::VariantsArgs),
    /// Measure payouts against running instances and their gateway: how
    /// fast they are accepted, how fast the outbox sends them, and how
    /// fast the gateway alone takes them.
    Payouts(payouts::PayoutArgs),
    /// Measure deposits against running instances: signed first
    /// deliveries of new events, credited per second.
    Deposits(deposits::DepositArgs),
    /// Measure the command consumers of running instances: publish a
    /// backlog of transfer commands and time until every one has its
    /// outcome.
    Commands(commands::CommandArgs),
    /// Stand between a server and PostgreSQL and count the round trips it
    /// makes, on the wire (for the benchmark's cost per transfer).
    PgWire(pg_wire::WireArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let ok = match cli.command {
        Command::Run(args) => {
            let report = run(&args).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                report::print_table(&args.scenario.name(), &report.summary);
                print_findings(report.invariants.as_ref());
            }
            verdict(report.invariants.as_ref(), args.expect_violations)
        }
        Command::Demo(args) => demo::run(&args).await?,
        Command::Variants(args) => variants::run(&args).await?,
        Command::PgWire(args) => {
            pg_wire::serve(&args).await?;
            true
        }
        Command::Payouts(args) => {
            let report = payouts::run(&args).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                payouts::print(&report);
            }
            report.complete()
        }
        Command::Deposits(args) => {
            let report = deposits::run(&args).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                deposits::print(&report);
            }
            report.credited.succeeded > 0
        }
        Command::Commands(args) => {
            let report = commands::run(&args).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                commands::print(&report);
            }
            report.left == 0
        }
    };
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
