//! Every transfer ends in one decision, reported the same way in the
//! response header, the problem body, the trace, the metrics and the
//! decision feed.

use std::collections::HashMap;
use std::time::Duration;

use layered_wallet::decision::{Decision, Layer, Outcome};
use layered_wallet::domain::TransferRequest;
use opentelemetry::Value as OtelValue;
use opentelemetry_sdk::trace::SpanData;
use secrecy::SecretString;
use serde_json::{Value, json};
use uuid::Uuid;
use wallet_testkit::*;

fn decision_of(response: &reqwest::Response) -> Decision {
    let header = response.headers()["defense-decision"].to_str().expect("ascii");
    Decision::parse_header(header).unwrap_or_else(|| panic!("bad Defense-Decision header {header:?}"))
}

fn trace_id_of(response: &reqwest::Response) -> String {
    let traceparent = response.headers()["traceparent"].to_str().expect("ascii");
    traceparent
        .split('-')
        .nth(1)
        .expect("a W3C traceparent")
        .to_owned()
}

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| match &kv.value {
            OtelValue::String(s) => s.as_str().to_owned(),
            other => other.to_string(),
        })
}

/// The finished spans of one trace, waiting briefly for the server span.
async fn trace_spans(trace_id: &str) -> Vec<SpanData> {
    for _ in 0..50 {
        let spans: Vec<SpanData> = spans()
            .get_finished_spans()
            .expect("spans")
            .into_iter()
            .filter(|span| span.span_context.trace_id().to_string() == trace_id)
            .collect();
        if spans.iter().any(|span| span.name.starts_with("POST ")) {
            return spans;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no server span for trace {trace_id}");
}

async fn decision_counts(app: &TestApp) -> HashMap<(String, String), u64> {
    let text = app.metrics().await;
    let mut counts = HashMap::new();
    for line in text
        .lines()
        .filter(|line| line.starts_with("wallet_decisions_total{entry_point=\"transfer\","))
    {
        let (labels, value) = line.rsplit_once(' ').expect("a sample");
        let label = |name: &str| {
            labels
                .split(&format!("{name}=\""))
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .expect("label")
                .to_owned()
        };
        let count: u64 = value.parse().expect("count");
        // Some series exist at zero from the start (for the alerts' rates).
        if count > 0 {
            counts.insert((label("layer"), label("outcome")), count);
        }
    }
    counts
}

/// The user's feed, waiting until it holds at least `at_least` entries.
async fn feed(app: &TestApp, user: &TestUser, at_least: usize) -> Vec<Value> {
    for _ in 0..100 {
        let page: Value = app.get_json("/api/v1/decisions?limit=200", Some(user)).await;
        let items = page["items"].as_array().expect("items").clone();
        if items.len() >= at_least {
            return items;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the feed never reached {at_least} entries");
}

/// The user's stream read straight from Redis (the feed API itself needs
/// PostgreSQL to authenticate, and one case takes PostgreSQL away).
async fn feed_in_redis(app: &TestApp, user: &TestUser, at_least: usize) -> Vec<Value> {
    for _ in 0..100 {
        let rows = stream_in_redis(app, user).await;
        if rows.len() >= at_least {
            return rows.into_iter().map(|(_, entry)| entry).collect();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the feed never reached {at_least} entries");
}

/// Every entry of the user's stream in Redis now, with its stream id.
async fn stream_in_redis(app: &TestApp, user: &TestUser) -> Vec<(String, Value)> {
    let client = redis::Client::open(redis_url()).expect("redis url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("redis");
    let key = format!("{}decisions:{}", app.redis_prefix, user.user_id);
    let rows: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(&key)
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .expect("XRANGE");
    rows.into_iter()
        .map(|(id, fields)| (id, serde_json::from_str(&fields[0].1).expect("a JSON entry")))
        .collect()
}

/// A storm of identical requests: exactly one accepted, every other one
/// labelled with the layer that stopped it, and the header, the metrics,
/// the feed and the spans all say the same.
#[tokio::test]
async fn a_storm_yields_one_accepted_and_every_other_request_names_its_layer() {
    let app = spawn_app(|_| {}).await;
    let (alice, bob) = app.alice_and_bob().await;
    let key = new_key();
    let requests = (0..30)
        .map(|_| app.transfer_request(&alice, bob.wallet_id, 100, Some(&key)))
        .collect();
    let responses = fire_together(requests).await;

    let decisions: Vec<Decision> = responses.iter().map(decision_of).collect();
    let accepted = Decision::new(Layer::RowGuard, Outcome::Accepted);
    assert_eq!(
        decisions.iter().filter(|d| **d == accepted).count(),
        1,
        "{decisions:?}"
    );
    for decision in &decisions {
        assert!(
            *decision == accepted
                || *decision == Decision::new(Layer::Cooldown, Outcome::Rejected)
                || *decision == Decision::new(Layer::Idempotency, Outcome::Replayed),
            "{decision:?}"
        );
    }
    assert_eq!(app.transfer_count().await, 1);

    let mut expected: HashMap<(String, String), u64> = HashMap::new();
    for decision in &decisions {
        *expected
            .entry((decision.layer.to_string(), decision.outcome.to_string()))
            .or_default() += 1;
    }
    assert_eq!(decision_counts(&app).await, expected);

    let entries = feed(&app, &alice, 30).await;
    let mut from_feed: HashMap<(String, String), u64> = HashMap::new();
    for entry in &entries {
        let key = (
            entry["layer"].as_str().expect("layer").to_owned(),
            entry["outcome"].as_str().expect("outcome").to_owned(),
        );
        *from_feed.entry(key).or_default() += 1;
    }
    assert_eq!(from_feed, expected);

    for response in &responses {
        let spans = trace_spans(&trace_id_of(response)).await;
        let server = spans
            .iter()
            .find(|span| span.name.starts_with("POST "))
            .expect("server span");
        let decision = decision_of(response);
        assert_eq!(
            attribute(server, "defense.layer").as_deref(),
            Some(decision.layer.as_str())
        );
        assert_eq!(
            attribute(server, "defense.outcome").as_deref(),
            Some(decision.outcome.as_str())
        );
        let cooldown = spans
            .iter()
            .find(|span| span.name == "defense.cooldown")
            .expect("every request met the cooldown");
        assert_eq!(cooldown.parent_span_id, server.span_context.span_id());
        if decision.layer == Layer::Cooldown {
            assert!(
                !spans.iter().any(|span| span.name == "defense.idempotency"),
                "a cooldown refusal went on"
            );
        }
    }
    app.assert_invariants().await;
}

struct Case {
    name: &'static str,
    expect: Decision,
    status: u16,
}

/// The outcome matrix: for each outcome, the header, the problem body, the
/// server span, the metric label and the feed entry agree.
#[tokio::test]
async fn header_body_span_metric_and_feed_agree_for_every_outcome() {
    let (app, proxy) = spawn_app_behind_proxy(|settings| {
        settings.cooldown_scope = layered_wallet::settings::CooldownScope::UserActionBody;
        settings.cooldown_ttl_ms = 300;
        settings.idempotency_wait_ms_max = 100;
        settings.db_acquire_wait_ms_max = 500;
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    let key = new_key();
    let held_key = Uuid::new_v4();
    let held_body =
        json!({ "from_wallet_id": alice.wallet_id, "to_wallet_id": bob.wallet_id, "amount_minor": 77 });
    let parsed = TransferRequest::parse(held_body.to_string().as_bytes(), i64::MAX).expect("valid");
    let mut held = app.db.begin().await.expect("begin");
    sqlx::query(
        "INSERT INTO idempotency_keys (user_id, key, fingerprint, expires_at) VALUES ($1, $2, $3, now() + interval '1 hour')",
    )
    .bind(alice.user_id)
    .bind(held_key)
    .bind(&layered_wallet::transfer::pipeline::fingerprint_of(&parsed.canonical_json())[..])
    .execute(&mut *held)
    .await
    .expect("hold a claim");

    let case = |name, layer, outcome, status| Case {
        name,
        expect: Decision::new(layer, outcome),
        status,
    };
    let mut feed_entries = 0;
    let steps: Vec<(Case, reqwest::RequestBuilder, bool)> = vec![
        (
            case("accepted", Layer::RowGuard, Outcome::Accepted, 201),
            app.transfer_request(&alice, bob.wallet_id, 10, Some(&key)),
            true,
        ),
        (
            case("cooldown", Layer::Cooldown, Outcome::Rejected, 429),
            app.transfer_request(&alice, bob.wallet_id, 10, Some(&key)),
            true,
        ),
        (
            case("key reused", Layer::Idempotency, Outcome::KeyReused, 422),
            app.transfer_request(&alice, bob.wallet_id, 11, Some(&key)),
            true,
        ),
        (
            case("in flight", Layer::Idempotency, Outcome::InFlight, 409),
            app.transfer_request(&alice, bob.wallet_id, 77, Some(&held_key.to_string())),
            true,
        ),
        (
            case(
                "insufficient funds",
                Layer::RowGuard,
                Outcome::InsufficientFunds,
                422,
            ),
            app.transfer_request(&alice, bob.wallet_id, 999_999, None),
            true,
        ),
        (
            case("unknown target", Layer::RowGuard, Outcome::Rejected, 422),
            app.transfer_request(&alice, Uuid::new_v4(), 12, None),
            true,
        ),
        (
            case("bad amount", Layer::NoLayer, Outcome::Invalid, 422),
            app.transfer_request(&alice, bob.wallet_id, 0, None),
            true,
        ),
        (
            case("bad key", Layer::Idempotency, Outcome::Invalid, 422),
            app.transfer_request(&alice, bob.wallet_id, 13, Some("nope")),
            true,
        ),
        (
            case("not your wallet", Layer::NoLayer, Outcome::Unauthorized, 403),
            app.transfer_request_from(&alice, bob.wallet_id, alice.wallet_id, 14, None),
            true,
        ),
        (
            case("no token", Layer::NoLayer, Outcome::Unauthorized, 401),
            app.client.post(app.url("/api/v1/transfers")).json(&json!({})),
            false,
        ),
    ];
    for (index, (case, request, user_known)) in steps.into_iter().enumerate() {
        if index == 2 {
            // Past the cooldown window, so the key decides.
            tokio::time::sleep(Duration::from_millis(350)).await;
        }
        check(&app, &alice, &case, request, user_known, &mut feed_entries).await;
    }
    held.rollback().await.expect("rollback");

    // A replay, after the window.
    tokio::time::sleep(Duration::from_millis(350)).await;
    let replay = case("replayed", Layer::Idempotency, Outcome::Replayed, 201);
    check(
        &app,
        &alice,
        &replay,
        app.transfer_request(&alice, bob.wallet_id, 10, Some(&key)),
        true,
        &mut feed_entries,
    )
    .await;

    // PostgreSQL gone: our error, with no layer to blame.
    proxy.go_down();
    tokio::time::sleep(Duration::from_millis(350)).await;
    let error = case("database down", Layer::NoLayer, Outcome::Error, 503);
    check(
        &app,
        &alice,
        &error,
        app.transfer_request(&alice, bob.wallet_id, 15, None),
        true,
        &mut feed_entries,
    )
    .await;
}

/// Redis gone: fail-open passes are `degraded`, fail-closed refusals are
/// `cooldown` errors. (The feed lives in Redis too, so it is not checked.)
#[tokio::test]
async fn with_redis_down_the_decisions_are_degraded_or_errors() {
    let closed = format!("redis://127.0.0.1:{}", closed_port());
    let open = spawn_app(|settings| settings.redis_url = SecretString::from(closed.clone())).await;
    let (alice, bob) = open.alice_and_bob().await;
    let mut unused = 0;
    let degraded = Case {
        name: "fail open",
        expect: Decision::new(Layer::RowGuard, Outcome::Degraded),
        status: 201,
    };
    check(
        &open,
        &alice,
        &degraded,
        open.transfer_request(&alice, bob.wallet_id, 5, None),
        false,
        &mut unused,
    )
    .await;

    let closed_app = spawn_app(|settings| {
        settings.redis_url = SecretString::from(closed.clone());
        settings.cooldown_on_store_error = layered_wallet::settings::StoreErrorPolicy::FailClosed;
    })
    .await;
    let carol = closed_app.sign_up("carol").await;
    let dave = closed_app.sign_up("dave").await;
    let error = Case {
        name: "fail closed",
        expect: Decision::new(Layer::Cooldown, Outcome::Error),
        status: 503,
    };
    check(
        &closed_app,
        &carol,
        &error,
        closed_app.transfer_request(&carol, dave.wallet_id, 5, None),
        false,
        &mut unused,
    )
    .await;
}

async fn check(
    app: &TestApp,
    user: &TestUser,
    case: &Case,
    request: reqwest::RequestBuilder,
    check_feed: bool,
    feed_entries: &mut usize,
) {
    let name = case.name;
    let before = decision_counts(app).await;
    let response = request.send().await.expect("send");
    assert_eq!(response.status().as_u16(), case.status, "{name}");
    let decision = decision_of(&response);
    assert_eq!(decision, case.expect, "{name}: header");
    let trace_id = trace_id_of(&response);

    let replayed = response.headers().contains_key("idempotent-replayed");
    if !response.status().is_success() {
        let (_, body) = problem(response).await;
        assert_eq!(body["layer"], decision.layer.as_str(), "{name}: body layer");
        assert_eq!(body["trace_id"], trace_id.as_str(), "{name}: body trace id");
    } else if replayed {
        assert_eq!(decision.outcome, Outcome::Replayed, "{name}");
    }

    let spans = trace_spans(&trace_id).await;
    let server = spans
        .iter()
        .find(|span| span.name.starts_with("POST "))
        .expect("server span");
    assert_eq!(
        attribute(server, "defense.layer").as_deref(),
        Some(decision.layer.as_str()),
        "{name}: span"
    );
    assert_eq!(
        attribute(server, "defense.outcome").as_deref(),
        Some(decision.outcome.as_str()),
        "{name}: span"
    );
    assert_eq!(
        attribute(server, "http.response.status_code").as_deref(),
        Some(case.status.to_string().as_str()),
        "{name}"
    );
    for span in &spans {
        for kv in &span.attributes {
            let value = kv.value.to_string();
            assert!(
                !value.contains(&user.token),
                "{name}: a token in span attribute {}",
                kv.key
            );
        }
    }

    let after = decision_counts(app).await;
    let label = (decision.layer.to_string(), decision.outcome.to_string());
    assert_eq!(
        after.get(&label).copied().unwrap_or(0),
        before.get(&label).copied().unwrap_or(0) + 1,
        "{name}: metric"
    );

    if check_feed {
        *feed_entries += 1;
        let entries = feed_in_redis(app, user, *feed_entries).await;
        let entry = entries.last().expect("an entry");
        assert_eq!(entry["layer"], decision.layer.as_str(), "{name}: feed");
        assert_eq!(entry["outcome"], decision.outcome.as_str(), "{name}: feed");
        assert_eq!(entry["status"], case.status, "{name}: feed");
        assert_eq!(entry["trace_id"], trace_id.as_str(), "{name}: feed");
        for field in ["time", "instance_id", "request_id", "latency_ms"] {
            assert!(!entry[field].is_null(), "{name}: feed entry lacks {field}");
        }
    }
}

/// Two instances write to one feed; a reader on either sees both, and the
/// live stream pushes decisions made on the other instance.
#[tokio::test]
async fn two_instances_share_one_feed_and_its_live_stream() {
    let first = spawn_app(|settings| {
        without_cooldown(settings);
        settings.instance_id = "first".into();
    })
    .await;
    let mut second_settings = first.settings.clone();
    second_settings.instance_id = "second".into();
    let second = {
        let mut app = spawn_with(second_settings, first.db_options.clone()).await;
        app.mark_second_instance();
        app
    };
    let (alice, bob) = first.alice_and_bob().await;

    // A live stream on the first instance, opened before anything happens.
    let mut stream = first
        .client
        .get(first.url("/api/v1/decisions/stream"))
        .bearer_auth(&alice.token)
        .send()
        .await
        .expect("stream");
    assert_eq!(stream.headers()["content-type"], "text/event-stream");

    let on_first = first.transfer(&alice, bob.wallet_id, 1, None).await;
    let on_second = second.transfer(&alice, bob.wallet_id, 2, None).await;
    assert_eq!(
        (on_first.status().as_u16(), on_second.status().as_u16()),
        (201, 201)
    );

    let entries = feed(&first, &alice, 2).await;
    let instances: Vec<&str> = entries
        .iter()
        .map(|e| e["instance_id"].as_str().expect("instance"))
        .collect();
    assert_eq!(instances, vec!["first", "second"]);
    let bobs = feed(&first, &bob, 0).await;
    assert!(bobs.is_empty(), "Bob saw Alice's decisions");

    let mut seen = String::new();
    while seen.matches("event: decision").count() < 2 {
        let chunk = tokio::time::timeout(Duration::from_secs(5), stream.chunk())
            .await
            .expect("the stream pushed nothing")
            .expect("chunk")
            .expect("the stream ended");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.contains("\"instance_id\":\"first\""), "{seen}");
    assert!(seen.contains("\"instance_id\":\"second\""), "{seen}");
}

/// No token, password or Authorization header reaches a log line: the real
/// binary, logging JSON, through sign-up, sign-in and transfers. With no
/// span exporter it records no spans, yet gives every answer and feed entry
/// a trace id all the same.
#[tokio::test]
async fn no_secret_reaches_the_logs() {
    let (_, options) = create_database().await;
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let password = "a very secret password 42";
    let mut server = std::process::Command::new(env!("CARGO_BIN_EXE_wallet-server"))
        .env("DATABASE_URL", database_url_of(&options))
        .env("REDIS_URL", redis_url())
        .env("PORT", port.to_string())
        .env("LOG_FORMAT", "json")
        .env("RUST_LOG", "debug")
        .env("WALLET_TOKEN_SIGNING_KEY", SIGNING_KEY)
        .env(
            "WALLET_REDIS_KEY_PREFIX",
            format!("test:{}:", Uuid::new_v4().simple()),
        )
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start wallet-server");
    // Drained as it is written: a debug log fills a pipe's buffer long
    // before the test ends, and a server blocked on writing its log would
    // stall mid-request.
    use std::io::Read;
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut text);
            }
            text
        })
    };
    let stdout = drain(
        server
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    );
    let stderr = drain(
        server
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    );
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let mut up = false;
    for _ in 0..100 {
        if client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(up, "wallet-server did not become ready");

    let mut tokens = Vec::new();
    let mut wallets = Vec::new();
    for name in ["alice", "bob"] {
        let body: Value = client
            .post(format!("{base}/api/v1/users"))
            .json(&json!({ "name": name, "password": password }))
            .send()
            .await
            .expect("send")
            .json()
            .await
            .expect("json");
        tokens.push(body["token"].as_str().expect("token").to_owned());
        wallets.push(body["wallet_id"].as_str().expect("wallet").to_owned());
    }
    let signed_in: Value = client
        .post(format!("{base}/api/v1/tokens"))
        .json(&json!({ "name": "alice", "password": password }))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    tokens.push(signed_in["token"].as_str().expect("token").to_owned());
    // With no exporter there is no OpenTelemetry layer, yet every answer
    // carries a trace: the caller's, continued, or one made for it.
    const CALLERS_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut trace_ids = Vec::new();
    for n in 0..3 {
        let mut request = client
            .post(format!("{base}/api/v1/transfers"))
            .bearer_auth(&tokens[2])
            .header("Idempotency-Key", new_key())
            .json(&json!({ "from_wallet_id": wallets[0], "to_wallet_id": wallets[1], "amount_minor": 5 }));
        if n == 0 {
            request = request.header("traceparent", format!("00-{CALLERS_TRACE}-00f067aa0ba902b7-01"));
        }
        let response = request.send().await.expect("send");
        let traceparent = response.headers()["traceparent"]
            .to_str()
            .expect("ascii")
            .to_owned();
        let parts: Vec<&str> = traceparent.split('-').collect();
        assert_eq!(parts.len(), 4, "{traceparent}");
        assert!(
            parts[1].len() == 32 && parts[1] != "0".repeat(32),
            "{traceparent}"
        );
        assert!(
            parts[2].len() == 16 && parts[2] != "00f067aa0ba902b7",
            "a span id of its own: {traceparent}"
        );
        trace_ids.push(parts[1].to_owned());
    }
    assert_eq!(trace_ids[0], CALLERS_TRACE, "the caller's trace is continued");
    assert_ne!(trace_ids[1], trace_ids[2], "each request its own trace");
    let mut fed: Vec<String> = Vec::new();
    for _ in 0..100 {
        let feed: Value = client
            .get(format!("{base}/api/v1/decisions?limit=10"))
            .bearer_auth(&tokens[2])
            .send()
            .await
            .expect("send")
            .json()
            .await
            .expect("json");
        fed = feed["items"]
            .as_array()
            .expect("items")
            .iter()
            .filter_map(|item| item["trace_id"].as_str().map(str::to_owned))
            .collect();
        if fed.len() >= trace_ids.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for trace_id in &trace_ids {
        assert!(fed.contains(trace_id), "{trace_id} is not in the feed: {fed:?}");
    }
    let _ = client
        .post(format!("{base}/api/v1/transfers"))
        .bearer_auth("lw1.forged.token")
        .json(&json!({}))
        .send()
        .await;

    let _ = std::process::Command::new("kill")
        .arg(server.id().to_string())
        .status();
    let (stdout, stderr) = tokio::task::spawn_blocking(move || {
        let _ = server.wait();
        (
            stdout.join().expect("stdout reader"),
            stderr.join().expect("stderr reader"),
        )
    })
    .await
    .expect("join");
    let logs = format!(
        "{}{}",
        String::from_utf8_lossy(&stdout),
        String::from_utf8_lossy(&stderr)
    );
    assert!(
        logs.contains("transfer decided"),
        "the decision log line is missing:\n{logs}"
    );
    for line in logs.lines().filter(|line| line.starts_with('{')) {
        serde_json::from_str::<Value>(line).unwrap_or_else(|_| panic!("not a JSON log line: {line}"));
    }
    for secret in tokens
        .iter()
        .map(String::as_str)
        .chain([password, "lw1.forged.token"])
    {
        assert!(!logs.contains(secret), "a secret reached the logs");
    }
    assert!(
        !logs.to_ascii_lowercase().contains("authorization"),
        "an Authorization header reached the logs"
    );
}

/// An incoming W3C `traceparent` is continued: the response and the server
/// span carry the caller's trace id, and the span's parent is the caller's.
#[tokio::test]
async fn an_incoming_traceparent_is_continued() {
    let app = spawn_app(|_| {}).await;
    let (alice, bob) = app.alice_and_bob().await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent_span = "00f067aa0ba902b7";
    let response = app
        .transfer_request(&alice, bob.wallet_id, 10, None)
        .header("traceparent", format!("00-{trace_id}-{parent_span}-01"))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 201);
    assert_eq!(trace_id_of(&response), trace_id);
    let spans = trace_spans(trace_id).await;
    let server = spans
        .iter()
        .find(|span| span.name.starts_with("POST "))
        .expect("server span");
    assert_eq!(server.parent_span_id.to_string(), parent_span);
    assert!(
        spans.iter().any(|span| span.name == "defense.row_guard"),
        "no row guard span"
    );
}

/// A user's stream expires no sooner than `decision_feed_retention_hours`
/// after its last entry and at most two minutes later: its expiry is
/// refreshed at most once a minute rather than with every entry.
#[tokio::test]
async fn a_users_stream_expires_after_the_retention_with_at_most_two_minutes_more() {
    let app = spawn_app(without_cooldown).await;
    let (alice, bob) = app.alice_and_bob().await;
    for _ in 0..3 {
        assert_eq!(app.transfer(&alice, bob.wallet_id, 1, None).await.status(), 201);
    }
    feed_in_redis(&app, &alice, 3).await;
    let client = redis::Client::open(redis_url()).expect("redis url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("redis");
    let key = format!("{}decisions:{}", app.redis_prefix, alice.user_id);
    let ttl_s: i64 = redis::cmd("TTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .expect("TTL");
    let retention_s = i64::try_from(app.settings.decision_feed_retention_hours * 3600).expect("small");
    assert!(
        (retention_s..=retention_s + 120).contains(&ttl_s),
        "TTL {ttl_s} s for a retention of {retention_s} s"
    );
}

/// The series the alerting rules read (deploy/prometheus/rules.yml): the
/// configured window, the transfers' problems by type, and how long the
/// oldest expired key has waited for the sweeper.
#[tokio::test]
async fn the_alerts_series_say_what_happened() {
    let app = spawn_app(|settings| settings.cooldown_ttl_ms = 2_500).await;
    let (alice, bob) = app.alice_and_bob().await;
    let sample = |text: &str, series: &str| -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    };

    let text = app.metrics().await;
    assert_eq!(
        sample(&text, "wallet_cooldown_window_seconds"),
        Some(2.5),
        "{text}"
    );
    assert_eq!(
        sample(&text, "wallet_idempotency_oldest_expired_age_seconds"),
        Some(0.0),
        "no key has expired yet"
    );

    // One accepted, the rest refused by the window: each refusal counted
    // by its problem type.
    let requests = (0..4)
        .map(|_| app.transfer_request(&alice, bob.wallet_id, 100, Some(&new_key())))
        .collect();
    let responses = fire_together(requests).await;
    let refused = responses.iter().filter(|r| r.status() == 429).count();
    assert_eq!(refused, 3);
    let text = app.metrics().await;
    assert_eq!(
        sample(
            &text,
            "wallet_problems_total{entry_point=\"transfer\",type=\"cooldown-active\"}"
        ),
        Some(3.0),
        "{text}"
    );

    // A key expired an hour ago waits for the sweeper, which has not run.
    sqlx::query("UPDATE idempotency_keys SET expires_at = now() - interval '1 hour'")
        .execute(&app.db)
        .await
        .expect("expire the key");
    let text = app.metrics().await;
    let age = sample(&text, "wallet_idempotency_oldest_expired_age_seconds").expect("the age");
    assert!((3600.0..3700.0).contains(&age), "{age}");
}

/// One user's burst, longer than their stream's cap, within one write of
/// the feed: that write carries only the cap's worth, the burst's last
/// entries, since the cap would trim the others at once. Each write is
/// told apart by its entries' stream ids (one write is one pipeline; two
/// are a write interval apart), so that a burst a slow machine spread over
/// two writes still passes.
#[tokio::test]
async fn a_burst_past_a_streams_cap_writes_only_what_the_cap_keeps() {
    let cap = 5;
    let write_interval_ms = 1_000;
    let app = spawn_app(|settings| {
        settings.decision_feed_entries_per_user_max = cap;
        settings.decision_feed_write_interval_ms = write_interval_ms;
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    let requests = (0..40)
        .map(|_| app.transfer_request(&alice, bob.wallet_id, 1, None))
        .collect();
    let responses = fire_together(requests).await;
    let request_ids: Vec<String> = responses
        .iter()
        .map(|response| {
            response.headers()["x-request-id"]
                .to_str()
                .expect("ascii")
                .to_owned()
        })
        .collect();
    feed_in_redis(&app, &alice, usize::try_from(cap).expect("small")).await;
    // Long enough for a second write, if the burst needed one.
    tokio::time::sleep(Duration::from_millis(2 * write_interval_ms)).await;

    let rows = stream_in_redis(&app, &alice).await;
    let mut writes: Vec<Vec<String>> = Vec::new();
    let mut last_ms = None;
    for (id, entry) in rows {
        let ms: u64 = id
            .split('-')
            .next()
            .and_then(|ms| ms.parse().ok())
            .expect("a stream id");
        if last_ms.is_none_or(|last| ms > last + write_interval_ms / 2) {
            writes.push(Vec::new());
        }
        last_ms = Some(ms);
        let request_id = entry["request_id"].as_str().expect("a request id").to_owned();
        assert!(
            request_ids.contains(&request_id),
            "{request_id} was not one of the burst's"
        );
        writes.last_mut().expect("a write").push(request_id);
    }
    let sizes: Vec<usize> = writes.iter().map(Vec::len).collect();
    let cap = usize::try_from(cap).expect("small");
    assert!(
        sizes.iter().all(|size| *size <= cap),
        "entries per write: {sizes:?}"
    );
    assert!(sizes.contains(&cap), "entries per write: {sizes:?}");
}
