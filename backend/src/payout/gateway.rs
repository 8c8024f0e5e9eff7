//! The bank gateway, as the dispatcher and `reconcile` call it: over HTTP,
//! with the payout's key, a time-out on every call, and every answer sorted
//! by what it says about the money.
//!
//! The sorting is the rule the saga lives by: only a definitive answer
//! settles or releases a hold. A time-out, a 5xx or a broken connection
//! says nothing about whether the money left, so it is `Unknown`, retried
//! with the same key and never compensated.
//!
//! A definitive answer must be the gateway's own. Redirects are not
//! followed: a 3xx comes from whatever stands at the URL, and what it
//! points to is not the gateway's word on the key. A 404 releases a hold
//! only when it carries the gateway's problem type for an unknown key
//! (`UNKNOWN_KEY_PROBLEM_TYPE`): a bare 404 is what a wrong path, a proxy or
//! a load balancer answers, and says nothing about the payout. A 422 is a
//! refusal only with the gateway's error body.
//!
//! The protocol, as a bank's engineer would implement it, is the OpenAPI
//! document `docs/gateway.openapi.yaml`; `backend/tests/gateway_protocol.rs`
//! holds this client and the simulator to it.

use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, LOCATION, RETRY_AFTER};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The longest gateway answer body read; a longer one is an unknown outcome.
pub const GATEWAY_ANSWER_BYTES_MAX: usize = 16 * 1024;

/// The gateway protocol's one answer that says no request with a key was
/// ever applied: `GET /v1/payouts/{key}` answered `404` with
/// `Content-Type: application/problem+json` (RFC 9457) and this `type`.
/// Only this answer releases a hold that may have left.
pub const UNKNOWN_KEY_PROBLEM_TYPE: &str = "urn:layered-wallet:gateway:unknown-idempotency-key";
/// The content type the gateway's unknown-key answer comes in.
pub const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";

/// What one call or look-up says about the money.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewayAnswer {
    /// 2xx: the gateway sent it (or had sent it, for a replay).
    Sent { reference: String },
    /// 422 with the gateway's error body: refused for good; nothing was
    /// sent, and the same request will be refused again.
    Refused { reason: String },
    /// A time-out, a 5xx, a 408 or 429, a broken connection, an answer that
    /// cannot be read: the money may or may not have left. Retry with the
    /// same key, not before `retry_after`.
    Unknown {
        why: String,
        retry_after: Option<Duration>,
    },
    /// Any other answer (a 3xx, 400, 401, 403, a 404 that is not the
    /// gateway's unknown-key answer, 409 for a key used for another payout,
    /// …): no retry changes it and it does not say the money stayed, so a
    /// person must look.
    Rejected { why: String },
    /// A look-up's unknown-key answer (`UNKNOWN_KEY_PROBLEM_TYPE`): the
    /// gateway has no request with this key.
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

#[derive(Deserialize)]
struct ProblemBody {
    #[serde(rename = "type")]
    kind: String,
}

/// An answer read whole, before it is sorted.
struct Heard {
    status: StatusCode,
    retry_after: Option<Duration>,
    content_type: Option<String>,
    location: Option<String>,
    body: Vec<u8>,
}

impl Heard {
    /// Whether this is the gateway protocol's answer for an unknown key,
    /// and nothing else's.
    fn says_unknown_key(&self) -> bool {
        self.status == StatusCode::NOT_FOUND
            && self.content_type.as_deref().is_some_and(|content_type| {
                content_type
                    .split(';')
                    .next()
                    .is_some_and(|essence| essence.trim().eq_ignore_ascii_case(PROBLEM_CONTENT_TYPE))
            })
            && serde_json::from_slice::<ProblemBody>(&self.body)
                .is_ok_and(|problem| problem.kind == UNKNOWN_KEY_PROBLEM_TYPE)
    }

    /// What the answer says about the money.
    fn sorted(&self) -> GatewayAnswer {
        let status = self.status;
        if status.is_success() {
            return match serde_json::from_slice::<SentBody>(&self.body) {
                Ok(sent) => GatewayAnswer::Sent { reference: sent.id },
                Err(_) => unknown(format!("{status} with an answer that does not say what was sent")),
            };
        }
        let error = serde_json::from_slice::<ErrorBody>(&self.body).ok();
        let said = error
            .as_ref()
            .map(|error| match error.message.as_str() {
                "" => error.error.clone(),
                message => format!("{}: {message}", error.error),
            })
            .unwrap_or_else(|| "no readable reason".to_owned());
        match status {
            StatusCode::UNPROCESSABLE_ENTITY if error.is_some() => GatewayAnswer::Refused { reason: said },
            StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS => GatewayAnswer::Unknown {
                why: format!("{status} ({said})"),
                retry_after: self.retry_after,
            },
            status if status.is_server_error() => GatewayAnswer::Unknown {
                why: format!("{status} ({said})"),
                retry_after: self.retry_after,
            },
            status if status.is_redirection() => GatewayAnswer::Rejected {
                why: format!(
                    "{} redirect to {}, not followed: only the gateway's own answer counts",
                    status.as_u16(),
                    self.location.as_deref().unwrap_or("nowhere said"),
                ),
            },
            StatusCode::NOT_FOUND => GatewayAnswer::Rejected {
                why: format!(
                    "404 without the gateway's unknown-key problem type ({said}): a wrong gateway URL or a \
                     proxy's answer says nothing about the payout"
                ),
            },
            status => GatewayAnswer::Rejected {
                why: format!("{} ({said})", status.as_u16()),
            },
        }
    }
}

