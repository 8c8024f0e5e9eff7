//! The client: one method per operation of the API, each sent through the
//! retry policy it may safely use.

use std::time::Duration;

use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::json;
use uuid::Uuid;

use crate::error::{Error, Problem};
use crate::retry::{IdempotencyKey, RetryPolicy, may_succeed_later};
use crate::types::{
    Paid, SignedIn, SignedUp, TransferItem, TransferOrder, TransferPage, TransferReceipt, Wallet,
};

#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base_url: String,
    token: Option<String>,
    policy: RetryPolicy,
    /// The wrong way, kept only so that a test can show what it costs.
    new_key_per_attempt: bool,
}

/// Whether a call may be sent again when its outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retries {
    /// A read, or a write carrying its idempotency key.
    Safe,
    /// A write without a key: a second copy could do it twice.
    Never,
}

impl Client {
    /// A client of the server at `base_url` (`http://127.0.0.1:8080`).
    pub fn new(base_url: &str, policy: RetryPolicy) -> Result<Self, Error> {
        let http = reqwest::Client::builder()
            .timeout(policy.request_timeout)
            .build()
            .map_err(|error| Error::Request(error.to_string()))?;
        Ok(Self {
            http,
            base_url: base_url.trim_end_matches('/').to_owned(),
            token: None,
            policy,
            new_key_per_attempt: false,
        })
    }

    /// The same client, speaking for the holder of `token`.
    pub fn with_token(&self, token: &str) -> Self {
        Self {
            token: Some(token.to_owned()),
            ..self.clone()
        }
    }

    /// **The wrong way, for demonstration only**: a new idempotency key on
    /// every attempt, as clients that cause double charges do. A test
    /// uses it to show that a cut connection then pays twice.
    #[doc(hidden)]
    pub fn minting_a_new_key_per_attempt(mut self) -> Self {
        self.new_key_per_attempt = true;
        self
    }

    /// `POST /api/v1/users`: a new account with a wallet. Not retried: a
    /// lost answer may mean the account exists (sign in to find out).
    pub async fn sign_up(&self, name: &str, password: &str) -> Result<SignedUp, Error> {
        let body = json!({ "name": name, "password": password });
        let (response, _) = self
            .send(Method::POST, "/api/v1/users", Retries::Never, |request, _| {
                request.json(&body)
            })
            .await?;
        read(response).await
    }

    /// `POST /api/v1/tokens`: a token for an existing account. Retried:
    /// a second token does no harm.
    pub async fn sign_in(&self, name: &str, password: &str) -> Result<SignedIn, Error> {
        let body = json!({ "name": name, "password": password });
        let (response, _) = self
            .send(Method::POST, "/api/v1/tokens", Retries::Safe, |request, _| {
                request.json(&body)
            })
            .await?;
        read(response).await
    }

    /// `DELETE /api/v1/tokens/current`: revokes this client's token.
    pub async fn revoke_current(&self) -> Result<(), Error> {
        let (response, _) = self
            .send(
                Method::DELETE,
                "/api/v1/tokens/current",
                Retries::Safe,
                |request, _| request,
            )
            .await?;
        if response.status() == StatusCode::NO_CONTENT {
            Ok(())
        } else {
            Err(refusal(response).await)
        }
    }

    /// `GET /api/v1/wallets/{id}`.
    pub async fn wallet(&self, id: Uuid) -> Result<Wallet, Error> {
        let (response, _) = self
            .send(
                Method::GET,
                &format!("/api/v1/wallets/{id}"),
                Retries::Safe,
                |request, _| request,
            )
            .await?;
        read(response).await
    }

    /// `POST /api/v1/transfers` with `key`: pays `order` exactly once,
    /// however many attempts it takes. Keep `key` for as long as the
    /// payment might be retried.
    pub async fn transfer(&self, order: &TransferOrder, key: IdempotencyKey) -> Result<Paid, Error> {
        let wrong_way = self.new_key_per_attempt;
        let (response, attempts) = self
            .send(Method::POST, "/api/v1/transfers", Retries::Safe, |request, _| {
                let key = if wrong_way { Uuid::new_v4() } else { key.as_uuid() };
                request.header("Idempotency-Key", key.to_string()).json(order)
            })
            .await?;
        paid(response, attempts).await
    }

