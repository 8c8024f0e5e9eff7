//! The common alternatives to a layer, each held to what it guarantees and
//! shown failing the way it fails, under real concurrent requests against
//! real PostgreSQL, with the database state asserted.
//!
//! Guarding the balance: `SELECT … FOR UPDATE` then a decision in the
//! server, and an optimistic version check, beside the conditional
//! `UPDATE` (tests/row_guard.rs) and the naive read-decide-write
//! (tests/unsafe_modes.rs).

use layered_wallet::settings::RowGuardMode;
use serde_json::Value;
use wallet_testkit::*;

/// Ten debits of 100 at once from a wallet holding 300.
const GRANT_MINOR: i64 = 300;
const DEBITS: usize = 10;
const DEBIT_MINOR: i64 = 100;

async fn problem_type(response: reqwest::Response) -> String {
    let body: Value = response.json().await.expect("a problem body");
    body["type"].as_str().unwrap_or_default().to_owned()
}

/// Locking both wallets first makes the decision in the server safe: what
/// the balance covers is paid, the rest is refused by the guard's own
/// answer, no update is lost and no money is created.
#[tokio::test]
async fn select_for_update_pays_what_the_balance_covers_and_loses_no_update() {
    let app = spawn_app(|settings| {
        without_cooldown(settings);
        settings.row_guard_mode = RowGuardMode::ForUpdate;
        settings.signup_grant_minor = GRANT_MINOR;
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    let requests = (0..DEBITS)
        .map(|_| app.transfer_request(&alice, bob.wallet_id, DEBIT_MINOR, Some(&new_key())))
        .collect();
    let responses = fire_together(requests).await;
    let mut statuses: Vec<u16> = responses
        .iter()
        .map(|response| response.status().as_u16())
        .collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [201, 201, 201, 422, 422, 422, 422, 422, 422, 422]);
    assert_eq!(app.balance(alice.wallet_id).await, 0);
    assert_eq!(app.balance(bob.wallet_id).await, 2 * GRANT_MINOR);
    assert_eq!(app.transfer_count().await, 3);
    app.assert_invariants().await;
}

/// Optimistic versions take no lock: of debits that read the same version,
/// one writes and the others find it moved. Each conflict is a 409 that
/// changed nothing and stored nothing with its key, so a retry with the same
/// key runs again; retried until they land, the debits each pay exactly once.
/// The conflicts are the cost: on a hot wallet the retries multiply the work.
#[tokio::test]
async fn optimistic_versions_conflict_on_a_hot_wallet_and_each_retry_pays_once() {
    let app = spawn_app(|settings| {
        without_cooldown(settings);
        settings.row_guard_mode = RowGuardMode::OptimisticVersion;
        // Every debit reads before any writes: the conflicts are certain.
        settings.naive_window_ms = 100;
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    let opening = app.balance(alice.wallet_id).await;
    let keys: Vec<String> = (0..DEBITS).map(|_| new_key()).collect();
    let requests = keys
        .iter()
        .map(|key| app.transfer_request(&alice, bob.wallet_id, DEBIT_MINOR, Some(key)))
        .collect();
    let responses = fire_together(requests).await;
    let mut conflicted = Vec::new();
    for (key, response) in keys.iter().zip(responses) {
        match response.status().as_u16() {
            201 => {}
            409 => {
                assert_eq!(problem_type(response).await, "/problems/version-conflict");
                conflicted.push(key.clone());
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert!(
        !conflicted.is_empty(),
        "ten debits read together and none conflicted"
    );
    assert_eq!(
        app.transfer_count().await,
        (DEBITS - conflicted.len()) as i64,
        "a conflict moved money"
    );
    app.assert_invariants().await;

    // Retried one after another with their own keys, each lands once.
    let mut retries = 0;
    for key in &conflicted {
        loop {
            retries += 1;
            assert!(retries <= 10 * DEBITS, "the retries never landed");
            let response = app.transfer(&alice, bob.wallet_id, DEBIT_MINOR, Some(key)).await;
            match response.status().as_u16() {
                201 => break,
                409 => continue,
                other => panic!("unexpected {other} on a retry"),
            }
        }
    }
    assert_eq!(app.transfer_count().await, DEBITS as i64);
    assert_eq!(
        app.balance(alice.wallet_id).await,
        opening - DEBITS as i64 * DEBIT_MINOR
    );
    // A retry of a landed key replays; it does not pay again.
    let replay = app
        .transfer(&alice, bob.wallet_id, DEBIT_MINOR, Some(&conflicted[0]))
        .await;
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(app.transfer_count().await, DEBITS as i64);
    app.assert_invariants().await;
}

/// An optimistic writer sees every other writer's change: the version is
/// bumped by the database on any balance change, not by the variant.
#[tokio::test]
async fn every_balance_change_bumps_the_version() {
    let app = spawn_app(|settings| settings.signup_grant_minor = GRANT_MINOR).await;
    let (alice, bob) = app.alice_and_bob().await;
    let version = |wallet| {
        sqlx::query_scalar::<_, i64>("SELECT version FROM wallets WHERE id = $1")
            .bind(wallet)
            .fetch_one(&app.db)
    };
    let before = (
        version(alice.wallet_id).await.expect("v"),
        version(bob.wallet_id).await.expect("v"),
    );
    let response = app
        .transfer(&alice, bob.wallet_id, DEBIT_MINOR, Some(&new_key()))
        .await;
    assert_eq!(response.status(), 201);
    let after = (
        version(alice.wallet_id).await.expect("v"),
        version(bob.wallet_id).await.expect("v"),
    );
    assert_eq!(after, (before.0 + 1, before.1 + 1));
}
