//! Where a person, an attacker or a failure meets the money: what a typed
//! amount means, what a client is told when the outcome is unknown, what the
//! cooldown says, what a revoked token can still do, look-alike names, two
//! currencies, oversized bodies. Through the real API and the real form,
//! asserting on the database.

use std::time::Duration;

use layered_wallet::web::money;
use serde_json::{Value, json};
use wallet_testkit::visitor::{Visitor, hidden, signed_up};
use wallet_testkit::*;

/// 23 typed amounts through the real form: the accepted ones move exactly
/// what they say, the rest are refused with a sentence that quotes what was
/// read, and move nothing.
#[tokio::test]
async fn a_typed_amount_means_what_it_says() {
    let app = spawn_app(|settings| {
        settings.cooldown_ttl_ms = 1;
        settings.signup_grant_minor = 10_000_000;
    })
    .await;
    app.sign_up("bob").await;
    let mut alice = signed_up(&app, "alice").await;
    let (alice_wallet, bob_wallet) = (app.wallet_of("alice").await, app.wallet_of("bob").await);

    let accepted = [
        ("9.50", 950),
        ("12", 1_200),
        ("12.5", 1_250),
        ("1,234.50", 123_450),
        (" 7.25 ", 725),
        ("0.01", 1),
        ("2,000", 200_000),
    ];
    for (typed, minor) in accepted {
        let (alice_before, bob_before) = (app.balance(alice_wallet).await, app.balance(bob_wallet).await);
        let (status, review) = alice.review("bob", typed).await;
        assert_eq!(status, 200, "{typed}");
        let amount = money::format(minor, "USD");
        assert!(
            review.contains(&format!("Send {amount} to bob?")),
            "{typed}: {review}"
        );
        assert_eq!(
            app.balance(alice_wallet).await,
            alice_before,
            "the review of {typed} moved money"
        );
        let sent = alice.confirm(&review).await;
        let (_, page) = alice.follow(sent).await;
        assert!(page.contains(&format!("Sent {amount} to bob")), "{typed}: {page}");
        assert_eq!(app.balance(alice_wallet).await, alice_before - minor, "{typed}");
        assert_eq!(app.balance(bob_wallet).await, bob_before + minor, "{typed}");
    }

    let refused = [
        ("9,50", "for cents use a dot"),
        ("1,0.5", "A comma may only separate thousands"),
        ("12,50", "A comma may only separate thousands"),
        ("1.005", "more than two decimals"),
        ("1e3", "is not an amount"),
        ("-1", "a negative amount"),
        ("$2", "currency sign"),
        ("٣", "digits other than 0 to 9"),
        ("１２", "digits other than 0 to 9"),
        ("100,000.01", "more than the largest single transfer, $100,000.00"),
        ("abc", "is not an amount"),
        (".5", "is not an amount"),
        ("12.", "is not an amount"),
        ("1 000", "is not an amount"),
        ("0", "as zero"),
        ("", "Enter an amount"),
    ];
    let transfers = app.transfer_count().await;
    let balance = app.balance(alice_wallet).await;
    for (typed, reason) in refused {
        let (status, page) = alice.review("bob", typed).await;
        assert_eq!(status, 200, "{typed}");
        assert!(
            !page.contains("id=\"confirm-form\""),
            "{typed} reached the confirmation"
        );
        if !typed.is_empty() {
            assert!(page.contains(&format!("We read “{typed}”")), "{typed}: {page}");
        }
        assert!(page.contains(reason), "{typed}: {page}");
        // The form keeps what was typed.
        assert!(
            page.contains(&format!("name=\"amount\" value=\"{typed}\"")),
            "{typed}"
        );
    }
    assert_eq!(app.transfer_count().await, transfers);
    assert_eq!(app.balance(alice_wallet).await, balance);
    app.assert_invariants().await;
}

/// The wallet form leaves the amount to the server's grammar: no HTML
/// `pattern` pre-empts its sentence with the browser's "Please match the
/// requested format".
#[tokio::test]
async fn the_form_leaves_the_amount_to_the_servers_sentence() {
    let app = spawn_app(|_| {}).await;
    let mut alice = signed_up(&app, "alice").await;
    let (_, html) = alice.get("/wallet").await;
    assert!(!html.contains("pattern="), "{html}");
    let (status, page) = alice.review("demo", "9,50").await;
    assert_eq!(status, 200);
    assert!(page.contains("We read “9,50”"), "{page}");
}

