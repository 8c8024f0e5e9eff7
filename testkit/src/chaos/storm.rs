//! The storm of clients: keyed clients that retry each key until it
//! settles, keyless users that double-click, and how each request ended
//! as the client saw it. Every request goes through the workspace's
//! client crate, whose retry policy is the one under test.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use uuid::Uuid;
use wallet_client::{AttemptSeen, Client, IdempotencyKey, RetryPolicy, TransferOrder};

use super::{CHAOS_COOLDOWN_TTL_MS, KEYLESS_BURST_REQUESTS, REQUEST_SECONDS_MAX, SETTLE_SECONDS_MAX};
use crate::TestUser;

/// What the storm's clients share: the instances, each reached through
/// the workspace's client (`wallet-client`) as any API user would.
pub(super) struct Storm {
    pub(super) instances: Vec<String>,
    pub(super) stop: Arc<AtomicBool>,
}

/// How the storm's keyed clients retry: the client crate's own policy,
/// its waits short enough for the storm, each key given up
/// `SETTLE_SECONDS_MAX` after its first attempt.
fn storm_policy() -> RetryPolicy {
    RetryPolicy {
        base: Duration::from_millis(50),
        cap: Duration::from_secs(1),
        attempts_max: u32::MAX,
        request_timeout: Duration::from_secs(2 * REQUEST_SECONDS_MAX),
        call_time_max: Duration::from_secs(SETTLE_SECONDS_MAX),
        jitter: true,
    }
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
    /// When the answer (or its absence) was seen.
    pub(super) ended: std::time::Instant,
}

/// Every attempt a client made with one key, in order, and the transfer
/// it asked for.
pub(super) struct KeyRecord {
    pub(super) user_id: Uuid,
    pub(super) key: String,
    pub(super) to: Uuid,
    pub(super) amount_minor: i64,
    pub(super) attempts: Vec<Attempt>,
}

impl KeyRecord {
    pub(super) fn new(user_id: Uuid, to: Uuid, amount_minor: i64) -> Self {
        Self {
            user_id,
            key: Uuid::new_v4().to_string(),
            to,
            amount_minor,
            attempts: Vec::new(),
        }
    }

    /// Was this key answered with a transfer that was not a replay?
    pub(super) fn answered_fresh_201(&self) -> bool {
        self.attempts
            .iter()
            .any(|a| matches!(a.outcome, Outcome::Transferred { replayed: false, .. }))
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

    /// A client over every instance, speaking for `user`, that records
    /// each request it sends in `attempts`.
    fn client_for(
        &self,
        user: &TestUser,
        policy: RetryPolicy,
        attempts: &Arc<Mutex<Vec<Attempt>>>,
    ) -> Client {
        let urls: Vec<&str> = self.instances.iter().map(String::as_str).collect();
        recording(Client::over(&urls, policy), user, attempts)
    }

    /// One request through instance `instance`, sent once: for the probes
    /// that time the recovery themselves.
    pub(super) async fn send_once(&self, instance: usize, user: &TestUser, record: &KeyRecord) -> Attempt {
        let attempts = Arc::new(Mutex::new(Vec::new()));
        let policy = RetryPolicy {
            attempts_max: 1,
            ..storm_policy()
        };
        let url = &self.instances[instance % self.instances.len()];
        let client = recording(Client::new(url, policy), user, &attempts);
        let key = IdempotencyKey::from_uuid(record.key.parse().expect("a key"));
        // What the probe checks is the attempt, success or not.
        let _ = client
            .transfer(&order(user, record.to, record.amount_minor), key)
            .await;
        take_one(&attempts)
    }

    /// New keys one after another until the storm stops; each key paid
    /// through the client crate, which retries it with the same key until
    /// it settles or `SETTLE_SECONDS_MAX` passes. Every attempt is kept.
    pub(super) async fn keyed_client(&self, number: usize, me: TestUser, to: Uuid) -> Vec<KeyRecord> {
        let mut records = Vec::new();
        let amount_minor = 1 + (number as i64 % 50);
        let attempts = Arc::new(Mutex::new(Vec::new()));
        let client = self.client_for(&me, storm_policy(), &attempts);
        while !self.stopped() {
            let mut record = KeyRecord::new(me.user_id, to, amount_minor);
            let key = IdempotencyKey::from_uuid(record.key.parse().expect("a key"));
            // Success or not, what the storm checks is every attempt.
            let _ = client.transfer(&order(&me, to, amount_minor), key).await;
            record.attempts = std::mem::take(&mut *attempts.lock().expect("attempts"));
            records.push(record);
        }
        records
    }

    /// Double clicks, each with an amount of its own so that the database
    /// tells how many of its requests were charged. Keyless, so the client
    /// sends each once.
    pub(super) async fn keyless_user(&self, me: TestUser, to: Uuid) -> Vec<Burst> {
        let mut bursts = Vec::new();
        let mut amount_minor = 0;
        while !self.stopped() {
            amount_minor += 1;
            let order = order(&me, to, amount_minor);
            let requests = (0..KEYLESS_BURST_REQUESTS).map(|_| {
                let attempts = Arc::new(Mutex::new(Vec::new()));
                let client = self.client_for(&me, storm_policy(), &attempts);
                let order = order.clone();
                async move {
                    let _ = client.transfer_without_key(&order).await;
                    take_one(&attempts)
                }
            });
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

/// `client`, speaking for `user`, recording each request it sends in
/// `attempts`.
fn recording(
    client: Result<Client, wallet_client::Error>,
    user: &TestUser,
    attempts: &Arc<Mutex<Vec<Attempt>>>,
) -> Client {
    let attempts = attempts.clone();
    client
        .expect("a client of the instances")
        .with_token(&user.token)
        .observed_by(Arc::new(move |seen: &AttemptSeen| {
            attempts.lock().expect("attempts").push(Attempt::of(seen));
        }))
}

fn order(from: &TestUser, to: Uuid, amount_minor: i64) -> TransferOrder {
    TransferOrder {
        from_wallet_id: from.wallet_id,
        to_wallet_id: to,
        amount_minor,
    }
}

/// The one attempt a call sent once recorded.
fn take_one(attempts: &Mutex<Vec<Attempt>>) -> Attempt {
    attempts
        .lock()
        .expect("attempts")
        .pop()
        .expect("the request was sent")
}

impl Attempt {
    /// A request as the client crate saw it, in the storm's terms.
    fn of(seen: &AttemptSeen) -> Self {
        let problem = seen
            .problem
            .as_deref()
            .map(|slug| format!("/problems/{slug}"))
            .unwrap_or_default();
        let outcome = match seen.status {
            None => Outcome::NoAnswer,
            Some(201) => match seen.transfer_id {
                Some(id) => Outcome::Transferred {
                    id,
                    replayed: seen.replayed,
                },
                None => Outcome::ServerError { status: 201 },
            },
            Some(status @ (409 | 429 | 503)) => Outcome::RetryLater { status, problem },
            Some(status @ 400..=499) => Outcome::Refused { status, problem },
            Some(status) => Outcome::ServerError { status },
        };
        Self {
            outcome,
            took: seen.took,
            ended: std::time::Instant::now(),
        }
    }
}
