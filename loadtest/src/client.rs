//! The load test's view of the API: sign-up, transfers, and one `Sample`
//! per response. A request sent once goes down the lean path (`wire`);
//! sign-ups, and every request of a run that retries, go through the
//! workspace's client crate.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use http::Method;
use layered_wallet::decision::Decision;
use uuid::Uuid;
use wallet_client::{AttemptSeen, Client, IdempotencyKey, RetryPolicy, TransferOrder, http_client_builder};

use crate::wire::{Answer, Wire};

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
    /// Every attempt the call made, in order; one unless the run retries.
    pub attempts: Vec<AttemptRecord>,
}

/// One attempt of a call, as the client saw it end.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    /// 0 where no answer came.
    pub status: u16,
    /// A refusal's problem type slug (`overloaded`).
    pub problem: Option<String>,
    pub ended: Instant,
    /// The attempt's own time, from sending to the whole answer.
    pub took: Duration,
}

impl AttemptRecord {
    /// Refused at once by an instance running all the transfers it takes.
    pub fn overloaded(&self) -> bool {
        self.status == 503 && self.problem.as_deref() == Some("overloaded")
    }
}

#[derive(Clone)]
pub struct Api {
    pub targets: Vec<String>,
    /// For `/healthz`, the one call that is not the API's.
    pub http: reqwest::Client,
    /// The workspace's client, one per target. By default each request is
    /// sent once: the load test fires copies on purpose and counts every
    /// answer. With `attempts_max` above one, a call retries as the
    /// library does (409, 429, 503; backoff with full jitter), each attempt
    /// to the call's own target, and every attempt is counted.
    clients: Vec<Client>,
    /// The lean path (`wire`), for runs that send each request once over
    /// plain HTTP; `None` otherwise.
    wire: Option<Arc<Wire>>,
}

impl Api {
    pub fn new(
        targets: Vec<String>,
        connections_per_host: usize,
        policy: RetryPolicy,
    ) -> anyhow::Result<Self> {
        // The API answers without redirects; not following any spares each
        // request the redirect policy's work.
        let http = http_client_builder()
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(connections_per_host)
            .timeout(Duration::from_secs(30))
            .build()?;
        let policy = RetryPolicy {
            attempts_max: policy.attempts_max.max(1),
            ..policy
        };
        let clients = targets
            .iter()
            .map(|target| Client::over_with(http.clone(), &[target.as_str()], policy))
            .collect::<Result<_, _>>()?;
        let wire = match policy.attempts_max {
            1 => Wire::over(&targets)?.map(Arc::new),
            _ => None,
        };
        Ok(Self {
            targets,
            http,
            clients,
            wire,
        })
    }

    pub async fn sign_up(&self, target: usize, name: &str, password: &str) -> anyhow::Result<User> {
        let signed_up = self.clients[target]
            .sign_up(name, password)
            .await
            .with_context(|| format!("sign-up on {}", self.targets[target]))?;
        Ok(User {
            user_id: signed_up.user_id,
            wallet_id: signed_up.wallet_id,
            token: signed_up.token,
        })
    }

    pub async fn transfer(&self, users: &[User], planned: &Planned) -> Sample {
        let user = &users[planned.from];
        if let Some(wire) = &self.wire {
            return transfer_once(wire, user, planned).await;
        }
        let seen: Arc<Mutex<Vec<(Instant, AttemptSeen)>>> = Arc::default();
        let observer = seen.clone();
        let client = self.clients[planned.target]
            .with_token(&user.token)
            .observed_by(Arc::new(move |attempt: &AttemptSeen| {
                let ended = Instant::now();
                observer
                    .lock()
                    .expect("the attempts")
                    .push((ended, attempt.clone()));
            }));
        let order = TransferOrder {
            from_wallet_id: user.wallet_id,
            to_wallet_id: planned.to_wallet,
            amount_minor: planned.amount_minor,
        };
        let started = Instant::now();
        // Whatever the call returns, the sample is what its attempts saw:
        // the last one's answer, over the whole call's time.
        let _ = match &planned.key {
            Some(key) => {
                let key = Uuid::parse_str(key).expect("the load test's keys are UUIDs");
                client.transfer(&order, IdempotencyKey::from_uuid(key)).await
            }
            None => client.transfer_without_key(&order).await,
        };
        let latency = started.elapsed();
        let mut attempts = std::mem::take(&mut *seen.lock().expect("the attempts"));
        let records = attempts
            .iter()
            .map(|(ended, attempt)| AttemptRecord {
                status: attempt.status.unwrap_or(0),
                problem: attempt.problem.clone(),
                ended: *ended,
                took: attempt.took,
            })
            .collect();
        match attempts.pop().map(|(_, attempt)| attempt) {
            Some(attempt) if attempt.status.is_some() => Sample {
                status: attempt.status.unwrap_or_default(),
                decision: attempt.decision.as_deref().and_then(Decision::parse_header),
                replayed: attempt.replayed,
                latency,
                key: planned.key.clone(),
                body: planned.key.as_ref().map(|_| attempt.body),
                transport_error: false,
                attempts: records,
            },
            _ => Sample {
                status: 0,
                decision: None,
                replayed: false,
                latency,
                key: planned.key.clone(),
                body: None,
                transport_error: true,
                attempts: records,
            },
        }
    }