/// The connection breaks after PostgreSQL committed the transfer and before
/// its answer arrived: the client is told the outcome is unknown, the
/// window stays, and a retry with the same key settles it at one transfer.
#[tokio::test]
async fn a_lost_commit_reply_is_an_unknown_outcome_that_the_same_key_settles() {
    let (app, proxy) = spawn_app_behind_proxy(|settings| settings.cooldown_ttl_ms = 1_000).await;
    let (alice, bob) = app.alice_and_bob().await;
    let key = new_key();
    proxy.lose_the_reply_to("FROM transfer(");
    let response = app.transfer(&alice, bob.wallet_id, 700, Some(&key)).await;
    assert!(proxy.reply_was_lost(), "the fault never fired");
    assert_eq!(response.headers()["retry-after"], "1");
    let (status, body) = problem(response).await;
    assert_eq!(
        (status, body["type"].as_str()),
        (503, Some("/problems/outcome-unknown"))
    );
    let detail = body["detail"].as_str().expect("detail");
    assert!(!detail.contains("Nothing was changed"), "{detail}");
    assert!(
        detail.contains("same Idempotency-Key") && detail.contains("GET /api/v1/transfers"),
        "{detail}"
    );
    assert_eq!(app.transfer_count().await, 1, "PostgreSQL committed it");

    // The window was kept: a keyless retry inside it cannot pay again.
    assert_eq!(app.cooldown_keys().await.len(), 1, "the window was released");
    let keyless = app.transfer(&alice, bob.wallet_id, 700, None).await;
    assert_eq!(keyless.status(), 429);

    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let retry = app.transfer(&alice, bob.wallet_id, 700, Some(&key)).await;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(app.transfer_count().await, 1);
    assert_eq!(app.balance(alice.wallet_id).await, 100_000 - 700);
    app.assert_invariants().await;
}

/// The same fault through the form: the page says the outcome is unknown
/// and shows the same confirmation with the same key; sending it again
/// shows the transfer that was made, once.
#[tokio::test]
async fn the_form_keeps_the_same_key_when_the_outcome_is_unknown() {
    let (app, proxy) = spawn_app_behind_proxy(|settings| settings.cooldown_ttl_ms = 500).await;
    app.sign_up("bob").await;
    let mut alice = signed_up(&app, "alice").await;
    let (_, review) = alice.review("bob", "3.00").await;
    proxy.lose_the_reply_to("FROM transfer(");
    let page = alice.confirmed(&review).await;
    assert!(proxy.reply_was_lost());
    assert!(
        page.contains("we cannot tell yet whether it went through"),
        "{page}"
    );
    assert!(!page.contains("Nothing was changed"), "{page}");
    assert_eq!(
        hidden(&page, "idempotency_key"),
        hidden(&review, "idempotency_key"),
        "a new key would let one more click pay twice"
    );
    assert_eq!(app.transfer_count().await, 1);

    tokio::time::sleep(Duration::from_millis(600)).await;
    let page = alice.confirmed(&page).await;
    assert!(
        page.contains("Already processed — showing the original result"),
        "{page}"
    );
    assert!(page.contains("Sent $3.00 to bob"), "{page}");
    assert_eq!(app.transfer_count().await, 1);
    app.assert_invariants().await;
}

