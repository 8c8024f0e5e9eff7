//! Talking to a test app over HTTP as its clients do: signing up,
//! transfers, the admin listener, problem+json answers, and requests fired
//! all at once.

use serde_json::{Value, json};
use uuid::Uuid;

use crate::TestApp;

#[derive(Clone)]
pub struct TestUser {
    pub name: String,
    pub user_id: Uuid,
    pub wallet_id: Uuid,
    pub token: String,
}

/// Signs `name` up through the server at `base_url`.
pub async fn sign_up_at(client: &reqwest::Client, base_url: &str, name: &str) -> TestUser {
    let response = client
        .post(format!("{base_url}/api/v1/users"))
        .json(&json!({ "name": name, "password": "correct horse battery" }))
        .send()
        .await
        .expect("sign-up request");
    assert_eq!(response.status(), 201, "sign-up of {name}");
    let body: Value = response.json().await.expect("json");
    let id = |field: &str| Uuid::parse_str(body[field].as_str().expect("an id")).expect("uuid");
    TestUser {
        name: name.to_owned(),
        user_id: id("user_id"),
        wallet_id: id("wallet_id"),
        token: body["token"].as_str().expect("token").to_owned(),
    }
}

impl TestApp {
    pub async fn sign_up(&self, name: &str) -> TestUser {
        sign_up_at(&self.client, &self.address, name).await
    }

    /// The admin listener's detailed `/readyz`: status code and body.
    pub async fn admin_readiness(&self) -> (u16, Value) {
        let response = self
            .client
            .get(self.admin_url("/readyz"))
            .send()
            .await
            .expect("send");
        let status = response.status().as_u16();
        (status, response.json().await.expect("a JSON body"))
    }

    /// The Prometheus text at the admin listener's `/metrics`.
    pub async fn metrics(&self) -> String {
        self.client
            .get(self.admin_url("/metrics"))
            .send()
            .await
            .expect("send")
            .text()
            .await
            .expect("metrics text")
    }

    /// One series' value at the admin listener's `/metrics`, e.g.
    /// `wallet_payout_attempts_total{answer="sent"}`; 0 while it is absent
    /// (a labelled series appears when it is first counted).
    pub async fn metric(&self, series: &str) -> f64 {
        self.metrics()
            .await
            .lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// Two fresh users, the cast of most tests.
    pub async fn alice_and_bob(&self) -> (TestUser, TestUser) {
        (self.sign_up("alice").await, self.sign_up("bob").await)
    }

    /// Revokes `user`'s token (`DELETE /api/v1/tokens/current`), asserting
    /// the 204.
    pub async fn revoke_token(&self, user: &TestUser) {
        let revoked = self
            .client
            .delete(self.url("/api/v1/tokens/current"))
            .bearer_auth(&user.token)
            .send()
            .await
            .expect("the revocation was sent");
        assert_eq!(revoked.status(), 204, "the token was not revoked");
    }

    /// Sends `POST /api/v1/transfers` from `user`'s wallet.
    pub async fn transfer(
        &self,
        user: &TestUser,
        to: Uuid,
        amount_minor: i64,
        key: Option<&str>,
    ) -> reqwest::Response {
        self.transfer_request(user, to, amount_minor, key)
            .send()
            .await
            .expect("the transfer request was sent")
    }

    /// `POST /api/v1/transfers` from `user`'s wallet, to send later.
    pub fn transfer_request(
        &self,
        user: &TestUser,
        to: Uuid,
        amount_minor: i64,
        key: Option<&str>,
    ) -> reqwest::RequestBuilder {
        self.transfer_request_from(user, user.wallet_id, to, amount_minor, key)
    }

    pub fn transfer_request_from(
        &self,
        user: &TestUser,
        from: Uuid,
        to: Uuid,
        amount_minor: i64,
        key: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let mut request = self
            .client
            .post(self.url("/api/v1/transfers"))
            .bearer_auth(&user.token)
            .json(&json!({ "from_wallet_id": from, "to_wallet_id": to, "amount_minor": amount_minor }));
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        request
    }

    /// GETs `path` as `user` (or anonymously) and parses the JSON body.
    pub async fn get_json(&self, path: &str, user: Option<&TestUser>) -> Value {
        let mut request = self.client.get(self.url(path));
        if let Some(user) = user {
            request = request.bearer_auth(&user.token);
        }
        request
            .send()
            .await
            .expect("send")
            .json()
            .await
            .expect("a JSON body")
    }
}

/// Reads a problem+json response, checking its media type and shape.
pub async fn problem(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert_eq!(content_type, "application/problem+json", "status {status}");
    let body: Value = response.json().await.expect("problem body is JSON");
    assert_eq!(body["status"], status, "{body}");
    for field in ["type", "title", "detail"] {
        assert!(body[field].is_string(), "problem lacks {field}: {body}");
    }
    (status, body)
}

/// Fires all requests at once and waits for every response.
pub async fn fire_together(requests: Vec<reqwest::RequestBuilder>) -> Vec<reqwest::Response> {
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(requests.len()));
    let tasks: Vec<_> = requests
        .into_iter()
        .map(|request| {
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                request.send().await.expect("request sent")
            })
        })
        .collect();
    let mut responses = Vec::with_capacity(tasks.len());
    for task in tasks {
        responses.push(task.await.expect("request task"));
    }
    responses
}

/// Responses that made a transfer: 201 and not a replay.
pub fn fresh_transfers(responses: &[reqwest::Response]) -> usize {
    responses
        .iter()
        .filter(|r| r.status() == 201 && r.headers().get("idempotent-replayed").is_none())
        .count()
}

pub fn new_key() -> String {
    Uuid::new_v4().to_string()
}
