//! The cooldown lock and the decision feed on a real Redis Cluster (three
//! masters, started by ./scripts/test), selected by `redis_cluster_urls`.

use layered_wallet::settings::Settings;
use wallet_testkit::*;

fn on_cluster(settings: &mut Settings) {
    on_redis_cluster(settings, redis_cluster_urls());
}

/// The window works the same on a cluster: one wins, the rest get 429, and
/// the decisions reach the feed.
#[tokio::test]
async fn the_cooldown_and_the_feed_work_on_a_redis_cluster() {
    assert_redis_cluster_reachable().await;
    let app = spawn_app(on_cluster).await;
    let (_, ready) = app.admin_readiness().await;
    assert_eq!(ready["redis"], "ok", "{ready}");

    // Users land in different hash slots, so this exercises several nodes.
    let mut users = Vec::new();
    for i in 0..6 {
        users.push(app.sign_up(&format!("user{i}")).await);
    }
    let target = app.sign_up("target").await;
    for user in &users {
        let requests = (0..10)
            .map(|_| app.transfer_request(user, target.wallet_id, 100, Some(&new_key())))
            .collect();
        let responses = fire_together(requests).await;
        let accepted = responses.iter().filter(|r| r.status() == 201).count();
        let refused = responses.iter().filter(|r| r.status() == 429).count();
        assert_eq!((accepted, refused), (1, 9), "one window per user on the cluster");
    }
    assert_eq!(app.transfer_count().await, 6);
    for user in &users {
        let mut entries = 0;
        for _ in 0..100 {
            entries = app.get_json("/api/v1/decisions", Some(user)).await["items"]
                .as_array()
                .map_or(0, Vec::len);
            if entries == 10 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(entries, 10, "the feed on the cluster lost entries");
    }
    app.assert_invariants().await;
}

/// Two instances sharing a cluster keep the same guarantees, and only the
/// owner releases a window.
#[tokio::test]
async fn two_instances_on_a_cluster_move_money_once() {
    assert_redis_cluster_reachable().await;
    let first = spawn_app(on_cluster).await;
    let second = spawn_second_instance(&first).await;
    let (alice, bob) = first.alice_and_bob().await;
    let key = new_key();
    let requests = (0..30)
        .map(|i| {
            let app = if i % 2 == 0 { &first } else { &second };
            app.transfer_request(&alice, bob.wallet_id, 100, Some(&key))
        })
        .collect();
    let responses = fire_together(requests).await;
    let fresh = fresh_transfers(&responses);
    assert_eq!(fresh, 1);
    assert_eq!(first.transfer_count().await, 1);
    first.assert_invariants().await;

    let config = first.settings.validate().expect("valid settings");
    let store = layered_wallet::redis_store::RedisStore::connect(&config.redis).expect("cluster connection");
    let lock = layered_wallet::defense::cooldown::CooldownLock::new(
        &config,
        Some(store),
        prometheus::IntCounter::new("t", "t").expect("counter"),
    );
    let user = layered_wallet::domain::UserId(uuid::Uuid::new_v4());
    let layered_wallet::defense::cooldown::CooldownVerdict::Acquired(permit) = lock
        .try_acquire(&verified_token_for(user), "transfer", "{}")
        .await
        .expect("cluster")
    else {
        panic!("the first attempt must acquire");
    };
    let impostor =
        layered_wallet::defense::cooldown::CooldownPermit::for_key(permit.key().to_owned(), "x".into());
    assert!(!lock.release(&impostor).await);
    assert!(lock.release(&permit).await);
}