    /// `GET /healthz`, for the HTTP ceiling.
    pub async fn healthz(&self, target: usize) -> Sample {
        let started = Instant::now();
        if let Some(wire) = &self.wire {
            let answer = wire.send(target, Method::GET, "/healthz", None, &[], None).await;
            return Sample::of_one(answer, None, started);
        }
        // Through the client's HTTP pool when the run retries or a target is
        // not plain `http://`: the same answer, read into the same sample.
        let answer = match self
            .http
            .get(format!("{}/healthz", self.targets[target]))
            .send()
            .await
        {
            Ok(response) => {
                let (status, headers) = (response.status().as_u16(), response.headers().clone());
                response.bytes().await.ok().map(|body| Answer {
                    status,
                    headers,
                    body,
                })
            }
            Err(_) => None,
        };
        Sample::of_one(answer, None, started)
    }
}

/// A transfer sent once down the lean path: what the client sends for one
/// attempt, and the sample of its answer.
async fn transfer_once(wire: &Wire, user: &User, planned: &Planned) -> Sample {
    let order = TransferOrder {
        from_wallet_id: user.wallet_id,
        to_wallet_id: planned.to_wallet,
        amount_minor: planned.amount_minor,
    };
    let body = serde_json::to_vec(&order).expect("a transfer order serializes");
    let key_header: Vec<(&'static str, &str)> = planned
        .key
        .as_deref()
        .map(|key| ("idempotency-key", key))
        .into_iter()
        .collect();
    let started = Instant::now();
    let answer = wire
        .send(
            planned.target,
            Method::POST,
            "/api/v1/transfers",
            Some(&user.token),
            &key_header,
            Some(body),
        )
        .await;
    Sample::of_one(answer, planned.key.clone(), started)
}

impl Sample {
    /// The sample of a request sent once at `started`: its answer, if one
    /// came; the body is kept for keyed requests only.
    fn of_one(answer: Option<Answer>, key: Option<String>, started: Instant) -> Self {
        let took = started.elapsed();
        let Some(answer) = answer else {
            return Sample {
                status: 0,
                decision: None,
                replayed: false,
                latency: took,
                key,
                body: None,
                transport_error: true,
                attempts: vec![AttemptRecord {
                    status: 0,
                    problem: None,
                    ended: Instant::now(),
                    took,
                }],
            };
        };
        let header = |name: &str| answer.headers.get(name).and_then(|value| value.to_str().ok());
        // Only a refusal names a problem type; a receipt is not parsed.
        let problem = (answer.status >= 400)
            .then(|| serde_json::from_slice::<ProblemType>(&answer.body).ok())
            .flatten()
            .and_then(|problem| problem.kind)
            .map(|kind| kind.trim_start_matches("/problems/").to_owned());
        Sample {
            status: answer.status,
            decision: header("defense-decision").and_then(Decision::parse_header),
            replayed: header("idempotent-replayed") == Some("true"),
            latency: took,
            body: key.as_ref().map(|_| answer.body.to_vec()),
            key,
            transport_error: false,
            attempts: vec![AttemptRecord {
                status: answer.status,
                problem,
                ended: Instant::now(),
                took,
            }],
        }
    }
}

/// A problem's `type`, the one field of a refusal the load test reads.
#[derive(serde::Deserialize)]
struct ProblemType {
    #[serde(rename = "type")]
    kind: Option<String>,
}
