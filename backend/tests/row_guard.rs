//! Layer 3, the guarded debit, against real PostgreSQL.

use wallet_testkit::*;

/// An overdraft is refused with 422 insufficient-funds and changes nothing;
/// spending the exact balance leaves zero.
#[tokio::test]
async fn the_row_guard_refuses_an_overdraft_and_allows_the_exact_balance() {
    let app = spawn_app(without_cooldown).await;
    let (alice, bob) = app.alice_and_bob().await;
    let before = app.snapshot().await;

    let over = app.transfer(&alice, bob.wallet_id, 100_001, None).await;
    let (status, body) = problem(over).await;
    assert_eq!(status, 422);
    assert_eq!(body["type"], "/problems/insufficient-funds");
    assert_eq!(body["layer"], "row_guard");
    assert_eq!(app.snapshot().await, before);

    let exact = app.transfer(&alice, bob.wallet_id, 100_000, None).await;
    assert_eq!(exact.status(), 201);
    let receipt: serde_json::Value = exact.json().await.expect("json");
    assert_eq!(receipt["balance_minor_after"], 0);
    assert_eq!(receipt["amount_minor"], 100_000);
    assert_eq!(app.balance(alice.wallet_id).await, 0);
    assert_eq!(app.balance(bob.wallet_id).await, 200_000);
    app.assert_invariants().await;
}

/// The database repeats the guard: even a hand-written statement cannot
/// take a balance below zero or record a self-transfer.
#[tokio::test]
async fn the_database_constraints_back_the_guard_up() {
    let app = spawn_app(|_| {}).await;
    let alice = app.sign_up("alice").await;
    let negative = sqlx::query("UPDATE wallets SET balance_minor = -1 WHERE id = $1")
        .bind(alice.wallet_id)
        .execute(&app.db)
        .await;
    assert!(negative.is_err(), "a negative balance was accepted");
    let self_transfer = sqlx::query(
        "INSERT INTO transfers (id, from_wallet_id, to_wallet_id, amount_minor, initiated_by)
         VALUES (gen_random_uuid(), $1, $1, 1, $2)",
    )
    .bind(alice.wallet_id)
    .bind(alice.user_id)
    .execute(&app.db)
    .await;
    assert!(self_transfer.is_err(), "a self-transfer was accepted");
    let zero = sqlx::query(
        "INSERT INTO transfers (id, from_wallet_id, to_wallet_id, amount_minor, initiated_by)
         VALUES (gen_random_uuid(), $1, $1, 0, $2)",
    )
    .bind(alice.wallet_id)
    .bind(alice.user_id)
    .execute(&app.db)
    .await;
    assert!(zero.is_err(), "a zero transfer was accepted");
}

/// The one-call path and the statement-by-statement path (used by the
/// demonstration modes) write the receipt in one format.
#[tokio::test]
async fn both_transaction_paths_write_the_same_receipt_format() {
    // The field names, in order, as written.
    let shape = |body: &str| {
        body.match_indices("\":")
            .map(|(end, _)| {
                let start = body[..end].rfind('"').expect("an opening quote") + 1;
                body[start..end].to_owned()
            })
            .collect::<Vec<_>>()
    };
    let mut formats = Vec::new();
    for step_by_step in [false, true] {
        let app = spawn_app(|settings| {
            if step_by_step {
                settings.idempotency_mode = layered_wallet::settings::IdempotencyMode::CheckThenInsert;
                settings.allow_unsafe_demo_modes = true;
            }
        })
        .await;
        let (alice, bob) = app.alice_and_bob().await;
        let response = app.transfer(&alice, bob.wallet_id, 1_250, Some(&new_key())).await;
        assert_eq!(response.status(), 201);
        let body = response.text().await.expect("body");
        let receipt: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(receipt["balance_minor_after"], 100_000 - 1_250);
        let created_at = receipt["created_at"].as_str().expect("created_at");
        assert!(
            created_at.ends_with('Z') && created_at.len() == 27,
            "{created_at}"
        );
        formats.push(shape(&body));
    }
    assert_eq!(formats[0], formats[1]);
    assert_eq!(
        formats[0],
        [
            "id",
            "from_wallet_id",
            "to_wallet_id",
            "amount_minor",
            "created_at",
            "balance_minor_after"
        ]
    );
}
