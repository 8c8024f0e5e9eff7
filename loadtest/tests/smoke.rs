//! A short run of every scenario against two instances on one database and
//! one Redis, asserting the invariants (never timings); and the same tool
//! finding the violations of an unsafe configuration.

use layered_wallet::settings::{IdempotencyMode, RowGuardMode, Settings};
use wallet_loadtest::scenarios::Scenario;
use wallet_loadtest::{RunArgs, run, verdict};
use wallet_testkit::*;

fn args(scenario: Scenario, first: &TestApp, second: &TestApp) -> RunArgs {
    RunArgs {
        rounds: 2,
        copies: 12,
        users: 6,
        concurrency: 4,
        duration_s: 1.0,
        duplicate_ratio: 0.3,
        retry_after_ms: 400,
        ..RunArgs::new(
            scenario,
            vec![first.address.clone(), second.address.clone()],
            Some(database_url_of(&first.db_options)),
        )
    }
}

async fn two_instances(adjust: impl FnOnce(&mut Settings)) -> (TestApp, TestApp) {
    let first = spawn_app(|settings| {
        settings.cooldown_ttl_ms = 300;
        adjust(settings);
    })
    .await;
    let second = spawn_second_instance(&first).await;
    (first, second)
}

/// Every scenario keeps every invariant against a safe pair of instances.
#[tokio::test]
async fn every_scenario_keeps_the_invariants_across_two_instances() {
    let (first, second) = two_instances(|_| {}).await;
    for scenario in [
        Scenario::Storm,
        Scenario::BuggyClient,
        Scenario::NoKey,
        Scenario::Overdraw,
        Scenario::Cross,
        Scenario::LateRetry,
        Scenario::Throughput,
        Scenario::Mixed,
        Scenario::HotWallet,
        Scenario::HotPayer,
        Scenario::Healthz,
    ] {
        let report = run(&args(scenario, &first, &second))
            .await
            .expect("the scenario runs");
        assert!(report.summary.requests > 0, "{scenario:?} sent nothing");
        assert_eq!(report.summary.transport_errors, 0, "{scenario:?}");
        if scenario == Scenario::Healthz {
            assert!(
                report.invariants.is_none(),
                "healthz moves no money; nothing to check"
            );
            continue;
        }
        let findings = report.invariants.as_ref().expect("checked");
        assert!(
            findings.violations.is_empty(),
            "{scenario:?}: {:?}",
            findings.violations
        );
        assert!(verdict(report.invariants.as_ref(), false));
        if scenario.is_burst() && scenario != Scenario::Cross {
            assert!(findings.new_transfers >= 1, "{scenario:?} moved no money");
        }
    }
    first.assert_invariants().await;
}

/// Against naive instances the same storm finds keys paid twice, and
/// `--expect-violations` turns that into success.
#[tokio::test]
async fn the_tool_finds_the_violations_of_an_unsafe_configuration() {
    let (first, second) = two_instances(|settings| {
        without_cooldown(settings);
        settings.idempotency_mode = IdempotencyMode::CheckThenInsert;
        settings.row_guard_mode = RowGuardMode::ReadDecideWrite;
        settings.naive_window_ms = 50;
    })
    .await;
    let mut storm = args(Scenario::Storm, &first, &second);
    storm.expect_violations = true;
    let mut found = false;
    for _ in 0..3 {
        let report = run(&storm).await.expect("the scenario runs");
        if verdict(report.invariants.as_ref(), true) {
            found = true;
            break;
        }
    }
    assert!(found, "no violation found against naive instances");
}

/// The cost probes measure the measured phase: the server's CPU time (the
/// test process hosts it), Redis's commands and the server's Redis round
/// trips, each counted for the transfers the run saw accepted.
#[tokio::test]
async fn the_cost_probes_count_what_the_run_cost() {
    let app = spawn_app(|settings| settings.cooldown_ttl_ms = 1).await;
    let report = run(&RunArgs {
        users: 4,
        concurrency: 4,
        duration_s: 1.0,
        server_pids: vec![std::process::id()],
        redis_url: Some(redis_url()),
        metrics_url: Some(format!("{}/metrics", app.admin_address)),
        ..RunArgs::new(
            Scenario::Throughput,
            vec![app.address.clone()],
            Some(database_url_of(&app.db_options)),
        )
    })
    .await
    .expect("the run");
    let costs = report.costs.expect("probes were given");
    assert!(costs.accepted > 0);
    assert!(costs.server_cpu_us > 0);
    assert!(
        costs.redis_round_trips >= costs.accepted,
        "each accepted transfer took its cooldown window: {costs:?}"
    );
    // Other tests share this Redis, so its count is a lower bound here.
    assert!(costs.redis_commands.values().sum::<u64>() >= costs.accepted);
}