/// A statement timeout rolls the transfer back: 503 "nothing was
/// changed", never 500, and the window is given back.
#[tokio::test]
async fn a_statement_timeout_answers_503_and_changes_nothing() {
    let app = spawn_app(|settings| {
        settings.idempotency_wait_ms_max = 100;
        settings.wallet_lock_wait_ms_max = 100;
        settings.inbox_wait_ms_max = 100;
        settings.db_statement_timeout_ms = 700;
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    app.slow_down_ledger_writes(2).await;
    let before = app.snapshot().await;
    let response = app.transfer(&alice, bob.wallet_id, 100, Some(&new_key())).await;
    let (status, body) = problem(response).await;
    assert_eq!(
        (status, body["type"].as_str()),
        (503, Some("/problems/service-unavailable"))
    );
    assert!(
        body["detail"]
            .as_str()
            .expect("detail")
            .contains("Nothing was changed")
    );
    assert_eq!(app.snapshot().await, before);
    assert!(app.cooldown_keys().await.is_empty(), "the window was kept");
}

/// Refused for insufficient funds, then corrected at once: the 429 says
/// what really happened (the last attempt was tried and refused, not
/// sent) and when the next transfer is possible.
#[tokio::test]
async fn the_cooldown_says_what_happened_and_when_to_try_again() {
    let app = spawn_app(|_| {}).await;
    let (alice, bob) = app.alice_and_bob().await;
    let refused = app.transfer(&alice, bob.wallet_id, 200_000, None).await;
    assert_eq!(refused.status(), 422);
    let corrected = app.transfer(&alice, bob.wallet_id, 500, None).await;
    let (status, body) = problem(corrected).await;
    assert_eq!(status, 429);
    assert_eq!(body["title"], "Too soon after your last transfer");
    let detail = body["detail"].as_str().expect("detail");
    assert!(
        detail.starts_with(
            "You tried a transfer less than a second ago. It was refused, and its window still holds."
        ) && detail
            .contains("Transfers are spaced at least 5 s apart so that duplicates cannot slip through.")
            && detail.contains("Try again in 5 s."),
        "{detail}"
    );
    assert!(!detail.contains("in progress"), "{detail}");

    // Scoped to the body: a different payment goes through, a copy does not.
    let app = spawn_app(|settings| {
        settings.cooldown_scope = layered_wallet::settings::CooldownScope::UserActionBody;
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    assert_eq!(app.transfer(&alice, bob.wallet_id, 100, None).await.status(), 201);
    assert_eq!(app.transfer(&alice, bob.wallet_id, 200, None).await.status(), 201);
    let (status, body) = problem(app.transfer(&alice, bob.wallet_id, 100, None).await).await;
    assert_eq!(status, 429);
    assert!(
        body["detail"]
            .as_str()
            .expect("detail")
            .starts_with("You sent this same transfer"),
        "{body}"
    );
    assert_eq!(app.transfer_count().await, 2);
}

/// A revoked token never takes its owner's window and never writes to the
/// owner's feed: refused in the cooldown's own script, with no PostgreSQL
/// query; and if Redis lost the revocation, the transaction refuses it and
/// the window is given back.
#[tokio::test]
async fn a_revoked_token_cannot_lock_its_owner_out() {
    let (app, proxy) = spawn_app_behind_proxy(|settings| settings.cooldown_ttl_ms = 1_000).await;
    let (alice, bob) = app.alice_and_bob().await;
    let signed_in: Value = app
        .client
        .post(app.url("/api/v1/tokens"))
        .json(&json!({ "name": "alice", "password": "correct horse battery" }))
        .send()
        .await
        .expect("sign in")
        .json()
        .await
        .expect("json");
    let alice_again = TestUser {
        name: alice.name.clone(),
        user_id: alice.user_id,
        wallet_id: alice.wallet_id,
        token: signed_in["token"].as_str().expect("token").to_owned(),
    };
    app.revoke_token(&alice).await;

    let queries = proxy.query_messages();
    let (status, _) = problem(app.transfer(&alice, bob.wallet_id, 100, None).await).await;
    assert_eq!(status, 401);
    assert_eq!(
        proxy.query_messages(),
        queries,
        "a revoked token reached PostgreSQL"
    );
    assert!(
        app.cooldown_keys().await.is_empty(),
        "a revoked token took the window"
    );
    let live = app.transfer(&alice_again, bob.wallet_id, 100, None).await;
    assert_eq!(live.status(), 201, "the owner was locked out");

    // Redis lost the revocation entry: PostgreSQL refuses the token, and the
    // window it took is given back at once.
    let client = redis::Client::open(redis_url()).expect("redis url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("redis");
    let entries: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}revoked:*", app.redis_prefix))
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    assert_eq!(entries.len(), 1, "{entries:?}");
    let _: () = redis::cmd("DEL")
        .arg(&entries)
        .query_async(&mut conn)
        .await
        .expect("DEL");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let (status, _) = problem(app.transfer(&alice, bob.wallet_id, 100, None).await).await;
    assert_eq!(status, 401);
    assert!(
        app.cooldown_keys().await.is_empty(),
        "the dead token kept the window"
    );
    assert_eq!(
        app.transfer(&alice_again, bob.wallet_id, 100, None)
            .await
            .status(),
        201
    );

    // The owner's feed holds the two transfers, and nothing from the dead
    // token.
    let mut items = Vec::new();
    for _ in 0..100 {
        let page: Value = app
            .get_json("/api/v1/decisions?limit=200", Some(&alice_again))
            .await;
        items = page["items"].as_array().expect("items").clone();
        if items.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let statuses: Vec<i64> = items
        .iter()
        .map(|item| item["status"].as_i64().expect("status"))
        .collect();
    assert_eq!(statuses, vec![201, 201], "{items:?}");
    assert_eq!(app.transfer_count().await, 2);
}

async fn sign_up_status(app: &TestApp, name: &str) -> (u16, Value) {
    let response = app
        .client
        .post(app.url("/api/v1/users"))
        .json(&json!({ "name": name, "password": "correct horse battery" }))
        .send()
        .await
        .expect("sign up");
    if response.status() == 201 {
        return (201, response.json().await.expect("json"));
    }
    problem(response).await
}

/// `bob`, `BOB`, `ｂｏｂ`, `bоb` with a Cyrillic о, `bob` with a zero-width
/// space, and `paypal` written all in Cyrillic are one name or no name:
/// never a second account.
#[tokio::test]
async fn look_alike_names_are_one_account() {
    let app = spawn_app(|settings| settings.cooldown_ttl_ms = 1).await;
    app.sign_up("bob").await;
    app.sign_up("paypal").await;
    for (name, status, kind) in [
        ("BOB", 409, "/problems/name-taken"),
        ("ｂｏｂ", 409, "/problems/name-taken"),
        // All Cyrillic, one script: caught by its skeleton.
        (
            "\u{0440}\u{0430}\u{0443}\u{0440}\u{0430}\u{04CF}",
            409,
            "/problems/name-taken",
        ),
        // Latin mixed with Cyrillic: refused outright.
        ("b\u{043E}b", 422, "/problems/validation-failed"),
        ("bob\u{200B}", 422, "/problems/validation-failed"),
        ("\u{202E}bob", 422, "/problems/validation-failed"),
        ("bob\u{0378}", 422, "/problems/validation-failed"),
    ] {
        let (got, body) = sign_up_status(&app, name).await;
        assert_eq!(
            (got, body["type"].as_str()),
            (status, Some(kind)),
            "{name:?}: {body}"
        );
    }
    assert_eq!(app.count("SELECT count(*) FROM users").await, 2);

    // Sign-in and sending by name use the same comparison, and the page
    // shows the account's own name.
    let signed_in = app
        .client
        .post(app.url("/api/v1/tokens"))
        .json(&json!({ "name": "BOB", "password": "correct horse battery" }))
        .send()
        .await
        .expect("sign in");
    assert_eq!(signed_in.status(), 201);
    let mut alice = signed_up(&app, "alice").await;
    let (_, review) = alice.review("BOB", "1.00").await;
    assert!(review.contains("Send $1.00 to bob?"), "{review}");
    alice.confirm(&review).await;
    assert_eq!(app.balance(app.wallet_of("bob").await).await, 100_100);
}

/// Characters that render as nothing, as a blank, or as another script's
/// letter make no second account of a name, wherever they are put: each is
/// refused with a sentence, and nothing is written. The allowlist still lets
/// people's names through.
#[tokio::test]
async fn names_hold_only_characters_allowed_in_identifiers() {
    let app = spawn_app(|settings| {
        settings.cooldown_ttl_ms = 1;
        settings.account_limits_enabled = false;
    })
    .await;
    const NAME: &str = "eve-nazlbjtd";
    app.sign_up(NAME).await;
    let refused = [
        // Blanks and fillers.
        '\u{2800}',
        '\u{3164}',
        '\u{115F}',
        '\u{1160}',
        '\u{FFA0}',
        '\u{1680}',
        '\u{180E}',
        '\u{205F}',
        // Invisible: zero-width, joiners, format and annotation characters.
        '\u{200B}',
        '\u{200C}',
        '\u{200D}',
        '\u{2060}',
        '\u{FEFF}',
        '\u{00AD}',
        '\u{034F}',
        '\u{061C}',
        '\u{FFF9}',
        '\u{1BCA0}',
        '\u{1D173}',
        // Musical and other symbols that draw nothing or a box.
        '\u{1D159}',
        '\u{FFFC}',
        '\u{FFFD}',
        '\u{1F600}',
        // Bidirectional controls, separators, controls.
        '\u{202E}',
        '\u{2066}',
        '\u{2028}',
        '\u{2029}',
        '\u{0007}',
        '\u{007F}',
        // Tags and variation selectors.
        '\u{E0001}',
        '\u{E0041}',
        '\u{E007F}',
        '\u{FE00}',
        '\u{FE0F}',
        '\u{E0100}',
        // Private use and unassigned.
        '\u{E000}',
        '\u{F8FF}',
        '\u{F0000}',
        '\u{100000}',
        '\u{0378}',
        // Letters of another script that copy Latin ones.
        '\u{0430}',
        '\u{0435}',
        '\u{03BF}',
        '\u{0440}',
    ];
    assert!(refused.len() >= 40);
    for c in refused {
        let (middle, end) = NAME.split_at(7);
        for name in [format!("{middle}{c}{end}"), format!("{NAME}{c}")] {
            let (status, body) = sign_up_status(&app, &name).await;
            assert_eq!(
                (status, body["type"].as_str()),
                (422, Some("/problems/validation-failed")),
                "U+{:04X} in {name:?}: {body}",
                u32::from(c)
            );
            let detail = body["detail"].as_str().unwrap_or_default();
            assert!(detail.starts_with("A name "), "{detail}");
        }
    }
    // Marks on nothing, on a space, or piled up.
    for name in [
        "\u{0301}eve",
        "eve \u{0301}x",
        "eve\u{0301}\u{0301}\u{0301}\u{0301}x",
    ] {
        assert_eq!(sign_up_status(&app, name).await.0, 422, "{name:?}");
    }
    assert_eq!(app.count("SELECT count(*) FROM users").await, 1);

    // People's names still pass: accents, one other script, a safe mix.
    for name in [
        "Zoë Ångström",
        "O'Brien",
        "Anne-Marie",
        "Nguyễn Thị Minh",
        "Мария Иванова",
        "李小龙",
        "山田 太郎",
        "Δήμητρα",
        "josé_2",
    ] {
        let (status, body) = sign_up_status(&app, name).await;
        assert_eq!(status, 201, "{name:?}: {body}");
    }
    assert_eq!(app.count("SELECT count(*) FROM users").await, 10);
}

/// Accounts without comparable names (as a hand-written insert or an
/// earlier schema leaves them) stay valid: the start-up backfill gives the
/// oldest of two look-alikes the name, and the later one still works under
/// its exact name.
#[tokio::test]
async fn the_name_migration_keeps_older_accounts_valid() {
    assert_redis_reachable().await;
    let (_, options) = create_database().await;
    let db = sqlx::PgPool::connect_with(options.clone())
        .await
        .expect("connect");
    layered_wallet::database::MIGRATOR
        .run(&db)
        .await
        .expect("the schema");
    for (name, age_s) in [("bob", 20), ("BOB", 10), ("carol", 5)] {
        let user = uuid::Uuid::new_v4();
        sqlx::query(
            "INSERT INTO users (id, name, password_hash, created_at) VALUES ($1, $2, 'x', now() - make_interval(secs => $3));
             ",
        )
        .bind(user)
        .bind(name)
        .bind(f64::from(age_s))
        .execute(&db)
        .await
        .expect("a legacy user");
        sqlx::query(
            "INSERT INTO wallets (id, user_id, currency, opening_balance_minor, balance_minor)
             VALUES ($1, $2, 'USD', 1000, 1000)",
        )
        .bind(uuid::Uuid::new_v4())
        .bind(user)
        .execute(&db)
        .await
        .expect("a legacy wallet");
    }
    db.close().await;

    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let app = spawn_with(test_settings(&database_url_of(&options), &prefix), options).await;
    let keys: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT name, name_key FROM users ORDER BY created_at")
            .fetch_all(&app.db)
            .await
            .expect("keys");
    assert_eq!(
        keys,
        vec![
            ("bob".to_owned(), Some("bob".to_owned())),
            ("BOB".to_owned(), None),
            ("carol".to_owned(), Some("carol".to_owned())),
        ]
    );
    let (status, _) = sign_up_status(&app, "Bob").await;
    assert_eq!(status, 409);
    let mut alice = signed_up(&app, "alice").await;
    let (_, review) = alice.review("BOB", "1.00").await;
    assert!(
        review.contains("Send $1.00 to BOB?"),
        "the exact legacy name wins: {review}"
    );
    let (_, review) = alice.review("Bob", "1.00").await;
    assert!(review.contains("Send $1.00 to bob?"), "{review}");
}

/// Two instances with different `currency` settings on one database: a
/// transfer between their wallets is refused by the row guard, stored and
/// replayed like any business refusal, and moves nothing.
#[tokio::test]
async fn minor_units_never_move_across_currencies() {
    let dollars = spawn_app(|_| {}).await;
    let mut settings = dollars.settings.clone();
    settings.currency = "EUR".into();
    settings.http_port = 0;
    let mut euros = spawn_with(settings, dollars.db_options.clone()).await;
    euros.mark_second_instance();
    let alice = dollars.sign_up("alice").await;
    let eve = euros.sign_up("eve").await;
    let balances = dollars.snapshot().await.balances;
    let key = new_key();
    let response = dollars.transfer(&alice, eve.wallet_id, 100, Some(&key)).await;
    assert_eq!(
        response.headers()["defense-decision"],
        "layer=row_guard, outcome=rejected"
    );
    let (status, body) = problem(response).await;
    assert_eq!(
        (status, body["type"].as_str()),
        (422, Some("/problems/currency-mismatch"))
    );
    assert_eq!(dollars.transfer_count().await, 0);
    assert_eq!(dollars.snapshot().await.balances, balances);

    tokio::time::sleep(Duration::from_millis(5_100)).await;
    let replay = dollars.transfer(&alice, eve.wallet_id, 100, Some(&key)).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.status(), 422);
    dollars.assert_invariants().await;
}

/// A client that sends a body over the limit without waiting for
/// `100 Continue` reads the 413 problem instead of a connection reset.
#[tokio::test]
async fn an_oversized_body_gets_its_413_read_by_the_client() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = spawn_app(|_| {}).await;
    let alice = app.sign_up("alice").await;
    for path in ["/api/v1/transfers", "/api/v1/users"] {
        let body = vec![b' '; 2 * 1024 * 1024];
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", app.port()))
            .await
            .expect("connect");
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            alice.token,
            body.len()
        );
        stream.write_all(head.as_bytes()).await.expect("head");
        // The whole body, then read: what httpx's async client does.
        stream
            .write_all(&body)
            .await
            .expect("the server reset the connection mid-body");
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), async {
            let mut buffer = [0u8; 4096];
            loop {
                match stream.read(&mut buffer).await {
                    Ok(0) => return Ok(()),
                    Ok(n) => {
                        answer.extend_from_slice(&buffer[..n]);
                        if answer.windows(4).any(|w| w == b"\r\n\r\n") && answer.ends_with(b"}") {
                            return Ok(());
                        }
                    }
                    Err(error) => return Err(error),
                }
            }
        })
        .await
        .expect("an answer in time");
        read.unwrap_or_else(|error| panic!("{path}: the answer was cut off: {error}"));
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 413"), "{path}: {answer}");
        assert!(answer.contains("/problems/payload-too-large"), "{path}: {answer}");
    }
    assert_eq!(app.transfer_count().await, 0);
}

