//! Money that arrives: a payment provider's deposit webhooks, delivered
//! signed, duplicated and concurrent over real HTTP, asserting on the
//! database afterwards.

use std::collections::HashMap;

use chrono::{TimeDelta, Utc};
use serde_json::Value;
use wallet_testkit::*;

/// Each response's status and body, and its `Defense-Decision`.
async fn answers(responses: Vec<reqwest::Response>) -> Vec<(u16, String, String)> {
    let mut answers = Vec::with_capacity(responses.len());
    for response in responses {
        let status = response.status().as_u16();
        let decision = response
            .headers()
            .get("defense-decision")
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        answers.push((status, response.text().await.expect("a body"), decision));
    }
    answers
}

fn decisions(answers: &[(u16, String, String)]) -> HashMap<&str, usize> {
    let mut counts = HashMap::new();
    for (_, _, decision) in answers {
        *counts.entry(decision.as_str()).or_insert(0) += 1;
    }
    counts
}

#[tokio::test]
async fn a_signed_deposit_is_credited_once_and_a_redelivery_gets_the_same_bytes() {
    let app = spawn_app(with_deposits).await;
    let alice = app.sign_up("alice").await;
    let event = deposit_event(&new_event_id(), alice.wallet_id, 2_500);

    let first = answers(vec![app.deposit_request(&event).send().await.expect("sent")]).await;
    let (status, body, decision) = &first[0];
    assert_eq!(*status, 200, "{body}");
    assert_eq!(decision, "layer=row_guard, outcome=accepted");
    let receipt: Value = serde_json::from_str(body).expect("json");
    assert_eq!(receipt["status"], "credited");
    assert_eq!(receipt["amount_minor"], 2_500);
    assert_eq!(receipt["event_id"], event["event_id"]);

    let again = answers(vec![app.deposit_request(&event).send().await.expect("sent")]).await;
    assert_eq!(
        (again[0].0, &again[0].1),
        (200, body),
        "a redelivery answers the same bytes"
    );
    assert_eq!(again[0].2, "layer=edge_lock, outcome=replayed");

    assert_eq!(app.balance(alice.wallet_id).await, 100_000 + 2_500);
    assert_eq!(app.deposit_count().await, 1);
    assert_eq!(app.inbox_rows().await, 1);
    app.assert_invariants().await;

    // The person sees it in their history, from the provider.
    let history = app.get_json("/api/v1/transfers", Some(&alice)).await;
    assert_eq!(history["items"][0]["amount_minor"], 2_500, "{history}");
    assert_eq!(history["items"][0]["direction"], "received", "{history}");
}

/// The storm: 100 copies of one event at once, half at each of two
/// instances. One credit, and 100 identical answers.
#[tokio::test]
async fn a_hundred_concurrent_copies_across_two_instances_credit_once_with_identical_answers() {
    let first = spawn_app(with_deposits).await;
    let second = spawn_second_instance(&first).await;
    let alice = first.sign_up("alice").await;
    let event = deposit_event(&new_event_id(), alice.wallet_id, 700);
    let requests = (0..100)
        .map(|copy| {
            let instance = if copy % 2 == 0 { &first } else { &second };
            instance.deposit_request(&event)
        })
        .collect();
    let answers = answers(fire_together(requests).await).await;
    let (status, body, _) = &answers[0];
    assert_eq!(*status, 200, "{body}");
    assert!(
        answers.iter().all(|(s, b, _)| s == status && b == body),
        "every copy gets the same status and bytes: {:?}",
        decisions(&answers)
    );
    let counts = decisions(&answers);
    assert_eq!(
        counts.get("layer=row_guard, outcome=accepted"),
        Some(&1),
        "{counts:?}"
    );

    assert_eq!(first.balance(alice.wallet_id).await, 100_000 + 700);
    assert_eq!(first.deposit_count().await, 1);
    assert_eq!(first.inbox_rows().await, 1);
    first.assert_invariants().await;
}

