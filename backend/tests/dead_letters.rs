//! Dead letters found by their issuer: an entry that is no command but
//! carried a well-formed command id is recorded under that id, and one
//! without a usable id is reported by its entry id and partition. Real
//! Redis Streams and a real consumer; asserted on the inbox afterwards.

use std::collections::HashMap;
use std::time::Duration;

use layered_wallet::domain::WalletId;
use serde_json::Value;
use wallet_testkit::*;

/// The results stream's entries, as published.
async fn results(app: &TestApp) -> Vec<HashMap<String, String>> {
    app.stream_entries(app.command_streams().results()).await
}

/// Waits (30 s at most) until the results stream holds `count` entries.
async fn wait_for_results(app: &TestApp, count: usize) -> Vec<HashMap<String, String>> {
    for _ in 0..300 {
        let entries = results(app).await;
        if entries.len() >= count {
            return entries;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("fewer than {count} results after 30 s: {:?}", results(app).await);
}

#[tokio::test]
async fn a_dead_lettered_entry_is_found_by_the_command_id_it_carried() {
    let app = spawn_app(with_commands).await;
    let (alice, bob) = app.alice_and_bob().await;
    let stream = app.command_streams().stream_for(WalletId(alice.wallet_id));
    let (from, to) = (alice.wallet_id.to_string(), bob.wallet_id.to_string());
    let entry = |id: &str, target: &str, amount: &str| {
        vec![
            ("command_id", id.to_owned()),
            ("issuer", "payroll".to_owned()),
            ("from_wallet_id", from.clone()),
            ("to_wallet_id", target.to_owned()),
            ("amount_minor", amount.to_owned()),
        ]
    };
    let applied = transfer_command(alice.wallet_id, bob.wallet_id, 700);
    app.publish_command(&applied).await;
    // An amount that is no number, published twice, as an issuer
    // republishes what it has no outcome for.
    app.publish_fields(stream.clone(), &entry("cmd_garbled", &to, "ten"))
        .await;
    app.publish_fields(stream.clone(), &entry("cmd_garbled", &to, "ten"))
        .await;
    // The same wallet as source and target.
    app.publish_fields(stream.clone(), &entry("cmd_to_itself", &from, "5"))
        .await;
    // An id the inbox cannot hold, and the applied command's id on garbage.
    let unusable = app
        .publish_fields(stream.clone(), &entry("cmd with spaces", &to, "5"))
        .await;
    app.publish_fields(stream.clone(), &entry(&applied.command_id, &to, "-1"))
        .await;
    let entries = wait_for_results(&app, 6).await;
    app.wait_until_nothing_pending().await;

    let garbled = app.wait_for_outcome("cmd_garbled").await;
    assert_eq!(garbled["outcome"], "dead_lettered", "{garbled}");
    assert_eq!(garbled["issuer"], "payroll", "{garbled}");
    assert!(
        garbled["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("amount_minor must be a positive integer")),
        "{garbled}"
    );
    let to_itself = app.wait_for_outcome("cmd_to_itself").await;
    assert_eq!(to_itself["outcome"], "dead_lettered", "{to_itself}");
    assert!(
        to_itself["reason"]
            .as_str()
            .is_some_and(|r| r.contains("another wallet"))
    );
    // The applied command's outcome stands; the garbage under its id is
    // still dead-lettered, and its result says why.
    assert_eq!(
        app.wait_for_outcome(&applied.command_id).await["outcome"],
        "applied"
    );
    let under_applied: Vec<&HashMap<String, String>> = entries
        .iter()
        .filter(|result| result["command_id"] == applied.command_id)
        .collect();
    assert_eq!(under_applied.len(), 2, "{entries:?}");
    let reused: Value = serde_json::from_str(&under_applied[1]["result"]).expect("JSON");
    assert_eq!(reused["outcome"], "dead_lettered");
    assert!(
        reused["reason"]
            .as_str()
            .is_some_and(|r| r.contains("whose outcome stands"))
    );

    // Every result names its command, but the one without a usable id,
    // which names its entry and partition.
    let anonymous: Vec<&HashMap<String, String>> = entries
        .iter()
        .filter(|result| result["command_id"].is_empty())
        .collect();
    assert_eq!(anonymous.len(), 1, "{entries:?}");
    let anonymous: Value = serde_json::from_str(&anonymous[0]["result"]).expect("JSON");
    assert_eq!(anonymous["entry_id"], unusable.as_str());
    assert_eq!(
        anonymous["partition"],
        app.command_streams().partition_of(WalletId(alice.wallet_id))
    );
    let garbled_results: Vec<&HashMap<String, String>> = entries
        .iter()
        .filter(|result| result["command_id"] == "cmd_garbled")
        .collect();
    assert_eq!(garbled_results.len(), 2, "both deliveries answered");
    assert_eq!(garbled_results[0]["result"], garbled_results[1]["result"]);

    // The database: one dead letter a usable id, one transfer.
    let recorded: Vec<(String, String)> =
        sqlx::query_as("SELECT event_id, verdict FROM inbox WHERE source = 'broker' ORDER BY event_id")
            .fetch_all(&app.db)
            .await
            .expect("the inbox");
    let mut expected = vec![
        (applied.command_id.clone(), "applied".to_owned()),
        ("cmd_garbled".to_owned(), "dead_lettered".to_owned()),
        ("cmd_to_itself".to_owned(), "dead_lettered".to_owned()),
    ];
    expected.sort();
    assert_eq!(recorded, expected);
    assert_eq!(
        app.stream_entries(app.command_streams().dead_letters())
            .await
            .len(),
        5,
        "every unreadable entry is moved aside"
    );
    assert_eq!(app.transfer_count().await, 1);
    assert_eq!(app.balance(bob.wallet_id).await, 100_000 + 700);
    app.assert_invariants().await;
}
