//! The retry policy against the real server, its PostgreSQL and Redis,
//! through a proxy that loses answers after the server gave them. Each
//! test counts the transfers in the database, not only the answers.

use wallet_client::{Client, DecisionSource, Error, IdempotencyKey, RetryPolicy, TransferOrder};
use wallet_testkit::answer_cutter::AnswerCutter;
use wallet_testkit::*;

#[path = "../examples/pay_once.rs"]
#[allow(dead_code)]
mod pay_once;

fn order(from: &TestUser, to: &TestUser, amount_minor: i64) -> TransferOrder {
    TransferOrder {
        from_wallet_id: from.wallet_id,
        to_wallet_id: to.wallet_id,
        amount_minor,
    }
}

/// Quick enough for a test; the waits still come from the policy and
/// `Retry-After`.
fn policy() -> RetryPolicy {
    RetryPolicy {
        base: std::time::Duration::from_millis(50),
        cap: std::time::Duration::from_millis(500),
        attempts_max: 8,
        request_timeout: std::time::Duration::from_secs(10),
        call_time_max: std::time::Duration::from_secs(60),
        jitter: true,
    }
}

/// The README's example, through two cut answers: the first attempt's
/// transfer is made and its answer lost; the retries carry the same key;
/// the last answer is the stored one. One transfer in the database.
#[tokio::test]
async fn the_example_pays_exactly_once_through_cut_connections() {
    let app = spawn_app(|settings| settings.cooldown_ttl_ms = 300).await;
    let (alice, bob) = app.alice_and_bob().await;
    let cutter = AnswerCutter::start(&app.address, 2).await;
    let paid = pay_once::pay_once(&cutter.address, &alice.token, &order(&alice, &bob, 950))
        .await
        .expect("paid");
    assert_eq!(cutter.answers_cut(), 2, "the faults fired");
    assert!(paid.replayed, "the answer that came was the stored one");
    assert!(paid.attempts >= 3, "{paid:?}");
    assert_eq!(app.transfer_count().await, 1);
    assert_eq!(app.balance(alice.wallet_id).await, 100_000 - 950);
    app.assert_invariants().await;
}

/// The wrong way, under the same faults: a new key per attempt pays again
/// once the cooldown window has passed.
#[tokio::test]
async fn a_new_key_per_attempt_pays_twice_where_one_key_pays_once() {
    let app = spawn_app(|settings| settings.cooldown_ttl_ms = 300).await;
    let (alice, bob) = app.alice_and_bob().await;
    let cutter = AnswerCutter::start(&app.address, 2).await;
    let client = Client::new(&cutter.address, policy())
        .expect("client")
        .with_token(&alice.token)
        .minting_a_new_key_per_attempt();
    let paid = client
        .transfer(&order(&alice, &bob, 950), IdempotencyKey::new())
        .await
        .expect("an answer at last");
    assert!(!paid.replayed, "a fresh key is never a replay");
    assert!(
        app.transfer_count().await >= 2,
        "one payment, charged {} times",
        app.transfer_count().await
    );
    app.assert_invariants().await;
}

/// A refusal the same request would get again is final: sent once, typed.
#[tokio::test]
async fn refusals_are_final_and_say_which() {
    let app = spawn_app(without_cooldown).await;
    let (alice, bob) = app.alice_and_bob().await;
    let cutter = AnswerCutter::start(&app.address, 0).await;
    let client = Client::new(&cutter.address, policy()).expect("client");
    let cases = [
        (
            client.with_token(&alice.token),
            order(&alice, &bob, 5_000_000),
            422,
            "insufficient-funds",
        ),
        (
            client.with_token(&alice.token),
            order(&alice, &alice, 5),
            422,
            "same-wallet",
        ),
        (
            client.with_token(&alice.token),
            order(&bob, &alice, 5),
            403,
            "not-your-wallet",
        ),
        (
            client.with_token("lw1.bogus.token"),
            order(&alice, &bob, 5),
            401,
            "unauthorized",
        ),
    ];
    for (caller, order, status, slug) in cases {
        let sent = cutter.requests();
        match caller.transfer(&order, IdempotencyKey::new()).await {
            Err(Error::Refused(problem)) => {
                assert_eq!((problem.status, problem.slug()), (status, slug));
            }
            other => panic!("{slug}: {other:?}"),
        }
        assert_eq!(cutter.requests() - sent, 1, "{slug} was retried");
    }
    match client.with_token(&alice.token).wallet(uuid::Uuid::new_v4()).await {
        Err(Error::Refused(problem)) => assert_eq!(problem.status, 404),
        other => panic!("{other:?}"),
    }
    assert_eq!(app.transfer_count().await, 0);
}