/// With the edge lock off, every copy reaches PostgreSQL, and the inbox
/// alone still credits once and answers each copy the same.
#[tokio::test]
async fn without_the_edge_lock_the_inbox_alone_credits_once() {
    let first = spawn_app(|settings| {
        with_deposits(settings);
        settings.event_lock_enabled = false;
    })
    .await;
    let second = spawn_second_instance(&first).await;
    let alice = first.sign_up("alice").await;
    let event = deposit_event(&new_event_id(), alice.wallet_id, 300);
    let requests = (0..40)
        .map(|copy| if copy % 2 == 0 { &first } else { &second }.deposit_request(&event))
        .collect();
    let answers = answers(fire_together(requests).await).await;
    let (status, body, _) = &answers[0];
    assert_eq!(*status, 200, "{body}");
    assert!(answers.iter().all(|(s, b, _)| s == status && b == body));
    let counts = decisions(&answers);
    assert_eq!(
        counts.get("layer=row_guard, outcome=accepted"),
        Some(&1),
        "{counts:?}"
    );
    assert_eq!(
        counts.get("layer=inbox, outcome=replayed"),
        Some(&39),
        "{counts:?}"
    );

    assert_eq!(first.balance(alice.wallet_id).await, 100_000 + 300);
    assert_eq!(first.deposit_count().await, 1);
    first.assert_invariants().await;
}

/// A duplicate that arrives while the first delivery is still inside its
/// transaction waits for it and answers the same, on another instance.
#[tokio::test]
async fn a_duplicate_during_a_slow_first_delivery_waits_and_answers_the_same() {
    let first = spawn_app(with_deposits).await;
    let second = spawn_second_instance(&first).await;
    let alice = first.sign_up("alice").await;
    first.slow_down_ledger_writes(1).await;
    let event = deposit_event(&new_event_id(), alice.wallet_id, 900);
    let slow = tokio::spawn(first.deposit_request(&event).send());
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let duplicate = answers(vec![second.deposit_request(&event).send().await.expect("sent")]).await;
    let original = answers(vec![slow.await.expect("task").expect("sent")]).await;
    assert_eq!(original[0].0, 200, "{}", original[0].1);
    assert_eq!((duplicate[0].0, &duplicate[0].1), (200, &original[0].1));
    assert_eq!(duplicate[0].2, "layer=edge_lock, outcome=replayed");
    assert_eq!(first.balance(alice.wallet_id).await, 100_000 + 900);
    assert_eq!(first.deposit_count().await, 1);
    first.assert_invariants().await;
}

