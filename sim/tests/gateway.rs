//! The bank gateway simulator as its callers will meet it: a real process
//! with its own database, deduplicating by `Idempotency-Key`, and each of
//! its misbehaviours. Every test reads the gateway's own ledger of money
//! sent, not only its answers.

use std::time::Duration;

use serde_json::{Value, json};
use wallet_testkit::gateway::Gateway as GatewayProcess;

/// This crate's own gateway binary.
struct Gateway;

impl Gateway {
    async fn start(knobs: &[&str]) -> GatewayProcess {
        GatewayProcess::start(std::path::Path::new(env!("CARGO_BIN_EXE_wallet-sim")), knobs).await
    }
}

fn payout(amount_minor: i64, destination: &str) -> Value {
    json!({ "amount_minor": amount_minor, "currency": "USD", "destination": destination })
}

#[tokio::test]
async fn one_key_sends_once_however_often_and_however_concurrently_it_is_sent() {
    let gateway = Gateway::start(&["--latency-ms", "20"]).await;
    let body = payout(2_500, "acct-42");
    let answers = futures::future::join_all((0..20).map(|_| gateway.send("po_1", &body))).await;
    assert!(answers.iter().all(|(status, _, _)| *status == 201), "{answers:?}");
    assert!(answers.iter().all(|(_, answer, _)| *answer == answers[0].1));
    assert_eq!(answers.iter().filter(|(_, _, replayed)| !replayed).count(), 1);
    assert_eq!(gateway.sent("po_1").await, 1);

    // A retry long after gets the same answer, and sends nothing more.
    let (status, again, replayed) = gateway.send("po_1", &body).await;
    assert_eq!((status, replayed), (201, true));
    assert_eq!(again, answers[0].1);
    assert_eq!(gateway.sent_in_all().await, 1);
}

#[tokio::test]
async fn a_key_reused_for_another_payout_is_refused_and_sends_nothing() {
    let gateway = Gateway::start(&[]).await;
    assert_eq!(gateway.send("po_1", &payout(100, "acct-1")).await.0, 201);
    let (status, answer, _) = gateway.send("po_1", &payout(101, "acct-1")).await;
    assert_eq!(status, 409);
    assert_eq!(answer["error"], "idempotency_key_reused");
    assert_eq!(gateway.sent_in_all().await, 1);
}

#[tokio::test]
async fn a_closed_destination_is_refused_for_good_and_the_refusal_replays() {
    let gateway = Gateway::start(&[]).await;
    let body = payout(100, "closed-7");
    let (status, first, _) = gateway.send("po_1", &body).await;
    assert_eq!(
        (status, first["error"].as_str()),
        (422, Some("destination_refused"))
    );
    let (status, again, replayed) = gateway.send("po_1", &body).await;
    assert_eq!((status, replayed), (422, true));
    assert_eq!(again, first);
    assert_eq!(gateway.look_up("po_1").await, (422, first));
    assert_eq!(gateway.sent_in_all().await, 0);
}

/// The money leaves, the answer does not: the caller times out. The key
/// then tells what happened, by lookup or by a retry.
#[tokio::test]
async fn an_answer_lost_after_sending_leaves_the_money_sent_and_the_key_tells() {
    let gateway = Gateway::start(&["--lose-answer-rate", "1", "--lose-answer-ms", "5000"]).await;
    let body = payout(700, "acct-3");
    let timed_out = gateway
        .payout(Some("po_1"), &body)
        .timeout(Duration::from_millis(500))
        .send()
        .await;
    assert!(timed_out.is_err_and(|error| error.is_timeout()));
    assert_eq!(gateway.sent("po_1").await, 1, "sent, though nobody heard");

    let (status, stored) = gateway.look_up("po_1").await;
    assert_eq!(status, 201);
    let (status, retried, replayed) = gateway.send("po_1", &body).await;
    assert_eq!((status, replayed), (201, true));
    assert_eq!(retried, stored);
    assert_eq!(gateway.sent("po_1").await, 1);

    let (status, unknown) = gateway.look_up("po_never").await;
    assert_eq!(
        (status, unknown["type"].as_str()),
        (
            404,
            Some(layered_wallet::payout::gateway::UNKNOWN_KEY_PROBLEM_TYPE)
        )
    );
}