/// With retries on, a call goes on as the client library does, and every
/// attempt is counted: against optimistic versions, debits of one balance
/// at once conflict, are retried with their keys, and land at most once
/// each; the transaction ids PostgreSQL handed out are counted too.
#[tokio::test]
async fn retried_calls_count_every_attempt_and_keep_the_invariants() {
    let (first, second) = two_instances(|settings| {
        without_cooldown(settings);
        settings.row_guard_mode = RowGuardMode::OptimisticVersion;
        settings.naive_window_ms = 50;
    })
    .await;
    let report = run(&RunArgs {
        attempts_max: 6,
        count_transaction_ids: true,
        ..args(Scenario::Overdraw, &first, &second)
    })
    .await
    .expect("the run");
    let findings = report.invariants.as_ref().expect("checked");
    assert!(findings.violations.is_empty(), "{:?}", findings.violations);
    let summary = &report.summary;
    assert!(
        summary.conflict_answers > 0,
        "debits that read together conflict: {summary:?}"
    );
    assert!(
        summary.attempts > summary.requests,
        "the conflicts were retried: {summary:?}"
    );
    let ids = report
        .costs
        .as_ref()
        .and_then(|costs| costs.pg_transaction_ids)
        .expect("counted");
    assert!(
        ids >= findings.new_transfers,
        "each transfer wrote in a transaction of its own: {ids} ids, {} transfers",
        findings.new_transfers
    );
    first.assert_invariants().await;
}

/// A retry storm whose clients go on paying: each starts its next payment,
/// with a new key, once one ends, until `keep_paying_s` after the outage.
/// The outage here takes nothing down (its commands are `true`); what is
/// checked is that the clients kept paying, that every payment the report
/// counts is one transfer in the database, and the invariants.
#[tokio::test]
async fn retry_storm_clients_go_on_paying_after_the_outage() {
    let (first, second) = two_instances(without_cooldown).await;
    let clients = 4;
    let report = run(&RunArgs {
        users: clients,
        concurrency: clients,
        attempts_max: 6,
        outage_begin: Some("true".to_owned()),
        outage_end: Some("true".to_owned()),
        outage_s: 0.2,
        keep_paying_s: 1.0,
        ..args(Scenario::RetryStorm, &first, &second)
    })
    .await
    .expect("the run");
    let findings = report.invariants.as_ref().expect("checked");
    assert!(findings.violations.is_empty(), "{:?}", findings.violations);
    let recovery = report
        .recovery
        .as_ref()
        .expect("a retry storm reports its recovery");
    assert!(
        recovery.calls > clients,
        "each client made more than its one payment: {} calls",
        recovery.calls
    );
    assert_eq!(
        i64::try_from(recovery.paid).expect("a count"),
        findings.new_transfers,
        "every payment counted is one transfer in the database"
    );
    assert!(
        recovery.paid_per_s_while_paying.is_some_and(|per_s| per_s > 0.0),
        "payments were made while the clients went on paying: {:?}",
        recovery.paid_per_s_while_paying
    );
    first.assert_invariants().await;
}

/// The lean path (`wire`) reads an answer as the client crate does: a
/// keyed transfer's 201, a copy's 429 from the cooldown with its problem
/// type, and after the window the key's replay, byte for byte; one transfer
/// in the database.
#[tokio::test]
async fn a_request_sent_once_is_read_as_the_client_reads_it() {
    use layered_wallet::decision::{Decision, Layer, Outcome};
    use wallet_client::RetryPolicy;
    use wallet_loadtest::client::{Api, Planned};

    // A window long enough that the copy, sent right after the first
    // answer, meets it even on a busy machine.
    let app = spawn_app(|settings| settings.cooldown_ttl_ms = 2_000).await;
    let once = RetryPolicy {
        attempts_max: 1,
        ..RetryPolicy::default()
    };
    let api = Api::new(vec![app.address.clone()], 2, once).expect("the load test's API");
    let users = wallet_loadtest::sign_up_users(&api, 2, true)
        .await
        .expect("a payer and a payee");
    let key = uuid::Uuid::new_v4().to_string();
    let planned = Planned {
        target: 0,
        from: 0,
        to_wallet: users[1].wallet_id,
        amount_minor: 7,
        key: Some(key.clone()),
    };

    let first = api.transfer(&users, &planned).await;
    assert_eq!(first.status, 201, "{first:?}");
    assert_eq!(
        first.decision,
        Some(Decision::new(Layer::RowGuard, Outcome::Accepted))
    );
    assert!(!first.replayed);
    let copy = api.transfer(&users, &planned).await;
    assert_eq!(copy.status, 429, "{copy:?}");
    assert_eq!(
        copy.decision,
        Some(Decision::new(Layer::Cooldown, Outcome::Rejected))
    );
    assert_eq!(copy.attempts[0].problem.as_deref(), Some("cooldown-active"));
    tokio::time::sleep(std::time::Duration::from_millis(2_100)).await;
    let retry = api.transfer(&users, &planned).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert!(retry.replayed);
    assert_eq!(
        retry.body, first.body,
        "a replay is the first answer, byte for byte"
    );

    let transfers: i64 = sqlx::query_scalar("SELECT count(*) FROM transfers WHERE amount_minor = 7")
        .fetch_one(&app.db)
        .await
        .expect("the transfers");
    assert_eq!(transfers, 1);
    app.assert_invariants().await;
}
