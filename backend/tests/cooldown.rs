//! Layer 1, the cooldown lock, against real Redis and PostgreSQL.

use std::time::Duration;

use layered_wallet::defense::cooldown::{CooldownLock, CooldownPermit, CooldownVerdict};
use layered_wallet::domain::UserId;
use layered_wallet::settings::{CooldownScope, StoreErrorPolicy};
use secrecy::SecretString;
use uuid::Uuid;
use wallet_testkit::*;

/// Proves the window refuses a second transfer with 429 and a Retry-After
/// rounded up from the key's TTL, and that the refusal sends not one query to
/// PostgreSQL (counted on a proxy between the app and the database).
#[tokio::test]
async fn a_second_transfer_inside_the_window_is_refused_without_touching_the_database() {
    let (app, proxy) = spawn_app_behind_proxy(|settings| settings.cooldown_ttl_ms = 5_000).await;
    let (alice, bob) = app.alice_and_bob().await;

    let first = app.transfer(&alice, bob.wallet_id, 100, None).await;
    assert_eq!(first.status(), 201);

    let queries_before = proxy.query_messages();
    assert!(
        queries_before > 0,
        "the proxy saw no queries at all: it is not in the path"
    );
    for _ in 0..5 {
        let refused = app
            .transfer_request(&alice, bob.wallet_id, 100, Some(&new_key()))
            .send()
            .await
            .expect("send");
        let retry_after: u64 = refused.headers()["retry-after"]
            .to_str()
            .expect("ascii")
            .parse()
            .expect("seconds");
        assert!((1..=5).contains(&retry_after), "Retry-After {retry_after}");
        let (status, body) = problem(refused).await;
        assert_eq!(status, 429);
        assert_eq!(body["layer"], "cooldown");
        assert_eq!(body["type"], "/problems/cooldown-active");
    }
    assert_eq!(
        proxy.query_messages(),
        queries_before,
        "a refused request reached PostgreSQL"
    );
    assert_eq!(app.balance(alice.wallet_id).await, 100_000 - 100);
    assert_eq!(app.transfer_count().await, 1);
}

/// The window is per user: Bob is not slowed by Alice's window.
#[tokio::test]
async fn the_window_belongs_to_one_user() {
    let app = spawn_app(|_| {}).await;
    let (alice, bob) = app.alice_and_bob().await;
    let a = app.transfer(&alice, bob.wallet_id, 100, None).await;
    let b = app.transfer(&bob, alice.wallet_id, 100, None).await;
    assert_eq!((a.status().as_u16(), b.status().as_u16()), (201, 201));
    app.assert_invariants().await;
}

/// After the TTL the next transfer goes through.
#[tokio::test]
async fn the_window_expires_after_its_ttl() {
    let app = spawn_app(|settings| settings.cooldown_ttl_ms = 300).await;
    let (alice, bob) = app.alice_and_bob().await;
    let first = app.transfer(&alice, bob.wallet_id, 100, None).await;
    assert_eq!(first.status(), 201);
    let inside = app.transfer(&alice, bob.wallet_id, 100, None).await;
    assert_eq!(inside.status(), 429);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let after = app.transfer(&alice, bob.wallet_id, 100, None).await;
    assert_eq!(after.status(), 201);
    assert_eq!(app.transfer_count().await, 2);
    assert_eq!(app.balance(alice.wallet_id).await, 100_000 - 200);
}

/// With the body scope only an identical transfer waits; a different one
/// goes through.
#[tokio::test]
async fn the_body_scope_refuses_only_identical_transfers() {
    let app = spawn_app(|settings| settings.cooldown_scope = CooldownScope::UserActionBody).await;
    let (alice, bob) = app.alice_and_bob().await;
    let first = app.transfer(&alice, bob.wallet_id, 100, None).await;
    let same = app.transfer(&alice, bob.wallet_id, 100, None).await;
    let different = app.transfer(&alice, bob.wallet_id, 250, None).await;
    assert_eq!(
        (
            first.status().as_u16(),
            same.status().as_u16(),
            different.status().as_u16()
        ),
        (201, 429, 201)
    );
    assert_eq!(app.balance(alice.wallet_id).await, 100_000 - 350);
}

