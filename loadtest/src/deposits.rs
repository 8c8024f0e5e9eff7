//! `wallet-loadtest deposits`: how fast the instances credit a payment
//! provider's deposit webhooks. Closed-loop workers deliver signed events,
//! each a new event id into one of the users' wallets, as a provider's
//! first deliveries would arrive, for the duration: 200s per second and
//! their latency. The duplicates' side is the simulator's (`wallet-sim
//! provider`); this measures the cost of the layers on the first delivery.

use std::sync::Arc;
use std::time::Duration;

use secrecy::SecretString;
use serde::Serialize;
use wallet_client::RetryPolicy;
use wallet_sim::provider::{DepositEvent, Provider};

use crate::closed_loop::{self, Load, Tally};

#[derive(clap::Args, Clone)]
pub struct DepositArgs {
    /// Base URL of an instance; repeat to spread deliveries across several.
    #[arg(long = "target", default_value = "http://127.0.0.1:8080")]
    pub targets: Vec<String>,
    /// One of the instances' `provider_webhook_secrets`, to sign with.
    #[arg(long, env = "LOADTEST_PROVIDER_SECRET", hide_env_values = true)]
    pub provider_secret: String,
    /// The instances' currency.
    #[arg(long, default_value = "USD")]
    pub currency: String,
    /// The accounts the deposits go to, the workers, the duration.
    #[command(flatten)]
    pub load: Load,
    /// How long one delivery waits for its answer.
    #[arg(long, default_value_t = 30_000)]
    pub answer_wait_ms: u64,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
pub struct DepositReport {
    /// The 200s (credited), and the other answers by status.
    pub credited: Tally,
}

pub async fn run(args: &DepositArgs) -> anyhow::Result<DepositReport> {
    let people = closed_loop::sign_up(&args.targets, args.load.users).await?;
    let wallets: Arc<Vec<uuid::Uuid>> = Arc::new(people.iter().map(|person| person.wallet_id).collect());
    let provider = Provider::new(
        args.targets.clone(),
        SecretString::from(args.provider_secret.clone()),
        RetryPolicy::default(),
    )?;
    let (currency, answer_wait) = (args.currency.clone(), Duration::from_millis(args.answer_wait_ms));
    let credited = closed_loop::run(args.load.concurrency, args.load.duration(), 200, {
        move |n: usize| {
            let (provider, wallets, currency) = (provider.clone(), wallets.clone(), currency.clone());
            async move {
                let event = DepositEvent::new(wallets[n % wallets.len()], 1, &currency);
                provider
                    .deliver_once(n, &event, answer_wait)
                    .await
                    .status
                    .unwrap_or(0)
            }
        }
    })
    .await?;
    Ok(DepositReport { credited })
}

pub fn print(report: &DepositReport) {
    let credited = &report.credited;
    println!(
        "deposits credited: {} ({:.0}/s, p50 {:.1} ms, p99 {:.1} ms; other answers {:?})",
        credited.succeeded, credited.per_s, credited.p50_ms, credited.p99_ms, credited.other_answers
    );
}
