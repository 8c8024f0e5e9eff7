//! A payment provider: it signs each delivery as a real one does, retries
//! after a time-out or a 5xx with the client crate's backoff and full
//! jitter, and delivers duplicates on purpose.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::future::join_all;
use layered_wallet::auth::provider_signature as signature;
use layered_wallet::decision::{Decision, Layer};
use secrecy::SecretString;
use serde::Serialize;
use tokio::sync::Barrier;
use uuid::Uuid;
use wallet_client::RetryPolicy;

use crate::checks::Checks;

/// The path a provider delivers deposit events to.
pub const DEPOSITS_PATH: &str = "/api/v1/webhooks/deposits";

/// One deposit event, as the provider sends it.
#[derive(Debug, Clone, Serialize)]
pub struct DepositEvent {
    pub event_id: String,
    pub wallet_id: Uuid,
    pub amount_minor: i64,
    pub currency: String,
    pub occurred_at: DateTime<Utc>,
}

impl DepositEvent {
    pub fn new(wallet_id: Uuid, amount_minor: i64, currency: &str) -> Self {
        Self {
            event_id: format!("evt_{}", Uuid::new_v4().simple()),
            wallet_id,
            amount_minor,
            currency: currency.to_owned(),
            occurred_at: Utc::now(),
        }
    }

    /// The same event id with other contents: a provider's bug, which the
    /// service must refuse.
    pub fn changed(&self) -> Self {
        Self {
            amount_minor: self.amount_minor + 1,
            ..self.clone()
        }
    }
}

/// What one delivery got back.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// `None`: no answer within the time-out, or the connection failed.
    pub status: Option<u16>,
    pub decision: Option<Decision>,
    pub body: Vec<u8>,
    /// The server's `Retry-After`.
    pub retry_after: Option<Duration>,
}

impl Delivery {
    fn unanswered() -> Self {
        Self {
            status: None,
            decision: None,
            body: Vec::new(),
            retry_after: None,
        }
    }

    /// Whether the provider delivers the event again: no answer, a 5xx, or
    /// an answer the client crate also retries (in flight, too early).
    pub fn is_retried(&self) -> bool {
        self.status
            .is_none_or(|status| status >= 500 || wallet_client::may_succeed_later(status))
    }

    /// The layer that decided, from the `Defense-Decision` header.
    pub fn layer(&self) -> Option<Layer> {
        self.decision.map(|decision| decision.layer)
    }
}

/// Every delivery of one event until the provider stopped.
#[derive(Debug, Clone, Default)]
pub struct Attempts {
    pub deliveries: Vec<Delivery>,
}

impl Attempts {
    /// The answer the provider stopped at, if it got a final one.
    pub fn last(&self) -> Option<&Delivery> {
        self.deliveries.last().filter(|delivery| !delivery.is_retried())
    }
}

/// What a provider saw of its events, one `Attempts` each: every event
/// ended with a final answer and was credited (a 200), and every 200 of
/// one event carried the same bytes.
pub fn check_answers<'a>(events: impl IntoIterator<Item = &'a Attempts>, checks: &mut Checks) {
    let (mut without_credit, mut differing_bodies) = (0, 0);
    for attempts in events {
        let credits: Vec<&[u8]> = attempts
            .deliveries
            .iter()
            .filter(|delivery| delivery.status == Some(200))
            .map(|delivery| delivery.body.as_slice())
            .collect();
        if credits.is_empty() || attempts.last().is_none() {
            without_credit += 1;
        }
        if credits.windows(2).any(|pair| pair[0] != pair[1]) {
            differing_bodies += 1;
        }
    }
    checks.add("events the provider got no credit for", without_credit);
    checks.add("events whose 200 answers differ", differing_bodies);
}

/// The provider's side of the webhook contract.
#[derive(Clone)]
pub struct Provider {
    http: reqwest::Client,
    targets: Arc<Vec<String>>,
    secret: SecretString,
    policy: RetryPolicy,
}

impl Provider {
    /// Delivers to `targets` (instances, or one load balancer), signing
    /// with `secret` in its scheme (`signature::headers_for`), retrying as
    /// `policy` says.
    pub fn new(targets: Vec<String>, secret: SecretString, policy: RetryPolicy) -> anyhow::Result<Self> {
        anyhow::ensure!(!targets.is_empty(), "the provider needs at least one target");
        Ok(Self {
            http: wallet_client::http_client_builder()
                .pool_max_idle_per_host(64)
                .build()?,
            targets: Arc::new(targets),
            secret,
            policy,
        })
    }

    pub fn targets(&self) -> usize {
        self.targets.len()
    }

    /// One delivery to target `target`, signed now, given `timeout` to answer.
    pub async fn deliver_once(&self, target: usize, event: &DepositEvent, timeout: Duration) -> Delivery {
        let body = match serde_json::to_vec(event) {
            Ok(body) => body,
            Err(_) => return Delivery::unanswered(),
        };
        let url = format!("{}{DEPOSITS_PATH}", self.targets[target % self.targets.len()]);
        let mut request = self.http.post(url).header("content-type", "application/json");
        // In the secret's scheme: Standard Webhooks for a `whsec_` one.
        for (name, value) in signature::headers_for(&self.secret, &event.event_id, Utc::now(), &body) {
            request = request.header(name, value);
        }
        let sent = request.timeout(timeout).body(body).send().await;
        let Ok(response) = sent else {
            return Delivery::unanswered();
        };
        let status = response.status().as_u16();
        let decision = response
            .headers()
            .get(layered_wallet::decision::HEADER)
            .and_then(|value| value.to_str().ok())
            .and_then(Decision::parse_header);
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<u64>().ok())
            .map(Duration::from_secs);
        match response.bytes().await {
            Ok(body) => Delivery {
                status: Some(status),
                decision,
                body: body.to_vec(),
                retry_after,
            },
            // The answer was cut off: the provider cannot tell what happened.
            Err(_) => Delivery::unanswered(),
        }
    }

    /// Delivers until a final answer, the attempts run out or the call's
    /// time does, each attempt waiting at most `attempt_timeout` (a
    /// provider that gives up sooner than the service answers redelivers
    /// while its first delivery is still being applied). Attempts go round
    /// the targets from `first_target`, as a load balancer would spread
    /// them.
    pub async fn deliver(
        &self,
        first_target: usize,
        event: &DepositEvent,
        attempt_timeout: Duration,
    ) -> Attempts {
        let started = Instant::now();
        let mut attempts = Attempts::default();
        for attempt in 0..self.policy.attempts_max.max(1) {
            let delivery = self
                .deliver_once(first_target + attempt as usize, event, attempt_timeout)
                .await;
            let retried = delivery.is_retried();
            let retry_after = delivery.retry_after;
            attempts.deliveries.push(delivery);
            if !retried {
                break;
            }
            let wait = self.policy.delay(attempt, retry_after);
            if started.elapsed() + wait >= self.policy.call_time_max {
                break;
            }
            tokio::time::sleep(wait).await;
        }
        attempts
    }

    /// `copies` deliveries of one event at the same moment, spread round
    /// the targets: the storm a provider makes when its retries overlap.
    pub async fn storm(&self, event: &DepositEvent, copies: usize, timeout: Duration) -> Vec<Delivery> {
        let barrier = Arc::new(Barrier::new(copies.max(1)));
        let sends = (0..copies.max(1)).map(|copy| {
            let (provider, event, barrier) = (self.clone(), event.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                provider.deliver_once(copy, &event, timeout).await
            })
        });
        join_all(sends).await.into_iter().filter_map(Result::ok).collect()
    }
}