/// Where a payout is sent: the deployment's gateway, or a stand-in that
/// answers in the gateway's terms, so a payout's answer is recorded the
/// same way whoever sent it. Used generically only, never as a trait
/// object, so its `async fn` needs no `Send` bound spelled out.
#[allow(async_fn_in_trait)]
pub trait PayoutBank {
    async fn send_payout(
        &self,
        key: &str,
        payout: &GatewayPayout<'_>,
        traceparent: Option<&str>,
    ) -> GatewayAnswer;

    /// Whether its calls count in the deployment's payout metrics.
    fn is_the_gateway(&self) -> bool;
}

impl PayoutBank for GatewayClient {
    async fn send_payout(
        &self,
        key: &str,
        payout: &GatewayPayout<'_>,
        traceparent: Option<&str>,
    ) -> GatewayAnswer {
        self.send(key, payout, traceparent).await
    }

    fn is_the_gateway(&self) -> bool {
        true
    }
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
            // A redirect is answered by whatever stands at the URL, not by
            // the gateway about the key: it is sorted, never followed.
            .redirect(reqwest::redirect::Policy::none())
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
        match self.hear(request).await {
            Ok(heard) => heard.sorted(),
            Err(unknown) => unknown,
        }
    }

    /// `GET /v1/payouts/{key}`: the answer the gateway stored for the key,
    /// or its unknown-key answer.
    pub async fn look_up(&self, key: &str) -> GatewayAnswer {
        let request = self.http.get(format!("{}/v1/payouts/{key}", self.base_url));
        match self.hear(request).await {
            Ok(heard) if heard.says_unknown_key() => GatewayAnswer::NeverReceived,
            Ok(heard) => heard.sorted(),
            Err(unknown) => unknown,
        }
    }

    /// Sends the request and reads the answer whole; an answer that could
    /// not be read is an unknown outcome (`Err`).
    async fn hear(&self, request: reqwest::RequestBuilder) -> Result<Heard, GatewayAnswer> {
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) if error.is_timeout() => {
                return Err(unknown(format!(
                    "no answer within payout_call_timeout_ms ({} ms)",
                    self.call_timeout.as_millis()
                )));
            }
            Err(error) if error.is_connect() => {
                return Err(unknown("could not connect to the gateway".into()));
            }
            Err(_) => return Err(unknown("the connection to the gateway broke".into())),
        };
        let status = response.status();
        let header = |name| {
            response
                .headers()
                .get(name)
                .and_then(|value: &reqwest::header::HeaderValue| value.to_str().ok())
                .map(str::to_owned)
        };
        let retry_after = header(RETRY_AFTER)
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let content_type = header(CONTENT_TYPE);
        let location = header(LOCATION);
        let body = match response.bytes().await {
            Ok(body) if body.len() <= GATEWAY_ANSWER_BYTES_MAX => body.to_vec(),
            Ok(_) => {
                return Err(unknown(format!(
                    "{status} with an answer over {GATEWAY_ANSWER_BYTES_MAX} bytes"
                )));
            }
            Err(_) => return Err(unknown(format!("{status}, and the answer broke off"))),
        };
        Ok(Heard {
            status,
            retry_after,
            content_type,
            location,
            body,
        })
    }
}

fn unknown(why: String) -> GatewayAnswer {
    GatewayAnswer::Unknown {
        why,
        retry_after: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heard(status: u16, content_type: Option<&str>, location: Option<&str>, body: &str) -> Heard {
        Heard {
            status: StatusCode::from_u16(status).expect("a status"),
            retry_after: None,
            content_type: content_type.map(str::to_owned),
            location: location.map(str::to_owned),
            body: body.as_bytes().to_vec(),
        }
    }

    fn unknown_key_body(kind: &str) -> String {
        serde_json::json!({ "type": kind, "title": "Unknown key", "status": 404 }).to_string()
    }

    #[test]
    fn only_the_gateways_own_unknown_key_answer_says_no_such_payout() {
        let own = unknown_key_body(UNKNOWN_KEY_PROBLEM_TYPE);
        assert!(heard(404, Some("application/problem+json"), None, &own).says_unknown_key());
        assert!(heard(404, Some("Application/Problem+JSON; charset=utf-8"), None, &own).says_unknown_key());
        let not_it = [
            heard(404, None, None, ""),
            heard(404, Some("text/html"), None, "<h1>404 Not Found</h1>"),
            heard(404, Some("application/json"), None, &own),
            heard(
                404,
                Some(PROBLEM_CONTENT_TYPE),
                None,
                &unknown_key_body("about:blank"),
            ),
            heard(410, Some(PROBLEM_CONTENT_TYPE), None, &own),
            heard(302, Some(PROBLEM_CONTENT_TYPE), Some("http://elsewhere/"), &own),
        ];
        for answer in not_it {
            assert!(!answer.says_unknown_key(), "{}", answer.status);
            assert!(
                matches!(answer.sorted(), GatewayAnswer::Rejected { .. }),
                "{}: {:?}",
                answer.status,
                answer.sorted()
            );
        }
    }

    #[test]
    fn a_refusal_is_a_422_with_the_gateways_error_body() {
        let refusal = r#"{"error":"destination_refused","message":"closed"}"#;
        assert_eq!(
            heard(422, Some("application/json"), None, refusal).sorted(),
            GatewayAnswer::Refused {
                reason: "destination_refused: closed".to_owned()
            }
        );
        // Without a message, the reason is the code alone.
        assert_eq!(
            heard(
                422,
                Some("application/json"),
                None,
                r#"{"error":"destination_refused"}"#
            )
            .sorted(),
            GatewayAnswer::Refused {
                reason: "destination_refused".to_owned()
            }
        );
        assert!(matches!(
            heard(422, Some("text/html"), None, "<p>Unprocessable</p>").sorted(),
            GatewayAnswer::Rejected { .. }
        ));
    }
}
