//! The load test's view of the API: sign-up, transfers, and one `Sample`
//! per response.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use layered_wallet::decision::Decision;
use serde_json::{Value, json};
use uuid::Uuid;

/// A user the load test created, with the instance it signed up on.
#[derive(Debug, Clone)]
pub struct User {
    pub user_id: Uuid,
    pub wallet_id: Uuid,
    pub token: String,
}

/// One transfer to send.
#[derive(Debug, Clone)]
pub struct Planned {
    pub target: usize,
    pub from: usize,
    pub to_wallet: Uuid,
    pub amount_minor: i64,
    pub key: Option<String>,
}

/// What came back.
#[derive(Debug, Clone)]
pub struct Sample {
    pub status: u16,
    pub decision: Option<Decision>,
    pub replayed: bool,
    pub latency: Duration,
    pub key: Option<String>,
    /// Kept for keyed requests only, to check replays byte for byte.
    pub body: Option<Vec<u8>>,
    /// The transport failed (no status).
    pub transport_error: bool,
}

#[derive(Clone)]
pub struct Api {
    pub targets: Vec<String>,
    pub http: reqwest::Client,
}

impl Api {
    pub fn new(targets: Vec<String>, connections_per_host: usize) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(connections_per_host)
            .timeout(Duration::from_secs(30))
            .build()?;
        Ok(Self { targets, http })
    }

    pub async fn sign_up(&self, target: usize, name: &str, password: &str) -> anyhow::Result<User> {
        let url = format!("{}/api/v1/users", self.targets[target]);
        let response = self
            .http
            .post(&url)
            .json(&json!({ "name": name, "password": password }))
            .send()
            .await
            .with_context(|| format!("failed to reach {url}"))?;
        if response.status() != 201 {
            bail!(
                "sign-up on {url} answered {}: {}",
                response.status(),
                response.text().await.unwrap_or_default()
            );
        }
        let body: Value = response.json().await?;
        let field = |name: &str| {
            body[name]
                .as_str()
                .map(str::to_owned)
                .context("sign-up response lacks a field")
        };
        Ok(User {
            user_id: field("user_id")?.parse()?,
            wallet_id: field("wallet_id")?.parse()?,
            token: field("token")?,
        })
    }

    pub async fn transfer(&self, users: &[User], planned: &Planned) -> Sample {
        let user = &users[planned.from];
        let mut request = self
            .http
            .post(format!("{}/api/v1/transfers", self.targets[planned.target]))
            .bearer_auth(&user.token)
            .json(&json!({
                "from_wallet_id": user.wallet_id,
                "to_wallet_id": planned.to_wallet,
                "amount_minor": planned.amount_minor,
            }));
        if let Some(key) = &planned.key {
            request = request.header("Idempotency-Key", key);
        }
        let started = Instant::now();
        match request.send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                let decision = response
                    .headers()
                    .get("defense-decision")
                    .and_then(|value| value.to_str().ok())
                    .and_then(Decision::parse_header);
                let replayed = response.headers().contains_key("idempotent-replayed");
                let body = response.bytes().await.ok().map(|bytes| bytes.to_vec());
                Sample {
                    status,
                    decision,
                    replayed,
                    latency: started.elapsed(),
                    key: planned.key.clone(),
                    body: planned.key.as_ref().and(body),
                    transport_error: false,
                }
            }
            Err(_) => Sample {
                status: 0,
                decision: None,
                replayed: false,
                latency: started.elapsed(),
                key: planned.key.clone(),
                body: None,
                transport_error: true,
            },
        }
    }

    /// `GET /healthz`, for the HTTP ceiling.
    pub async fn healthz(&self, target: usize) -> Sample {
        let started = Instant::now();
        let result = self
            .http
            .get(format!("{}/healthz", self.targets[target]))
            .send()
            .await;
        let (status, transport_error) = match result {
            Ok(response) => {
                let status = response.status().as_u16();
                let _ = response.bytes().await;
                (status, false)
            }
            Err(_) => (0, true),
        };
        Sample {
            status,
            decision: None,
            replayed: false,
            latency: started.elapsed(),
            key: None,
            body: None,
            transport_error,
        }
    }
}
