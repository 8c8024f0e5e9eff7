//! The common alternatives to a layer, each held to what it guarantees and
//! shown failing the way it fails, under real concurrent requests against
//! real PostgreSQL, with the database state asserted.
//!
//! - Guarding the balance: `SELECT … FOR UPDATE` then a decision in the
//!   server, and an optimistic version check, beside the conditional
//!   `UPDATE` (tests/row_guard.rs) and the naive read-decide-write
//!   (tests/unsafe_modes.rs).
//! - Claiming a key: a transaction's advisory lock on its hash, and a Redis
//!   lock on the key, each followed by a point read and the claim, beside
//!   the insert-first claim (tests/idempotency.rs) and the naive
//!   check-then-insert (tests/unsafe_modes.rs).

use std::time::Duration;

use layered_wallet::settings::{IdempotencyMode, RowGuardMode};
use serde_json::Value;
use uuid::Uuid;
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

/// `FOR UPDATE` makes a transfer wait for whoever holds either wallet's row,
/// for as long as they hold it: here another transaction holds the payer's
/// row past `wallet_lock_wait_ms_max`. The transfer is answered 503 with
/// nothing changed and its key free, and once the row is let go the same
/// request with the same key pays, once.
#[tokio::test]
async fn select_for_update_waits_for_a_held_row_then_answers_busy_with_nothing_changed() {
    let app = spawn_app(|settings| {
        without_cooldown(settings);
        settings.row_guard_mode = RowGuardMode::ForUpdate;
        settings.signup_grant_minor = GRANT_MINOR;
        settings.wallet_lock_wait_ms_max = 200;
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    let mut holder = app.db.begin().await.expect("a transaction");
    sqlx::query("SELECT id FROM wallets WHERE id = $1 FOR UPDATE")
        .bind(alice.wallet_id)
        .execute(&mut *holder)
        .await
        .expect("the row is held");

    let key = new_key();
    let response = app
        .transfer_request(&alice, bob.wallet_id, DEBIT_MINOR, Some(&key))
        .send()
        .await
        .expect("an answer");
    assert_eq!(response.status(), 503);
    assert!(response.headers().contains_key("retry-after"));
    let body: Value = response.json().await.expect("a problem body");
    assert!(
        body["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("Nothing was changed"),
        "{body}"
    );
    assert_eq!(app.transfer_count().await, 0);
    assert_eq!(app.balance(alice.wallet_id).await, GRANT_MINOR);
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_keys")
        .fetch_one(&app.db)
        .await
        .expect("count");
    assert_eq!(stored, 0, "the key went with the rolled-back transaction");

    holder.rollback().await.expect("let go");
    let response = app
        .transfer_request(&alice, bob.wallet_id, DEBIT_MINOR, Some(&key))
        .send()
        .await
        .expect("an answer");
    assert_eq!(response.status(), 201);
    assert_eq!(app.balance(alice.wallet_id).await, GRANT_MINOR - DEBIT_MINOR);
    assert_eq!(app.transfer_count().await, 1);
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

/// Twenty copies of one transfer at once, one key: how many transfers it
/// made, and how many copies were answered 409 (the key's lock was held).
async fn storm_of_one_key(app: &TestApp) -> (i64, usize) {
    let (alice, bob) = app.alice_and_bob().await;
    let key = new_key();
    let copies = (0..20)
        .map(|_| app.transfer_request(&alice, bob.wallet_id, DEBIT_MINOR, Some(&key)))
        .collect();
    let responses = fire_together(copies).await;
    let mut held = 0;
    for response in responses {
        match response.status().as_u16() {
            201 => {}
            409 => {
                assert_eq!(
                    problem_type(response).await,
                    "/problems/idempotency-key-in-flight"
                );
                held += 1;
            }
            other => panic!("unexpected {other}"),
        }
    }
    (app.transfer_count().await, held)
}

/// Claimed under a transaction's advisory lock, or under a Redis lock, a
/// storm of one key makes one transfer: the copies that find the lock held
/// are answered 409, the rest replay.
#[tokio::test]
async fn a_storm_of_one_key_pays_once_under_either_lock() {
    for mode in [IdempotencyMode::AdvisoryLock, IdempotencyMode::RedisKeyLock] {
        let app = spawn_app(|settings| {
            without_cooldown(settings);
            settings.idempotency_mode = mode;
            // The copies overlap the holder's work.
            settings.naive_window_ms = 100;
        })
        .await;
        let (transfers, held) = storm_of_one_key(&app).await;
        assert_eq!(transfers, 1, "{mode:?}");
        assert!(held > 0, "{mode:?}: no copy found the lock held");
        app.assert_invariants().await;
    }
}

/// The advisory lock is keyed by a 32-bit hash, so two different keys can
/// share a lock: a transfer is refused because of another key's request.
/// Contention that is not real, shown with a pair of keys whose hashes
/// collide.
#[tokio::test]
async fn hashed_advisory_locks_collide_and_hold_up_a_different_key() {
    let app = spawn_app(|settings| {
        without_cooldown(settings);
        settings.idempotency_mode = IdempotencyMode::AdvisoryLock;
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    // About ten colliding pairs are expected among 300,000 keys.
    let (held_key, other_key): (Uuid, Uuid) = sqlx::query_as(
        "SELECT (array_agg(key))[1], (array_agg(key))[2]
           FROM (SELECT gen_random_uuid() AS key FROM generate_series(1, 300000)) AS generated
          GROUP BY idempotency_lock_id($1, key)
         HAVING count(*) > 1
          LIMIT 1",
    )
    .bind(alice.user_id)
    .fetch_one(&app.db)
    .await
    .expect("two keys whose lock ids collide");

    // Another request holds the first key's lock...
    let mut holder = app.db.begin().await.expect("begin");
    sqlx::query("SELECT pg_advisory_xact_lock(idempotency_lock_id($1, $2))")
        .bind(alice.user_id)
        .bind(held_key)
        .execute(&mut *holder)
        .await
        .expect("lock");
    // ...and a transfer with the other key, never seen before, is refused.
    let refused = app
        .transfer(&alice, bob.wallet_id, DEBIT_MINOR, Some(&other_key.to_string()))
        .await;
    assert_eq!(refused.status(), 409);
    assert_eq!(problem_type(refused).await, "/problems/idempotency-key-in-flight");
    assert_eq!(app.transfer_count().await, 0, "a refused transfer moved money");
    holder.rollback().await.expect("rollback");

    let paid = app
        .transfer(&alice, bob.wallet_id, DEBIT_MINOR, Some(&other_key.to_string()))
        .await;
    assert_eq!(paid.status(), 201);
    assert_eq!(app.transfer_count().await, 1);
}

/// A Redis lock guarantees nothing on its own: its holder pauses past the
/// lock's lifetime, a retry with the same key takes the lock and finds no
/// key yet. The claim in PostgreSQL is what stops it: the retry waits for
/// the holder's claim and replays its answer, and one transfer is made.
#[tokio::test]
async fn a_redis_key_lock_lost_under_a_paused_holder_is_caught_by_the_claim() {
    let app = spawn_app(|settings| {
        without_cooldown(settings);
        settings.idempotency_mode = IdempotencyMode::RedisKeyLock;
        settings.idempotency_redis_lock_ttl_ms = 50;
        // The holder's pause, between its point read and its claim.
        settings.naive_window_ms = 400;
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    let key = new_key();
    let holder = app
        .transfer_request(&alice, bob.wallet_id, DEBIT_MINOR, Some(&key))
        .send();
    let retry = async {
        // Past the lock's lifetime, inside the holder's pause.
        tokio::time::sleep(Duration::from_millis(150)).await;
        app.transfer_request(&alice, bob.wallet_id, DEBIT_MINOR, Some(&key))
            .send()
            .await
    };
    let (holder, retry) = tokio::join!(holder, retry);
    let (holder, retry) = (holder.expect("holder"), retry.expect("retry"));
    assert_eq!(holder.status(), 201);
    // Not refused at the lock, which had expired: answered by the claim.
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(app.transfer_count().await, 1, "the lost lock paid twice");
    app.assert_invariants().await;
}
