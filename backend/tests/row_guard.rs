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
