//! A person with a browser, without the browser: a cookie-keeping HTTP
//! client that fills in and posts the pages' forms, for tests of the pages
//! over plain HTTP.

use std::collections::HashMap;

use reqwest::redirect::Policy;

use crate::TestApp;

/// A cookie-keeping client that does not follow redirects.
pub struct Visitor {
    pub http: reqwest::Client,
    cookies: HashMap<String, String>,
    base: String,
}

impl Visitor {
    pub fn new(app: &TestApp) -> Self {
        let http = wallet_client::http_client_builder()
            .redirect(Policy::none())
            .build()
            .expect("client");
        Self {
            http,
            cookies: HashMap::new(),
            base: app.address.clone(),
        }
    }

    pub fn cookie_header(&self) -> String {
        self.cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    pub fn keep_cookies(&mut self, response: &reqwest::Response) {
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

    pub async fn get(&mut self, path: &str) -> (u16, String) {
        let response = self.get_response(path).await;
        let status = response.status().as_u16();
        (status, response.text().await.expect("body"))
    }

    /// A page as the browser gets it, headers and all.
    pub async fn get_response(&mut self, path: &str) -> reqwest::Response {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .header("cookie", self.cookie_header())
            .header("accept", "text/html")
            .send()
            .await
            .expect("send");
        self.keep_cookies(&response);
        response
    }

    pub async fn post(&mut self, path: &str, form: &[(&str, &str)]) -> reqwest::Response {
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
pub fn hidden(html: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let start = html.find(&marker).unwrap_or_else(|| panic!("no {name} field")) + marker.len();
    html[start..].split('"').next().expect("value").to_owned()
}

pub async fn signed_up(app: &TestApp, name: &str) -> Visitor {
    through_account_form(app, "/signup", name).await
}

/// A browser signed in as someone already signed up (e.g. through the API).
pub async fn signed_in(app: &TestApp, name: &str) -> Visitor {
    through_account_form(app, "/signin", name).await
}

/// Fills in the sign-up or sign-in form with the test password; checks
/// that it leads to the wallet with a strict session cookie.
async fn through_account_form(app: &TestApp, form: &str, name: &str) -> Visitor {
    let mut visitor = Visitor::new(app);
    let (status, page) = visitor.get(form).await;
    assert_eq!(status, 200);
    let csrf = hidden(&page, "csrf");
    let response = visitor
        .post(
            form,
            &[
                ("name", name),
                ("password", "correct horse battery"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(response.status(), 303, "{form} as {name}");
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

impl Visitor {
    /// Fills in the wallet form and asks for the review: the confirmation
    /// page, or the wallet page with the reason it was refused, each at the
    /// address the form redirects to.
    pub async fn review(&mut self, recipient: &str, amount: &str) -> (u16, String) {
        let (_, wallet) = self.get("/wallet").await;
        let response = self
            .post(
                "/wallet/review",
                &[
                    ("recipient", recipient),
                    ("amount", amount),
                    ("form_key", &hidden(&wallet, "form_key")),
                    ("csrf", &hidden(&wallet, "csrf")),
                ],
            )
            .await;
        assert_eq!(
            response.status(),
            303,
            "the review form redirects (post/redirect/get)"
        );
        self.follow(response).await
    }

    /// Presses Send on a confirmation page, as it stands.
    pub async fn confirm(&mut self, review: &str) -> reqwest::Response {
        let fields: Vec<(&str, String)> = [
            "csrf",
            "idempotency_key",
            "to_wallet_id",
            "amount_minor",
            "recipient",
            "amount",
        ]
        .into_iter()
        .map(|name| (name, hidden(review, name)))
        .collect();
        let form: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.post("/wallet/transfer", &form).await
    }

    /// Presses Send and follows the redirect: the page Send leads to.
    pub async fn confirmed(&mut self, review: &str) -> String {
        let response = self.confirm(review).await;
        self.follow(response).await.1
    }

    /// The page a response leads to: its own body, or, after a redirect
    /// (post/redirect/get), the page it redirects to.
    pub async fn follow(&mut self, response: reqwest::Response) -> (u16, String) {
        if response.status() == 303 {
            let location = response.headers()["location"].to_str().expect("ascii").to_owned();
            return self.get(&location).await;
        }
        let status = response.status().as_u16();
        (status, response.text().await.expect("page"))
    }

    /// Review, then confirm: the page after Send.
    pub async fn send(&mut self, recipient: &str, amount: &str) -> reqwest::Response {
        let (status, review) = self.review(recipient, amount).await;
        assert_eq!(status, 200, "the review of {amount} to {recipient}");
        assert!(
            review.contains("id=\"confirm-form\""),
            "no confirmation for {amount} to {recipient}: {review}"
        );
        self.confirm(&review).await
    }
}