/// The browser speaks in sentences: no field names, no header names, no
/// "use a new key", whatever the refusal.
#[tokio::test]
async fn pages_never_show_api_wording() {
    let app = spawn_app(|settings| settings.cooldown_ttl_ms = 1).await;
    app.sign_up("bob").await;
    let mut alice = signed_up(&app, "alice").await;
    let mut pages = Vec::new();
    for (recipient, amount) in [
        ("bob", "2,000"),
        ("bob", "200000"),
        ("alice", "1"),
        ("nobody", "1"),
    ] {
        pages.push(alice.review(recipient, amount).await.1);
    }
    let (_, review) = alice.review("bob", "2,000").await;
    pages.push(alice.confirmed(&review).await);
    // A confirmation tampered into a self-transfer, and one damaged.
    let own = review.replace(
        &hidden(&review, "to_wallet_id"),
        &app.wallet_of("alice").await.to_string(),
    );
    pages.push(alice.confirmed(&own).await);
    let damaged = review.replace(&hidden(&review, "amount_minor"), "lots");
    pages.push(alice.confirmed(&damaged).await);
    for page in &pages {
        for api_word in [
            "amount_minor must",
            "from_wallet_id",
            "to_wallet_id and",
            "Idempotency-Key",
            "Use a new key",
            "/problems/",
        ] {
            let shown = page.split("<main").nth(1).unwrap_or(page);
            assert!(!shown.contains(api_word), "a page shows “{api_word}”: {shown}");
        }
    }
    assert_eq!(app.transfer_count().await, 0);
}