#[tokio::test]
async fn the_same_event_id_with_another_payload_is_refused_and_the_first_stands() {
    let app = spawn_app(with_deposits).await;
    let alice = app.sign_up("alice").await;
    let event_id = new_event_id();
    let event = deposit_event(&event_id, alice.wallet_id, 1_000);
    let first = app.deposit_request(&event).send().await.expect("sent");
    assert_eq!(first.status(), 200);
    let first_body = first.text().await.expect("body");

    let mut changed = event.clone();
    changed["amount_minor"] = 100_000.into();
    let (status, refused) = problem(app.deposit_request(&changed).send().await.expect("sent")).await;
    assert_eq!(status, 422);
    assert_eq!(refused["type"], "/problems/event-payload-changed");

    // Straight to the inbox too, with the edge's answer gone.
    let second_instance_without_edge = {
        let mut settings = app.settings.clone();
        settings.http_port = 0;
        settings.event_lock_enabled = false;
        let mut second = spawn_with(settings, app.db_options.clone()).await;
        second.mark_second_instance();
        second
    };
    let (status, refused) = problem(
        second_instance_without_edge
            .deposit_request(&changed)
            .send()
            .await
            .expect("sent"),
    )
    .await;
    assert_eq!(status, 422);
    assert_eq!(refused["type"], "/problems/event-payload-changed");
    assert_eq!(refused["layer"], "inbox");

    app.forget_event_answers().await;
    let again = app.deposit_request(&event).send().await.expect("sent");
    assert_eq!(again.status(), 200);
    assert_eq!(
        again.headers()["defense-decision"],
        "layer=inbox, outcome=replayed"
    );
    assert_eq!(again.text().await.expect("body"), first_body);
    assert_eq!(app.balance(alice.wallet_id).await, 100_000 + 1_000);
    assert_eq!(app.deposit_count().await, 1);
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_delivery_without_a_valid_signature_is_401_and_stores_nothing() {
    let app = spawn_app(with_deposits).await;
    let alice = app.sign_up("alice").await;
    let before = app.snapshot().await;
    let event = deposit_event(&new_event_id(), alice.wallet_id, 1_000);
    let body = serde_json::to_vec(&event).expect("json");
    // Well past the tolerance, so that the seconds a busy machine takes
    // between signing and sending cannot bring a signature back inside it.
    let past_tolerance = TimeDelta::seconds(app.settings.provider_signature_tolerance_s as i64 + 120);
    let unsigned = || {
        app.client
            .post(app.url("/api/v1/webhooks/deposits"))
            .header("content-type", "application/json")
            .body(body.clone())
    };
    let deliveries = [
        ("no signature", unsigned()),
        ("a user's bearer token", unsigned().bearer_auth(&alice.token)),
        (
            "a malformed header",
            unsigned().header("provider-signature", "v1=zz"),
        ),
        (
            "another secret",
            app.deposit_request_signed(&event, "a-secret-the-server-does-not-know-0000", Utc::now()),
        ),
        (
            "a stale signature",
            app.deposit_request_signed(&event, PROVIDER_SECRET, Utc::now() - past_tolerance),
        ),
        (
            "a signature from the future",
            app.deposit_request_signed(&event, PROVIDER_SECRET, Utc::now() + past_tolerance),
        ),
    ];
    for (what, delivery) in deliveries {
        let (status, problem) = problem(delivery.send().await.expect("sent")).await;
        assert_eq!(status, 401, "{what}");
        assert_eq!(problem["type"], "/problems/provider-signature-invalid", "{what}");
        assert!(
            !problem.to_string().contains(PROVIDER_SECRET),
            "{what}: the secret leaked"
        );
    }
    // A body signed for another body does not carry over.
    let mut other = event.clone();
    other["amount_minor"] = 99.into();
    let signed_for_event = app.deposit_request(&event).build().expect("request");
    let header = signed_for_event.headers()["provider-signature"].clone();
    let forged = app
        .client
        .post(app.url("/api/v1/webhooks/deposits"))
        .header("content-type", "application/json")
        .header("provider-signature", header)
        .body(serde_json::to_vec(&other).expect("json"));
    let (status, _) = problem(forged.send().await.expect("sent")).await;
    assert_eq!(status, 401);
    assert_eq!(app.snapshot().await, before);
}

/// The refusals that depend on the event alone are stored, so that every
/// redelivery gets the same answer and credits nothing.
#[tokio::test]
async fn permanent_refusals_are_stored_and_every_redelivery_gets_them() {
    let app = spawn_app(|settings| {
        with_deposits(settings);
        settings.deposit_amount_minor_max = 50_000;
    })
    .await;
    let alice = app.sign_up("alice").await;
    let clearing: uuid::Uuid =
        sqlx::query_scalar("SELECT id FROM wallets WHERE clearing_source = 'provider'")
            .fetch_one(&app.db)
            .await
            .expect("the clearing wallet");
    let mut other_currency = deposit_event(&new_event_id(), alice.wallet_id, 100);
    other_currency["currency"] = "EUR".into();
    let mut too_old = deposit_event(&new_event_id(), alice.wallet_id, 100);
    too_old["occurred_at"] = (Utc::now() - TimeDelta::days(31)).to_rfc3339().into();
    let cases = [
        (
            deposit_event(&new_event_id(), uuid::Uuid::now_v7(), 100),
            "deposit-wallet-unknown",
        ),
        (
            deposit_event(&new_event_id(), clearing, 100),
            "deposit-wallet-unknown",
        ),
        (other_currency, "deposit-currency-mismatch"),
        (
            deposit_event(&new_event_id(), alice.wallet_id, 50_001),
            "deposit-amount-over-limit",
        ),
        (too_old, "deposit-event-too-old"),
    ];
    for (event, slug) in &cases {
        let first = app.deposit_request(event).send().await.expect("sent");
        assert_eq!(first.status(), 422, "{slug}");
        let first_body = first.text().await.expect("body");
        assert!(first_body.contains(&format!("/problems/{slug}")), "{first_body}");
        // Past the edge's memory too: the inbox answers the same bytes.
        app.forget_event_answers().await;
        let again = app.deposit_request(event).send().await.expect("sent");
        assert_eq!(again.status(), 422);
        assert_eq!(again.text().await.expect("body"), first_body, "{slug}");
    }
    assert_eq!(app.balance(alice.wallet_id).await, 100_000);
    assert_eq!(app.deposit_count().await, 0);
    assert_eq!(app.inbox_rows().await, cases.len() as i64);
    app.assert_invariants().await;
}

/// The clearing wallet is money outside the service: no transfer can
/// reach it.
#[tokio::test]
async fn no_transfer_can_send_money_into_the_clearing_wallet() {
    let app = spawn_app(with_deposits).await;
    let alice = app.sign_up("alice").await;
    let clearing: uuid::Uuid =
        sqlx::query_scalar("SELECT id FROM wallets WHERE clearing_source = 'provider'")
            .fetch_one(&app.db)
            .await
            .expect("the clearing wallet");
    let response = app
        .transfer_request(&alice, clearing, 100, Some(&new_key()))
        .send()
        .await
        .expect("sent");
    let (status, problem) = problem(response).await;
    assert_eq!(status, 422);
    assert_eq!(problem["type"], "/problems/unknown-target-wallet");
    assert_eq!(app.balance(alice.wallet_id).await, 100_000);
    app.assert_invariants().await;
}

/// An event dated later than the clocks' allowed drift would stay young
/// past the sweep of its claim, and a redelivery then would be credited
/// again. It is refused, the refusal stored like "too old": every
/// redelivery gets the same bytes, and nothing is credited.
#[tokio::test]
async fn an_event_dated_past_the_signature_tolerance_is_refused_and_the_refusal_stored() {
    let app = spawn_app(with_deposits).await;
    let alice = app.sign_up("alice").await;
    let tolerance = TimeDelta::seconds(app.settings.provider_signature_tolerance_s as i64);
    let dated = |occurred_at: String| {
        let mut event = deposit_event(&new_event_id(), alice.wallet_id, 100);
        event["occurred_at"] = occurred_at.into();
        event
    };
    let refused = [
        dated("9999-12-31T23:59:59Z".to_owned()),
        dated((Utc::now() + tolerance + TimeDelta::seconds(120)).to_rfc3339()),
    ];
    for event in &refused {
        let first = app.deposit_request(event).send().await.expect("sent");
        assert_eq!(first.status(), 422, "{event}");
        let first_body = first.text().await.expect("body");
        assert!(
            first_body.contains("/problems/deposit-event-in-future"),
            "{first_body}"
        );
        app.forget_event_answers().await;
        let again = app.deposit_request(event).send().await.expect("sent");
        assert_eq!(again.status(), 422);
        assert_eq!(
            again.headers()["defense-decision"],
            "layer=inbox, outcome=replayed"
        );
        assert_eq!(again.text().await.expect("body"), first_body);
        let event_id = event["event_id"].as_str().expect("an id");
        assert_eq!(
            app.inbox_verdict(event_id).await.as_deref(),
            Some("event_in_future")
        );
    }
    assert_eq!(app.balance(alice.wallet_id).await, 100_000);
    assert_eq!(app.deposit_count().await, 0);

    // Within the tolerance, a provider's clock running ahead of ours is
    // no reason to refuse.
    let ahead = dated((Utc::now() + tolerance / 2).to_rfc3339());
    let credited = app.deposit_request(&ahead).send().await.expect("sent");
    assert_eq!(credited.status(), 200);
    assert_eq!(app.balance(alice.wallet_id).await, 100_000 + 100);
    assert_eq!(app.deposit_count().await, 1);
    app.assert_invariants().await;
}

/// `Provider-Signature` is single-valued, as every header that proves
/// something is: a second copy is refused before either is checked, even
/// when the first is valid.
#[tokio::test]
async fn a_second_signature_header_is_refused_and_nothing_is_stored() {
    let app = spawn_app(with_deposits).await;
    let alice = app.sign_up("alice").await;
    let before = app.snapshot().await;
    let event = deposit_event(&new_event_id(), alice.wallet_id, 1_000);
    let valid = app.deposit_request(&event).build().expect("request").headers()["provider-signature"].clone();
    for second in [valid.clone(), "t=1,v1=00".parse().expect("a header value")] {
        let delivery = app.deposit_request(&event).header("provider-signature", second);
        let (status, problem) = problem(delivery.send().await.expect("sent")).await;
        assert_eq!(status, 422, "{problem}");
        assert_eq!(problem["type"], "/problems/validation-failed", "{problem}");
        assert!(
            problem["detail"]
                .as_str()
                .is_some_and(|detail| detail.contains("provider-signature")),
            "{problem}"
        );
    }
    assert_eq!(app.snapshot().await, before);
    assert_eq!(app.inbox_rows().await, 0);
    assert_eq!(app.deposit_count().await, 0);
}