/// Without a key nobody can tell a retry from a second payment: a lost
/// answer is reported as unknown, and nothing is sent again.
#[tokio::test]
async fn a_keyless_transfer_is_never_retried() {
    let app = spawn_app(without_cooldown).await;
    let (alice, bob) = app.alice_and_bob().await;
    let cutter = AnswerCutter::start(&app.address, 1).await;
    let client = Client::new(&cutter.address, policy())
        .expect("client")
        .with_token(&alice.token);
    match client.transfer_without_key(&order(&alice, &bob, 700)).await {
        Err(Error::OutcomeUnknown(_)) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(cutter.requests(), 1);
    assert_eq!(app.transfer_count().await, 1, "it was made, once");
}

/// A second payment inside the cooldown window is refused with 429 and
/// `Retry-After`; the client waits it out and pays, once.
#[tokio::test]
async fn a_cooldown_is_waited_out_and_then_paid_once() {
    let app = spawn_app(|settings| settings.cooldown_ttl_ms = 500).await;
    let (alice, bob) = app.alice_and_bob().await;
    let client = Client::new(&app.address, policy())
        .expect("client")
        .with_token(&alice.token);
    let first = client
        .transfer(&order(&alice, &bob, 100), IdempotencyKey::new())
        .await
        .expect("first");
    assert_eq!(first.attempts, 1);
    let second = client
        .transfer(&order(&alice, &bob, 200), IdempotencyKey::new())
        .await
        .expect("second");
    assert!(second.attempts >= 2, "the 429 was waited out: {second:?}");
    assert!(!second.replayed);
    assert_eq!(app.transfer_count().await, 2);
    app.assert_invariants().await;

    // The decisions say which layer decided each attempt: two made by the
    // row guard, the 429s by the cooldown. The feed is written
    // asynchronously: wait for it, bounded.
    let expected = 1 + second.attempts as usize;
    let mut decisions = Vec::new();
    for _ in 0..100 {
        decisions = client
            .decisions(DecisionSource::Real, None, None)
            .await
            .expect("decisions")
            .items;
        if decisions.len() >= expected {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let decided: Vec<(&str, &str)> = decisions
        .iter()
        .map(|decision| (decision.layer.as_str(), decision.outcome.as_str()))
        .collect();
    assert_eq!(decided.len(), expected, "{decided:?}");
    assert_eq!(decided.first(), Some(&("row_guard", "accepted")));
    assert_eq!(decided.last(), Some(&("row_guard", "accepted")));
    assert!(
        decided[1..expected - 1]
            .iter()
            .all(|d| *d == ("cooldown", "rejected")),
        "{decided:?}"
    );
}

/// Every answer lost: the client gives up after `attempts_max` requests
/// and says the payment may have been made; the database holds it once.
#[tokio::test]
async fn giving_up_says_the_outcome_is_unknown_and_it_was_paid_at_most_once() {
    let app = spawn_app(|settings| settings.cooldown_ttl_ms = 100).await;
    let (alice, bob) = app.alice_and_bob().await;
    let cutter = AnswerCutter::start(&app.address, usize::MAX).await;
    let policy = RetryPolicy {
        attempts_max: 4,
        ..policy()
    };
    let client = Client::new(&cutter.address, policy)
        .expect("client")
        .with_token(&alice.token);
    let key = IdempotencyKey::new();
    match client.transfer(&order(&alice, &bob, 300), key).await {
        Err(Error::GaveUp { attempts, .. }) => assert_eq!(attempts, 4),
        other => panic!("{other:?}"),
    }
    assert_eq!(cutter.requests(), 4);
    assert_eq!(app.transfer_count().await, 1, "four attempts, one payment");
    // The same key later, on a working network: the stored receipt.
    let direct = Client::new(&app.address, policy)
        .expect("client")
        .with_token(&alice.token);
    let paid = direct
        .transfer(&order(&alice, &bob, 300), key)
        .await
        .expect("paid");
    assert!(paid.replayed);
    assert_eq!(app.transfer_count().await, 1);
}

/// The live stream: a decision arrives as it is made, and a stream opened
/// again after the last id read goes on from there.
#[tokio::test]
async fn the_decision_stream_follows_and_resumes() {
    let app = spawn_app(without_cooldown).await;
    let (alice, bob) = app.alice_and_bob().await;
    let client = Client::new(&app.address, policy())
        .expect("client")
        .with_token(&alice.token);
    let mut stream = client
        .decision_stream(DecisionSource::Real, None)
        .await
        .expect("a stream");
    client
        .transfer(&order(&alice, &bob, 100), IdempotencyKey::new())
        .await
        .expect("paid");
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), stream.next())
        .await
        .expect("a decision in time")
        .expect("the stream is open")
        .expect("a decision");
    assert_eq!(
        (first.layer.as_str(), first.outcome.as_str()),
        ("row_guard", "accepted")
    );
    assert_eq!(first.amount_minor, Some(100));
    let after = stream.last_id().expect("an id").to_owned();
    drop(stream);

    client
        .transfer(&order(&alice, &bob, 200), IdempotencyKey::new())
        .await
        .expect("paid");
    let mut resumed = client
        .decision_stream(DecisionSource::Real, Some(&after))
        .await
        .expect("a stream");
    let second = tokio::time::timeout(std::time::Duration::from_secs(10), resumed.next())
        .await
        .expect("a decision in time")
        .expect("the stream is open")
        .expect("a decision");
    assert_eq!(second.amount_minor, Some(200), "nothing missed, nothing repeated");
    assert_ne!(second.id, first.id);
    assert!(matches!(
        client
            .decision_stream(DecisionSource::Real, Some("1-0&x=y"))
            .await,
        Err(Error::Request(_))
    ));
}

/// A time-out is an unknown outcome like a cut connection: the answer is
/// held back past `request_timeout`, the client retries with the same key,
/// and the payment is made once.
#[tokio::test]
async fn a_time_out_is_retried_with_the_same_key() {
    let app = spawn_app(without_cooldown).await;
    let (alice, bob) = app.alice_and_bob().await;
    let cutter = AnswerCutter::delaying(&app.address, 1, std::time::Duration::from_secs(2)).await;
    let policy = RetryPolicy {
        request_timeout: std::time::Duration::from_millis(500),
        ..policy()
    };
    let client = Client::new(&cutter.address, policy)
        .expect("client")
        .with_token(&alice.token);
    let paid = client
        .transfer(&order(&alice, &bob, 400), IdempotencyKey::new())
        .await
        .expect("paid");
    assert_eq!(cutter.answers_cut(), 1, "the first answer was held back");
    assert!(paid.replayed && paid.attempts >= 2, "{paid:?}");
    assert_eq!(app.transfer_count().await, 1);
}

/// A second copy of a payment arrives while the first is still in its
/// transaction: 409 in flight, waited out, then the first one's receipt.
#[tokio::test]
async fn a_key_in_flight_is_waited_out_and_replayed() {
    let app = spawn_app(|settings| {
        without_cooldown(settings);
        settings.idempotency_wait_ms_max = 100;
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    app.slow_down_ledger_writes(1).await;
    let statuses = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = statuses.clone();
    let client = Client::new(&app.address, policy())
        .expect("client")
        .with_token(&alice.token);
    let watched = client.observed_by(std::sync::Arc::new(
        move |attempt: &wallet_client::AttemptSeen| {
            seen.lock().expect("statuses").push(attempt.status);
        },
    ));
    let key = IdempotencyKey::new();
    let order = order(&alice, &bob, 600);
    let (first, second) = tokio::join!(client.transfer(&order, key), async {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        watched.transfer(&order, key).await
    });
    let (first, second) = (first.expect("first"), second.expect("second"));
    assert!(!first.replayed);
    assert!(second.replayed, "{second:?}");
    assert_eq!(first.receipt, second.receipt, "the same receipt");
    assert!(
        statuses.lock().expect("statuses").contains(&Some(409)),
        "the copy met the key in flight"
    );
    assert_eq!(app.transfer_count().await, 1);
}