/// Every problem type has its page, including the ones only sign-up uses.
#[tokio::test]
async fn every_problem_type_has_a_page() {
    let app = spawn_app(|_| {}).await;
    let mut visitor = Visitor::new(&app);
    for kind in layered_wallet::problem::ProblemType::ALL {
        let (status, html) = visitor.get(&format!("/problems/{}", kind.slug())).await;
        assert_eq!(status, 200, "{kind:?}");
        assert!(html.contains(kind.title()), "{kind:?}");
    }
}

/// The production transfer is one statement and one round trip, counted
/// on the wire: the transfer executor keeps its connection, so nothing is
/// checked before the call or after it. With
/// `transfers_idle_check_after_ms` at 0, every transfer finds its
/// connection "idle" and checks it first: two. A replay costs the same as
/// a transfer.
#[tokio::test]
async fn a_transfer_and_its_replay_each_cost_one_postgresql_statement() {
    for (idle_check_after_ms, round_trips_per_request) in [(60_000, 1), (0, 2)] {
        let (app, proxy) = spawn_app_behind_proxy(|settings| {
            without_cooldown(settings);
            settings.transfers_idle_check_after_ms = idle_check_after_ms;
            // One executor, so the statement prepared by the first
            // transfer is the one the next transfers use. Each HTTP worker
            // runs executors of its own: one worker.
            settings.http_workers = 1;
            settings.transfers_connections = 1;
        })
        .await;
        let (alice, bob) = app.alice_and_bob().await;
        let warm_up = app.transfer(&alice, bob.wallet_id, 1, Some(&new_key())).await;
        assert_eq!(warm_up.status(), 201);

        let key = new_key();
        for (what, replayed) in [("an accepted transfer", false), ("a replay", true)] {
            // The sign-ups' connections go back to the pool with a ping
            // after their answers: let those land before counting.
            let mut round_trips = proxy.round_trips();
            for _ in 0..40 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                if proxy.round_trips() == round_trips {
                    break;
                }
                round_trips = proxy.round_trips();
            }
            let statements = proxy.query_messages();
            let response = app.transfer(&alice, bob.wallet_id, 100, Some(&key)).await;
            assert_eq!(response.status(), 201, "{what}");
            assert_eq!(response.headers().get("idempotent-replayed").is_some(), replayed);
            // Anything that followed the answer would land here.
            tokio::time::sleep(Duration::from_millis(200)).await;
            // A cached statement is a Bind and an Execute: one statement.
            assert_eq!(proxy.query_messages() - statements, 2, "{what}: one statement");
            assert_eq!(
                proxy.round_trips() - round_trips,
                round_trips_per_request,
                "{what}, idle check after {idle_check_after_ms} ms"
            );
        }
        assert_eq!(app.transfer_count().await, 2);
    }
}
