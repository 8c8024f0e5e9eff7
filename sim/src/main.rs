//! `wallet-sim provider` and `wallet-sim broker`; see `--help`.

use clap::{Parser, Subcommand};
use wallet_sim::{broker_run, gateway, payout_run, provider_run};

#[derive(Parser)]
#[command(
    name = "wallet-sim",
    version,
    about = "A payment provider and a broker that misbehave on purpose, and the database's verdict"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Deliver deposit webhooks with storms, impatient retries, changed
    /// payloads and late duplicates, then check every event was credited
    /// exactly once.
    Provider(provider_run::ProviderArgs),
    /// Publish transfer commands with duplicates while consumers are killed
    /// and stalled, then check every command was applied at most once, and
    /// exactly once when acknowledged.
    Broker(broker_run::BrokerArgs),
    /// Serve as a bank gateway: payouts deduplicated by Idempotency-Key,
    /// with latency, failures, lost answers, crashes and refusals on
    /// purpose, and a ledger of every sending in its own database.
    Gateway(gateway::GatewayArgs),
    /// Pay money out through instances and a gateway that lose answers,
    /// fail, crash and are killed, then reconcile, then check that every
    /// payout was sent at most once, every settled one exactly once, and
    /// money conserved.
    Payouts(payout_run::PayoutArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let passed = match Cli::parse().command {
        Command::Provider(args) => {
            let report = provider_run::run(&args).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                provider_run::print(&report);
            }
            report.checks.passed()
        }
        Command::Gateway(args) => {
            // Serves until the process ends; the checks are its callers'.
            gateway::serve(args).await?;
            true
        }
        Command::Payouts(args) => {
            let report = payout_run::run(&args).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                payout_run::print(&report);
            }
            report.checks.passed()
        }
        Command::Broker(args) => {
            let report = broker_run::run(&args).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                broker_run::print(&report);
            }
            report.checks.passed()
        }
    };
    if !passed {
        eprintln!("a check failed: see the table");
        std::process::exit(1);
    }
    Ok(())
}
