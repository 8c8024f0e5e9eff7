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
/// take a balance below zero, record a self-transfer or a transfer of
/// nothing. Each is refused by its own named constraint.
#[tokio::test]
async fn the_database_constraints_back_the_guard_up() {
    let app = spawn_app(|_| {}).await;
    let (alice, bob) = app.alice_and_bob().await;
    let refused_by = |result: Result<sqlx::postgres::PgQueryResult, sqlx::Error>| {
        let error = result.expect_err("the statement must be refused");
        let database = error.as_database_error().expect("a database error");
        (
            database.code().map(|code| code.into_owned()),
            database.constraint().map(str::to_owned),
        )
    };
    let check_violation = Some("23514".to_owned());

    let negative = sqlx::query("UPDATE wallets SET balance_minor = -1 WHERE id = $1")
        .bind(alice.wallet_id)
        .execute(&app.db)
        .await;
    assert_eq!(
        refused_by(negative),
        (
            check_violation.clone(),
            Some("wallets_never_below_zero".to_owned())
        )
    );
    let insert = "INSERT INTO transfers (id, from_wallet_id, to_wallet_id, amount_minor, initiated_by)
                  VALUES (gen_random_uuid(), $1, $2, $3, $4)";
    let self_transfer = sqlx::query(insert)
        .bind(alice.wallet_id)
        .bind(alice.wallet_id)
        .bind(1_i64)
        .bind(alice.user_id)
        .execute(&app.db)
        .await;
    assert_eq!(
        refused_by(self_transfer),
        (
            check_violation.clone(),
            Some("transfers_distinct_wallets".to_owned())
        )
    );
    // Distinct wallets, so that only the amount can be what is refused.
    let zero = sqlx::query(insert)
        .bind(alice.wallet_id)
        .bind(bob.wallet_id)
        .bind(0_i64)
        .bind(alice.user_id)
        .execute(&app.db)
        .await;
    assert_eq!(
        refused_by(zero),
        (check_violation, Some("transfers_amount_minor_check".to_owned()))
    );
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

/// The invariants' one definition sees each kind of damage: a checker that
/// cannot fail proves nothing.
#[tokio::test]
async fn the_money_invariants_see_each_kind_of_damage() {
    let app = spawn_app(|_| {}).await;
    let (alice, bob) = app.alice_and_bob().await;
    assert_eq!(app.transfer(&alice, bob.wallet_id, 100, None).await.status(), 201);
    assert!(money_invariant_violations(&app.db).await.is_empty());

    // A transfer's ledger pair that no longer sums to zero, and a balance
    // that no longer matches its ledger.
    sqlx::query(
        "UPDATE ledger_entries SET amount_minor = amount_minor + 1
         WHERE wallet_id = $1",
    )
    .bind(bob.wallet_id)
    .execute(&app.db)
    .await
    .expect("damage the ledger");
    sqlx::query("UPDATE wallets SET balance_minor = balance_minor + 5 WHERE id = $1")
        .bind(alice.wallet_id)
        .execute(&app.db)
        .await
        .expect("create money");
    let violations = money_invariant_violations(&app.db).await.join("; ");
    for expected in [
        "money was created or destroyed: 5 minor units",
        "balances do not match their ledger",
        "1 transfers are not recorded as two entries summing to zero",
    ] {
        assert!(violations.contains(expected), "{violations}");
    }
}
