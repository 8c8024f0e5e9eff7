//! The browser demo's pages and forms, over plain HTTP: rendering, sessions,
//! CSRF, and the transfer form going through the same three layers.

use wallet_testkit::visitor::{Visitor, hidden, signed_in, signed_up};
use wallet_testkit::*;

#[tokio::test]
async fn pages_need_a_session_and_render_money_formatted() {
    let app = spawn_app(|_| {}).await;
    let anonymous = Visitor::new(&app);
    let response = anonymous.http.get(app.url("/wallet")).send().await.expect("send");
    assert_eq!(response.status(), 303);
    assert_eq!(response.headers()["location"], "/signin");

    let mut alice = signed_up(&app, "alice").await;
    let (status, wallet) = alice.get("/wallet").await;
    assert_eq!(status, 200);
    assert!(wallet.contains("$1,000.00"), "the balance is not formatted");
    assert!(!wallet.contains("100000"), "raw minor units on the page");
    for page in ["/race-lab", "/feed"] {
        let (status, html) = alice.get(page).await;
        assert_eq!(status, 200, "{page}");
        assert!(html.contains("Sign out alice"), "{page}");
    }
    let (status, html) = alice.get("/problems/insufficient-funds").await;
    assert_eq!(status, 200);
    assert!(html.contains("Insufficient funds"));
    let (status, html) = alice.get("/no/such/page").await;
    assert_eq!(status, 404);
    assert!(html.contains("Page not found"), "a person gets a page, not JSON");
}

#[tokio::test]
async fn the_transfer_form_goes_through_the_layers_and_a_resubmit_replays() {
    let app = spawn_app(|_| {}).await;
    let bob = app.sign_up("bob").await;
    let mut alice = signed_up(&app, "alice").await;

    // The review names the exact recipient and moves nothing.
    let (status, review) = alice.review("bob", "12.50").await;
    assert_eq!(status, 200);
    let short_wallet = &layered_wallet::domain::short_id(bob.wallet_id);
    assert!(
        review.contains("Send $12.50 to bob?") && review.contains(short_wallet),
        "{review}"
    );
    assert_eq!(app.transfer_count().await, 0, "a review moved money");

    let first = alice.confirm(&review).await;
    assert_eq!(
        first.headers()["defense-decision"],
        "layer=row_guard, outcome=accepted"
    );
    // Post/redirect/get: the result has an address of its own.
    assert_eq!(first.status(), 303);
    let location = first.headers()["location"].to_str().expect("ascii").to_owned();
    assert!(location.starts_with("/wallet?sent="), "{location}");
    let (_, page) = alice.follow(first).await;
    assert!(page.contains("Sent $12.50 to bob"), "{page}");
    let (_, reloaded) = alice.get(&location).await;
    assert!(
        reloaded.contains("Sent $12.50 to bob"),
        "a reload shows the result again"
    );
    assert_eq!(app.transfer_count().await, 1, "and sends nothing");
    assert!(page.contains("$987.50"));

    // The browser resubmits the same confirmation (same hidden key): the
    // replay has an address of its own too, and reloading it sends nothing.
    let again = alice.confirm(&review).await;
    assert_eq!(again.status(), 303);
    let replay_address = again.headers()["location"].to_str().expect("ascii").to_owned();
    assert!(replay_address.starts_with("/wallet?shown="), "{replay_address}");
    for _ in 0..2 {
        let (status, page) = alice.get(&replay_address).await;
        assert_eq!(status, 200);
        assert!(
            page.contains("Already processed — showing the original result"),
            "{page}"
        );
    }
    assert_eq!(app.transfer_count().await, 1);

    // The review and Send's own address, opened by hand, lead to the
    // wallet rather than to a bare 405.
    for path in ["/wallet/review", "/wallet/transfer"] {
        let response = alice
            .http
            .get(app.url(path))
            .header("cookie", alice.cookie_header())
            .send()
            .await
            .expect("get");
        assert_eq!(response.status(), 303, "{path}");
        assert_eq!(response.headers()["location"], "/wallet", "{path}");
    }
    // Another person cannot open someone's kept page.
    let mut carol = signed_up(&app, "carol").await;
    let (_, foreign) = carol.get(&replay_address).await;
    assert!(!foreign.contains("Already processed"), "{foreign}");
    assert!(foreign.contains("no longer kept here"), "{foreign}");

    // A bad amount and an unknown recipient are explained, not attempted.
    let (_, page) = alice.review("bob", "12.345").await;
    assert!(page.contains("more than two decimals"), "{page}");
    let (_, page) = alice.review("nobody", "1.00").await;
    assert!(
        page.contains("We found no user or wallet called “nobody”"),
        "{page}"
    );
    let (_, page) = alice.review("alice", "1.00").await;
    assert!(page.contains("That is your own wallet"), "{page}");
    assert_eq!(app.transfer_count().await, 1);
    app.assert_invariants().await;
}

