//! The REST contract: accounts, reads, the OpenAPI document, and the whole
//! error matrix, each refusal checked to have changed nothing.

use chrono::Duration;
use layered_wallet::auth::TokenSigner;
use layered_wallet::domain::UserId;
use layered_wallet::settings::CooldownScope;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};
use uuid::Uuid;
use wallet_testkit::*;

#[tokio::test]
async fn sign_up_gives_a_wallet_with_the_grant_and_a_working_token() {
    let app = spawn_app(|settings| settings.signup_grant_minor = 12_345).await;
    let response = app
        .client
        .post(app.url("/api/v1/users"))
        .json(&json!({ "name": "carol", "password": "long enough" }))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 201);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["balance_minor"], 12_345);
    let wallet_id = body["wallet_id"].as_str().expect("wallet id");
    let token = body["token"].as_str().expect("token");

    let wallet: Value = app
        .client
        .get(app.url(&format!("/api/v1/wallets/{wallet_id}")))
        .bearer_auth(token)
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(
        wallet,
        json!({
            "id": wallet_id, "balance_minor": 12_345, "held_minor": 0, "posted_balance_minor": 12_345,
            "currency": "USD"
        })
    );

    // The password is stored as an argon2 hash, the token as a SHA-256.
    let stored: String = sqlx::query_scalar("SELECT password_hash FROM users WHERE name = 'carol'")
        .fetch_one(&app.db)
        .await
        .expect("user");
    assert!(stored.starts_with("$argon2id$"), "{stored}");
    let tokens: i64 = app
        .count("SELECT count(*) FROM api_tokens WHERE octet_length(token_hash) = 32")
        .await;
    assert_eq!(tokens, 1);
}

