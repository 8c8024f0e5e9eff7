//! What hostile or careless traffic can make the service hold, and what it
//! can reach: every resource an outsider touches has a bound.

use serde_json::{Value, json};
use sqlx::Connection;
use wallet_testkit::*;

/// Series of the request-latency histogram in a `/metrics` text.
fn latency_series(metrics: &str) -> usize {
    metrics
        .lines()
        .filter(|line| line.starts_with("wallet_http_request_duration_seconds_count"))
        .count()
}

#[tokio::test]
async fn invented_methods_and_paths_mint_no_metric_series() {
    let app = spawn_app(|_| {}).await;
    let send = |method: String, path: String| {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method token");
        app.client.request(method, app.url(&path)).send()
    };
    // One of each kind first, so that the `other` and `unmatched` series
    // exist.
    send("BREW".into(), "/no-such-page".into()).await.expect("send");
    let before = latency_series(&app.metrics().await);

    for chunk in (0..1_000).collect::<Vec<_>>().chunks(100) {
        let requests = chunk.iter().map(|i| {
            let method = if i % 2 == 0 {
                format!("INVENTED{i}")
            } else {
                "X".repeat(3_000)
            };
            send(method, format!("/invented/{i}/{}", "p".repeat(i % 50)))
        });
        for response in futures::future::join_all(requests).await {
            assert_eq!(response.expect("send").status(), 404);
        }
    }

    let metrics = app.metrics().await;
    assert_eq!(
        latency_series(&metrics),
        before,
        "new series were minted:\n{metrics}"
    );
    assert!(metrics.contains(r#"method="other""#), "{metrics}");
    assert!(metrics.contains(r#"route="unmatched""#), "{metrics}");
    assert!(!metrics.contains("INVENTED"), "a client's method became a label");
    assert!(!metrics.contains("/invented/"), "a client's path became a label");
}

#[tokio::test]
async fn metrics_and_readiness_details_are_only_on_the_admin_listener() {
    let app = spawn_app(|_| {}).await;
    let public_metrics = app.client.get(app.url("/metrics")).send().await.expect("send");
    assert_eq!(public_metrics.status(), 404);
    let public_ready: Value = app.get_json("/readyz", None).await;
    assert_eq!(public_ready, json!({ "status": "ready" }));

    assert!(
        app.metrics()
            .await
            .contains("wallet_http_request_duration_seconds")
    );
    let (status, detailed) = app.admin_readiness().await;
    assert_eq!(status, 200);
    assert_eq!(detailed["postgres"], "ok");
    assert_eq!(detailed["mode"]["safe"], true);
    assert!(
        app.admin_address.starts_with("http://127.0.0.1:"),
        "the admin listener is on loopback in tests as by default"
    );
    // And it serves nothing else: not the API, not the pages.
    for path in ["/api/v1/users", "/", "/api/openapi.json"] {
        let response = app.client.get(app.admin_url(path)).send().await.expect("send");
        assert_eq!(response.status(), 404, "{path} on the admin listener");
    }
}

async fn sign_up_as(app: &TestApp, name: &str, forwarded_for: Option<&str>) -> reqwest::Response {
    let mut request = app
        .client
        .post(app.url("/api/v1/users"))
        .json(&json!({ "name": name, "password": "correct horse battery" }));
    if let Some(address) = forwarded_for {
        request = request.header("X-Forwarded-For", address);
    }
    request.send().await.expect("send")
}

async fn sign_in_as(app: &TestApp, name: &str, password: &str, forwarded_for: &str) -> reqwest::Response {
    app.client
        .post(app.url("/api/v1/tokens"))
        .header("X-Forwarded-For", forwarded_for)
        .json(&json!({ "name": name, "password": password }))
        .send()
        .await
        .expect("send")
}

fn with_account_limits(settings: &mut layered_wallet::settings::Settings) {
    settings.account_limits_enabled = true;
    settings.signup_per_address_per_hour_max = 3;
    settings.signin_per_name_per_minute_max = 2;
}

/// A direct client cannot pick its address: without trusted proxies,
/// X-Forwarded-For is ignored and every attempt counts against the peer.
#[tokio::test]
async fn sign_ups_are_limited_per_address_whatever_the_client_claims() {
    let app = spawn_app(with_account_limits).await;
    for (i, claimed) in ["10.0.0.1", "10.0.0.2", "10.0.0.3"].into_iter().enumerate() {
        let response = sign_up_as(&app, &format!("user{i}"), Some(claimed)).await;
        assert_eq!(response.status(), 201);
    }
    let refused = sign_up_as(&app, "user3", Some("10.0.0.4")).await;
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((1..=1200).contains(&retry_after), "{retry_after}");
    let (status, body) = problem(refused).await;
    assert_eq!(status, 429);
    assert!(
        body["type"]
            .as_str()
            .expect("type")
            .ends_with("/too-many-attempts"),
        "{body}"
    );
    assert!(
        body["detail"]
            .as_str()
            .expect("detail")
            .contains("nothing was changed")
    );
    assert_eq!(
        app.count("SELECT count(*) FROM users").await,
        3,
        "the refused sign-up made a user"
    );
}

/// Behind a trusted proxy, the address is the one the proxy saw; the name
/// limit holds across addresses and across instances.
#[tokio::test]
async fn sign_ins_are_limited_per_name_across_addresses_and_instances() {
    let app = spawn_app(|settings| {
        with_account_limits(settings);
        settings.trusted_proxies = vec!["127.0.0.1".into()];
    })
    .await;
    let second = spawn_second_instance(&app).await;
    // Three sign-ups through the proxy from three client addresses: the
    // per-address limit (3) is not reached by any one of them.
    for (i, client) in ["192.0.2.1", "192.0.2.2", "192.0.2.3"].into_iter().enumerate() {
        let forwarded = format!("203.0.113.9, {client}");
        assert_eq!(
            sign_up_as(&app, &format!("user{i}"), Some(&forwarded))
                .await
                .status(),
            201
        );
    }
    assert_eq!(sign_up_as(&app, "user3", Some("192.0.2.4")).await.status(), 201);

    // Guessing user0's password: two tries, on two instances, from two
    // addresses; the third is refused before the password is checked.
    assert_eq!(
        sign_in_as(&app, "user0", "wrong password 1", "198.51.100.1")
            .await
            .status(),
        401
    );
    assert_eq!(
        sign_in_as(&second, "USER0", "wrong password 2", "198.51.100.2")
            .await
            .status(),
        401
    );
    let refused = sign_in_as(&second, "user0", "correct horse battery", "198.51.100.3").await;
    let (status, _) = problem(refused).await;
    assert_eq!(status, 429, "the right password after the limit is still refused");
    assert_eq!(
        app.count("SELECT count(*) FROM api_tokens").await,
        4,
        "a refused sign-in issued a token"
    );
    // Another name from the same addresses is unaffected.
    assert_eq!(
        sign_in_as(&app, "user1", "correct horse battery", "198.51.100.1")
            .await
            .status(),
        201
    );
}

/// Guesses at a name from rotating addresses end up refused, but never the
/// owner at an address they signed in from: only failures count, keyed on
/// the name and the address, and the name's own cap skips the owner's
/// known address. Right passwords never use up anything.
#[tokio::test]
async fn guesses_from_elsewhere_never_lock_the_owner_out() {
    let app = spawn_app(|settings| {
        settings.account_limits_enabled = true;
        settings.trusted_proxies = vec!["127.0.0.1".into()];
        // One failure a minute per name: no refill within the test.
        settings.signin_per_name_per_minute_max = 1;
        settings.signin_per_name_and_address_per_minute_max = 3;
    })
    .await;
    let second = spawn_second_instance(&app).await;
    const HOME: &str = "203.0.113.7";
    assert_eq!(sign_up_as(&app, "olivia", Some(HOME)).await.status(), 201);
    // Right passwords from home, many times: nothing is used up.
    for _ in 0..20 {
        assert_eq!(
            sign_in_as(&app, "olivia", "correct horse battery", HOME)
                .await
                .status(),
            201
        );
    }

    // Guesses from rotating addresses, on both instances, one per address.
    let mut refused = 0;
    for i in 0..30 {
        let instance = if i % 2 == 0 { &app } else { &second };
        let status = sign_in_as(
            instance,
            "olivia",
            &format!("wrong guess {i}"),
            &format!("198.51.100.{i}"),
        )
        .await
        .status()
        .as_u16();
        assert!(status == 401 || status == 429, "{status}");
        refused += usize::from(status == 429);
    }
    assert_eq!(refused, 29, "the name's cap let one guess through");
    // A new address, even with the right password, waits for the cap.
    assert_eq!(
        sign_in_as(&app, "olivia", "correct horse battery", "198.51.100.200")
            .await
            .status(),
        429
    );
    // The owner at home is let in, on either instance.
    for instance in [&app, &second] {
        assert_eq!(
            sign_in_as(instance, "olivia", "correct horse battery", HOME)
                .await
                .status(),
            201
        );
    }

    // Wrong passwords at home count against the name from home.
    for i in 0..3 {
        assert_eq!(
            sign_in_as(&app, "olivia", &format!("a typo, number {i}"), HOME)
                .await
                .status(),
            401
        );
    }
    assert_eq!(
        sign_in_as(&app, "olivia", "correct horse battery", HOME)
            .await
            .status(),
        429
    );
    let tokens = app.count("SELECT count(*) FROM api_tokens").await;
    assert_eq!(tokens, 1 + 20 + 2, "a refused sign-in issued a token");
}

/// With Redis down, the limits follow the cooldown's policy.
#[tokio::test]
async fn account_limits_follow_the_redis_policy() {
    let port = closed_port();
    let open = spawn_app(|settings| {
        with_account_limits(settings);
        settings.redis_url = format!("redis://127.0.0.1:{port}").into();
    })
    .await;
    for i in 0..4 {
        assert_eq!(sign_up_as(&open, &format!("user{i}"), None).await.status(), 201);
    }
    assert!(
        open.metrics()
            .await
            .contains("wallet_account_limits_fail_open_total 4"),
        "the passes are counted"
    );

    let closed = spawn_app(|settings| {
        with_account_limits(settings);
        settings.redis_url = format!("redis://127.0.0.1:{port}").into();
        settings.cooldown_on_store_error = layered_wallet::settings::StoreErrorPolicy::FailClosed;
    })
    .await;
    let refused = sign_up_as(&closed, "someone", None).await;
    assert!(refused.headers().contains_key("retry-after"));
    let (status, _) = problem(refused).await;
    assert_eq!(status, 503);
    assert_eq!(closed.count("SELECT count(*) FROM users").await, 0);
}

/// The browser's sign-in form is limited like the API, and says so in a
/// sentence.
#[tokio::test]
async fn the_sign_in_form_is_limited_too_and_says_so() {
    let app = spawn_app(with_account_limits).await;
    app.sign_up("alice").await;
    let mut visitor = visitor::Visitor::new(&app);
    let mut last = (0, String::new());
    for attempt in 0..3 {
        let (_, page) = visitor.get("/signin").await;
        let csrf = visitor::hidden(&page, "csrf");
        let password = format!("wrong password {attempt}");
        let response = visitor
            .post(
                "/signin",
                &[("name", "alice"), ("password", &password), ("csrf", &csrf)],
            )
            .await;
        last = (response.status().as_u16(), response.text().await.expect("page"));
    }
    assert_eq!(last.0, 429, "{}", last.1);
    assert!(last.1.contains("too many attempts"), "{}", last.1);
    assert!(
        !last.1.contains("too-many-attempts"),
        "the page shows a field name"
    );
}

/// The feed budgets its own entries, not Redis's memory: past the budget it
/// removes the streams written least recently, so the newest decisions are
/// always written, their owner is told on the feed page, and a Redis with
/// `noeviction` keeps room for the cooldown's windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_feed_keeps_to_its_own_budget_by_removing_the_streams_written_least_recently() {
    const BUDGET_ENTRIES: u64 = 1_000;
    const CAP_ENTRIES: u64 = 100;
    const REDIS_MAXMEMORY_BYTES: u64 = 4 * 1024 * 1024;
    let redis =
        tokio::task::spawn_blocking(|| private_stores::PrivateRedis::start_with(&["--maxmemory", "4mb"]))
            .await
            .expect("a private Redis");
    let app = spawn_app(|settings| {
        settings.redis_url = redis.url().into();
        settings.decision_feed_entries_max = BUDGET_ENTRIES;
        settings.decision_feed_entries_per_user_max = CAP_ENTRIES;
        settings.decision_feed_lab_entries_per_user_max = CAP_ENTRIES;
        settings.cooldown_ttl_ms = 3_600_000;
    })
    .await;
    let client = redis::Client::open(redis.url()).expect("url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("redis");
    let stream_of = |user: &TestUser| format!("{}decisions:{}", app.redis_prefix, user.user_id);

    // Carol sends once, long before anyone else.
    let (carol, bob) = (app.sign_up("carol").await, app.sign_up("bob").await);
    assert_eq!(app.transfer(&carol, bob.wallet_id, 1, None).await.status(), 201);
    wait_for_stream_length(&mut conn, &stream_of(&carol), 1).await;

    // Then twelve others each fill a stream to its cap: 1,200 entries
    // counted against a budget of 1,000. Each one's window is open for an
    // hour, so every request after the first is a cooldown refusal.
    let mut others = Vec::new();
    for n in 0..12 {
        let user = app.sign_up(&format!("filler-{n}")).await;
        assert_eq!(app.transfer(&user, bob.wallet_id, 1, None).await.status(), 201);
        for _ in 0..2 {
            let burst = (0..64)
                .map(|_| app.transfer_request(&user, bob.wallet_id, 1, None))
                .collect();
            for response in fire_together(burst).await {
                assert_eq!(response.status(), 429);
            }
        }
        others.push(user);
    }
    let newest = others.last().expect("twelve");
    wait_for_stream_length(&mut conn, &stream_of(newest), CAP_ENTRIES).await;

    // Carol's stream went first, whole; the newest is all there.
    let carol_exists: bool = redis::cmd("EXISTS")
        .arg(stream_of(&carol))
        .query_async(&mut conn)
        .await
        .expect("EXISTS");
    assert!(!carol_exists, "the stream written least recently was kept");
    let removed = app.metric("wallet_decision_feed_streams_removed_total").await;
    assert!(
        removed >= 2.0,
        "1,300 entries against 1,000 remove at least two streams: {removed}"
    );
    let counted = app.metric("wallet_decision_feed_entries").await;
    assert!(counted <= BUDGET_ENTRIES as f64, "counted {counted}");
    assert_eq!(
        app.metric("wallet_decision_feed_dropped_total").await,
        0.0,
        "nothing was dropped"
    );
    // What Redis holds: each stream's cap is trimmed in whole nodes of up
    // to 100 entries (`MAXLEN ~`), so a stream may hold that many more.
    let streams: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}decisions:*", app.redis_prefix))
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    let streams: Vec<&String> = streams.iter().filter(|key| !key.ends_with(":removed")).collect();
    let mut held = 0;
    for stream in &streams {
        let length: u64 = redis::cmd("XLEN")
            .arg(*stream)
            .query_async(&mut conn)
            .await
            .expect("XLEN");
        held += length;
    }
    assert!(
        held <= BUDGET_ENTRIES + 100 * streams.len() as u64,
        "{held} entries in {} streams",
        streams.len()
    );

    // Carol's feed page says what went and why.
    let mut carol_browser = visitor::signed_in(&app, "carol").await;
    let (status, page) = carol_browser.get("/feed").await;
    assert_eq!(status, 200);
    assert!(
        page.contains("The decisions on your real transfers before"),
        "{page}"
    );
    assert!(
        page.contains("were removed. The feed keeps at most 1,000 entries"),
        "{page}"
    );
    assert!(page.contains("written to least recently"), "{page}");
    let (_, newest_page) = visitor::signed_in(&app, &newest.name).await.get("/feed").await;
    assert!(!newest_page.contains("were removed"), "{newest_page}");

    // And her next decision is written like anyone's: the feed is not silenced.
    assert_eq!(app.transfer(&carol, bob.wallet_id, 1, None).await.status(), 429);
    wait_for_stream_length(&mut conn, &stream_of(&carol), 1).await;

    // Redis kept room for the cooldown: a newcomer's window is taken.
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut conn)
        .await
        .expect("INFO");
    let used: u64 = info
        .lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .and_then(|value| value.trim().parse().ok())
        .expect("used_memory");
    assert!(
        used < REDIS_MAXMEMORY_BYTES,
        "Redis reached maxmemory: {used} bytes"
    );
    let dave = app.sign_up("dave").await;
    let response = app.transfer(&dave, bob.wallet_id, 1, None).await;
    assert_eq!(response.status(), 201);
    assert_eq!(
        response.headers()["defense-decision"],
        "layer=row_guard, outcome=accepted",
        "the cooldown was skipped (degraded) rather than taken"
    );
    assert_eq!(app.transfer(&dave, bob.wallet_id, 1, None).await.status(), 429);
}

/// Another tenant's keys filling the same Redis past the old 64 MiB
/// budget leave the feed writing: it counts its own entries only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_keys_in_redis_do_not_silence_the_feed() {
    const OTHER_TENANTS_MIB: usize = 80;
    let redis = tokio::task::spawn_blocking(private_stores::PrivateRedis::start)
        .await
        .expect("a private Redis");
    let client = redis::Client::open(redis.url()).expect("url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("redis");
    let mebibyte = vec![b'x'; 1024 * 1024];
    for n in 0..OTHER_TENANTS_MIB {
        let () = redis::cmd("SET")
            .arg(format!("another-tenant:blob:{n}"))
            .arg(&mebibyte)
            .query_async(&mut conn)
            .await
            .expect("SET");
    }
    let app = spawn_app(|settings| settings.redis_url = redis.url().into()).await;
    let (alice, bob) = app.alice_and_bob().await;
    assert_eq!(app.transfer(&alice, bob.wallet_id, 1, None).await.status(), 201);
    let stream = format!("{}decisions:{}", app.redis_prefix, alice.user_id);
    wait_for_stream_length(&mut conn, &stream, 1).await;
    let page: Value = app.get_json("/api/v1/decisions", Some(&alice)).await;
    assert_eq!(page["items"].as_array().expect("items").len(), 1, "{page}");
    assert!(
        app.metrics()
            .await
            .contains("wallet_decision_feed_dropped_total 0")
    );
}

/// Entries this server had to drop are owned up to on the feed page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_feed_page_says_when_this_server_dropped_entries_and_why() {
    let app = spawn_app(|settings| {
        settings.decision_feed_queue_entries_max = 1;
        settings.cooldown_ttl_ms = 3_600_000;
    })
    .await;
    let mut alice_browser = visitor::signed_up(&app, "alice").await;
    let (_, page) = alice_browser.get("/feed").await;
    assert!(
        !page.contains("out of the feed"),
        "nothing was dropped yet: {page}"
    );
    let (carol, bob) = (app.sign_up("carol").await, app.sign_up("bob").await);
    let mut dropped = 0.0;
    for _ in 0..20 {
        let burst = (0..64)
            .map(|_| app.transfer_request(&carol, bob.wallet_id, 1, None))
            .collect();
        fire_together(burst).await;
        dropped = app.metric("wallet_decision_feed_dropped_total").await;
        if dropped > 0.0 {
            break;
        }
    }
    assert!(dropped > 0.0, "a queue of one never overflowed");
    let (_, page) = alice_browser.get("/feed").await;
    assert!(page.contains("This server left"), "{page}");
    assert!(
        page.contains("decisions came faster than it could write them (it holds up to 1 waiting)"),
        "{page}"
    );
    assert!(
        page.contains("the transfers themselves were made or refused as their answers said"),
        "{page}"
    );
}

async fn wait_for_stream_length(conn: &mut redis::aio::MultiplexedConnection, stream: &str, at_least: u64) {
    let mut length = 0;
    for _ in 0..200 {
        length = redis::cmd("XLEN")
            .arg(stream)
            .query_async(conn)
            .await
            .expect("XLEN");
        if length >= at_least {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("{stream} holds {length} entries, not {at_least}");
}

async fn open_stream(app: &TestApp, user: &TestUser) -> reqwest::Response {
    app.client
        .get(app.url("/api/v1/decisions/stream"))
        .bearer_auth(&user.token)
        .send()
        .await
        .expect("stream")
}

/// Reads a live stream until `done` says so, or the stream ends; fails
/// after `seconds`.
async fn read_stream_until(
    stream: &mut reqwest::Response,
    seconds: u64,
    done: impl Fn(&str) -> bool,
) -> (String, bool) {
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(seconds);
    while !done(&seen) {
        let chunk = tokio::time::timeout_at(deadline, stream.chunk())
            .await
            .unwrap_or_else(|_| panic!("the stream did not get there in {seconds} s: {seen}"))
            .expect("chunk");
        match chunk {
            Some(bytes) => seen.push_str(&String::from_utf8_lossy(&bytes)),
            None => return (seen, true),
        }
    }
    (seen, false)
}

/// A live stream re-checks its token and ends once it is revoked.
#[tokio::test]
async fn a_stream_ends_soon_after_its_token_is_revoked() {
    let app = spawn_app(|settings| {
        settings.decision_stream_token_check_s = 1;
        settings.decision_stream_keepalive_ms = 200;
    })
    .await;
    let alice = app.sign_up("alice").await;
    let mut stream = open_stream(&app, &alice).await;
    assert_eq!(stream.status(), 200);
    app.revoke_token(&alice).await;
    let (seen, _) = read_stream_until(&mut stream, 5, |seen| seen.contains("event: end")).await;
    assert!(seen.contains(r#"data: {"reason":"token"}"#), "{seen}");
    let (_, ended) = read_stream_until(&mut stream, 5, |_| false).await;
    assert!(ended, "the stream went on after its end event");
}

/// Streams have a lifetime, and each user a cap on how many they hold.
#[tokio::test]
async fn streams_have_a_lifetime_and_a_cap_per_user() {
    let app = spawn_app(|settings| {
        settings.decision_stream_lifetime_s = 1;
        settings.decision_stream_keepalive_ms = 200;
        settings.decision_streams_per_user_max = 2;
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    let mut first = open_stream(&app, &alice).await;
    let second = open_stream(&app, &alice).await;
    assert_eq!((first.status().as_u16(), second.status().as_u16()), (200, 200));
    let (status, body) = problem(open_stream(&app, &alice).await).await;
    assert_eq!(status, 429);
    assert!(
        body["type"]
            .as_str()
            .expect("type")
            .ends_with("/too-many-streams"),
        "{body}"
    );
    assert_eq!(open_stream(&app, &bob).await.status(), 200, "the cap is per user");

    drop(second);
    let (seen, _) = read_stream_until(&mut first, 5, |seen| seen.contains("event: end")).await;
    assert!(seen.contains(r#"data: {"reason":"lifetime"}"#), "{seen}");
    read_stream_until(&mut first, 5, |_| false).await;
    // Both of Alice's streams are gone: she may open two again.
    let mut reopened = Vec::new();
    for _ in 0..2 {
        let mut ok = false;
        for _ in 0..50 {
            let response = open_stream(&app, &alice).await;
            if response.status() == 200 {
                reopened.push(response);
                ok = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert!(ok, "a slot was not given back when its stream ended");
    }
}

/// Every entry reaches the stream, even those that arrive between two
/// reads: reads continue from the last delivered id, never from `$`.
#[tokio::test]
async fn a_live_stream_loses_no_entry_between_reads() {
    let app = spawn_app(|settings| {
        settings.decision_stream_keepalive_ms = 100;
        settings.cooldown_ttl_ms = 3_600_000;
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    let mut stream = open_stream(&app, &alice).await;
    assert_eq!(app.transfer(&alice, bob.wallet_id, 1, None).await.status(), 201);
    // Refusals in small bursts, spread over time, so that some land while
    // the stream is between two reads.
    for _ in 0..20 {
        let requests = (0..5)
            .map(|_| app.transfer_request(&alice, bob.wallet_id, 1, None))
            .collect();
        fire_together(requests).await;
        tokio::time::sleep(std::time::Duration::from_millis(37)).await;
    }
    let (seen, _) = read_stream_until(&mut stream, 10, |seen| {
        seen.matches("event: decision").count() >= 101
    })
    .await;
    assert_eq!(seen.matches("event: decision").count(), 101);
}

#[tokio::test]
async fn cursors_redis_would_reject_are_the_clients_mistake() {
    let app = spawn_app(|_| {}).await;
    let alice = app.sign_up("alice").await;
    for path in [
        "/api/v1/decisions?after=99999999999999999999-0",
        "/api/v1/decisions/stream?after=1-99999999999999999999",
        "/api/v1/decisions?limit=abc",
    ] {
        let response = app
            .client
            .get(app.url(path))
            .bearer_auth(&alice.token)
            .send()
            .await
            .expect("send");
        let (status, _) = problem(response).await;
        assert_eq!(status, 422, "{path}");
    }
}

/// `before=` another user's transfer answers exactly as an id that does
/// not exist.
#[tokio::test]
async fn a_foreign_history_cursor_reveals_nothing() {
    let app = spawn_app(without_cooldown).await;
    let (alice, bob) = app.alice_and_bob().await;
    let carol = app.sign_up("carol").await;
    for _ in 0..3 {
        assert_eq!(app.transfer(&alice, bob.wallet_id, 1, None).await.status(), 201);
    }
    let response = app.transfer(&bob, carol.wallet_id, 1, None).await;
    let bobs: Value = response.json().await.expect("json");
    let foreign_path = format!("/api/v1/transfers?before={}", bobs["id"].as_str().expect("id"));
    let foreign = app.get_json(&foreign_path, Some(&alice)).await;
    let unknown_path = format!("/api/v1/transfers?before={}", uuid::Uuid::new_v4());
    let unknown = app.get_json(&unknown_path, Some(&alice)).await;
    assert_eq!(foreign, unknown);
    assert_eq!(foreign["items"], json!([]));
}

/// A page of history is two bounded index scans, however long the
/// wallet's history: no sort of all its transfers.
#[tokio::test]
async fn a_history_page_reads_only_its_rows() {
    let app = spawn_app(|_| {}).await;
    let (alice, bob) = app.alice_and_bob().await;
    // 20,000 transfers each way, written directly: this test is about the
    // plan, not the money.
    sqlx::query(
        "INSERT INTO transfers (id, from_wallet_id, to_wallet_id, amount_minor, initiated_by, created_at)
         SELECT gen_random_uuid(),
                CASE WHEN g % 2 = 0 THEN $1 ELSE $2 END, CASE WHEN g % 2 = 0 THEN $2 ELSE $1 END,
                1, $3, now() - g * interval '1 second'
         FROM generate_series(1, 40000) g",
    )
    .bind(alice.wallet_id)
    .bind(bob.wallet_id)
    .bind(alice.user_id)
    .execute(&app.db)
    .await
    .expect("history");
    sqlx::query("ANALYZE transfers")
        .execute(&app.db)
        .await
        .expect("analyze");
    let deep: uuid::Uuid =
        sqlx::query_scalar("SELECT id FROM transfers ORDER BY created_at LIMIT 1 OFFSET 20000")
            .fetch_one(&app.db)
            .await
            .expect("a cursor deep in the history");
    const LIMIT: i64 = 21;
    for before in [None, Some(deep)] {
        let plan: Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "EXPLAIN (ANALYZE, FORMAT JSON) {}",
            layered_wallet::transfer::history::HISTORY_PAGE_SQL
        )))
        .bind(alice.user_id)
        .bind(before)
        .bind(LIMIT)
        .fetch_one(&app.db)
        .await
        .expect("explain");
        let mut scans = Vec::new();
        collect_scans(&plan[0]["Plan"], &mut scans);
        let history_scans: Vec<_> = scans
            .iter()
            .filter(|(_, index, _)| index.as_deref() != Some("transfers_pkey"))
            .collect();
        assert_eq!(history_scans.len(), 2, "{plan}");
        for (node, index, rows) in history_scans {
            assert_eq!(node, "Index Scan", "{plan}");
            assert!(index.is_some(), "{plan}");
            assert!(
                *rows <= LIMIT,
                "a scan read {rows} rows for a page of {LIMIT}: {plan}"
            );
        }
    }
}

/// Every scan of `transfers` in a JSON plan: node type, index, rows read.
fn collect_scans(node: &Value, scans: &mut Vec<(String, Option<String>, i64)>) {
    if node["Relation Name"] == "transfers" {
        scans.push((
            node["Node Type"].as_str().unwrap_or_default().to_owned(),
            node["Index Name"].as_str().map(str::to_owned),
            node["Actual Rows"].as_i64().unwrap_or_default(),
        ));
    }
    for child in node["Plans"].as_array().into_iter().flatten() {
        collect_scans(child, scans);
    }
}

/// Runs `deploy/postgres/roles.sql` for `database` with the given roles.
fn create_roles(database: &str, owner: &str, app: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/postgres/roles.sql");
    let output = std::process::Command::new("psql")
        .arg(postgres_server_url())
        .args(["-X", "-q", "-v", &format!("database={database}")])
        .args([
            "-v",
            &format!("owner_role={owner}"),
            "-v",
            "owner_password=owner-password",
        ])
        .args([
            "-v",
            &format!("app_role={app}"),
            "-v",
            "app_password=app-password",
        ])
        .args(["-f", script])
        .output()
        .expect("psql runs (Debian's postgresql-client)");
    assert!(
        output.status.success(),
        "roles.sql failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The server runs as a role that can read and write rows and call
/// functions, and nothing else; the migrations ran as the owner.
#[tokio::test]
async fn the_server_role_can_do_its_work_and_nothing_more() {
    assert_redis_reachable().await;
    let (database, options) = create_database().await;
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let (owner, app_role) = (format!("lw_owner_{suffix}"), format!("lw_app_{suffix}"));
    create_roles(&database, &owner, &app_role);
    let as_role = |role: &str, password: &str| database_url_as(&options, role, password);
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let mut settings = test_settings(&as_role(&app_role, "app-password"), &prefix);
    settings.database_migration_url = as_role(&owner, "owner-password").into();
    let app = spawn_with(settings, options.clone()).await;

    // It does its work.
    let (alice, bob) = app.alice_and_bob().await;
    assert_eq!(
        app.transfer(&alice, bob.wallet_id, 100, Some(&new_key()))
            .await
            .status(),
        201
    );
    app.assert_invariants().await;
    let owned_by_owner: bool =
        sqlx::query_scalar("SELECT bool_and(tableowner = $1) FROM pg_tables WHERE schemaname = 'public'")
            .bind(&owner)
            .fetch_one(&app.db)
            .await
            .expect("owners");
    assert!(owned_by_owner, "the migrations did not run as the owner");

    // And nothing more.
    let mut server_role = sqlx::PgConnection::connect(&as_role(&app_role, "app-password"))
        .await
        .expect("connect as the server's role");
    for statement in [
        "CREATE TABLE intruder (id int)",
        "DROP TABLE transfers",
        "ALTER TABLE wallets DROP CONSTRAINT wallets_never_below_zero",
        "TRUNCATE ledger_entries",
        "CREATE ROLE intruder",
        "CREATE OR REPLACE FUNCTION transfer() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    ] {
        let refused = sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut server_role)
            .await
            .expect_err(statement);
        let code = refused
            .as_database_error()
            .and_then(|e| e.code())
            .map(|c| c.into_owned());
        assert!(matches!(code.as_deref(), Some("42501")), "{statement}: {refused}");
    }
    let superuser: bool = sqlx::query_scalar(
        "SELECT rolsuper OR rolcreaterole OR rolcreatedb FROM pg_roles WHERE rolname = current_user",
    )
    .fetch_one(&mut server_role)
    .await
    .expect("role");
    assert!(!superuser);
    drop(server_role);

    drop(app);
    let mut admin = sqlx::PgConnection::connect(&postgres_server_url())
        .await
        .expect("admin");
    for role in [&app_role, &owner] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP ROLE IF EXISTS {role}")))
            .execute(&mut admin)
            .await
            .expect("drop a test role");
    }
}

/// `sslmode` in `DATABASE_URL` is honoured: `require` encrypts every
/// connection the server makes, and is refused by a server without TLS
/// rather than quietly sent in the clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_in_the_database_url_is_honoured() {
    let postgres = tokio::task::spawn_blocking(private_stores::PrivatePostgres::start_with_tls)
        .await
        .expect("a private PostgreSQL with TLS");
    postgres.create_database("wallet").await;
    let url = format!("{}?sslmode=require", postgres.url("wallet"));
    let options: sqlx::postgres::PgConnectOptions = postgres.url("wallet").parse().expect("options");
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let app = spawn_with(test_settings(&url, &prefix), options).await;
    let (alice, bob) = app.alice_and_bob().await;
    assert_eq!(app.transfer(&alice, bob.wallet_id, 100, None).await.status(), 201);
    let (connections, encrypted): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE s.ssl)
         FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
         WHERE a.application_name = 'layered-wallet'",
    )
    .fetch_one(&app.db)
    .await
    .expect("pg_stat_ssl");
    assert!(connections > 0, "the server holds no connection");
    assert_eq!(encrypted, connections, "a server connection is not encrypted");
    drop(app);

    let plain = tokio::task::spawn_blocking(private_stores::PrivatePostgres::start)
        .await
        .expect("a private PostgreSQL without TLS");
    plain.create_database("wallet").await;
    let options: sqlx::postgres::PgConnectOptions = plain.url("wallet").parse().expect("options");
    let mut settings = test_settings(&format!("{}?sslmode=require", plain.url("wallet")), &prefix);
    // Started without migrating (a migration would fail at start-up the
    // same way), so that readiness can say it.
    settings.migrate_on_start = false;
    let refused = spawn_with(settings, options).await;
    let ready = refused
        .client
        .get(refused.url("/readyz"))
        .send()
        .await
        .expect("send");
    assert_eq!(
        ready.status(),
        503,
        "connected in the clear despite sslmode=require"
    );
}

/// Every answer that carries a token, a balance, a transfer, a decision or
/// a signed-in person's page tells browsers and proxies to keep nothing;
/// the static files may be cached.
#[tokio::test]
async fn private_answers_are_never_cached() {
    let app = spawn_app(|settings| settings.cooldown_ttl_ms = 1).await;
    let no_store = |response: &reqwest::Response, what: &str| {
        assert_eq!(
            response
                .headers()
                .get("cache-control")
                .map(|v| v.to_str().unwrap_or_default()),
            Some("no-store"),
            "{what}"
        );
    };
    let signed_up = app
        .client
        .post(app.url("/api/v1/users"))
        .json(&json!({ "name": "carol", "password": "correct horse battery" }))
        .send()
        .await
        .expect("sign up");
    assert_eq!(signed_up.status(), 201);
    no_store(&signed_up, "a new account's token");
    let signed_in = app
        .client
        .post(app.url("/api/v1/tokens"))
        .json(&json!({ "name": "carol", "password": "correct horse battery" }))
        .send()
        .await
        .expect("sign in");
    no_store(&signed_in, "a token");

    let (alice, bob) = app.alice_and_bob().await;
    let transfer = app
        .transfer_request(&alice, bob.wallet_id, 100, Some(&new_key()))
        .send()
        .await
        .expect("transfer");
    assert_eq!(transfer.status(), 201);
    no_store(&transfer, "a transfer");
    let body: Value = transfer.json().await.expect("json");
    let transfer_id = body["id"].as_str().expect("an id").to_owned();
    for path in [
        format!("/api/v1/wallets/{}", alice.wallet_id),
        format!("/api/v1/transfers/{transfer_id}"),
        "/api/v1/transfers".to_owned(),
        "/api/v1/decisions".to_owned(),
        "/api/v1/wallets/not-a-wallet".to_owned(),
    ] {
        let response = app
            .client
            .get(app.url(&path))
            .bearer_auth(&alice.token)
            .send()
            .await
            .expect("get");
        assert!(response.status().as_u16() < 500, "{path}");
        no_store(&response, &path);
    }

    let mut visitor = wallet_testkit::visitor::signed_up(&app, "dave").await;
    for path in ["/wallet", "/race-lab", "/feed"] {
        let response = visitor.get_response(path).await;
        assert_eq!(response.status(), 200, "{path}");
        no_store(&response, path);
    }
    let style = visitor.get_response("/static/app.css").await;
    assert_eq!(style.headers()["cache-control"], "public, max-age=300");
}

/// The latency histogram and the request spans are labelled with the route
/// a request matched, as written in the route table: a transfer lands on
/// its route's series, and a wallet read on its pattern, never on its id.
#[tokio::test]
async fn requests_are_labelled_with_the_route_they_matched() {
    let app = spawn_app(|settings| settings.cooldown_ttl_ms = 1).await;
    let (alice, bob) = app.alice_and_bob().await;
    let transfer = app
        .transfer_request(&alice, bob.wallet_id, 100, Some(&new_key()))
        .send()
        .await
        .expect("transfer");
    assert_eq!(transfer.status(), 201);
    let wallet = app
        .client
        .get(app.url(&format!("/api/v1/wallets/{}", alice.wallet_id)))
        .bearer_auth(&alice.token)
        .send()
        .await
        .expect("wallet");
    assert_eq!(wallet.status(), 200);
    let metrics = app.metrics().await;
    let series = |method: &str, route: &str| {
        metrics
            .lines()
            .find(|line| {
                line.starts_with("wallet_http_request_duration_seconds_count")
                    && line.contains(&format!(r#"method="{method}""#))
                    && line.contains(&format!(r#"route="{route}""#))
            })
            .and_then(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
    };
    assert_eq!(series("POST", "/api/v1/transfers"), Some(1.0), "{metrics}");
    assert_eq!(series("GET", "/api/v1/wallets/{id}"), Some(1.0), "{metrics}");
    assert_eq!(series("POST", "/api/v1/users"), Some(2.0), "{metrics}");
    assert!(
        !metrics.contains(&alice.wallet_id.to_string()),
        "an id became a label"
    );
}

/// One rule for a UUID wherever one is read: the hyphenated form, in either
/// case. A body's braced, URN and 32-hex forms are refused as a path's and
/// a key's are; and a header that carries one value, sent twice, is
/// refused before anything happens.
#[tokio::test]
async fn uuids_have_one_form_and_single_headers_come_once() {
    let app = spawn_app(|settings| settings.cooldown_ttl_ms = 1).await;
    let (alice, bob) = app.alice_and_bob().await;
    let to = bob.wallet_id;
    for written in [
        format!("{{{to}}}"),
        format!("urn:uuid:{to}"),
        to.simple().to_string(),
    ] {
        let response = app
            .client
            .post(app.url("/api/v1/transfers"))
            .bearer_auth(&alice.token)
            .header("idempotency-key", new_key())
            .json(&json!({ "from_wallet_id": alice.wallet_id, "to_wallet_id": written, "amount_minor": 100 }))
            .send()
            .await
            .expect("send");
        assert_eq!(response.status(), 422, "{written}");
        let body: Value = response.json().await.expect("json");
        assert_eq!(body["errors"][0]["pointer"], "#/to_wallet_id", "{body}");
        let path = app
            .client
            .get(app.url(&format!("/api/v1/wallets/{written}")))
            .bearer_auth(&bob.token)
            .send()
            .await
            .expect("send");
        assert_eq!(path.status(), 404, "{written}");
        let key = app
            .transfer_request(&alice, to, 100, Some(&written))
            .send()
            .await
            .expect("send");
        assert_eq!(key.status(), 422, "{written}");
    }
    assert_eq!(app.transfer_count().await, 0);

    // Upper case is the same UUID in the body, the path and the key.
    let upper = to.to_string().to_uppercase();
    let key = new_key();
    let response = app
        .client
        .post(app.url("/api/v1/transfers"))
        .bearer_auth(&alice.token)
        .header("idempotency-key", key.to_uppercase())
        .json(&json!({ "from_wallet_id": alice.wallet_id, "to_wallet_id": upper, "amount_minor": 100 }))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 201);
    let replay = app
        .transfer_request(&alice, to, 100, Some(&key))
        .send()
        .await
        .expect("send");
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let path = app
        .client
        .get(app.url(&format!("/api/v1/wallets/{upper}")))
        .bearer_auth(&bob.token)
        .send()
        .await
        .expect("send");
    assert_eq!(path.status(), 200);
    assert_eq!(app.transfer_count().await, 1);

    // Single-valued headers, twice.
    for (name, first, second) in [
        ("idempotency-key", new_key(), new_key()),
        (
            "authorization",
            format!("Bearer {}", alice.token),
            format!("Bearer {}", bob.token),
        ),
        (
            "race-lab-switches",
            "cooldown=off".to_owned(),
            "cooldown=on".to_owned(),
        ),
    ] {
        let response = app
            .client
            .post(app.url("/api/v1/transfers"))
            .bearer_auth(&alice.token)
            .header(name, first)
            .header(name, second)
            .json(&json!({ "from_wallet_id": alice.wallet_id, "to_wallet_id": to, "amount_minor": 100 }))
            .send()
            .await
            .expect("send");
        assert_eq!(response.status(), 422, "{name}");
        let body: Value = response.json().await.expect("json");
        assert!(
            body["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("once at most"),
            "{name}: {body}"
        );
    }
    assert_eq!(app.transfer_count().await, 1);
}

/// `/readyz` is answered from a verdict at most `readiness_cache_ms` old:
/// a hundred probes at once, from anyone, cost PostgreSQL one query.
#[tokio::test]
async fn readiness_probes_share_one_verdict_per_period() {
    let (app, proxy) = spawn_app_behind_proxy(|settings| settings.readiness_cache_ms = 60_000).await;
    proxy.record_statements();
    let probes = (0..100).map(|_| app.client.get(app.url("/readyz")).send());
    for response in futures::future::join_all(probes).await {
        assert_eq!(response.expect("readyz").status(), 200);
    }
    let probes_run = proxy
        .statements_run()
        .iter()
        .filter(|statement| statement.trim() == "SELECT 1")
        .count();
    assert_eq!(probes_run, 1, "{:?}", proxy.statements_run());

    // With no cache, each probe asks.
    let (app, proxy) = spawn_app_behind_proxy(|settings| settings.readiness_cache_ms = 0).await;
    proxy.record_statements();
    for _ in 0..3 {
        assert_eq!(
            app.client
                .get(app.url("/readyz"))
                .send()
                .await
                .expect("readyz")
                .status(),
            200
        );
    }
    let probes_run = proxy
        .statements_run()
        .iter()
        .filter(|statement| statement.trim() == "SELECT 1")
        .count();
    assert_eq!(probes_run, 3);
}

/// Live streams are bounded per client address as well as per user, and a
/// stream that delivers nothing for `decision_stream_idle_s` ends.
#[tokio::test]
async fn streams_are_bounded_per_address_and_end_when_idle() {
    let app = spawn_app(|settings| {
        settings.decision_streams_per_address_max = 3;
        settings.decision_stream_idle_s = 1;
        settings.decision_stream_keepalive_ms = 200;
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    let mut first = open_stream(&app, &alice).await;
    let second = open_stream(&app, &alice).await;
    let third = open_stream(&app, &bob).await;
    for stream in [&first, &second, &third] {
        assert_eq!(stream.status(), 200);
    }
    let (status, body) = problem(open_stream(&app, &bob).await).await;
    assert_eq!(status, 429, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("from your address"),
        "{body}"
    );
    let (seen, _) = read_stream_until(&mut first, 5, |seen| seen.contains("event: end")).await;
    assert!(seen.contains(r#"data: {"reason":"idle"}"#), "{seen}");
}