    /// `POST /api/v1/transfers` without a key: sent once and never retried,
    /// since without a key the server cannot tell a retry from a second
    /// payment. Prefer [`Client::transfer`].
    pub async fn transfer_without_key(&self, order: &TransferOrder) -> Result<Paid, Error> {
        let (response, attempts) = self
            .send(Method::POST, "/api/v1/transfers", Retries::Never, |request, _| {
                request.json(order)
            })
            .await?;
        paid(response, attempts).await
    }

    /// `GET /api/v1/transfers`: the caller's transfers, newest first.
    pub async fn transfers(&self, limit: Option<i64>, before: Option<Uuid>) -> Result<TransferPage, Error> {
        // Numbers and UUIDs need no escaping.
        let mut query = Vec::new();
        if let Some(limit) = limit {
            query.push(format!("limit={limit}"));
        }
        if let Some(before) = before {
            query.push(format!("before={before}"));
        }
        let path = format!("/api/v1/transfers?{}", query.join("&"));
        let (response, _) = self
            .send(Method::GET, &path, Retries::Safe, |request, _| request)
            .await?;
        read(response).await
    }

    /// `GET /api/v1/transfers/{id}`.
    pub async fn transfer_by_id(&self, id: Uuid) -> Result<TransferItem, Error> {
        let (response, _) = self
            .send(
                Method::GET,
                &format!("/api/v1/transfers/{id}"),
                Retries::Safe,
                |request, _| request,
            )
            .await?;
        read(response).await
    }

    /// Sends a request built by `build` (given the attempt, from 0) until
    /// it gets a final answer, retrying only what `retries` allows and the
    /// policy bounds. The final answer, whatever its status, and the
    /// attempts it took.
    async fn send(
        &self,
        method: Method,
        path: &str,
        retries: Retries,
        build: impl Fn(RequestBuilder, u32) -> RequestBuilder,
    ) -> Result<(Response, u32), Error> {
        let url = format!("{}{path}", self.base_url);
        let attempts_max = match retries {
            Retries::Safe => self.policy.attempts_max.max(1),
            Retries::Never => 1,
        };
        let mut attempt = 0;
        loop {
            let mut request = self.http.request(method.clone(), &url);
            if let Some(token) = &self.token {
                request = request.bearer_auth(token);
            }
            let last_attempt = attempt + 1 >= attempts_max;
            let wait = match build(request, attempt).send().await {
                Ok(response) if may_succeed_later(response.status().as_u16()) && !last_attempt => {
                    self.policy.delay(attempt, retry_after(&response))
                }
                Ok(response) if may_succeed_later(response.status().as_u16()) && retries == Retries::Safe => {
                    let status = response.status().as_u16();
                    let problem = response.text().await.unwrap_or_default();
                    return Err(Error::GaveUp {
                        attempts: attempt + 1,
                        last: format!("{status} {problem}"),
                    });
                }
                Ok(response) => return Ok((response, attempt + 1)),
                Err(error) if error.is_builder() => return Err(Error::Request(error.to_string())),
                Err(error) if retries == Retries::Never => {
                    return Err(Error::OutcomeUnknown(error.to_string()));
                }
                Err(error) if last_attempt => {
                    return Err(Error::GaveUp {
                        attempts: attempt + 1,
                        last: error.to_string(),
                    });
                }
                Err(_) => self.policy.delay(attempt, None),
            };
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }
}

/// The server's `Retry-After`, in whole seconds.
fn retry_after(response: &Response) -> Option<Duration> {
    response
        .headers()
        .get("retry-after")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// A success's body, or the refusal.
async fn read<T: DeserializeOwned>(response: Response) -> Result<T, Error> {
    if response.status().is_success() {
        response
            .json()
            .await
            .map_err(|error| Error::Request(format!("the answer could not be read: {error}")))
    } else {
        Err(refusal(response).await)
    }
}

/// A transfer's final answer: the receipt (made now, or replayed), or why not.
async fn paid(response: Response, attempts: u32) -> Result<Paid, Error> {
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|value| value == "true");
    let receipt: TransferReceipt = read(response).await?;
    Ok(Paid {
        receipt,
        replayed,
        attempts,
    })
}

/// A final answer that is not a success: a refusal the same request would
/// get again, or a server failure.
async fn refusal(response: Response) -> Error {
    let status = response.status().as_u16();
    let body = response.text().await.unwrap_or_default();
    match serde_json::from_str::<Problem>(&body) {
        Ok(problem) if status < 500 => Error::Refused(Box::new(problem)),
        _ => Error::Unexpected { status, body },
    }
}