#[tokio::test]
async fn forms_and_session_api_calls_need_their_csrf_token() {
    let app = spawn_app(|_| {}).await;
    let bob = app.sign_up("bob").await;
    let mut alice = signed_up(&app, "alice").await;
    let (_, wallet) = alice.get("/wallet").await;
    let response = alice
        .post(
            "/wallet/review",
            &[
                ("recipient", "bob"),
                ("amount", "1"),
                ("form_key", &hidden(&wallet, "form_key")),
                ("csrf", "forged"),
            ],
        )
        .await;
    assert_eq!(response.status(), 403);
    let (_, review) = alice.review("bob", "1").await;
    let forged = review.replace(&hidden(&review, "csrf"), "forged");
    assert_eq!(alice.confirm(&forged).await.status(), 403);
    assert_eq!(app.transfer_count().await, 0);

    // The REST endpoint with the session cookie: refused without the CSRF
    // header, accepted with it.
    let alice_wallet: uuid::Uuid = wallet
        .split("id=\"wallet-id\">")
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .expect("wallet id")
        .parse()
        .expect("uuid");
    let body = serde_json::json!({ "from_wallet_id": alice_wallet, "to_wallet_id": bob.wallet_id, "amount_minor": 100 });
    let without = alice
        .http
        .post(app.url("/api/v1/transfers"))
        .header("cookie", alice.cookie_header())
        .json(&body)
        .send()
        .await
        .expect("send");
    let (status, problem_body) = problem(without).await;
    assert_eq!(
        (status, problem_body["type"].as_str()),
        (403, Some("/problems/csrf-token-invalid"))
    );
    let with = alice
        .http
        .post(app.url("/api/v1/transfers"))
        .header("cookie", alice.cookie_header())
        .header("x-csrf-token", hidden(&wallet, "csrf"))
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(with.status(), 201);

    // Revoking the session's token through the API: the same rule.
    let revoke = |csrf: Option<String>| {
        let mut request = alice
            .http
            .delete(app.url("/api/v1/tokens/current"))
            .header("cookie", alice.cookie_header());
        if let Some(csrf) = csrf {
            request = request.header("x-csrf-token", csrf);
        }
        request.send()
    };
    let (status, problem_body) = problem(revoke(None).await.expect("send")).await;
    assert_eq!(
        (status, problem_body["type"].as_str()),
        (403, Some("/problems/csrf-token-invalid"))
    );
    assert_eq!(
        alice.get("/wallet").await.0,
        200,
        "a refused revocation ended the session"
    );

    // Signing out revokes the session's token.
    let (_, wallet) = alice.get("/wallet").await;
    let response = alice
        .post("/signout", &[("csrf", &hidden(&wallet, "csrf"))])
        .await;
    assert_eq!(response.status(), 303);
    assert_eq!(
        app.count(
            "SELECT count(*) FROM api_tokens t JOIN users u ON u.id = t.user_id WHERE u.name = 'alice'"
        )
        .await,
        0
    );
}

#[tokio::test]
async fn an_unsafe_mode_is_announced_on_every_page() {
    let app = spawn_app(without_cooldown).await;
    let mut alice = signed_up(&app, "alice").await;
    for page in ["/wallet", "/race-lab", "/feed"] {
        let (_, html) = alice.get(page).await;
        assert!(
            html.contains("Demonstration mode:") && html.contains("cooldown off"),
            "{page}"
        );
    }
    let mut anonymous = Visitor::new(&app);
    let (_, html) = anonymous.get("/signin").await;
    assert!(html.contains("Demonstration mode:"));
}

