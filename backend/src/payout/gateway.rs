//! The bank gateway, as the dispatcher and `reconcile` call it: over HTTP,
//! with the payout's key, a time-out on every call, and every answer sorted
//! by what it says about the money.
//!
//! The sorting is the rule the saga lives by: only a definitive answer
//! settles or releases a hold. A time-out, a 5xx or a broken connection
//! says nothing about whether the money left, so it is `Unknown`, retried
//! with the same key and never compensated.

use std::time::Duration;

use reqwest::StatusCode;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The longest gateway answer body read; a longer one is an unknown outcome.
pub const GATEWAY_ANSWER_BYTES_MAX: usize = 16 * 1024;

/// What one call or look-up says about the money.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewayAnswer {
    /// 2xx: the gateway sent it (or had sent it, for a replay).
    Sent { reference: String },
    /// 422: refused for good; nothing was sent, and the same request will
    /// be refused again.
    Refused { reason: String },
    /// A time-out, a 5xx, a 408 or 429, a broken connection, an answer that
    /// cannot be read: the money may or may not have left. Retry with the
    /// same key, not before `retry_after`.
    Unknown {
        why: String,
        retry_after: Option<Duration>,
    },
    /// Any other answer (400, 401, 403, 409 for a key used for another
    /// payout, …): no retry changes it and it does not say the money
    /// stayed, so a person must look.
    Rejected { why: String },
    /// A look-up's 404: the gateway has no request with this key.
    NeverReceived,
}

impl GatewayAnswer {
    /// The `answer` label of `wallet_payout_attempts_total`.
    pub fn label(&self) -> &'static str {
        match self {
            GatewayAnswer::Sent { .. } => "sent",
            GatewayAnswer::Refused { .. } => "refused",
            GatewayAnswer::Unknown { .. } => "unknown",
            GatewayAnswer::Rejected { .. } => "rejected",
            GatewayAnswer::NeverReceived => "never_received",
        }
    }
}

/// A payout as the gateway's API takes it.
#[derive(Debug, Serialize)]
pub struct GatewayPayout<'a> {
    pub amount_minor: i64,
    pub currency: &'a str,
    pub destination: &'a str,
    /// The payout's id, whatever the key: the gateway's ledger names the
    /// payout each sending was for.
    pub reference: Uuid,
}

#[derive(Deserialize)]
struct SentBody {
    id: String,
}

#[derive(Deserialize)]
struct ErrorBody {
    error: String,
    #[serde(default)]
    message: String,
}

#[derive(Clone)]
pub struct GatewayClient {
    http: reqwest::Client,
    base_url: String,
    call_timeout: Duration,
}

impl GatewayClient {
    /// `base_url` without a trailing slash (`payout_gateway_url`).
    pub fn new(base_url: &str, call_timeout: Duration) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(call_timeout)
            .connect_timeout(call_timeout)
            .build()?;
        Ok(Self {
            http,
            base_url: base_url.to_owned(),
            call_timeout,
        })
    }

    /// `POST /v1/payouts` with `key` as the `Idempotency-Key`, continuing
    /// the trace in `traceparent`.
    pub async fn send(
        &self,
        key: &str,
        payout: &GatewayPayout<'_>,
        traceparent: Option<&str>,
    ) -> GatewayAnswer {
        let mut request = self
            .http
            .post(format!("{}/v1/payouts", self.base_url))
            .header("Idempotency-Key", key)
            .json(payout);
        if let Some(traceparent) = traceparent {
            request = request.header("traceparent", traceparent);
        }
        self.answer_of(request).await
    }

    /// `GET /v1/payouts/{key}`: the answer the gateway stored for the key.
    pub async fn look_up(&self, key: &str) -> GatewayAnswer {
        let request = self.http.get(format!("{}/v1/payouts/{key}", self.base_url));
        match self.answer_of(request).await {
            GatewayAnswer::Rejected { why } if why.starts_with("404") => GatewayAnswer::NeverReceived,
            answer => answer,
        }
    }

    async fn answer_of(&self, request: reqwest::RequestBuilder) -> GatewayAnswer {
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) if error.is_timeout() => {
                return unknown(format!(
                    "no answer within payout_call_timeout_ms ({} ms)",
                    self.call_timeout.as_millis()
                ));
            }
            Err(error) if error.is_connect() => return unknown("could not connect to the gateway".into()),
            Err(_) => return unknown("the connection to the gateway broke".into()),
        };
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body = match response.bytes().await {
            Ok(body) if body.len() <= GATEWAY_ANSWER_BYTES_MAX => body,
            Ok(_) => {
                return unknown(format!(
                    "{status} with an answer over {GATEWAY_ANSWER_BYTES_MAX} bytes"
                ));
            }
            Err(_) => return unknown(format!("{status}, and the answer broke off")),
        };
        if status.is_success() {
            return match serde_json::from_slice::<SentBody>(&body) {
                Ok(sent) => GatewayAnswer::Sent { reference: sent.id },
                Err(_) => unknown(format!("{status} with an answer that does not say what was sent")),
            };
        }
        let said = serde_json::from_slice::<ErrorBody>(&body)
            .map(|error| format!("{}: {}", error.error, error.message))
            .unwrap_or_else(|_| "no readable reason".to_owned());
        match status {
            StatusCode::UNPROCESSABLE_ENTITY => GatewayAnswer::Refused { reason: said },
            StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS => GatewayAnswer::Unknown {
                why: format!("{status} ({said})"),
                retry_after,
            },
            status if status.is_server_error() => GatewayAnswer::Unknown {
                why: format!("{status} ({said})"),
                retry_after,
            },
            status => GatewayAnswer::Rejected {
                why: format!("{} ({said})", status.as_u16()),
            },
        }
    }
}

fn unknown(why: String) -> GatewayAnswer {
    GatewayAnswer::Unknown {
        why,
        retry_after: None,
    }
}
