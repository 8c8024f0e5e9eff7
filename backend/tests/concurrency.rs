//! The three layers under real concurrency: many requests in flight at
//! once, over real HTTP, asserting on the database afterwards.

use std::collections::HashMap;

use uuid::Uuid;
use wallet_testkit::*;

fn statuses(responses: &[reqwest::Response]) -> HashMap<u16, usize> {
    let mut counts = HashMap::new();
    for response in responses {
        *counts.entry(response.status().as_u16()).or_insert(0) += 1;
    }
    counts
}

fn replays(responses: &[reqwest::Response]) -> usize {
    responses
        .iter()
        .filter(|response| response.headers().get("idempotent-replayed").is_some())
        .count()
}

/// 50 identical requests with one key, all layers on: exactly one transfer
/// and one debit; the rest are cooldown refusals or replays.
#[tokio::test]
async fn fifty_identical_requests_with_one_key_move_money_once() {
    let app = spawn_app(|_| {}).await;
    let (alice, bob) = app.alice_and_bob().await;
    let key = new_key();
    let requests = (0..50)
        .map(|_| app.transfer_request(&alice, bob.wallet_id, 1_000, Some(&key)))
        .collect();
    let responses = fire_together(requests).await;
    let counts = statuses(&responses);
    let fresh = fresh_transfers(&responses);
    assert_eq!(fresh, 1, "{counts:?}");
    assert_eq!(
        counts.get(&429).copied().unwrap_or(0) + replays(&responses) + 1,
        50,
        "{counts:?}"
    );
    assert_eq!(app.transfer_count().await, 1);
    assert_eq!(app.balance(alice.wallet_id).await, 100_000 - 1_000);
    assert_eq!(app.balance(bob.wallet_id).await, 100_000 + 1_000);
    app.assert_invariants().await;
}

/// The same storm with the cooldown off: the idempotency key alone still
/// lets exactly one through; the rest are replays or 409s.
#[tokio::test]
async fn without_the_cooldown_the_key_alone_still_moves_money_once() {
    let app = spawn_app(|settings| {
        without_cooldown(settings);
        settings.idempotency_wait_ms_max = 5_000;
        settings.db_statement_timeout_ms = 10_000;
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    let key = new_key();
    let requests = (0..50)
        .map(|_| app.transfer_request(&alice, bob.wallet_id, 1_000, Some(&key)))
        .collect();
    let responses = fire_together(requests).await;
    let counts = statuses(&responses);
    assert_eq!(
        counts.get(&201).copied().unwrap_or(0) + counts.get(&409).copied().unwrap_or(0),
        50,
        "{counts:?}"
    );
    assert_eq!(replays(&responses), counts[&201] - 1, "{counts:?}");
    assert_eq!(app.transfer_count().await, 1);
    assert_eq!(app.balance(alice.wallet_id).await, 100_000 - 1_000);
    app.assert_invariants().await;
}

/// A wallet holding 10.00 hit by 100 concurrent 1.00 transfers with
/// distinct keys and no cooldown: the row guard lets exactly 10 through.
#[tokio::test]
async fn one_hundred_distinct_transfers_against_ten_units_succeed_exactly_ten_times() {
    let app = spawn_app(|settings| {
        without_cooldown(settings);
        settings.signup_grant_minor = 1_000;
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    let requests = (0..100)
        .map(|_| app.transfer_request(&alice, bob.wallet_id, 100, Some(&new_key())))
        .collect();
    let responses = fire_together(requests).await;
    let counts = statuses(&responses);
    assert_eq!(counts.get(&201), Some(&10), "{counts:?}");
    assert_eq!(counts.get(&422), Some(&90), "{counts:?}");
    assert_eq!(app.balance(alice.wallet_id).await, 0);
    assert_eq!(app.balance(bob.wallet_id).await, 2_000);
    assert_eq!(app.transfer_count().await, 10);
    app.assert_invariants().await;
}

/// 200 concurrent transfers A→B and B→A: no deadlock reaches the client
/// (no 5xx), and no money is created or destroyed.
#[tokio::test]
async fn crossing_transfers_never_deadlock_and_conserve_money() {
    let app = spawn_app(without_cooldown).await;
    let (alice, bob) = app.alice_and_bob().await;
    let requests = (0..200)
        .map(|i| {
            if i % 2 == 0 {
                app.transfer_request(&alice, bob.wallet_id, 7, None)
            } else {
                app.transfer_request(&bob, alice.wallet_id, 11, None)
            }
        })
        .collect();
    let responses = fire_together(requests).await;
    let counts = statuses(&responses);
    assert_eq!(counts.get(&201), Some(&200), "{counts:?}");
    assert_eq!(app.balance(alice.wallet_id).await, 100_000 - 100 * 7 + 100 * 11);
    assert_eq!(app.transfer_count().await, 200);
    app.assert_invariants().await;
}

/// Two instances with their own pools on one database and one Redis: a
/// storm split across them still moves money once, with or without the
/// cooldown, and the overdraft guard holds across them.
#[tokio::test]
async fn two_instances_keep_the_same_guarantees() {
    let first = spawn_app(|_| {}).await;
    let second = spawn_second_instance(&first).await;
    let (alice, bob) = first.alice_and_bob().await;

    // One key, both instances, all layers on.
    let key = new_key();
    let requests = (0..40)
        .map(|i| {
            let app = if i % 2 == 0 { &first } else { &second };
            app.transfer_request(&alice, bob.wallet_id, 500, Some(&key))
        })
        .collect();
    let responses = fire_together(requests).await;
    let fresh = fresh_transfers(&responses);
    assert_eq!(fresh, 1, "{:?}", statuses(&responses));
    assert_eq!(first.transfer_count().await, 1);
    first.assert_invariants().await;
}

#[tokio::test]
async fn two_instances_without_cooldown_never_overdraw() {
    let first = spawn_app(|settings| {
        without_cooldown(settings);
        settings.signup_grant_minor = 1_000;
        settings.idempotency_wait_ms_max = 5_000;
        settings.db_statement_timeout_ms = 10_000;
    })
    .await;
    let second = spawn_second_instance(&first).await;
    let (alice, bob) = first.alice_and_bob().await;

    // The same key on both instances: one transfer.
    let key = new_key();
    let requests = (0..40)
        .map(|i| {
            let app = if i % 2 == 0 { &first } else { &second };
            app.transfer_request(&alice, bob.wallet_id, 100, Some(&key))
        })
        .collect();
    let responses = fire_together(requests).await;
    assert!(
        responses.iter().all(|r| r.status() == 201 || r.status() == 409),
        "{:?}",
        statuses(&responses)
    );
    assert_eq!(first.transfer_count().await, 1);

    // Distinct keys against the 9.00 left: exactly 9 more succeed.
    let requests = (0..60)
        .map(|i| {
            let app = if i % 2 == 0 { &first } else { &second };
            app.transfer_request(&alice, bob.wallet_id, 100, Some(&Uuid::new_v4().to_string()))
        })
        .collect();
    let responses = fire_together(requests).await;
    let counts = statuses(&responses);
    assert_eq!(counts.get(&201), Some(&9), "{counts:?}");
    assert_eq!(first.balance(alice.wallet_id).await, 0);
    assert_eq!(first.transfer_count().await, 10);
    first.assert_invariants().await;
}
