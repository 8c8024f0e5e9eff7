//! Money that leaves: payouts through the bank gateway simulator, a real
//! process with its own database. Every test asserts on both sides: the
//! wallets, holds and ledger here, and the gateway's own ledger of money
//! sent.

use std::time::{Duration, Instant};

use layered_wallet::payout::reconcile;
use opentelemetry_sdk::trace::SpanData;
use serde_json::Value;
use uuid::Uuid;
use wallet_testkit::gateway::{Gateway, wallet_sim_binary};
use wallet_testkit::*;

async fn gateway(knobs: &[&str]) -> Gateway {
    Gateway::start(&wallet_sim_binary(), knobs).await
}

/// Sendings per payout in the gateway's ledger, by the reference every
/// attempt carried.
async fn sendings(gateway: &Gateway) -> Vec<(Uuid, i64)> {
    wallet_sim::gateway::sendings_by_reference(&gateway.db)
        .await
        .expect("the gateway's ledger")
        .into_iter()
        .map(|(reference, count, _)| (reference.parse().expect("a payout id"), count))
        .collect()
}

async fn attempts(app: &TestApp, payout: Uuid) -> i32 {
    sqlx::query_scalar("SELECT attempts FROM payouts WHERE id = $1")
        .bind(payout)
        .fetch_one(&app.db)
        .await
        .expect("attempts")
}

/// The cooldown window the tests that retry wait out.
const SHORT_COOLDOWN_MS: u64 = 200;

fn with_payouts_and_a_short_cooldown(
    gateway_url: &str,
) -> impl FnOnce(&mut layered_wallet::settings::Settings) + use<> {
    let payouts = with_payouts(gateway_url);
    move |settings| {
        payouts(settings);
        settings.cooldown_ttl_ms = SHORT_COOLDOWN_MS;
    }
}

async fn after_the_cooldown() {
    tokio::time::sleep(Duration::from_millis(SHORT_COOLDOWN_MS + 50)).await;
}

