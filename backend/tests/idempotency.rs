//! Layer 2, the idempotency key, against real PostgreSQL. The cooldown is
//! off in most of these tests so that each branch is reached directly.

use std::time::Duration;

use layered_wallet::domain::TransferRequest;
use serde_json::Value;
use uuid::Uuid;
use wallet_testkit::*;

/// A retry with the same key gets the first response back byte for byte,
/// marked as a replay, and no second transfer happens.
#[tokio::test]
async fn a_retry_with_the_same_key_replays_the_first_response_byte_for_byte() {
    let app = spawn_app(without_cooldown).await;
    let (alice, bob) = app.alice_and_bob().await;
    let key = new_key();

    let first = app.transfer(&alice, bob.wallet_id, 700, Some(&key)).await;
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first_body = first.bytes().await.expect("body");

    // The quoted RFC 8941 form names the same key.
    let quoted = format!("\"{key}\"");
    for header in [key.as_str(), quoted.as_str()] {
        let retry = app.transfer(&alice, bob.wallet_id, 700, Some(header)).await;
        assert_eq!(retry.status(), 201);
        assert_eq!(retry.headers()["idempotent-replayed"], "true");
        assert_eq!(retry.headers()["content-type"], "application/json");
        assert_eq!(retry.bytes().await.expect("body"), first_body);
    }
    assert_eq!(app.transfer_count().await, 1);
    assert_eq!(app.balance(alice.wallet_id).await, 100_000 - 700);
    app.assert_invariants().await;
}

/// A key reused for a different body is refused and changes nothing.
#[tokio::test]
async fn a_key_reused_with_a_different_body_is_refused() {
    let app = spawn_app(without_cooldown).await;
    let (alice, bob) = app.alice_and_bob().await;
    let key = new_key();
    let first = app.transfer(&alice, bob.wallet_id, 700, Some(&key)).await;
    assert_eq!(first.status(), 201);
    let before = app.snapshot().await;

    let reused = app.transfer(&alice, bob.wallet_id, 701, Some(&key)).await;
    let (status, body) = problem(reused).await;
    assert_eq!(status, 422);
    assert_eq!(body["type"], "/problems/idempotency-key-reused");
    assert_eq!(body["layer"], "idempotency");
    assert_eq!(app.snapshot().await, before);
}

/// Keys are per user: Bob may use the key Alice used.
#[tokio::test]
async fn keys_belong_to_one_user() {
    let app = spawn_app(without_cooldown).await;
    let (alice, bob) = app.alice_and_bob().await;
    let key = new_key();
    let a = app.transfer(&alice, bob.wallet_id, 10, Some(&key)).await;
    let b = app.transfer(&bob, alice.wallet_id, 20, Some(&key)).await;
    assert_eq!((a.status().as_u16(), b.status().as_u16()), (201, 201));
    assert!(b.headers().get("idempotent-replayed").is_none());
    assert_eq!(app.transfer_count().await, 2);
}

/// A malformed key is refused before any work: the cooldown window is not
/// taken, so the corrected request goes straight through.
#[tokio::test]
async fn a_malformed_key_is_refused_before_any_work() {
    let app = spawn_app(|_| {}).await;
    let (alice, bob) = app.alice_and_bob().await;
    let before = app.snapshot().await;
    for bad in ["not-a-uuid", "\"unterminated", "12345"] {
        let response = app.transfer(&alice, bob.wallet_id, 10, Some(bad)).await;
        let (status, body) = problem(response).await;
        assert_eq!(status, 422, "{bad}");
        assert_eq!(body["layer"], "idempotency");
    }
    assert_eq!(app.snapshot().await, before);
    assert!(
        app.cooldown_keys().await.is_empty(),
        "a refused request took the cooldown window"
    );
    let fixed = app
        .transfer_request(&alice, bob.wallet_id, 10, Some(&new_key()))
        .send()
        .await
        .expect("send");
    assert_eq!(fixed.status(), 201);
}

/// Where the deployment requires a key, a transfer without one is a 400.
#[tokio::test]
async fn a_required_key_that_is_missing_is_a_400() {
    let app = spawn_app(|settings| settings.idempotency_key_required = true).await;
    let (alice, bob) = app.alice_and_bob().await;
    let before = app.snapshot().await;
    let response = app.transfer(&alice, bob.wallet_id, 10, None).await;
    let (status, body) = problem(response).await;
    assert_eq!(status, 400);
    assert_eq!(body["layer"], "idempotency");
    assert_eq!(app.snapshot().await, before);
}