/// Every page, signed in or not, found or not, carries the headers that
/// keep it from being framed, sniffed or made to run another site's script.
#[tokio::test]
async fn every_page_sends_the_security_headers() {
    let app = spawn_app(|_| {}).await;
    let mut alice = signed_up(&app, "alice").await;
    for path in [
        "/",
        "/signin",
        "/signup",
        "/wallet",
        "/race-lab",
        "/feed",
        "/problems/cooldown-active",
        "/no-such-page",
        "/static/app.css",
        "/api/v1/transfers",
    ] {
        let response = alice
            .http
            .get(app.url(path))
            .header("cookie", alice.cookie_header())
            .header("accept", "text/html")
            .send()
            .await
            .expect("send");
        let headers = response.headers();
        let csp = headers
            .get("content-security-policy")
            .unwrap_or_else(|| panic!("{path} has no Content-Security-Policy"))
            .to_str()
            .expect("ascii");
        assert!(
            csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
            "{path}: {csp}"
        );
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        assert_eq!(headers["x-frame-options"], "DENY", "{path}");
        assert_eq!(headers["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(headers["referrer-policy"], "same-origin", "{path}");
    }
    // The pages hold to the policy: no inline script or handler.
    for path in ["/", "/wallet", "/race-lab", "/feed"] {
        let (_, page) = alice.get(path).await;
        for forbidden in [
            "<script>",
            "onclick=",
            "onsubmit=",
            "onload=",
            "style=\"",
            "<style",
        ] {
            assert!(!page.contains(forbidden), "{path} has {forbidden}");
        }
    }
}

/// A first visit: `/` explains the three layers and leads in; a lone
/// visitor can send to the demo recipient; error and problem pages show who
/// is signed in.
#[tokio::test]
async fn a_first_visit_explains_itself_and_needs_one_account() {
    let app = spawn_app(|settings| settings.demo_recipient_name = "demo".into()).await;
    let mut anonymous = Visitor::new(&app);
    let (status, home) = anonymous.get("/").await;
    assert_eq!(status, 200);
    assert!(
        home.contains("1. Cooldown lock")
            && home.contains("2. Idempotency key")
            && home.contains("3. Row guard")
    );
    assert!(home.contains("href=\"/signup\"") && home.contains("<strong>demo</strong>"));
    // It opens with what the reader gets, and names the layers' code only
    // after saying what each does.
    let said = |text: &str| home.find(text).unwrap_or_else(|| panic!("{text}: {home}"));
    assert!(said("a wallet service you can try") < said("SET NX PX"), "{home}");
    assert!(said("href=\"/signup\"") < said("1. Cooldown lock"), "{home}");

    let mut alice = signed_up(&app, "alice").await;
    let (_, home) = alice.get("/").await;
    assert!(home.contains("href=\"/race-lab\"") && home.contains("Sign out alice"));
    let sent = alice.send("demo", "2.50").await;
    let (_, page) = alice.follow(sent).await;
    assert!(page.contains("Sent $2.50 to demo"), "{page}");
    assert_eq!(app.balance(app.wallet_of("demo").await).await, 250);

    // Nobody signs in as the demo recipient.
    let response = app
        .client
        .post(app.url("/api/v1/tokens"))
        .json(&serde_json::json!({ "name": "demo", "password": "" }))
        .send()
        .await
        .expect("send");
    assert!(response.status().is_client_error());

    for path in ["/problems/insufficient-funds", "/no-such-page"] {
        let (_, page) = alice.get(path).await;
        assert!(page.contains("Sign out alice"), "{path} forgets who is signed in");
    }
    app.assert_invariants().await;
}

/// The CSRF value of a form shown before sign-in is one the server made and
/// signed: a cookie planted with a value of the attacker's choosing, sent
/// with the same value in the form, is refused, and no account is made.
#[tokio::test]
async fn a_planted_pre_sign_in_csrf_cookie_is_refused() {
    let app = spawn_app(|_| {}).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let planted = "0123456789abcdef0123456789abcdef";
    for (cookie, field) in [
        (planted.to_owned(), planted.to_owned()),
        (format!("{planted}.00"), format!("{planted}.00")),
    ] {
        let response = http
            .post(app.url("/signup"))
            .header("cookie", format!("lw_csrf={cookie}"))
            .form(&[
                ("name", "mallory"),
                ("password", "correct horse battery"),
                ("csrf", &field),
            ])
            .send()
            .await
            .expect("send");
        assert_eq!(response.status(), 403, "{cookie}");
        let page = response.text().await.expect("page");
        assert!(page.contains("This form expired"), "{page}");
    }
    assert_eq!(
        app.count("SELECT count(*) FROM users WHERE name = 'mallory'")
            .await,
        0
    );

    // The page replaces a planted cookie with one of its own, and that one
    // works.
    let mut visitor = Visitor::new(&app);
    let response = visitor.get_response("/signup").await;
    let set = response
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|value| value.to_str().ok())
        .find(|value| value.starts_with("lw_csrf="))
        .expect("a CSRF cookie")
        .to_owned();
    assert!(!set.contains(planted));
    let page = response.text().await.expect("page");
    let csrf = hidden(&page, "csrf");
    assert!(csrf.contains('.'), "nonce.mac: {csrf}");
    let response = visitor
        .post(
            "/signup",
            &[
                ("name", "mallory"),
                ("password", "correct horse battery"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(response.status(), 303);
    assert_eq!(
        app.count("SELECT count(*) FROM users WHERE name = 'mallory'")
            .await,
        1
    );
}

/// An amount over the balance is said in a sentence on the review, with no
/// negative balance and Send disabled, for a transfer and for a payout;
/// sent anyway, it is refused and nothing changes.
#[tokio::test]
async fn a_review_over_the_balance_says_so_and_offers_no_send() {
    let app = spawn_app(|settings| {
        settings.payout_gateway_url = "http://127.0.0.1:9".into();
        settings.payout_dispatcher_enabled = false;
    })
    .await;
    app.sign_up("bob").await;
    let mut alice = signed_up(&app, "alice").await;
    let (status, review) = alice.review("bob", "1,500.00").await;
    assert_eq!(status, 200);
    assert!(
        review.contains(
            "Your wallet does not hold enough for this transfer: you can spend $1,000.00, and this transfer is \
             $1,500.00."
        ),
        "{review}"
    );
    assert!(
        !review.contains("-$"),
        "a negative balance on the review: {review}"
    );
    assert!(
        review.contains("id=\"send\" disabled>"),
        "Send is offered: {review}"
    );
    let response = alice.confirm(&review).await;
    let (_, page) = alice.follow(response).await;
    assert!(
        page.contains("Your balance is too low for this amount."),
        "{page}"
    );
    assert_eq!(app.transfer_count().await, 0);
    assert_eq!(app.balance(app.wallet_of("alice").await).await, 100_000);

    let (_, wallet) = alice.get("/wallet").await;
    let response = alice
        .post(
            "/wallet/payout/review",
            &[
                ("destination", "acct-42"),
                ("amount", "1,000.01"),
                ("form_key", &hidden(&wallet, "form_key")),
                ("csrf", &hidden(&wallet, "csrf")),
            ],
        )
        .await;
    let (status, review) = alice.follow(response).await;
    assert_eq!(status, 200);
    assert!(
        review.contains(
            "Your wallet does not hold enough for this payout: you can spend $1,000.00, and this payout is \
             $1,000.01."
        ),
        "{review}"
    );
    assert!(
        !review.contains("-$"),
        "a negative balance on the review: {review}"
    );
    assert!(
        review.contains("id=\"pay-out\" disabled>"),
        "Pay out is offered: {review}"
    );
    let fields: Vec<(&str, String)> = ["csrf", "idempotency_key", "destination", "amount_minor", "amount"]
        .into_iter()
        .map(|name| (name, hidden(&review, name)))
        .collect();
    let form: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let response = alice.post("/wallet/payout", &form).await;
    let (_, page) = alice.follow(response).await;
    assert!(
        page.contains("Your balance is too low for this amount."),
        "{page}"
    );
    assert_eq!(app.count("SELECT count(*) FROM payouts").await, 0);
    assert_eq!(app.balance(app.wallet_of("alice").await).await, 100_000);
    app.assert_invariants().await;
}

/// The history says a payout was sent to the bank only once it was: one
/// waiting for the dispatcher says so, one the bank refused says it was
/// not sent and that the money came back, and a paid one says it was sent.
#[tokio::test]
async fn the_history_says_where_each_payout_stands() {
    let waiting = spawn_app(|settings| {
        settings.payout_gateway_url = "http://127.0.0.1:9".into();
        settings.payout_dispatcher_enabled = false;
    })
    .await;
    let alice = waiting.sign_up("alice").await;
    let payout = waiting.pay_out(&alice, 2_500, "acct-42").await;
    let mut browser = signed_in(&waiting, "alice").await;
    let (_, wallet) = browser.get("/wallet").await;
    assert!(
        wallet.contains("Payout to bank account acct-42, set aside and waiting to be sent"),
        "{wallet}"
    );
    assert!(!wallet.contains("Sent to bank account"), "{wallet}");
    assert_eq!(waiting.payout_state(payout).await, "pending");

    let gateway =
        wallet_testkit::gateway::Gateway::start(&wallet_testkit::gateway::wallet_sim_binary(), &[]).await;
    let app = spawn_app(with_payouts(&gateway.url)).await;
    let alice = app.sign_up("alice").await;
    let refused = app.pay_out(&alice, 4_000, "closed-9").await;
    assert_eq!(app.wait_for_payout(refused, &["failed"]).await, "failed");
    let carol = app.sign_up("carol").await;
    let paid = app.pay_out(&carol, 2_500, "acct-42").await;
    assert_eq!(app.wait_for_payout(paid, &["settled"]).await, "settled");
    let (_, wallet) = signed_in(&app, "carol").await.get("/wallet").await;
    assert!(wallet.contains("Sent to bank account acct-42"), "{wallet}");
    let (_, wallet) = signed_in(&app, "alice").await.get("/wallet").await;
    for line in [
        "Payout to bank account closed-9, not sent: the bank refused it, and the money is back",
        "Money back from the payout to bank account closed-9, which was not sent",
    ] {
        assert!(wallet.contains(line), "{line}: {wallet}");
    }
    assert!(!wallet.contains("Sent to bank account closed-9"), "{wallet}");
    assert_eq!(app.balance(alice.wallet_id).await, 100_000);
    assert_eq!(app.balance(carol.wallet_id).await, 97_500);
    app.assert_invariants().await;
}