#[tokio::test]
async fn a_payout_is_held_then_sent_once_and_settled_and_its_retry_replays_the_202() {
    let gateway = gateway(&["--latency-ms", "20"]).await;
    let app = spawn_app(with_payouts_and_a_short_cooldown(&gateway.url)).await;
    let alice = app.sign_up("alice").await;
    let key = Uuid::new_v4();
    let body = payout_body(alice.wallet_id, 2_500, "acct-42");

    let response = app
        .payout_request(&alice, &body, Some(key))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), 202);
    let location = response.headers()["location"].to_str().expect("text").to_owned();
    let trace_id = response.headers()["traceparent"].to_str().expect("text")[3..35].to_owned();
    let first = response.text().await.expect("body");
    let receipt: Value = serde_json::from_str(&first).expect("json");
    let payout: Uuid = receipt["id"].as_str().expect("id").parse().expect("uuid");
    assert_eq!(location, format!("/api/v1/payouts/{payout}"));
    assert_eq!(receipt["state"], "pending");
    assert_eq!(receipt["available_balance_minor_after"], 97_500);

    // Until it settles, the wallet shows the amount held; after, posted.
    let wallet = app
        .get_json(&format!("/api/v1/wallets/{}", alice.wallet_id), Some(&alice))
        .await;
    assert_eq!(wallet["balance_minor"], 97_500, "{wallet}");
    assert_eq!(
        wallet["posted_balance_minor"].as_i64().expect("posted")
            - wallet["held_minor"].as_i64().expect("held"),
        97_500,
        "{wallet}"
    );
    assert_eq!(app.wait_for_payout(payout, &["settled"]).await, "settled");
    let settled = app
        .get_json(&format!("/api/v1/wallets/{}", alice.wallet_id), Some(&alice))
        .await;
    assert_eq!(
        (
            settled["held_minor"].as_i64(),
            settled["posted_balance_minor"].as_i64()
        ),
        (Some(0), Some(97_500)),
        "{settled}"
    );
    let shown = app.get_json(&location, Some(&alice)).await;
    assert_eq!(
        (shown["state"].as_str(), shown["attempts"].as_i64()),
        (Some("settled"), Some(1))
    );
    assert!(shown["gateway_reference"].is_string(), "{shown}");

    // A retry with the key replays the 202, byte for byte, and sends nothing.
    after_the_cooldown().await;
    let again = app
        .payout_request(&alice, &body, Some(key))
        .send()
        .await
        .expect("sent");
    assert_eq!(again.status(), 202);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["location"].to_str().expect("text"), location);
    assert_eq!(again.text().await.expect("body"), first);

    assert_eq!(sendings(&gateway).await, vec![(payout, 1)]);
    assert_eq!(app.balance(alice.wallet_id).await, 97_500);
    assert_eq!(app.held_minor().await, 0);
    assert_eq!(app.outbox_rows().await, 0);
    assert!(money_invariant_violations(&app.db).await.is_empty());
    let list = app.get_json("/api/v1/payouts", Some(&alice)).await;
    assert_eq!(list["items"][0]["id"], payout.to_string());

    // One trace: the request, the dispatcher's span under it, and the
    // gateway call under that.
    let deadline = Instant::now() + Duration::from_secs(10);
    let spans: Vec<SpanData> = loop {
        let spans: Vec<SpanData> = spans()
            .get_finished_spans()
            .expect("spans")
            .into_iter()
            .filter(|span| span.span_context.trace_id().to_string() == trace_id)
            .collect();
        if spans.iter().any(|span| span.name == "payout.dispatch") || Instant::now() > deadline {
            break spans;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let named = |name: &str| spans.iter().find(|span| span.name == name);
    let request = spans
        .iter()
        .find(|span| span.name.starts_with("POST "))
        .expect("the request's span");
    let dispatch = named("payout.dispatch").expect("the dispatcher's span in the request's trace");
    let call = named("payout.gateway_call").expect("the gateway call's span");
    assert_eq!(dispatch.parent_span_id, request.span_context.span_id());
    assert_eq!(call.parent_span_id, dispatch.span_context.span_id());
}

#[tokio::test]
async fn bad_payouts_are_refused_and_change_nothing() {
    let gateway = gateway(&[]).await;
    let app = spawn_app(with_payouts_and_a_short_cooldown(&gateway.url)).await;
    let alice = app.sign_up("alice").await;
    let bob = app.sign_up("bob").await;
    let before = app.snapshot().await;
    let refusals = [
        (
            payout_body(alice.wallet_id, 0, "acct-1"),
            422,
            "validation-failed",
        ),
        (
            payout_body(alice.wallet_id, 100, "acct 1"),
            422,
            "validation-failed",
        ),
        (
            payout_body(alice.wallet_id, 2_000_000, "acct-1"),
            422,
            "validation-failed",
        ),
        (payout_body(bob.wallet_id, 100, "acct-1"), 403, "not-your-wallet"),
    ];
    for (body, status, kind) in refusals {
        after_the_cooldown().await;
        let (got, problem) = problem(
            app.payout_request(&alice, &body, Some(Uuid::new_v4()))
                .send()
                .await
                .expect("sent"),
        )
        .await;
        assert_eq!(
            (got, problem["type"].as_str()),
            (status, Some(&*format!("/problems/{kind}"))),
            "{body}"
        );
    }
    assert_eq!(app.snapshot().await, before, "a refused payout changed something");

    // More than the available balance: stored like a success, no hold.
    let key = Uuid::new_v4();
    let body = payout_body(alice.wallet_id, 100_001, "acct-1");
    after_the_cooldown().await;
    let (status, refused) = problem(
        app.payout_request(&alice, &body, Some(key))
            .send()
            .await
            .expect("sent"),
    )
    .await;
    assert_eq!(
        (status, refused["type"].as_str()),
        (422, Some("/problems/insufficient-funds"))
    );
    let other = payout_body(alice.wallet_id, 5, "acct-1");
    after_the_cooldown().await;
    let (status, reused) = problem(
        app.payout_request(&alice, &other, Some(key))
            .send()
            .await
            .expect("sent"),
    )
    .await;
    assert_eq!(
        (status, reused["type"].as_str()),
        (422, Some("/problems/idempotency-key-reused"))
    );
    assert_eq!(app.payouts_by_state().await, vec![]);
    assert_eq!(app.balance(alice.wallet_id).await, 100_000);
    assert!(sendings(&gateway).await.is_empty());

    // A deployment without a gateway says so.
    let without = spawn_app(|_| {}).await;
    let carol = without.sign_up("carol").await;
    let (status, problem) = problem(
        without
            .payout_request(&carol, &payout_body(carol.wallet_id, 5, "acct-1"), None)
            .send()
            .await
            .expect("sent"),
    )
    .await;
    assert_eq!(
        (status, problem["type"].as_str()),
        (404, Some("/problems/payouts-not-offered"))
    );
}

#[tokio::test]
async fn a_refused_destination_releases_the_hold_and_tells_the_owner() {
    let gateway = gateway(&[]).await;
    let app = spawn_app(with_payouts(&gateway.url)).await;
    let alice = app.sign_up("alice").await;
    let payout = app.pay_out(&alice, 4_000, "closed-9").await;
    assert_eq!(app.wait_for_payout(payout, &["failed"]).await, "failed");
    let shown = app
        .get_json(&format!("/api/v1/payouts/{payout}"), Some(&alice))
        .await;
    assert!(
        shown["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("destination_refused")),
        "{shown}"
    );
    assert_eq!(app.balance(alice.wallet_id).await, 100_000, "the hold came back");
    assert_eq!(app.held_minor().await, 0);
    assert!(sendings(&gateway).await.is_empty(), "nothing was sent");
    assert!(money_invariant_violations(&app.db).await.is_empty());

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let feed = app.get_json("/api/v1/decisions", Some(&alice)).await;
        let told = feed["items"].as_array().into_iter().flatten().any(|entry| {
            entry["entry_point"] == "payout"
                && entry["problem_type"] == "payout-refused"
                && entry["layer"] == "gateway"
        });
        if told {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the owner's feed never said the payout was refused: {feed}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The gateway sends, then holds its answer past our call's time-out: the
/// outcome is unknown, the retry carries the same key, the gateway replays
/// its answer, and each payout settles having been sent once.
#[tokio::test]
async fn answers_lost_after_sending_are_retried_with_the_same_key_and_each_payout_is_sent_once() {
    let gateway = gateway(&["--lose-answer-rate", "1", "--lose-answer-ms", "3000"]).await;
    let app = spawn_app(with_payouts(&gateway.url)).await;
    let mut payouts = Vec::new();
    for name in ["alice", "bob", "carol", "dave", "erin"] {
        let user = app.sign_up(name).await;
        payouts.push((app.pay_out(&user, 1_000, "acct-7").await, user));
    }
    for (payout, user) in &payouts {
        assert_eq!(app.wait_for_payout(*payout, &["settled"]).await, "settled");
        assert!(attempts(&app, *payout).await >= 2, "the first answer was lost");
        assert_eq!(app.balance(user.wallet_id).await, 99_000);
    }
    let mut expected: Vec<(Uuid, i64)> = payouts.iter().map(|(payout, _)| (*payout, 1)).collect();
    expected.sort();
    assert_eq!(
        sendings(&gateway).await,
        expected,
        "each payout sent exactly once"
    );
    assert!(
        app.metric("wallet_payout_attempts_total{answer=\"unknown\"}")
            .await
            >= 5.0
    );
    assert!(money_invariant_violations(&app.db).await.is_empty());
}

/// With the gateway gone for longer than the retries, payouts need a
/// person and keep their holds; `reconcile` then asks the restarted
/// gateway: the one it had sent before crashing settles, the one it never
/// received is released.
#[tokio::test]
async fn the_gateway_down_past_the_retries_leaves_payouts_needing_attention_until_reconciled() {
    let mut gateway = gateway(&["--crash-after-send-rate", "1"]).await;
    let app = spawn_app(with_payouts(&gateway.url)).await;
    let alice = app.sign_up("alice").await;
    let bob = app.sign_up("bob").await;
    let sent_before_the_crash = app.pay_out(&alice, 3_000, "acct-1").await;
    assert_eq!(
        app.wait_for_payout(sent_before_the_crash, &["needs_attention"])
            .await,
        "needs_attention"
    );
    let never_received = app.pay_out(&bob, 2_000, "acct-2").await;
    assert_eq!(
        app.wait_for_payout(never_received, &["needs_attention"]).await,
        "needs_attention"
    );
    assert_eq!(
        attempts(&app, never_received).await,
        4,
        "payout_attempts_max calls"
    );
    assert_eq!(app.held_minor().await, 5_000, "an unknown outcome keeps its hold");
    assert_eq!(app.balance(alice.wallet_id).await, 97_000);
    assert_eq!(app.outbox_rows().await, 0);
    assert!(app.metric("wallet_payouts_needs_attention_total").await >= 2.0);

    gateway.kill();
    gateway.start_again(&[]).await;
    let config = app.settings.validate().expect("valid settings");
    let reconciled = reconcile::run(&app.db, &config).await.expect("reconcile");
    assert_eq!(reconciled.settled, vec![sent_before_the_crash]);
    assert_eq!(reconciled.released, vec![never_received]);
    assert!(reconciled.left.is_empty());
    assert_eq!(app.payout_state(sent_before_the_crash).await, "settled");
    assert_eq!(app.payout_state(never_received).await, "failed");
    assert_eq!(app.balance(alice.wallet_id).await, 97_000);
    assert_eq!(app.balance(bob.wallet_id).await, 100_000);
    assert_eq!(app.held_minor().await, 0);
    assert_eq!(sendings(&gateway).await, vec![(sent_before_the_crash, 1)]);
    assert!(money_invariant_violations(&app.db).await.is_empty());

    // Run again, it finds nothing left to do.
    let again = reconcile::run(&app.db, &config).await.expect("reconcile");
    assert!(again.settled.is_empty() && again.released.is_empty() && again.left.is_empty());
}

/// Two instances' dispatchers race for one outbox, against a gateway that
/// does not deduplicate: only the outbox's locks and leases stand between
/// a payout and a second sending.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_racing_for_the_outbox_send_each_payout_once_even_without_gateway_deduplication() {
    let gateway = gateway(&["--no-dedup", "--latency-ms", "30"]).await;
    let first = spawn_app(with_payouts(&gateway.url)).await;
    let second = spawn_second_instance(&first).await;
    let mut payouts = Vec::new();
    for index in 0..24 {
        let app = if index % 2 == 0 { &first } else { &second };
        let user = app.sign_up(&format!("payee-{index}")).await;
        payouts.push(app.pay_out(&user, 100 + index, "acct-9").await);
    }
    for payout in &payouts {
        assert_eq!(first.wait_for_payout(*payout, &["settled"]).await, "settled");
    }
    let total_attempts: i64 = sqlx::query_scalar("SELECT sum(attempts)::bigint FROM payouts")
        .fetch_one(&first.db)
        .await
        .expect("attempts");
    assert_eq!(total_attempts, 24, "no row was taken twice");
    let mut expected: Vec<(Uuid, i64)> = payouts.iter().map(|payout| (*payout, 1)).collect();
    expected.sort();
    assert_eq!(sendings(&gateway).await, expected);
    let dispatched_by_each = [
        first
            .metric("wallet_payout_attempts_total{answer=\"sent\"}")
            .await,
        second
            .metric("wallet_payout_attempts_total{answer=\"sent\"}")
            .await,
    ];
    assert_eq!(
        dispatched_by_each.iter().sum::<f64>(),
        24.0,
        "{dispatched_by_each:?}"
    );
    assert!(money_invariant_violations(&first.db).await.is_empty());
}

/// The instance dies after the gateway sent and before the settlement: its
/// lease runs out, another instance takes the row, sends again with the
/// same key, gets the gateway's stored answer, and settles once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_instance_killed_between_the_call_and_the_settlement_is_taken_over_and_settles_once() {
    let gateway = gateway(&["--lose-answer-rate", "1", "--lose-answer-ms", "2000"]).await;
    let mut first = spawn_app(|settings| {
        with_payouts(&gateway.url)(settings);
        settings.payout_call_timeout_ms = 2_500;
    })
    .await;
    let alice = first.sign_up("alice").await;
    let payout = first.pay_out(&alice, 6_000, "acct-3").await;

    // The gateway has sent; its answer is held back, and the instance dies
    // waiting for it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while sendings(&gateway).await.is_empty() {
        assert!(Instant::now() < deadline, "the gateway never sent");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.kill().await;
    assert_eq!(
        first.payout_state(payout).await,
        "sent",
        "killed before the settlement"
    );

    let second = spawn_second_instance(&first).await;
    assert_eq!(second.wait_for_payout(payout, &["settled"]).await, "settled");
    assert_eq!(
        attempts(&second, payout).await,
        2,
        "taken over once its lease ran out"
    );
    assert_eq!(sendings(&gateway).await, vec![(payout, 1)], "sent once");
    assert_eq!(second.balance(alice.wallet_id).await, 94_000);
    assert_eq!(second.held_minor().await, 0);
    assert!(money_invariant_violations(&second.db).await.is_empty());
}

/// DEMO ONLY: with a new key per attempt, each attempt whose answer was
/// lost is a new payment to the gateway, and the payout is paid once per
/// attempt.
#[tokio::test]
async fn a_new_key_per_attempt_pays_once_per_lost_answer() {
    let gateway = gateway(&["--lose-answer-rate", "1", "--lose-answer-ms", "3000"]).await;
    let app = spawn_app(|settings| {
        with_payouts(&gateway.url)(settings);
        settings.allow_unsafe_demo_modes = true;
        settings.payout_mode = layered_wallet::settings::PayoutMode::NewKeyPerAttempt;
    })
    .await;
    let alice = app.sign_up("alice").await;
    let payout = app.pay_out(&alice, 1_500, "acct-5").await;
    assert_eq!(
        app.wait_for_payout(payout, &["needs_attention"]).await,
        "needs_attention"
    );
    assert_eq!(
        sendings(&gateway).await,
        vec![(payout, 4)],
        "one payout, paid at each of its 4 attempts"
    );
    assert_eq!(
        app.held_minor().await,
        1_500,
        "debited once here, sent four times there"
    );
}

/// DEMO ONLY: calling the gateway inside the transaction, a lost answer
/// rolls the hold back while the money has left; the client's retry then
/// sends it again.
#[tokio::test]
async fn calling_the_gateway_inside_the_transaction_sends_money_without_a_debit() {
    let gateway = gateway(&["--lose-answer-rate", "1", "--lose-answer-ms", "3000"]).await;
    let app = spawn_app(|settings| {
        with_payouts_and_a_short_cooldown(&gateway.url)(settings);
        settings.allow_unsafe_demo_modes = true;
        settings.payout_mode = layered_wallet::settings::PayoutMode::CallInTransaction;
    })
    .await;
    let alice = app.sign_up("alice").await;
    let key = Uuid::new_v4();
    let body = payout_body(alice.wallet_id, 2_000, "acct-6");
    for attempt in 1..=2 {
        let (status, problem) = problem(
            app.payout_request(&alice, &body, Some(key))
                .send()
                .await
                .expect("sent"),
        )
        .await;
        assert_eq!(status, 503, "attempt {attempt}: {problem}");
        after_the_cooldown().await;
    }
    let sent = sendings(&gateway).await;
    assert_eq!(sent.len(), 2, "each retry was a new payout, each sent: {sent:?}");
    assert_eq!(app.payouts_by_state().await, vec![], "every hold rolled back");
    assert_eq!(
        app.balance(alice.wallet_id).await,
        100_000,
        "4,000 left, nothing debited"
    );
}

/// The dispatcher settles a batch of sent payouts in one transaction
/// (`payout_settle_all()`): each once, whoever settled some of them first
/// (another dispatcher whose lease ran out, reconcile), and a batch
/// recorded again changes nothing.
#[tokio::test]
async fn a_batch_settles_each_sent_payout_once_whoever_settled_some_first() {
    let gateway = gateway(&[]).await;
    let payouts = with_payouts_and_a_short_cooldown(&gateway.url);
    let app = spawn_app(move |settings| {
        payouts(settings);
        // Nothing settles them but this test.
        settings.payout_dispatcher_enabled = false;
    })
    .await;
    let alice = app.sign_up("alice").await;
    let mut batch = Vec::new();
    for amount in [100, 200, 300] {
        batch.push(app.pay_out(&alice, amount, "acct-7").await);
        after_the_cooldown().await;
    }
    let settle_one: String = sqlx::query_scalar("SELECT recorded::text FROM payout_settle($1, $2, 'first')")
        .bind(batch[1])
        .bind(Uuid::now_v7())
        .fetch_one(&app.db)
        .await
        .expect("one settled first");
    assert_eq!(settle_one, "done");

    let settle_all = || async {
        let transfer_ids: Vec<Uuid> = batch.iter().map(|_| Uuid::now_v7()).collect();
        let references = vec!["ref-a", "ref-b", "ref-c"];
        sqlx::query_as::<_, (Uuid, String)>(
            "SELECT settled_payout_id, recorded::text FROM payout_settle_all($1, $2, $3)",
        )
        .bind(&batch)
        .bind(transfer_ids)
        .bind(references)
        .fetch_all(&app.db)
        .await
        .expect("the batch settles")
    };
    let recorded = |labels: [&str; 3]| -> Vec<(Uuid, String)> {
        batch
            .iter()
            .zip(labels)
            .map(|(payout, label)| (*payout, label.to_owned()))
            .collect()
    };
    assert_eq!(settle_all().await, recorded(["done", "already", "done"]));
    assert_eq!(settle_all().await, recorded(["already", "already", "already"]));

    assert_eq!(app.payouts_by_state().await, vec![("settled".to_owned(), 3)]);
    let settlements: i64 =
        sqlx::query_scalar("SELECT count(*) FROM transfers t JOIN payouts p ON p.settle_transfer_id = t.id")
            .fetch_one(&app.db)
            .await
            .expect("settlements");
    let transfers_from_holds: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM transfers WHERE from_wallet_id = (SELECT id FROM wallets WHERE clearing_source = 'holds')",
    )
    .fetch_one(&app.db)
    .await
    .expect("transfers out of the holds wallet");
    assert_eq!((settlements, transfers_from_holds), (3, 3), "each settled once");
    assert_eq!(app.held_minor().await, 0);
    assert_eq!(app.outbox_rows().await, 0);
    assert_eq!(app.balance(alice.wallet_id).await, 100_000 - 600);
    assert_eq!(money_invariant_violations(&app.db).await, Vec::<String>::new());
}

#[tokio::test]
async fn a_payout_from_your_own_lab_wallet_is_refused_each_time_and_leaves_no_key_behind() {
    let gateway = gateway(&[]).await;
    let app = spawn_app(with_payouts_and_a_short_cooldown(&gateway.url)).await;
    let alice = app.sign_up("alice").await;
    let (lab_a,): (Uuid,) = sqlx::query_as("SELECT wallet_a FROM race_lab_reset($1, 10000)")
        .bind(alice.user_id)
        .fetch_one(&app.db)
        .await
        .expect("lab wallets");
    let before = app.snapshot().await;
    let key = Uuid::new_v4();
    // The same key twice: a claim left without an answer would make the
    // second an "in flight" 409 until the key expired.
    for _ in 0..2 {
        after_the_cooldown().await;
        let (status, problem) = problem(
            app.payout_request(&alice, &payout_body(lab_a, 100, "acct-1"), Some(key))
                .send()
                .await
                .expect("sent"),
        )
        .await;
        assert_eq!(
            (status, problem["type"].as_str()),
            (403, Some("/problems/not-your-wallet"))
        );
    }
    let keys: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE key = $1")
        .bind(key)
        .fetch_one(&app.db)
        .await
        .expect("keys");
    assert_eq!(keys, 0, "a refused payout left its key claimed");
    assert_eq!(app.snapshot().await, before, "a refused payout changed something");
}

/// A relay in front of the gateway that counts the connections open
/// through it at once. The dispatcher's client opens a connection only
/// when a call finds every open one carrying another call, so the most
/// connections open at once is never more than the calls that were in
/// flight at once, and more than one when calls went at once.
struct ConnectionsCounted {
    url: String,
    most_open: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

async fn count_connections_to(gateway: &Gateway) -> ConnectionsCounted {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let upstream = gateway.url.trim_start_matches("http://").to_owned();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the relay");
    let url = format!("http://{}", listener.local_addr().expect("the relay's address"));
    let (open, most_open) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let most = most_open.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            most.fetch_max(open.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
            let (open, upstream) = (open.clone(), upstream.clone());
            tokio::spawn(async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
                open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    ConnectionsCounted { url, most_open }
}

/// A backlog larger than the calls in flight: the dispatcher keeps
/// `payout_gateway_calls_in_flight_max` calls going, refills each slot as
/// its answer is recorded, and every payout reaches the gateway once and
/// settles once, its hold moved to the gateway's clearing wallet.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backlog_dispatched_with_calls_in_flight_reaches_the_gateway_once_each_within_the_bound() {
    const PAYOUTS: i64 = 40;
    const CALLS_IN_FLIGHT_MAX: u32 = 3;
    let gateway = gateway(&["--latency-ms", "50"]).await;
    let relay = count_connections_to(&gateway).await;
    let payouts = with_payouts(&relay.url);
    let accepting = spawn_app(move |settings| {
        payouts(settings);
        // The backlog builds up before any dispatcher runs.
        settings.payout_dispatcher_enabled = false;
    })
    .await;
    let mut made = Vec::new();
    for index in 0..PAYOUTS {
        let user = accepting.sign_up(&format!("payee-{index}")).await;
        let amount = 100 + index;
        made.push((accepting.pay_out(&user, amount, "acct-3").await, user, amount));
    }
    assert_eq!(accepting.outbox_rows().await, PAYOUTS);

    let dispatching = spawn_second_instance_with(&accepting, |settings| {
        settings.payout_dispatcher_enabled = true;
        settings.payout_gateway_calls_in_flight_max = CALLS_IN_FLIGHT_MAX;
        // Slots are refilled two at a time while a call is still out.
        settings.payout_take_rows_min = 2;
    })
    .await;
    for (payout, user, amount) in &made {
        assert_eq!(
            dispatching.wait_for_payout(*payout, &["settled"]).await,
            "settled"
        );
        assert_eq!(dispatching.balance(user.wallet_id).await, 100_000 - amount);
    }
    let mut expected: Vec<(Uuid, i64)> = made.iter().map(|(payout, _, _)| (*payout, 1)).collect();
    expected.sort();
    assert_eq!(
        sendings(&gateway).await,
        expected,
        "each payout sent exactly once"
    );
    let total_attempts: i64 = sqlx::query_scalar("SELECT sum(attempts)::bigint FROM payouts")
        .fetch_one(&accepting.db)
        .await
        .expect("attempts");
    assert_eq!(total_attempts, PAYOUTS, "no row was taken twice");
    let paid_out: i64 = made.iter().map(|(_, _, amount)| amount).sum();
    let at_the_gateway: i64 =
        sqlx::query_scalar("SELECT balance_minor FROM wallets WHERE clearing_source = 'gateway'")
            .fetch_one(&accepting.db)
            .await
            .expect("the gateway's clearing wallet");
    assert_eq!(at_the_gateway, paid_out);
    assert_eq!(accepting.held_minor().await, 0);
    assert_eq!(accepting.outbox_rows().await, 0);

    let most_open = relay.most_open.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        (2..=CALLS_IN_FLIGHT_MAX as usize).contains(&most_open),
        "calls went at once, never more than the bound: {most_open} connections open at once"
    );
    assert_eq!(
        money_invariant_violations(&accepting.db).await,
        Vec::<String>::new()
    );
}