/// The process dies right after sending: the caller's connection breaks.
/// Started again on its database, it still knows the key.
#[tokio::test]
async fn a_crash_after_sending_loses_the_answer_but_not_the_sending() {
    let mut gateway = Gateway::start(&["--crash-after-send-rate", "1"]).await;
    let body = payout(900, "acct-9");
    assert!(gateway.payout(Some("po_1"), &body).send().await.is_err());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(gateway.has_exited(), "the gateway crashed");
    assert_eq!(gateway.sent("po_1").await, 1);

    gateway.kill();
    gateway.start_again(&[]).await;
    let (status, answer, replayed) = gateway.send("po_1", &body).await;
    assert_eq!((status, replayed), (201, true));
    assert_eq!(answer["status"], "sent");
    assert_eq!(gateway.sent("po_1").await, 1);
}

#[tokio::test]
async fn a_failure_before_applying_sends_nothing_and_says_when_to_retry() {
    let gateway = Gateway::start(&["--failure-rate", "1"]).await;
    let response = gateway
        .payout(Some("po_1"), &payout(100, "acct-1"))
        .send()
        .await
        .expect("an answer");
    assert_eq!(response.status(), 503);
    assert_eq!(
        response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    assert_eq!(gateway.sent_in_all().await, 0);
}

/// A gateway past its key retention period forgets the key, not the
/// sending: it answers the key as unknown, in the protocol's own words, and
/// a retry with it would send again. The wallet's reconcile therefore
/// takes that answer only for payouts younger than the promised retention.
#[tokio::test]
async fn a_key_past_its_retention_is_forgotten_but_its_sending_is_not() {
    let gateway = Gateway::start(&["--key-retention-ms", "100"]).await;
    let body = payout(300, "acct-4");
    assert_eq!(gateway.send("po_1", &body).await.0, 201);
    assert_eq!(
        gateway.look_up("po_1").await.0,
        201,
        "remembered within its retention"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;

    let response = gateway
        .http
        .get(format!("{}/v1/payouts/po_1", gateway.url))
        .send()
        .await
        .expect("an answer");
    assert_eq!(response.status(), 404);
    assert_eq!(
        response.headers()["content-type"],
        layered_wallet::payout::gateway::PROBLEM_CONTENT_TYPE
    );
    let forgotten: Value = response.json().await.expect("a problem");
    assert_eq!(
        forgotten["type"],
        layered_wallet::payout::gateway::UNKNOWN_KEY_PROBLEM_TYPE
    );
    assert_eq!(gateway.sent("po_1").await, 1, "the sending stays in the ledger");
    let (status, _, replayed) = gateway.send("po_1", &body).await;
    assert_eq!((status, replayed), (201, false));
    assert_eq!(gateway.sent("po_1").await, 2, "a forgotten key sends again");
}

/// The demonstration mode: without deduplication, every retry of one
/// payout sends the money again.
#[tokio::test]
async fn without_deduplication_every_retry_sends_again() {
    let gateway = Gateway::start(&["--no-dedup"]).await;
    for _ in 0..5 {
        assert_eq!(gateway.send("po_1", &payout(100, "acct-1")).await.0, 201);
    }
    assert_eq!(gateway.sent("po_1").await, 5);
}

#[tokio::test]
async fn bad_requests_are_refused_and_send_nothing() {
    let gateway = Gateway::start(&[]).await;
    let without_key = gateway
        .payout(None, &payout(100, "acct-1"))
        .send()
        .await
        .expect("answer");
    assert_eq!(without_key.status(), 400);
    for (body, status) in [
        (json!({"amount": 1}), 400),
        (payout(0, "acct-1"), 422),
        (payout(100, "acct 1"), 422),
        (
            json!({"amount_minor": 1, "currency": "usd", "destination": "a"}),
            422,
        ),
    ] {
        let response = gateway
            .payout(Some("po_bad"), &body)
            .send()
            .await
            .expect("answer");
        assert_eq!(response.status().as_u16(), status, "{body}");
    }
    assert_eq!(gateway.sent_in_all().await, 0);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM gateway_requests")
        .fetch_one(&gateway.db)
        .await
        .expect("count");
    assert_eq!(rows, 0, "a refused request claims no key");
}
