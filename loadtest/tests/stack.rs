//! The deployment's topology on one machine: instances behind nginx with
//! the stack's own nginx configuration. A storm through the proxy keeps
//! every invariant, and killing an instance mid-storm loses nothing.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::json;
use wallet_loadtest::scenarios::Scenario;
use wallet_loadtest::{RunArgs, run};
use wallet_testkit::nginx::Nginx;
use wallet_testkit::*;

fn through(target: &str, scenario: Scenario, app: &TestApp) -> RunArgs {
    RunArgs {
        rounds: 3,
        copies: 30,
        users: 8,
        concurrency: 8,
        duration_s: 1.0,
        duplicate_ratio: 0.3,
        retry_after_ms: 400,
        ..RunArgs::new(
            scenario,
            vec![target.to_owned()],
            Some(database_url_of(&app.db_options)),
        )
    }
}

#[tokio::test]
async fn a_storm_through_nginx_across_three_instances_keeps_every_invariant() {
    let first = spawn_app(|settings| settings.cooldown_ttl_ms = 300).await;
    let second = spawn_second_instance(&first).await;
    let third = spawn_second_instance(&first).await;
    let nginx = Nginx::start(&[first.port(), second.port(), third.port()]).await;
    for scenario in [
        Scenario::Storm,
        Scenario::NoKey,
        Scenario::Overdraw,
        Scenario::Mixed,
    ] {
        let report = run(&through(&nginx.url(), scenario, &first))
            .await
            .expect("the scenario runs");
        let findings = report.invariants.expect("checked");
        assert!(
            findings.violations.is_empty(),
            "{scenario:?}: {:?}",
            findings.violations
        );
        assert!(findings.new_transfers >= 1, "{scenario:?} moved no money");
    }
    // Requests really were spread: every instance answered some.
    for app in [&first, &second, &third] {
        let metrics = app.metrics().await;
        assert!(
            metrics.contains("wallet_decisions_total"),
            "an instance got no transfers"
        );
    }
    first.assert_invariants().await;
}

/// Users retry with their key until they get an answer; one instance dies
/// in the middle. Every key ends with exactly one transfer.
#[tokio::test]
async fn killing_an_instance_mid_storm_loses_nothing() {
    let first = spawn_app(|settings| settings.cooldown_ttl_ms = 200).await;
    let mut second = spawn_second_instance(&first).await;
    let third = spawn_second_instance(&first).await;
    let nginx = Nginx::start(&[first.port(), second.port(), third.port()]).await;
    let target = first.sign_up("target").await;
    let mut users = Vec::new();
    for i in 0..24 {
        users.push(first.sign_up(&format!("payer{i}")).await);
    }

    let client = reqwest::Client::new();
    let url = format!("{}/api/v1/transfers", nginx.url());
    const KEYS_PER_CLIENT: usize = 5;
    let tasks: Vec<_> = users
        .iter()
        .map(|user| {
            let (client, url) = (client.clone(), url.clone());
            let (token, from, to) = (user.token.clone(), user.wallet_id, target.wallet_id);
            tokio::spawn(async move {
                // A well-behaved client: several transfers in a row, each
                // retried with its own key until it is answered with 201.
                let mut keys = Vec::new();
                let mut interrupted = 0;
                for _ in 0..KEYS_PER_CLIENT {
                    let key = new_key();
                    let mut done = false;
                    for _ in 0..100 {
                        let response = client
                            .post(&url)
                            .bearer_auth(&token)
                            .header("Idempotency-Key", &key)
                            .json(&json!({ "from_wallet_id": from, "to_wallet_id": to, "amount_minor": 100 }))
                            .send()
                            .await;
                        let status = response.map(|r| r.status().as_u16()).unwrap_or(0);
                        if status == 201 {
                            done = true;
                            break;
                        }
                        if status == 0 || status >= 500 {
                            interrupted += 1;
                        }
                        tokio::time::sleep(Duration::from_millis(40)).await;
                    }
                    assert!(done, "key {key} never got its transfer");
                    keys.push(key);
                }
                (keys, interrupted)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    second.kill().await;

    let mut all_keys = HashMap::new();
    let mut interrupted = 0;
    for task in tasks {
        let (keys, failures) = task.await.expect("client task");
        interrupted += failures;
        for key in keys {
            all_keys.insert(key, ());
        }
    }
    println!("requests interrupted by the kill and retried: {interrupted}");
    let per_key: Vec<(String, i64)> = sqlx::query_as(
        "SELECT idempotency_key::text, count(*) FROM transfers WHERE idempotency_key IS NOT NULL GROUP BY 1",
    )
    .fetch_all(&first.db)
    .await
    .expect("per key");
    assert_eq!(per_key.len(), all_keys.len(), "a key has no transfer");
    assert!(
        per_key.iter().all(|(_, n)| *n == 1),
        "a key paid twice: {per_key:?}"
    );
    assert_eq!(
        first.balance(target.wallet_id).await,
        100_000 + 24 * KEYS_PER_CLIENT as i64 * 100
    );
    first.assert_invariants().await;
}
