//! The storm of clients: keyed clients that retry each key until it
//! settles, keyless users that double-click, and how each request ended
//! as the client saw it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

use super::{CHAOS_COOLDOWN_TTL_MS, KEYLESS_BURST_REQUESTS, SETTLE_SECONDS_MAX};
use crate::TestUser;

/// What the storm's clients share.
pub(super) struct Storm {
    pub(super) client: reqwest::Client,
    pub(super) instances: Vec<String>,
    pub(super) stop: Arc<AtomicBool>,
}

/// How one request ended, as the client saw it.
#[derive(Debug, Clone)]
pub(super) enum Outcome {
    Transferred {
        id: Uuid,
        replayed: bool,
    },
    /// An answer that asks the client to come back: 409, 429, 503.
    RetryLater {
        status: u16,
        problem: String,
        retry_after: Duration,
    },
    /// Any other 4xx: the transfer will not happen.
    Refused {
        status: u16,
        problem: String,
    },
    /// A 5xx other than 503.
    ServerError {
        status: u16,
    },
    /// The connection failed or timed out: the client knows nothing.
    NoAnswer,
}

impl Outcome {
    pub(super) fn settles(&self) -> bool {
        matches!(self, Outcome::Transferred { .. } | Outcome::Refused { .. })
    }

    /// Might this request have made the transfer? Only an answer that
    /// says so, or one that admits it cannot know, or none at all.
    pub(super) fn may_have_transferred(&self) -> bool {
        match self {
            Outcome::Transferred { replayed, .. } => !replayed,
            Outcome::RetryLater { problem, .. } => problem.ends_with("/outcome-unknown"),
            Outcome::ServerError { .. } | Outcome::NoAnswer => true,
            Outcome::Refused { .. } => false,
        }
    }

    pub(super) fn label(&self) -> String {
        match self {
            Outcome::Transferred { replayed: false, .. } => "201".into(),
            Outcome::Transferred { replayed: true, .. } => "201 replay".into(),
            Outcome::RetryLater { status, problem, .. } | Outcome::Refused { status, problem } => {
                format!("{status} {}", problem.rsplit('/').next().unwrap_or(problem))
            }
            Outcome::ServerError { status } => status.to_string(),
            Outcome::NoAnswer => "no answer".into(),
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Attempt {
    pub(super) outcome: Outcome,
    pub(super) took: Duration,
}

/// Every attempt a client made with one key, in order.
pub(super) struct KeyRecord {
    pub(super) user_id: Uuid,
    pub(super) key: String,
    pub(super) attempts: Vec<Attempt>,
}

impl KeyRecord {
    pub(super) fn new(user_id: Uuid) -> Self {
        Self {
            user_id,
            key: Uuid::new_v4().to_string(),
            attempts: Vec::new(),
        }
    }
}

/// One double click: identical keyless requests fired at once.
pub(super) struct Burst {
    pub(super) wallet_id: Uuid,
    pub(super) amount_minor: i64,
    pub(super) outcomes: Vec<Attempt>,
}

impl Storm {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    pub(super) async fn send(
        &self,
        instance: usize,
        user: &TestUser,
        to: Uuid,
        amount_minor: i64,
        key: Option<&str>,
    ) -> Attempt {
        let url = format!(
            "{}/api/v1/transfers",
            self.instances[instance % self.instances.len()]
        );
        let mut request = self.client.post(url).bearer_auth(&user.token).json(
            &json!({ "from_wallet_id": user.wallet_id, "to_wallet_id": to, "amount_minor": amount_minor }),
        );
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        let started = Instant::now();
        let outcome = match request.send().await {
            Err(_) => Outcome::NoAnswer,
            Ok(response) => read_outcome(response).await,
        };
        Attempt {
            outcome,
            took: started.elapsed(),
        }
    }

    /// New keys one after another until the storm stops; each key retried
    /// until settled.
    pub(super) async fn keyed_client(&self, number: usize, me: TestUser, to: Uuid) -> Vec<KeyRecord> {
        let mut records = Vec::new();
        let mut instance = number;
        let amount_minor = 1 + (number as i64 % 50);
        while !self.stopped() {
            let mut record = KeyRecord::new(me.user_id);
            let settle_by = Instant::now() + Duration::from_secs(SETTLE_SECONDS_MAX);
            loop {
                let attempt = self
                    .send(instance, &me, to, amount_minor, Some(&record.key))
                    .await;
                // The next attempt, whatever it is, goes to the next
                // instance: a client behind a load balancer would.
                instance += 1;
                let wait = match &attempt.outcome {
                    Outcome::RetryLater { retry_after, .. } => *retry_after,
                    _ => Duration::from_millis(100),
                };
                let settled = attempt.outcome.settles();
                record.attempts.push(attempt);
                if settled || Instant::now() >= settle_by {
                    break;
                }
                tokio::time::sleep(wait).await;
            }
            records.push(record);
        }
        records
    }

    /// Double clicks, each with an amount of its own so that the database
    /// tells how many of its requests were charged.
    pub(super) async fn keyless_user(&self, number: usize, me: TestUser, to: Uuid) -> Vec<Burst> {
        let mut bursts = Vec::new();
        let mut amount_minor = 0;
        while !self.stopped() {
            amount_minor += 1;
            let instance = number + amount_minor as usize;
            let requests =
                (0..KEYLESS_BURST_REQUESTS).map(|_| self.send(instance, &me, to, amount_minor, None));
            let outcomes = futures::future::join_all(requests).await;
            bursts.push(Burst {
                wallet_id: me.wallet_id,
                amount_minor,
                outcomes,
            });
            tokio::time::sleep(Duration::from_millis(CHAOS_COOLDOWN_TTL_MS + 100)).await;
        }
        bursts
    }
}

async fn read_outcome(response: reqwest::Response) -> Outcome {
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_millis(100));
    let Ok(body) = response.json::<Value>().await else {
        return Outcome::NoAnswer;
    };
    let problem = body["type"].as_str().unwrap_or_default().to_owned();
    match status {
        201 => match body["id"].as_str().and_then(|id| Uuid::parse_str(id).ok()) {
            Some(id) => Outcome::Transferred { id, replayed },
            None => Outcome::ServerError { status },
        },
        409 | 429 | 503 => Outcome::RetryLater {
            status,
            problem,
            retry_after,
        },
        400..=499 => Outcome::Refused { status, problem },
        _ => Outcome::ServerError { status },
    }
}