/// A 5xx of ours releases the window, so the client's honest retry is not
/// told to wait: with PostgreSQL gone, the retry gets 503 again, not 429.
#[tokio::test]
async fn a_server_failure_releases_the_window_for_an_honest_retry() {
    let (app, proxy) = spawn_app_behind_proxy(|settings| settings.db_acquire_wait_ms_max = 500).await;
    let (alice, bob) = app.alice_and_bob().await;
    proxy.go_down();

    for attempt in 0..3 {
        let response = app.transfer(&alice, bob.wallet_id, 100, None).await;
        let (status, _) = problem(response).await;
        assert_eq!(status, 503, "attempt {attempt}");
    }
    assert!(
        app.cooldown_keys().await.is_empty(),
        "the window was not released"
    );
    assert_eq!(app.transfer_count().await, 0);
}

/// Only the holder's token deletes the key: a stale request whose window
/// expired cannot remove a newer holder's window.
#[tokio::test]
async fn only_the_owner_can_release_a_window() {
    assert_redis_reachable().await;
    let prefix = format!("test:{}:", Uuid::new_v4().simple());
    let settings = test_settings("postgres://unused@127.0.0.1/unused", &prefix);
    let config = settings.validate().expect("valid settings");
    let store = layered_wallet::redis_store::RedisStore::connect(&config.redis).expect("Redis connection");
    let lock = CooldownLock::new(
        &config,
        Some(store),
        prometheus::IntCounter::new("t", "t").expect("counter"),
    );
    let user = UserId(Uuid::new_v4());

    let CooldownVerdict::Acquired(permit) = lock
        .try_acquire(&verified_token_for(user), "transfer", "{}")
        .await
        .expect("redis")
    else {
        panic!("the first attempt must acquire");
    };
    let impostor = CooldownPermit::for_key(permit.key().to_owned(), "not-the-token".into());
    assert!(
        !lock.release(&impostor).await,
        "a wrong token released the window"
    );
    assert!(matches!(
        lock.try_acquire(&verified_token_for(user), "transfer", "{}")
            .await,
        Ok(CooldownVerdict::Active { .. })
    ));
    assert!(lock.release(&permit).await, "the owner could not release");
    assert!(matches!(
        lock.try_acquire(&verified_token_for(user), "transfer", "{}")
            .await,
        Ok(CooldownVerdict::Acquired(_))
    ));
}

