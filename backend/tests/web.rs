//! The browser demo's pages and forms, over plain HTTP: rendering, sessions,
//! CSRF, and the transfer form going through the same three layers.

use std::collections::HashMap;

use reqwest::redirect::Policy;
use wallet_testkit::*;

/// A cookie-keeping client that does not follow redirects.
struct Visitor {
    http: reqwest::Client,
    cookies: HashMap<String, String>,
    base: String,
}

impl Visitor {
    fn new(app: &TestApp) -> Self {
        let http = reqwest::Client::builder()
            .redirect(Policy::none())
            .build()
            .expect("client");
        Self {
            http,
            cookies: HashMap::new(),
            base: app.address.clone(),
        }
    }

    fn cookie_header(&self) -> String {
        self.cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn keep_cookies(&mut self, response: &reqwest::Response) {
        for value in response.headers().get_all("set-cookie") {
            let text = value.to_str().expect("ascii");
            let (pair, _) = text.split_once(';').unwrap_or((text, ""));
            let (name, value) = pair.split_once('=').expect("a cookie");
            if value.is_empty() {
                self.cookies.remove(name);
            } else {
                self.cookies.insert(name.to_owned(), value.to_owned());
            }
        }
    }

    async fn get(&mut self, path: &str) -> (u16, String) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .header("cookie", self.cookie_header())
            .header("accept", "text/html")
            .send()
            .await
            .expect("send");
        self.keep_cookies(&response);
        let status = response.status().as_u16();
        (status, response.text().await.expect("body"))
    }

    async fn post(&mut self, path: &str, form: &[(&str, &str)]) -> reqwest::Response {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .header("cookie", self.cookie_header())
            .form(form)
            .send()
            .await
            .expect("send");
        self.keep_cookies(&response);
        response
    }
}

/// The value of the first hidden input called `name`.
fn hidden(html: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let start = html.find(&marker).unwrap_or_else(|| panic!("no {name} field")) + marker.len();
    html[start..].split('"').next().expect("value").to_owned()
}

async fn signed_up(app: &TestApp, name: &str) -> Visitor {
    let mut visitor = Visitor::new(app);
    let (status, page) = visitor.get("/signup").await;
    assert_eq!(status, 200);
    let csrf = hidden(&page, "csrf");
    let response = visitor
        .post(
            "/signup",
            &[
                ("name", name),
                ("password", "correct horse battery"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(response.status(), 303);
    assert_eq!(response.headers()["location"], "/wallet");
    let cookie = response
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().expect("ascii").to_owned())
        .find(|c| c.starts_with("lw_session="))
        .expect("a session cookie");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    visitor
}

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
    app.sign_up("bob").await;
    let mut alice = signed_up(&app, "alice").await;
    let (_, wallet) = alice.get("/wallet").await;
    let form = [
        ("recipient", "bob".to_owned()),
        ("amount", "12.50".to_owned()),
        ("idempotency_key", hidden(&wallet, "idempotency_key")),
        ("csrf", hidden(&wallet, "csrf")),
    ];
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();

    let first = alice.post("/wallet/transfer", &form).await;
    assert_eq!(
        first.headers()["defense-decision"],
        "layer=row_guard, outcome=accepted"
    );
    let page = first.text().await.expect("page");
    assert!(page.contains("Sent $12.50 to bob"), "{page}");
    assert!(page.contains("$987.50"));

    // The browser resubmits the same form (same hidden key).
    let again = alice.post("/wallet/transfer", &form).await;
    let page = again.text().await.expect("page");
    assert!(
        page.contains("Already processed — showing the original result"),
        "{page}"
    );
    assert_eq!(app.transfer_count().await, 1);

    // A bad amount and an unknown recipient are explained, not attempted.
    let mut bad = form.clone();
    bad[1] = ("amount", "12.345");
    let page = alice
        .post("/wallet/transfer", &bad)
        .await
        .text()
        .await
        .expect("page");
    assert!(page.contains("at most two decimals"), "{page}");
    let mut nobody = form.clone();
    nobody[0] = ("recipient", "nobody");
    let page = alice
        .post("/wallet/transfer", &nobody)
        .await
        .text()
        .await
        .expect("page");
    assert!(page.contains("No user or wallet called"), "{page}");
    assert_eq!(app.transfer_count().await, 1);
    app.assert_invariants().await;
}

#[tokio::test]
async fn forms_and_session_api_calls_need_their_csrf_token() {
    let app = spawn_app(|_| {}).await;
    let bob = app.sign_up("bob").await;
    let mut alice = signed_up(&app, "alice").await;
    let (_, wallet) = alice.get("/wallet").await;
    let key = hidden(&wallet, "idempotency_key");
    let response = alice
        .post(
            "/wallet/transfer",
            &[
                ("recipient", "bob"),
                ("amount", "1"),
                ("idempotency_key", &key),
                ("csrf", "forged"),
            ],
        )
        .await;
    assert_eq!(response.status(), 403);
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