#[tokio::test]
async fn accounts_refuse_taken_names_bad_input_and_wrong_passwords() {
    let app = spawn_app(|_| {}).await;
    app.sign_up("dave").await;
    let post = |path: &'static str, body: Value| app.client.post(app.url(path)).json(&body).send();

    let (status, body) = problem(
        post(
            "/api/v1/users",
            json!({"name": "dave", "password": "another one"}),
        )
        .await
        .expect("send"),
    )
    .await;
    assert_eq!(
        (status, body["type"].as_str()),
        (409, Some("/problems/name-taken"))
    );
    let (status, _) = problem(
        post("/api/v1/users", json!({"name": "erin", "password": "short"}))
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(status, 422);
    let (status, _) = problem(
        post(
            "/api/v1/users",
            json!({"name": " erin", "password": "long enough"}),
        )
        .await
        .expect("send"),
    )
    .await;
    assert_eq!(status, 422);
    let (status, _) = problem(
        post("/api/v1/users", json!({"name": "", "password": "long enough"}))
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(status, 422);
    assert_eq!(app.count("SELECT count(*) FROM users").await, 1);

    let wrong = post(
        "/api/v1/tokens",
        json!({"name": "dave", "password": "wrong password"}),
    )
    .await
    .expect("send");
    assert_eq!(wrong.headers()["www-authenticate"], "Bearer");
    let (status, _) = problem(wrong).await;
    assert_eq!(status, 401);
    let (status, _) = problem(
        post(
            "/api/v1/tokens",
            json!({"name": "nobody", "password": "wrong password"}),
        )
        .await
        .expect("send"),
    )
    .await;
    assert_eq!(status, 401);
    let right = post(
        "/api/v1/tokens",
        json!({"name": "dave", "password": "correct horse battery"}),
    )
    .await
    .expect("send");
    assert_eq!(right.status(), 201);
    let body: Value = right.json().await.expect("json");
    assert!(body["token"].as_str().expect("token").starts_with("lw1."));
}

/// Reads are the owner's only; anything else is a 404 that does not reveal
/// whether the wallet or transfer exists.
#[tokio::test]
async fn wallets_and_transfers_are_visible_to_their_owners_only() {
    let app = spawn_app(without_cooldown).await;
    let (alice, bob) = app.alice_and_bob().await;
    let carol = app.sign_up("carol").await;
    let get = |user: &TestUser, path: String| app.client.get(app.url(&path)).bearer_auth(&user.token).send();

    let (status, _) = problem(
        get(&bob, format!("/api/v1/wallets/{}", alice.wallet_id))
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = problem(
        get(&bob, "/api/v1/wallets/not-a-uuid".into())
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(status, 404);

    let mut ids = Vec::new();
    for amount in [1, 2, 3, 4, 5] {
        let receipt: Value = app
            .transfer(&alice, bob.wallet_id, amount, None)
            .await
            .json()
            .await
            .expect("json");
        ids.push(receipt["id"].as_str().expect("id").to_owned());
    }
    let received: Value = app
        .transfer(&carol, alice.wallet_id, 9, None)
        .await
        .json()
        .await
        .expect("json");

    // Newest first, paged with `before`.
    let page: Value = get(&alice, "/api/v1/transfers?limit=4".into())
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    let items = page["items"].as_array().expect("items");
    assert_eq!(items.len(), 4);
    assert_eq!(items[0]["id"], received["id"]);
    assert_eq!(items[0]["direction"], "received");
    assert_eq!(items[1]["id"], ids[4].as_str());
    assert_eq!(items[1]["direction"], "sent");
    let next = page["next_before"].as_str().expect("a next page");
    let page: Value = get(&alice, format!("/api/v1/transfers?limit=4&before={next}"))
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    let rest: Vec<&str> = page["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|item| item["id"].as_str().expect("id"))
        .collect();
    assert_eq!(rest, vec![ids[1].as_str(), ids[0].as_str()]);
    assert!(page.get("next_before").is_none());

    let one = get(&bob, format!("/api/v1/transfers/{}", ids[0]))
        .await
        .expect("send");
    assert_eq!(one.status(), 200);
    let (status, _) = problem(
        get(&carol, format!("/api/v1/transfers/{}", ids[0]))
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = problem(
        get(&alice, "/api/v1/transfers?limit=0".into())
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(status, 422);
}

/// The status matrix the README shows: every refusal is problem+json with
/// the right status, type and layer, and changes nothing in the database.
#[tokio::test]
async fn every_refusal_in_the_matrix_is_a_problem_and_changes_nothing() {
    // Body scope: each distinct request has its own window, so only the
    // deliberate repeat meets the cooldown.
    let app = spawn_app(|settings| {
        settings.cooldown_scope = CooldownScope::UserActionBody;
        settings.signup_grant_minor = 1_000;
        settings.request_body_bytes_max = 512;
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    let key = new_key();
    let done = app.transfer(&alice, bob.wallet_id, 5, Some(&key)).await;
    assert_eq!(done.status(), 201);
    let revoked = app.sign_up("revoked").await;
    app.revoke_token(&revoked).await;

    let transfers = app.url("/api/v1/transfers");
    let body = |from: Uuid, to: Uuid, amount: i64| json!({ "from_wallet_id": from, "to_wallet_id": to, "amount_minor": amount });
    let ok_body = body(alice.wallet_id, bob.wallet_id, 7);
    let cases: Vec<(&str, reqwest::RequestBuilder, u16, &str, Option<&str>)> = vec![
        ("missing token", app.client.post(&transfers).json(&ok_body), 401, "unauthorized", None),
        ("invalid token", app.client.post(&transfers).bearer_auth("lw1.bogus.token").json(&ok_body), 401, "unauthorized", None),
        ("revoked token", app.client.post(&transfers).bearer_auth(&revoked.token).json(&body(revoked.wallet_id, bob.wallet_id, 1)), 401, "unauthorized", None),
        ("not your wallet", app.transfer_request_from(&alice, bob.wallet_id, alice.wallet_id, 8, None), 403, "not-your-wallet", None),
        ("unknown source", app.transfer_request_from(&alice, Uuid::new_v4(), bob.wallet_id, 8, None), 403, "not-your-wallet", None),
        ("unknown target", app.transfer_request(&alice, Uuid::new_v4(), 9, None), 422, "unknown-target-wallet", Some("row_guard")),
        ("same source and target", app.transfer_request(&alice, alice.wallet_id, 10, None), 422, "same-wallet", None),
        ("zero amount", app.transfer_request(&alice, bob.wallet_id, 0, None), 422, "validation-failed", None),
        ("negative amount", app.transfer_request(&alice, bob.wallet_id, -5, None), 422, "validation-failed", None),
        ("amount over the maximum", app.transfer_request(&alice, bob.wallet_id, 10_000_001, None), 422, "validation-failed", None),
        ("wrong field type", app.client.post(&transfers).bearer_auth(&alice.token).json(&json!({"from_wallet_id": alice.wallet_id, "to_wallet_id": bob.wallet_id, "amount_minor": "7"})), 422, "validation-failed", None),
        ("malformed JSON", app.client.post(&transfers).bearer_auth(&alice.token).header("content-type", "application/json").body("{\"from_wallet_id\":"), 400, "malformed-request", None),
        ("not JSON", app.client.post(&transfers).bearer_auth(&alice.token).header("content-type", "text/plain").body("hello"), 415, "unsupported-media-type", None),
        ("body too large", app.client.post(&transfers).bearer_auth(&alice.token).header("content-type", "application/json").body(format!("{{\"pad\":\"{}\"}}", "x".repeat(1_000))), 413, "payload-too-large", None),
        ("malformed key", app.transfer_request(&alice, bob.wallet_id, 11, Some("nope")), 422, "validation-failed", Some("idempotency")),
        ("reused key", app.transfer_request(&alice, bob.wallet_id, 12, Some(&key)), 422, "idempotency-key-reused", Some("idempotency")),
        ("insufficient funds", app.transfer_request(&alice, bob.wallet_id, 5_000, None), 422, "insufficient-funds", Some("row_guard")),
        ("cooldown", app.transfer_request(&alice, bob.wallet_id, 5_000, None), 429, "cooldown-active", Some("cooldown")),
    ];
    for (name, request, status, slug, layer) in cases {
        let before = app.snapshot().await;
        let response = request.send().await.expect("send");
        let (got, problem_body) = problem(response).await;
        assert_eq!(got, status, "{name}: {problem_body}");
        assert_eq!(problem_body["type"], format!("/problems/{slug}"), "{name}");
        assert_eq!(
            problem_body["layer"].as_str(),
            Some(layer.unwrap_or("none")),
            "{name}"
        );
        assert_eq!(
            problem_body["trace_id"].as_str().map(str::len),
            Some(32),
            "{name}"
        );
        assert_eq!(app.snapshot().await, before, "{name} changed the database");
    }
    app.assert_invariants().await;
}

/// PostgreSQL unreachable: 503 problem, never a 500, and /readyz says so.
#[tokio::test]
async fn with_postgres_unreachable_a_transfer_is_a_503() {
    assert_redis_reachable().await;
    let prefix = format!("test:{}:", Uuid::new_v4().simple());
    let mut settings = test_settings(
        &format!("postgres://postgres@127.0.0.1:{}/none", closed_port()),
        &prefix,
    );
    settings.migrate_on_start = false;
    settings.db_acquire_wait_ms_max = 500;
    let (_, options) = create_database().await;
    let app = spawn_with(settings, options).await;
    let signer = TokenSigner::new(&SecretString::from(SIGNING_KEY));
    let token = signer.issue(UserId(Uuid::new_v4()), Duration::hours(1));
    let response = app
        .client
        .post(app.url("/api/v1/transfers"))
        .bearer_auth(token.token.expose_secret())
        .json(&json!({ "from_wallet_id": Uuid::new_v4(), "to_wallet_id": Uuid::new_v4(), "amount_minor": 1 }))
        .send()
        .await
        .expect("send");
    assert_eq!(response.headers()["retry-after"], "1");
    let (status, body) = problem(response).await;
    assert_eq!(status, 503, "{body}");
    let ready = app.client.get(app.url("/readyz")).send().await.expect("send");
    assert_eq!(ready.status(), 503);
    let ready: Value = ready.json().await.expect("json");
    assert_eq!(ready, json!({ "status": "not_ready" }));
    let (status, ready) = app.admin_readiness().await;
    assert_eq!(status, 503);
    assert_eq!(ready["postgres"], "unreachable");
}

#[tokio::test]
async fn health_readiness_openapi_and_unknown_routes() {
    let app = spawn_app(|_| {}).await;
    assert_eq!(
        app.client
            .get(app.url("/healthz"))
            .send()
            .await
            .expect("send")
            .status(),
        200
    );
    // The public probe gives the verdict only; the admin listener, why.
    let ready: Value = app.get_json("/readyz", None).await;
    assert_eq!(ready, json!({ "status": "ready" }));
    let (status, ready) = app.admin_readiness().await;
    assert_eq!(status, 200);
    assert_eq!(ready["status"], "ready");
    assert_eq!(ready["postgres"], "ok");
    assert_eq!(ready["redis"], "ok");

    let openapi: Value = app.get_json("/api/openapi.json", None).await;
    assert!(openapi["openapi"].as_str().expect("version").starts_with("3."));
    for path in [
        "/api/v1/users",
        "/api/v1/tokens",
        "/api/v1/wallets/{id}",
        "/api/v1/transfers",
        "/api/v1/transfers/{id}",
    ] {
        assert!(
            openapi["paths"].get(path).is_some(),
            "{path} missing from the OpenAPI document"
        );
    }
    let responses = &openapi["paths"]["/api/v1/transfers"]["post"]["responses"];
    for status in [
        "201", "400", "401", "403", "409", "413", "415", "422", "429", "503",
    ] {
        assert!(
            responses.get(status).is_some(),
            "POST /api/v1/transfers does not document {status}"
        );
    }

    let (status, _) = problem(
        app.client
            .get(app.url("/no/such/route"))
            .send()
            .await
            .expect("send"),
    )
    .await;
    assert_eq!(status, 404);
}

/// Expired token hashes are swept in batches; live ones stay.
#[tokio::test]
async fn expired_tokens_are_swept() {
    let app = spawn_app(|_| {}).await;
    let alice = app.sign_up("alice").await;
    sqlx::query(
        "INSERT INTO api_tokens (token_hash, user_id, expires_at)
         SELECT sha256(n::text::bytea), $1, now() - interval '1 minute' FROM generate_series(1, 5) AS n",
    )
    .bind(alice.user_id)
    .execute(&app.db)
    .await
    .expect("expired tokens");
    let deleted = layered_wallet::sweep::expired_tokens(&app.db, 2)
        .await
        .expect("sweep");
    assert_eq!(deleted, 5);
    assert_eq!(
        app.count("SELECT count(*) FROM api_tokens").await,
        1,
        "the live token was swept"
    );
    let wallet = app
        .get_json(&format!("/api/v1/wallets/{}", alice.wallet_id), Some(&alice))
        .await;
    assert_eq!(wallet["balance_minor"], 100_000);
}

/// A known path with a method it does not take: 405, `Allow`, problem+json.
/// And every method the table lists is really served.
#[tokio::test]
async fn a_wrong_method_on_a_known_path_is_405_with_allow() {
    let app = spawn_app(|_| {}).await;
    for (method, path, allow) in [
        ("TRACE", "/api/v1/transfers", "GET, POST"),
        (
            "DELETE",
            format!("/api/v1/wallets/{}", Uuid::new_v4()).leak() as &str,
            "GET",
        ),
        ("PUT", "/api/v1/users", "POST"),
        ("GET", "/api/v1/tokens/current", "DELETE"),
    ] {
        let response = app
            .client
            .request(
                reqwest::Method::from_bytes(method.as_bytes()).expect("method"),
                app.url(path),
            )
            .send()
            .await
            .expect("send");
        assert_eq!(
            response
                .headers()
                .get("allow")
                .map(|v| v.to_str().expect("ascii")),
            Some(allow),
            "{method} {path}"
        );
        let (status, body) = problem(response).await;
        assert_eq!(status, 405, "{method} {path}");
        assert_eq!(body["type"], "/problems/method-not-allowed");
    }
    for (pattern, methods) in layered_wallet::router::ROUTE_METHODS {
        let path = pattern
            .replace("{id}", &Uuid::new_v4().to_string())
            .replace("{slug}", "not-found")
            .replace("{file}", "app.css");
        for method in methods.split(", ") {
            let response = app
                .client
                .request(
                    reqwest::Method::from_bytes(method.as_bytes()).expect("method"),
                    app.url(&path),
                )
                .send()
                .await
                .expect("send");
            assert_ne!(response.status(), 405, "{method} {path} is listed but not served");
        }
    }
}

/// The document promises what the server does: every failure with its
/// problem types, the headers, the limits and the links.
#[tokio::test]
async fn the_openapi_document_is_the_whole_contract() {
    let app = spawn_app(|settings| settings.transfer_amount_minor_max = 5_000_000).await;
    let doc: Value = app.get_json("/api/openapi.json", None).await;
    let create = &doc["paths"]["/api/v1/transfers"]["post"];
    for status in [
        "201", "400", "401", "403", "409", "413", "415", "422", "429", "500", "503",
    ] {
        let response = &create["responses"][status];
        assert!(
            response["description"].is_string(),
            "POST /api/v1/transfers lacks {status}"
        );
        assert!(response["headers"]["X-Request-Id"].is_object(), "{status}");
        assert!(response["headers"]["Defense-Decision"].is_object(), "{status}");
    }
    assert!(
        create["responses"]["422"]["description"]
            .as_str()
            .expect("text")
            .contains("/problems/insufficient-funds")
    );
    assert!(
        create["responses"]["503"]["description"]
            .as_str()
            .expect("text")
            .contains("/problems/outcome-unknown")
    );
    assert!(create["responses"]["429"]["headers"]["Retry-After"].is_object());
    assert!(create["responses"]["201"]["headers"]["Idempotent-Replayed"].is_object());
    assert_eq!(
        create["responses"]["201"]["links"]["GetTransfer"]["operationId"],
        "get_transfer"
    );
    let key = create["parameters"]
        .as_array()
        .expect("parameters")
        .iter()
        .find(|p| p["name"] == "Idempotency-Key")
        .expect("the key is documented");
    assert!(
        key["schema"]["pattern"].as_str().expect("pattern").contains('"'),
        "quoted form"
    );
    let amount = &doc["components"]["schemas"]["TransferBody"]["properties"]["amount_minor"];
    assert_eq!(
        (amount["minimum"].as_i64(), amount["maximum"].as_i64()),
        (Some(1), Some(5_000_000))
    );

    let signup = &doc["paths"]["/api/v1/users"]["post"]["responses"];
    for status in ["201", "400", "409", "413", "415", "422", "429", "503"] {
        assert!(signup[status].is_object(), "sign-up lacks {status}");
    }
    assert_eq!(
        signup["201"]["links"]["GetWallet"]["parameters"]["id"],
        "$response.body#/wallet_id"
    );
    let revoke = &doc["paths"]["/api/v1/tokens/current"]["delete"]["responses"];
    assert!(revoke["401"]["headers"]["WWW-Authenticate"].is_object());
    assert!(
        revoke["403"]["description"]
            .as_str()
            .expect("text")
            .contains("csrf-token-invalid")
    );
    for path in ["/api/v1/transfers", "/api/v1/decisions"] {
        let limit = doc["paths"][path]["get"]["parameters"]
            .as_array()
            .expect("parameters")
            .iter()
            .find(|p| p["name"] == "limit")
            .expect("limit");
        assert_eq!(limit["in"], "query", "{path}");
        assert_eq!(limit["schema"]["minimum"], 1, "{path}");
        assert!(limit["schema"]["maximum"].is_i64(), "{path}");
    }
}

/// A body that breaks the rules gets one 422 naming every field it got
/// wrong by a JSON Pointer (`errors[].pointer`), never the JSON parser's
/// text and never a value sent; nothing changes. A whole number written
/// with a fraction of zero is the integer JSON Schema says it is.
#[tokio::test]
async fn validation_problems_name_each_field() {
    let app = spawn_app(|_| {}).await;
    let (alice, bob) = app.alice_and_bob().await;
    let transfers = app.url("/api/v1/transfers");
    let pointers = |body: &Value| -> Vec<String> {
        body["errors"]
            .as_array()
            .expect("errors")
            .iter()
            .map(|error| error["pointer"].as_str().expect("pointer").to_owned())
            .collect()
    };
    let before = app.snapshot().await;
    let braced = format!("{{{}}}", bob.wallet_id);
    let cases = [
        (
            json!({ "from_wallet_id": alice.wallet_id, "to_wallet_id": alice.wallet_id, "amount_minor": 0 }),
            vec!["#/amount_minor", "#/to_wallet_id"],
        ),
        (
            json!({ "to_wallet_id": braced, "amount_minor": "7", "memo": "hi" }),
            vec!["#/memo", "#/from_wallet_id", "#/to_wallet_id", "#/amount_minor"],
        ),
        (json!([1, 2]), vec!["#"]),
        (
            json!({ "from_wallet_id": alice.wallet_id, "to_wallet_id": bob.wallet_id, "amount_minor": 1.5 }),
            vec!["#/amount_minor"],
        ),
    ];
    for (body, expected) in cases {
        let response = app
            .client
            .post(&transfers)
            .bearer_auth(&alice.token)
            .json(&body)
            .send()
            .await
            .expect("send");
        let (status, problem_body) = problem(response).await;
        assert_eq!(status, 422, "{body}: {problem_body}");
        assert_eq!(problem_body["type"], "/problems/validation-failed");
        assert_eq!(pointers(&problem_body), expected, "{body}");
        let detail = problem_body["detail"].as_str().expect("detail");
        assert!(
            !detail.contains("invalid type") && !detail.contains("line 1"),
            "{detail}"
        );
    }
    assert_eq!(
        app.snapshot().await,
        before,
        "a refused body changed the database"
    );

    // 57340.0 is the integer 57340.
    let response = app
        .client
        .post(&transfers)
        .bearer_auth(&alice.token)
        .json(&json!({ "from_wallet_id": alice.wallet_id, "to_wallet_id": bob.wallet_id, "amount_minor": 57340.0 }))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 201);
    assert_eq!(app.balance(alice.wallet_id).await, 100_000 - 57_340);

    // Sign-up: each field named, and a password never echoed.
    let users = app.url("/api/v1/users");
    for (body, expected) in [
        (
            json!({ "name": 5, "password": 123456789 }),
            vec!["#/name", "#/password"],
        ),
        (json!({ "name": "carol" }), vec!["#/password"]),
        (
            json!({ "name": "", "password": "correct horse battery" }),
            vec!["#/name"],
        ),
        (
            json!({ "name": "carol", "password": "short" }),
            vec!["#/password"],
        ),
    ] {
        let response = app.client.post(&users).json(&body).send().await.expect("send");
        let (status, problem_body) = problem(response).await;
        assert_eq!(status, 422, "{body}: {problem_body}");
        assert_eq!(pointers(&problem_body), expected, "{body}");
        assert!(!problem_body.to_string().contains("123456789"), "{problem_body}");
    }
}

/// The document says what a linter and a fuzzer need: every operation
/// declares its security (public ones, `[]`), there is a server, every
/// reference resolves, and a name's length and spacing are the ones the
/// server enforces, so that an empty name is not a schema-valid request.
#[tokio::test]
async fn the_document_declares_security_servers_and_the_names_rules() {
    let app = spawn_app(|settings| settings.user_name_chars_max = 40).await;
    let doc: Value = app.get_json("/api/openapi.json", None).await;
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("operations") {
            assert!(
                operation["security"].is_array(),
                "{method} {path} declares no security"
            );
        }
    }
    assert_eq!(doc["paths"]["/api/v1/users"]["post"]["security"], json!([]));
    assert_eq!(
        doc["paths"]["/api/v1/transfers"]["post"]["security"],
        json!([{ "bearer": [] }])
    );
    assert_eq!(doc["servers"][0]["url"], "/");
    let name = &doc["components"]["schemas"]["Credentials"]["properties"]["name"];
    assert_eq!(
        (name["minLength"].as_u64(), name["maxLength"].as_u64()),
        (Some(1), Some(40))
    );

    // Every `$ref` names a schema the document holds.
    let text = doc.to_string();
    for reference in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
        let name = reference.split('"').next().expect("a name");
        assert!(
            doc["components"]["schemas"].get(name).is_some(),
            "#/components/schemas/{name} is referenced but not defined"
        );
    }

    // The schema's pattern states the narrower form every deployment
    // accepts; `x-accepted-pattern` states the spacing every accepted name
    // keeps. What it refuses, the server refuses too; and the names it
    // lets through that follow the rest of the rules are taken.
    let ascii =
        regex::Regex::new(name["pattern"].as_str().expect("a pattern")).expect("a regular expression");
    assert!(ascii.is_match("o'brien-2") && !ascii.is_match("zoë ana"));
    let spacing = regex::Regex::new(name["x-accepted-pattern"].as_str().expect("the accepted spacing"))
        .expect("a regular expression");
    let sign_up = |name: &str| {
        app.client
            .post(app.url("/api/v1/users"))
            .json(&json!({ "name": name, "password": "correct horse battery" }))
            .send()
    };
    for refused in [
        "",
        " zoe",
        "zoe ",
        "zo  e",
        "zo\te",
        "zo\u{a0}e",
        "zo\u{3000}e",
        "zo\ne",
    ] {
        assert!(!spacing.is_match(refused), "{refused:?}");
        assert_eq!(sign_up(refused).await.expect("send").status(), 422, "{refused:?}");
    }
    for taken in ["zoë ana", "o'brien-2", "李 小龍"] {
        assert!(spacing.is_match(taken), "{taken:?}");
        assert_eq!(sign_up(taken).await.expect("send").status(), 201, "{taken:?}");
    }
}