/// Redis down, fail-open (the default): transfers go through, the lower
/// layers still decide (a keyed retry replays), the pass is counted, and
/// /readyz stays 200 with Redis "degraded", so a load balancer keeps the
/// instance.
#[tokio::test]
async fn with_redis_down_the_default_fails_open_and_the_lower_layers_still_decide() {
    let app = spawn_app(|settings| {
        settings.redis_url = SecretString::from(format!("redis://127.0.0.1:{}", closed_port()));
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    let key = new_key();
    let first = app.transfer(&alice, bob.wallet_id, 100, Some(&key)).await;
    assert_eq!(first.status(), 201);
    let retry = app.transfer(&alice, bob.wallet_id, 100, Some(&key)).await;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let plain = app.transfer(&alice, bob.wallet_id, 100, None).await;
    assert_eq!(plain.status(), 201, "no cooldown without Redis");
    assert_eq!(app.transfer_count().await, 2);

    let ready = app.client.get(app.url("/readyz")).send().await.expect("send");
    assert_eq!(ready.status(), 200);
    let (status, body) = app.admin_readiness().await;
    assert_eq!(status, 200);
    assert_eq!(
        (body["status"].as_str(), body["redis"].as_str()),
        (Some("degraded"), Some("degraded"))
    );
    assert_eq!(body["cooldown_fail_open_passes"], 3);
    assert!(app.metrics().await.contains("wallet_cooldown_degraded 1"));
    app.assert_invariants().await;
}

/// Redis down, fail-closed: 503 with the layer named, never 429, and
/// nothing written.
#[tokio::test]
async fn with_redis_down_fail_closed_answers_503_and_changes_nothing() {
    let app = spawn_app(|settings| {
        settings.redis_url = SecretString::from(format!("redis://127.0.0.1:{}", closed_port()));
        settings.cooldown_on_store_error = StoreErrorPolicy::FailClosed;
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    let before = app.snapshot().await;
    let response = app
        .transfer_request(&alice, bob.wallet_id, 100, Some(&new_key()))
        .send()
        .await
        .expect("send");
    assert!(response.headers().contains_key("retry-after"));
    let (status, body) = problem(response).await;
    assert_eq!(status, 503);
    assert_eq!(body["layer"], "cooldown");
    assert_eq!(app.snapshot().await, before);
    let ready = app.client.get(app.url("/readyz")).send().await.expect("send");
    assert_eq!(
        ready.status(),
        503,
        "failing closed, the instance cannot serve transfers"
    );
    let (_, body) = app.admin_readiness().await;
    assert_eq!(body["redis"], "unreachable");
}

/// A transfer's path makes one Redis round trip: the cooldown script takes
/// the window, or, on an instance that does not hold it, refuses with the
/// window's remaining time. The instance that took the window refuses a
/// further attempt without asking Redis. Counted by each server's own
/// `wallet_redis_round_trips_total`, with the feed off so that its
/// background batches do not count.
#[tokio::test]
async fn a_transfer_makes_at_most_one_redis_round_trip() {
    let no_feed = |settings: &mut layered_wallet::settings::Settings| {
        settings.decision_feed_enabled = false;
        settings.cooldown_ttl_ms = 60_000;
    };
    let holder = spawn_app(no_feed).await;
    let other = spawn_second_instance_with(&holder, no_feed).await;
    let (alice, bob) = holder.alice_and_bob().await;
    for (what, app, status, trips) in [
        ("accepted", &holder, 201, 1),
        ("refused where the window was taken", &holder, 429, 0),
        ("refused by another instance", &other, 429, 1),
    ] {
        let before = redis_round_trips(app).await;
        let response = app.transfer(&alice, bob.wallet_id, 100, Some(&new_key())).await;
        assert_eq!(response.status(), status, "{what}");
        let refused = response.status() == 429;
        assert_eq!(response.headers().contains_key("retry-after"), refused, "{what}");
        assert_eq!(redis_round_trips(app).await - before, trips, "{what}");
    }
    assert_eq!(holder.transfer_count().await, 1);
}

/// What the instance holding a window knows that Redis may not: a window
/// Redis lost (a failover) is still refused there for the rest of its TTL,
/// while another instance, asking Redis, lets the next attempt reach
/// PostgreSQL; and a token revoked through the holding instance is
/// answered as revoked, not with the window's 429.
#[tokio::test]
async fn the_holding_instance_refuses_a_window_redis_lost_and_forgets_a_revoked_users() {
    let holder = spawn_app(|settings| settings.cooldown_ttl_ms = 60_000).await;
    let other = spawn_second_instance_with(&holder, |settings| settings.cooldown_ttl_ms = 60_000).await;
    let (alice, bob) = holder.alice_and_bob().await;
    let first = holder.transfer(&alice, bob.wallet_id, 100, None).await;
    assert_eq!(first.status(), 201);

    let client = redis::Client::open(redis_url()).expect("redis url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("redis");
    for key in holder.cooldown_keys().await {
        let _: () = redis::cmd("DEL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("DEL");
    }
    let (status, body) = problem(holder.transfer(&alice, bob.wallet_id, 100, None).await).await;
    assert_eq!(
        (status, body["layer"].as_str()),
        (429, Some("cooldown")),
        "{body}"
    );
    let through = other.transfer(&alice, bob.wallet_id, 100, None).await;
    assert_eq!(
        through.status(),
        201,
        "Redis lost the window: another instance asks it"
    );
    assert_eq!(holder.transfer_count().await, 2);

    // The holder takes Bob's window, then Bob's token is revoked through it.
    let paid = holder.transfer(&bob, alice.wallet_id, 100, None).await;
    assert_eq!(paid.status(), 201);
    holder.revoke_token(&bob).await;
    let (status, body) = problem(holder.transfer(&bob, alice.wallet_id, 100, None).await).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(holder.transfer_count().await, 3);
}

/// The server's own count of its Redis round trips.
async fn redis_round_trips(app: &TestApp) -> u64 {
    app.metrics()
        .await
        .lines()
        .find_map(|line| line.strip_prefix("wallet_redis_round_trips_total "))
        .and_then(|value| value.trim().parse::<u64>().ok())
        .expect("the round-trip counter")
}