/// Holds a claim open in a transaction of the test's own, as a slow first
/// request would, and returns that transaction.
async fn hold_claim(
    app: &TestApp,
    user: &TestUser,
    key: Uuid,
    body: &TransferRequest,
    response: Option<(i16, &str)>,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = app.db.begin().await.expect("begin");
    sqlx::query(
        "INSERT INTO idempotency_keys (user_id, key, fingerprint, response_status, response_body, expires_at)
         VALUES ($1, $2, $3, $4, $5, now() + interval '1 hour')",
    )
    .bind(user.user_id)
    .bind(key)
    .bind(&layered_wallet::transfer::pipeline::fingerprint_of(&body.canonical_json())[..])
    .bind(response.map(|(status, _)| status))
    .bind(response.map(|(_, body)| body.to_owned()))
    .execute(&mut *tx)
    .await
    .expect("claim");
    tx
}

fn parsed(from: Uuid, to: Uuid, amount: i64) -> TransferRequest {
    let body = serde_json::json!({ "from_wallet_id": from, "to_wallet_id": to, "amount_minor": amount });
    TransferRequest::parse(body.to_string().as_bytes(), i64::MAX).expect("valid")
}

/// A key whose first request is still running: the retry waits at most
/// `idempotency_wait_ms_max`, then gets 409 with Retry-After, and nothing
/// changes.
#[tokio::test]
async fn a_key_still_in_flight_waits_then_answers_409() {
    let app = spawn_app(|settings| {
        without_cooldown(settings);
        settings.idempotency_wait_ms_max = 300;
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    let key = Uuid::new_v4();
    let held = hold_claim(
        &app,
        &alice,
        key,
        &parsed(alice.wallet_id, bob.wallet_id, 10),
        None,
    )
    .await;

    let started = std::time::Instant::now();
    let response = app
        .transfer_request(&alice, bob.wallet_id, 10, Some(&key.to_string()))
        .send()
        .await
        .expect("send");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "it did not wait for the claim"
    );
    assert_eq!(response.headers()["retry-after"], "1");
    let (status, body) = problem(response).await;
    assert_eq!(status, 409);
    assert_eq!(body["type"], "/problems/idempotency-key-in-flight");
    assert_eq!(body["layer"], "idempotency");
    held.rollback().await.expect("rollback");
    assert_eq!(app.transfer_count().await, 0);
    assert_eq!(app.balance(alice.wallet_id).await, 100_000);
}

/// A key whose first request completes during the wait: the retry replays
/// the stored response instead of answering 409.
#[tokio::test]
async fn a_key_that_completes_during_the_wait_is_replayed() {
    let app = spawn_app(|settings| {
        without_cooldown(settings);
        settings.idempotency_wait_ms_max = 5_000;
        settings.db_statement_timeout_ms = 10_000;
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    let key = Uuid::new_v4();
    let stored = r#"{"stored":"by the first request"}"#;
    let held = hold_claim(
        &app,
        &alice,
        key,
        &parsed(alice.wallet_id, bob.wallet_id, 10),
        Some((201, stored)),
    )
    .await;

    let retry = tokio::spawn(
        app.transfer_request(&alice, bob.wallet_id, 10, Some(&key.to_string()))
            .send(),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.commit().await.expect("commit");
    let response = retry.await.expect("task").expect("send");
    assert_eq!(response.status(), 201);
    assert_eq!(response.headers()["idempotent-replayed"], "true");
    assert_eq!(response.text().await.expect("body"), stored);
    assert_eq!(app.transfer_count().await, 0, "the retry moved money itself");
}

/// If the first request rolls back (our failure), the key is free: the
/// waiting retry does the transfer itself.
#[tokio::test]
async fn a_key_whose_first_request_rolled_back_is_free_for_the_retry() {
    let app = spawn_app(without_cooldown).await;
    let (alice, bob) = app.alice_and_bob().await;
    let key = Uuid::new_v4();
    let held = hold_claim(
        &app,
        &alice,
        key,
        &parsed(alice.wallet_id, bob.wallet_id, 10),
        None,
    )
    .await;
    let retry = tokio::spawn(
        app.transfer_request(&alice, bob.wallet_id, 10, Some(&key.to_string()))
            .send(),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.rollback().await.expect("rollback");
    let response = retry.await.expect("task").expect("send");
    assert_eq!(response.status(), 201);
    assert!(response.headers().get("idempotent-replayed").is_none());
    assert_eq!(app.transfer_count().await, 1);
}

/// Business refusals are stored like successes: a retry of an overdraft
/// replays the refusal even after the wallet was topped up.
#[tokio::test]
async fn a_business_refusal_is_stored_and_replayed() {
    let app = spawn_app(without_cooldown).await;
    let (alice, bob) = app.alice_and_bob().await;
    let key = new_key();
    let refused = app.transfer(&alice, bob.wallet_id, 150_000, Some(&key)).await;
    let refused_bytes = {
        assert_eq!(refused.status(), 422);
        refused.bytes().await.expect("body")
    };
    let body: Value = serde_json::from_slice(&refused_bytes).expect("json");
    assert_eq!(body["type"], "/problems/insufficient-funds");

    let top_up = app.transfer(&bob, alice.wallet_id, 60_000, None).await;
    assert_eq!(top_up.status(), 201);
    let retry = app.transfer(&alice, bob.wallet_id, 150_000, Some(&key)).await;
    assert_eq!(retry.status(), 422);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.headers()["content-type"], "application/problem+json");
    assert_eq!(retry.bytes().await.expect("body"), refused_bytes);
    assert_eq!(app.transfer_count().await, 1, "only the top-up");

    // Unknown targets are business refusals too.
    let ghost_key = new_key();
    let ghost = Uuid::new_v4();
    let first = app.transfer(&alice, ghost, 10, Some(&ghost_key)).await;
    assert_eq!(first.status(), 422);
    let again = app.transfer(&alice, ghost, 10, Some(&ghost_key)).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    app.assert_invariants().await;
}

/// After `idempotency_retention_hours` a key is forgotten: the same key is
/// a new request, even before the sweeper has deleted the old row.
#[tokio::test]
async fn an_expired_key_is_a_new_request() {
    let app = spawn_app(without_cooldown).await;
    let (alice, bob) = app.alice_and_bob().await;
    let key = new_key();
    let first = app.transfer(&alice, bob.wallet_id, 10, Some(&key)).await;
    assert_eq!(first.status(), 201);
    sqlx::query("UPDATE idempotency_keys SET expires_at = now() - interval '1 second'")
        .execute(&app.db)
        .await
        .expect("expire");
    let again = app.transfer(&alice, bob.wallet_id, 10, Some(&key)).await;
    assert_eq!(again.status(), 201);
    assert!(again.headers().get("idempotent-replayed").is_none());
    assert_eq!(app.transfer_count().await, 2);
}

/// The sweeper deletes expired keys in batches and keeps live ones.
#[tokio::test]
async fn the_sweeper_deletes_expired_keys_in_batches() {
    let app = spawn_app(without_cooldown).await;
    let alice = app.sign_up("alice").await;
    sqlx::query(
        "INSERT INTO idempotency_keys (user_id, key, fingerprint, response_status, response_body, expires_at)
         SELECT $1, gen_random_uuid(), decode(repeat('00', 32), 'hex'), 201, '{}',
                CASE WHEN n <= 7 THEN now() - interval '1 minute' ELSE now() + interval '1 hour' END
         FROM generate_series(1, 10) AS n",
    )
    .bind(alice.user_id)
    .execute(&app.db)
    .await
    .expect("seed keys");
    let deleted = layered_wallet::sweep::expired_idempotency_keys(&app.db, 3)
        .await
        .expect("sweep");
    assert_eq!(deleted, 7);
    assert_eq!(app.count("SELECT count(*) FROM idempotency_keys").await, 3);
}

/// A retry of a completed key is answered by a read alone: the stored row
/// is neither updated nor even locked (a claim attempt would lock it, and
/// its `xmax` would then name the retry's transaction).
#[tokio::test]
async fn a_replay_is_a_read_that_writes_and_locks_nothing() {
    let app = spawn_app(without_cooldown).await;
    let (alice, bob) = app.alice_and_bob().await;
    let key = new_key();
    let first = app.transfer(&alice, bob.wallet_id, 700, Some(&key)).await;
    assert_eq!(first.status(), 201);
    let key_row = || {
        sqlx::query_as::<_, (String, String)>(
            "SELECT xmin::text, xmax::text FROM idempotency_keys WHERE key = $1::uuid",
        )
        .bind(key.clone())
        .fetch_one(&app.db)
    };
    let before = key_row().await.expect("the key's row");

    for _ in 0..3 {
        let retry = app.transfer(&alice, bob.wallet_id, 700, Some(&key)).await;
        assert_eq!(retry.headers()["idempotent-replayed"], "true");
    }
    assert_eq!(
        key_row().await.expect("the key's row"),
        before,
        "the stored claim was touched"
    );
    assert_eq!(before.1, "0", "a completed claim is never locked by a retry");
    assert_eq!(app.transfer_count().await, 1);
}
