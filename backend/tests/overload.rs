//! Overload is refused, not queued: past `transfers_in_flight_max`
//! transfers in flight, a transfer that finds no place within
//! `transfers_admission_wait_ms_max`, or finds
//! `transfers_admission_queue_max` already waiting, gets 503
//! `/problems/overloaded` with `Retry-After`, having changed nothing, while
//! the ones admitted go on. Only transfers that passed the cooldown are
//! counted: a copy inside its window is refused by the cooldown first.

use std::time::Duration;

use wallet_testkit::*;

#[tokio::test]
async fn a_transfer_past_the_limit_is_refused_at_once_and_changes_nothing() {
    let app = spawn_app(|settings| {
        settings.transfers_in_flight_max = 1;
        settings.transfers_admission_wait_ms_max = 20;
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    let carol = app.sign_up("carol").await;
    let (locker, held) = hold_the_one_place(&app, &alice, &bob).await;

    // Carol's transfer touches other rows, but finds no place.
    let key = new_key();
    let refused = app
        .transfer_request(&carol, alice.wallet_id, 100, Some(&key))
        .send()
        .await
        .expect("sent");
    assert_refused_as_overloaded(refused, "none finished within 20 ms").await;
    assert_eq!(
        app.transfer_count().await,
        0,
        "the refused transfer changed nothing"
    );
    let claims: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE key = $1::uuid")
        .bind(&key)
        .fetch_one(&app.db)
        .await
        .expect("count claims");
    assert_eq!(claims, 0, "not even a claim");

    // The lock goes: the admitted transfer completes, and Carol's retry,
    // with its key, at once (the refusal gave its window back), is made
    // once.
    locker.rollback().await.expect("release the lock");
    let first = held.await.expect("the held transfer").expect("answered");
    assert_eq!(first.status(), 201);
    let retried = app
        .transfer_request(&carol, alice.wallet_id, 100, Some(&key))
        .send()
        .await
        .expect("sent");
    assert_eq!(retried.status(), 201);
    assert_eq!(app.transfer_count().await, 2);
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_transfer_that_finds_the_queue_full_is_refused_while_the_queued_one_waits() {
    let app = spawn_app(|settings| {
        settings.transfers_in_flight_max = 1;
        settings.transfers_admission_queue_max = 1;
        settings.transfers_admission_wait_ms_max = 1_500;
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    let (carol, dave) = (app.sign_up("carol").await, app.sign_up("dave").await);
    let (locker, held) = hold_the_one_place(&app, &alice, &bob).await;

    // Carol takes the one turn in the queue...
    let queued = tokio::spawn(
        app.transfer_request(&carol, alice.wallet_id, 100, Some(&new_key()))
            .send(),
    );
    let mut waiting = false;
    for _ in 0..100 {
        waiting = app
            .metrics()
            .await
            .contains("wallet_transfer_admission{state=\"waiting\"} 1");
        if waiting {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(waiting, "Carol's transfer waits for the place");

    // ...so Dave is refused without waiting: his answer comes while Carol
    // is still queued behind Alice's locked row.
    let refused = app
        .transfer_request(&dave, alice.wallet_id, 100, Some(&new_key()))
        .send()
        .await
        .expect("sent");
    assert_refused_as_overloaded(refused, "are waiting (1)").await;
    assert!(!queued.is_finished(), "Carol is still waiting for the place");
    assert_eq!(app.transfer_count().await, 0, "nothing was changed");

    // The lock goes: Alice's transfer completes, and Carol's, queued, takes
    // the place it frees.
    locker.rollback().await.expect("release the lock");
    let first = held.await.expect("the held transfer").expect("answered");
    assert_eq!(first.status(), 201);
    let second = queued.await.expect("the queued transfer").expect("answered");
    assert_eq!(second.status(), 201);
    assert_eq!(
        app.transfer_count().await,
        2,
        "Dave's refused transfer was not made"
    );
    app.assert_invariants().await;
}

/// Admission counts only what passed the cooldown: with the one place
/// taken and no turn to wait for, a copy of the transfer in flight is
/// refused by its window (429), not as overload. A transfer refused as
/// overloaded gives back the window it took, so that its keyless retry is
/// made once the place frees, and not refused for a window that changed
/// nothing.
#[tokio::test]
async fn a_copy_meets_the_cooldown_even_when_the_instance_is_full() {
    let app = spawn_app(|settings| {
        settings.transfers_in_flight_max = 1;
        settings.transfers_admission_queue_max = 0;
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    let carol = app.sign_up("carol").await;
    let (locker, held) = hold_the_one_place(&app, &alice, &bob).await;

    let copy = app.transfer(&alice, bob.wallet_id, 100, None).await;
    let (status, body) = problem(copy).await;
    assert_eq!(
        (status, body["type"].as_str()),
        (429, Some("/problems/cooldown-active")),
        "{body}"
    );
    let refused = app.transfer(&carol, alice.wallet_id, 100, None).await;
    assert_refused_as_overloaded(refused, "are waiting (0)").await;

    locker.rollback().await.expect("release the lock");
    let first = held.await.expect("the held transfer").expect("answered");
    assert_eq!(first.status(), 201);
    let retried = app.transfer(&carol, alice.wallet_id, 100, None).await;
    assert_eq!(retried.status(), 201, "Carol's window was given back");
    assert_eq!(
        app.transfer_count().await,
        2,
        "Alice's transfer once, and Carol's retry"
    );
    app.assert_invariants().await;
}

/// A 503 `/problems/overloaded` with `Retry-After`, saying nothing was
/// changed and why it was refused (`why`).
async fn assert_refused_as_overloaded(refused: reqwest::Response, why: &str) {
    assert_eq!(refused.headers()["retry-after"], "1");
    let (status, body) = problem(refused).await;
    assert_eq!(
        (status, body["type"].as_str()),
        (503, Some("/problems/overloaded")),
        "{body}"
    );
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains(why) && detail.contains("Nothing was changed"),
        "{body}"
    );
}

/// Locks Bob's wallet row from outside, then sends Alice's transfer to him:
/// it takes the one place and holds it until the returned transaction ends.
async fn hold_the_one_place(
    app: &TestApp,
    alice: &TestUser,
    bob: &TestUser,
) -> (
    sqlx::Transaction<'static, sqlx::Postgres>,
    tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>,
) {
    let mut locker = app.db.begin().await.expect("a transaction");
    sqlx::query("SELECT 1 FROM wallets WHERE id = $1 FOR UPDATE")
        .bind(bob.wallet_id)
        .execute(&mut *locker)
        .await
        .expect("lock Bob's wallet");
    let held = tokio::spawn(
        app.transfer_request(alice, bob.wallet_id, 100, Some(&new_key()))
            .send(),
    );
    // Wait until Alice's transfer is inside, waiting for the row.
    for _ in 0..100 {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()",
        )
        .fetch_one(&app.db)
        .await
        .expect("read pg_stat_activity");
        if waiting > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (locker, held)
}

/// The admission wait must be shorter than the pool's: otherwise overload
/// would queue for a connection before it could be refused.
#[test]
fn an_admission_wait_as_long_as_the_pools_is_refused_at_start_up() {
    let mut settings = test_settings("postgres://127.0.0.1/unused", "unused:");
    settings.transfers_admission_wait_ms_max = settings.db_acquire_wait_ms_max;
    let error = settings.validate().expect_err("refused").to_string();
    assert!(error.contains("transfers_admission_wait_ms_max"), "{error}");
}
