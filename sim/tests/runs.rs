//! Short runs of both simulators against `wallet-server` processes they
//! start themselves, on a database of their own, each ending in the
//! database's verdict; and the provider finding the double credits of a
//! naive inbox, so that its checks are known to see them.

use std::path::PathBuf;

use wallet_sim::broker_run::{self, BrokerArgs};
use wallet_sim::instances::Stores;
use wallet_sim::payout_run::{self, PayoutArgs};
use wallet_sim::provider_run::{self, ProviderArgs, SignatureScheme};
use wallet_testkit::{create_database, database_url_of, drop_database, redis_url};

/// The `wallet-server` the workspace's tests build next to this test's
/// directory (`target/debug/`).
fn server_binary() -> PathBuf {
    let server = std::env::current_exe()
        .expect("the test's path")
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/debug")
        .join("wallet-server");
    assert!(
        server.exists(),
        "no wallet-server at {}: run the workspace's tests (./scripts/test), which build it",
        server.display()
    );
    server
}

fn stores(database: &sqlx::postgres::PgConnectOptions) -> Stores {
    Stores {
        server_bin: Some(server_binary()),
        database_url: database_url_of(database),
        redis_url: redis_url(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_misbehaving_provider_gets_every_event_credited_exactly_once() {
    let (name, options) = create_database().await;
    let args = ProviderArgs {
        stores: stores(&options),
        instances: 2,
        accounts: 5,
        events: 40,
        copies: 8,
        concurrency: 8,
        impatient_timeout_ms: 2,
        backoff_base_ms: 10,
        event_lock: false,
        inbox: "atomic".into(),
        // Standard Webhooks here; the naive run below signs with ours.
        scheme: SignatureScheme::StandardWebhooks,
        json: false,
    };
    let report = provider_run::run(&args).await.expect("the run");
    assert!(report.checks.passed(), "{:#?}", report.checks);
    assert_eq!(report.events, 40);
    // Every misbehaviour happened: duplicates reached the inbox, and each
    // changed payload was refused there.
    let decided = |name: &str| {
        report
            .by_decision
            .iter()
            .find(|(decision, _)| decision == name)
            .map_or(0, |(_, count)| *count)
    };
    assert!(decided("inbox/replayed") > 40, "{:?}", report.by_decision);
    assert_eq!(decided("inbox/payload_changed"), 10, "{:?}", report.by_decision);

    // The same provider against a naive inbox: its checks see the damage.
    let naive = provider_run::run(&ProviderArgs {
        events: 8,
        inbox: "check_then_insert".into(),
        scheme: SignatureScheme::ProviderSignature,
        ..args.clone()
    })
    .await
    .expect("the naive run");
    assert!(!naive.checks.passed());
    let extra_credits = naive
        .checks
        .0
        .iter()
        .find(|check| check.what == "credits beyond one per event")
        .expect("the check")
        .found;
    assert!(extra_credits > 0, "{:#?}", naive.checks);
    drop_database(&name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commands_survive_killed_and_stalled_consumers_applied_at_most_once() {
    let (name, options) = create_database().await;
    let args = BrokerArgs {
        stores: stores(&options),
        instances: 3,
        accounts: 8,
        grant_minor: 20_000,
        commands: 300,
        duplicate_every: 5,
        unreadable: 2,
        partitions: 2,
        claim_idle_ms: 500,
        publish_per_s: 200,
        kills: 1,
        stalls: 1,
        settle_s: 60,
        json: false,
    };
    let report = broker_run::run(&args).await.expect("the run");
    assert!(report.checks.passed(), "{:#?}", report.checks);
    assert_eq!(report.commands, 300);
    assert_eq!(report.dead_letters, 2);
    let decided: i64 = report.outcomes.iter().map(|(_, count)| count).sum();
    assert_eq!(decided, 300, "{:?}", report.outcomes);
    drop_database(&name).await;
}

async fn payout_run(mode: &str) -> (wallet_sim::payout_run::Report, String, String) {
    let (name, options) = create_database().await;
    let (gateway_name, gateway_options) = create_database().await;
    let args = PayoutArgs {
        stores: stores(&options),
        gateway_bin: Some(env!("CARGO_BIN_EXE_wallet-sim").into()),
        gateway_database_url: database_url_of(&gateway_options),
        instances: 2,
        accounts: 6,
        payouts: 60,
        refused_every: 10,
        lose_answer_rate: 0.3,
        failure_rate: 0.3,
        crash_after_send_rate: 0.02,
        kills: 1,
        call_timeout_ms: 300,
        lease_ms: 1_000,
        attempts_max: 3,
        payout_mode: mode.to_owned(),
        settle_s: 60,
        json: false,
    };
    (payout_run::run(&args).await.expect("the run"), name, gateway_name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn payouts_through_a_misbehaving_gateway_are_each_sent_at_most_once_and_settled_ones_exactly_once() {
    let (report, name, gateway_name) = payout_run("outbox").await;
    payout_run::print(&report);
    assert!(report.checks.passed(), "{:?}", report.checks);
    assert_eq!(report.payouts, 60);
    let finished: i64 = report.states.iter().map(|(_, count)| count).sum();
    assert_eq!(finished, 60);
    assert!(
        report.unknown_outcomes > 0.0,
        "the gateway lost answers and failed, on purpose"
    );
    drop_database(&name).await;
    drop_database(&gateway_name).await;
}

/// The checks see a double sending when there is one: with a new key per
/// attempt, a lost answer's retry is a second payment.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_payout_checks_find_the_double_sendings_of_a_new_key_per_attempt() {
    let (report, name, gateway_name) = payout_run("new_key_per_attempt").await;
    let sent_twice = report
        .checks
        .0
        .iter()
        .find(|check| check.what == "payouts the gateway sent more than once")
        .expect("the check");
    assert!(sent_twice.found > 0, "{:?}", report.checks);
    drop_database(&name).await;
    drop_database(&gateway_name).await;
}
