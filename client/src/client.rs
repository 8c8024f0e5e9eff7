//! The client: one method per operation of the API, each sent through the
//! retry policy it may safely use.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use reqwest::{Method, RequestBuilder, Response, Url};
use serde::de::DeserializeOwned;
use serde_json::json;
use uuid::Uuid;

use crate::error::{Error, Problem};
use crate::retry::{IdempotencyKey, RetryPolicy, may_succeed_later};
use crate::types::{
    Decision, DecisionPage, DecisionSource, Paid, Payout, PayoutAccepted, PayoutOrder, SignedIn, SignedUp,
    TransferItem, TransferOrder, TransferPage, TransferReceipt, Wallet,
};

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    /// One server, or several behind which attempts rotate, as a load
    /// balancer would spread them.
    /// Parsed once: each attempt only sets its path on a copy.
    base_urls: Arc<[Url]>,
    next_base: Arc<AtomicUsize>,
    token: Option<String>,
    policy: RetryPolicy,
    observer: Option<Observer>,
    /// The wrong way, kept only so that a test can show what it costs.
    new_key_per_attempt: bool,
}

/// Called with every request a call sends, as it is answered.
pub type Observer = Arc<dyn Fn(&AttemptSeen) + Send + Sync>;

/// One request of a call, as the client saw it, for callers that account
/// for every attempt (a chaos storm, a load test).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptSeen {
    /// `None` when no answer came: a broken connection or a time-out.
    pub status: Option<u16>,
    /// The slug of a refusal's problem type (`cooldown-active`).
    pub problem: Option<String>,
    /// `Idempotent-Replayed: true`.
    pub replayed: bool,
    /// A transfer's id, on a 201.
    pub transfer_id: Option<Uuid>,
    pub retry_after: Option<Duration>,
    /// The `Defense-Decision` header: which layer decided, and how.
    pub decision: Option<String>,
    /// The answer's bytes, for checks that a replay is the original byte
    /// for byte; empty when no answer came.
    pub body: Vec<u8>,
    /// From sending to the whole answer (or to the failure).
    pub took: Duration,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token stays out of logs.
        formatter
            .debug_struct("Client")
            .field(
                "base_urls",
                &self.base_urls.iter().map(Url::as_str).collect::<Vec<_>>(),
            )
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// Whether a call may be sent again when its outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retries {
    /// A read, or a write carrying its idempotency key.
    Safe,
    /// A write without a key: a second copy could do it twice.
    Never,
}

/// How long an idle connection stays in the client's pool: under the
/// server's `http_keep_alive_s` (5 s by default), so that the client lets a
/// connection go before the server closes it, and never sends a request on
/// one the server is closing. That request would fail with no answer, and a
/// keyless write could not be retried.
pub const IDLE_CONNECTION_S_MAX: u64 = 4;

/// An HTTP client builder for this service's servers, its pool's idle
/// timeout at [`IDLE_CONNECTION_S_MAX`]: where every HTTP client that
/// talks to them starts, and sets its own pool size and time-outs.
pub fn http_client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().pool_idle_timeout(Duration::from_secs(IDLE_CONNECTION_S_MAX))
}

impl Client {
    /// A client of the server at `base_url` (`http://127.0.0.1:8080`).
    pub fn new(base_url: &str, policy: RetryPolicy) -> Result<Self, Error> {
        Self::over(&[base_url], policy)
    }

    /// A client of several instances of one deployment: each attempt goes
    /// to the next, so that a retry reaches another instance, as it would
    /// behind a load balancer.
    pub fn over(base_urls: &[&str], policy: RetryPolicy) -> Result<Self, Error> {
        let http = http_client_builder()
            .timeout(policy.request_timeout)
            .build()
            .map_err(|error| Error::Request(error.to_string()))?;
        Self::over_with(http, base_urls, policy)
    }

    /// As [`Client::over`], through an HTTP client of your own (its pool
    /// sizes, its TLS); `policy.request_timeout` is then left to it, and so
    /// is its pool's idle timeout, which should stay under
    /// [`IDLE_CONNECTION_S_MAX`]: build it from [`http_client_builder`].
    pub fn over_with(http: reqwest::Client, base_urls: &[&str], policy: RetryPolicy) -> Result<Self, Error> {
        if base_urls.is_empty() {
            return Err(Error::Request("no server to talk to".to_owned()));
        }
        let base_urls = base_urls
            .iter()
            .map(|url| {
                Url::parse(url).map_err(|error| Error::Request(format!("{url:?} is not a URL: {error}")))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            http,
            base_urls,
            next_base: Arc::new(AtomicUsize::new(0)),
            token: None,
            policy,
            observer: None,
            new_key_per_attempt: false,
        })
    }

    /// The same client, calling `observer` with every request it sends.
    pub fn observed_by(&self, observer: Observer) -> Self {
        Self {
            observer: Some(observer),
            ..self.clone()
        }
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
        read(response)
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
        read(response)
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
        if response.status == 204 {
            Ok(())
        } else {
            Err(refusal(response))
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
        read(response)
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
        paid(response, attempts)
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
        paid(response, attempts)
    }

    /// `POST /api/v1/payouts`, retried with the same key until a final
    /// answer: the money is held once, and the bank is asked once, however
    /// often the answer is lost.
    pub async fn pay_out(&self, order: &PayoutOrder, key: IdempotencyKey) -> Result<PayoutAccepted, Error> {
        let (response, attempts) = self
            .send(Method::POST, "/api/v1/payouts", Retries::Safe, |request, _| {
                request
                    .header("Idempotency-Key", key.as_uuid().to_string())
                    .json(order)
            })
            .await?;
        let replayed = response.replayed;
        Ok(PayoutAccepted {
            receipt: read(response)?,
            replayed,
            attempts,
        })
    }

    /// `GET /api/v1/payouts/{id}`: where the payout stands now.
    pub async fn payout(&self, id: Uuid) -> Result<Payout, Error> {
        let (response, _) = self
            .send(
                Method::GET,
                &format!("/api/v1/payouts/{id}"),
                Retries::Safe,
                |request, _| request,
            )
            .await?;
        read(response)
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
        read(response)
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
        read(response)
    }

    /// `GET /api/v1/decisions`: which layer decided each of the caller's
    /// requests, oldest first, after the entry `after` (from an earlier
    /// page), at most `limit`.
    pub async fn decisions(
        &self,
        source: DecisionSource,
        after: Option<&str>,
        limit: Option<usize>,
    ) -> Result<DecisionPage, Error> {
        let mut query = vec![format!("source={}", source.as_str())];
        if let Some(after) = after {
            query.push(format!("after={}", entry_id(after)?));
        }
        if let Some(limit) = limit {
            query.push(format!("limit={limit}"));
        }
        let path = format!("/api/v1/decisions?{}", query.join("&"));
        let (response, _) = self
            .send(Method::GET, &path, Retries::Safe, |request, _| request)
            .await?;
        read(response)
    }

    /// `GET /api/v1/decisions/stream`: the caller's decisions as they are
    /// made, from every instance, after the entry `after` (or only new
    /// ones). Read it with [`DecisionStream::next`]; when it ends, open it
    /// again after [`DecisionStream::last_id`], and nothing is missed.
    pub async fn decision_stream(
        &self,
        source: DecisionSource,
        after: Option<&str>,
    ) -> Result<DecisionStream, Error> {
        let mut path = format!("/api/v1/decisions/stream?source={}", source.as_str());
        if let Some(after) = after {
            path.push_str(&format!("&after={}", entry_id(after)?));
        }
        // A stream outlives any one request's time-out: the server ends it
        // after decision_stream_lifetime_s, at most a day.
        let mut request = self.http.get(self.next_url(&path)).timeout(STREAM_TIME_MAX);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request
            .send()
            .await
            .map_err(|error| Error::Request(error.to_string()))?;
        if !response.status().is_success() {
            let answer = Answer::read(response)
                .await
                .map_err(|error| Error::Request(error.to_string()))?;
            return Err(refusal(answer));
        }
        Ok(DecisionStream {
            response,
            buffer: Vec::new(),
            last_id: after.map(str::to_owned),
        })
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
    ) -> Result<(Answer, u32), Error> {
        let attempts_max = match retries {
            Retries::Safe => self.policy.attempts_max.max(1),
            Retries::Never => 1,
        };
        let give_up_at = Instant::now() + self.policy.call_time_max;
        let mut attempt = 0;
        loop {
            let mut request = self.http.request(method.clone(), self.next_url(path));
            if let Some(token) = &self.token {
                request = request.bearer_auth(token);
            }
            let started = Instant::now();
            let answered = match build(request, attempt).send().await {
                Ok(response) => Answer::read(response).await,
                Err(error) if error.is_builder() => return Err(Error::Request(error.to_string())),
                Err(error) => Err(error),
            };
            self.observe(&answered, started.elapsed());
            let last_attempt = attempt + 1 >= attempts_max || Instant::now() >= give_up_at;
            let wait = match answered {
                Ok(answer) if !may_succeed_later(answer.status) => return Ok((answer, attempt + 1)),
                Ok(answer) if retries == Retries::Never => return Ok((answer, attempt + 1)),
                Ok(answer) if last_attempt => {
                    return Err(Error::GaveUp {
                        attempts: attempt + 1,
                        last: format!("{} {}", answer.status, String::from_utf8_lossy(&answer.body)),
                    });
                }
                Ok(answer) => self.policy.delay(attempt, answer.retry_after),
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

    /// `path` (with its query, if any) on the next server in turn, under
    /// the base URL's own path. Setting the path on a parsed base costs a
    /// busy client far less than parsing a whole URL for every attempt.
    fn next_url(&self, path: &str) -> Url {
        let base = &self.base_urls[self.next_base.fetch_add(1, Ordering::Relaxed) % self.base_urls.len()];
        let (path, query) = path
            .split_once('?')
            .map_or((path, None), |(path, query)| (path, Some(query)));
        let mut url = base.clone();
        match base.path().trim_end_matches('/') {
            "" => url.set_path(path),
            prefix => url.set_path(&format!("{prefix}{path}")),
        }
        url.set_query(query);
        url
    }

    fn observe(&self, answered: &Result<Answer, reqwest::Error>, took: Duration) {
        let Some(observer) = &self.observer else {
            return;
        };
        let seen = match answered {
            Ok(answer) => {
                let glance = serde_json::from_slice::<Glance>(&answer.body).unwrap_or_default();
                AttemptSeen {
                    status: Some(answer.status),
                    problem: glance
                        .kind
                        .map(|kind| kind.trim_start_matches("/problems/").to_owned()),
                    replayed: answer.replayed,
                    transfer_id: glance
                        .id
                        .filter(|_| answer.status == 201)
                        .and_then(|id| id.parse().ok()),
                    retry_after: answer.retry_after,
                    decision: answer.decision.clone(),
                    body: answer.body.clone(),
                    took,
                }
            }
            Err(_) => AttemptSeen {
                status: None,
                problem: None,
                replayed: false,
                transfer_id: None,
                retry_after: None,
                decision: None,
                body: Vec::new(),
                took,
            },
        };
        observer(&seen);
    }
}

/// The two fields of an answer an observer is told: read in one pass,
/// the rest skipped, since every attempt of a busy client is observed.
#[derive(Default, serde::Deserialize)]
struct Glance<'a> {
    /// A problem's type, `/problems/<slug>`.
    #[serde(rename = "type", borrow, default)]
    kind: Option<std::borrow::Cow<'a, str>>,
    /// A receipt's id.
    #[serde(borrow, default)]
    id: Option<std::borrow::Cow<'a, str>>,
}

/// How long a decision stream may stay open: the server's longest stream
/// lifetime.
const STREAM_TIME_MAX: Duration = Duration::from_secs(24 * 3_600);

/// `after`, if it is an entry id (digits, a hyphen, digits): nothing in
/// it needs escaping in a query.
fn entry_id(after: &str) -> Result<&str, Error> {
    if after.bytes().all(|byte| byte.is_ascii_digit() || byte == b'-') {
        Ok(after)
    } else {
        Err(Error::Request(format!(
            "{after:?} is not an entry id such as 1700000000000-0"
        )))
    }
}

/// A live stream of decisions (Server-Sent Events).
pub struct DecisionStream {
    response: Response,
    buffer: Vec<u8>,
    last_id: Option<String>,
}

impl DecisionStream {
    /// The next decision, or `None` when the server ended the stream (its
    /// lifetime passed, or the token is no longer valid) or the connection
    /// closed: reopen after [`DecisionStream::last_id`] to go on.
    pub async fn next(&mut self) -> Option<Result<Decision, Error>> {
        loop {
            // An event ends at a blank line.
            if let Some(end) = self.buffer.windows(2).position(|pair| pair == b"\n\n") {
                let event: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let event = String::from_utf8_lossy(&event);
                let field = |name: &str| {
                    event
                        .lines()
                        .find_map(|line| line.strip_prefix(name))
                        .map(|value| value.trim_start().to_owned())
                };
                match field("event:").as_deref() {
                    Some("decision") => {
                        let id = field("id:").unwrap_or_default();
                        self.last_id = Some(id.clone());
                        return Some(decision_of(&id, &field("data:").unwrap_or_default()));
                    }
                    Some("end") => return None,
                    // A keep-alive comment, or an event this client does not know.
                    _ => continue,
                }
            }
            match self.response.chunk().await {
                Ok(Some(chunk)) => self.buffer.extend_from_slice(&chunk),
                Ok(None) | Err(_) => return None,
            }
        }
    }

    /// The id of the last decision read: reopen the stream after it.
    pub fn last_id(&self) -> Option<&str> {
        self.last_id.as_deref()
    }
}

/// A streamed decision: its entry id from `id:`, the rest from `data:`.
fn decision_of(id: &str, data: &str) -> Result<Decision, Error> {
    let mut value: serde_json::Value = serde_json::from_str(data)
        .map_err(|error| Error::Request(format!("a streamed decision: {error}")))?;
    if let Some(fields) = value.as_object_mut() {
        fields.insert("id".to_owned(), serde_json::Value::String(id.to_owned()));
    }
    serde_json::from_value(value).map_err(|error| Error::Request(format!("a streamed decision: {error}")))
}

/// An answer, read whole.
struct Answer {
    status: u16,
    retry_after: Option<Duration>,
    /// `Idempotent-Replayed: true`.
    replayed: bool,
    decision: Option<String>,
    body: Vec<u8>,
}

impl Answer {
    async fn read(response: Response) -> Result<Self, reqwest::Error> {
        let status = response.status().as_u16();
        let retry_after = retry_after(&response);
        let replayed = response
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|value| value == "true");
        let decision = response
            .headers()
            .get("defense-decision")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let body = response.bytes().await?.to_vec();
        Ok(Self {
            status,
            retry_after,
            replayed,
            decision,
            body,
        })
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
fn read<T: DeserializeOwned>(answer: Answer) -> Result<T, Error> {
    if (200..300).contains(&answer.status) {
        serde_json::from_slice(&answer.body)
            .map_err(|error| Error::Request(format!("the answer could not be read: {error}")))
    } else {
        Err(refusal(answer))
    }
}

/// A transfer's final answer: the receipt (made now, or replayed), or why not.
fn paid(answer: Answer, attempts: u32) -> Result<Paid, Error> {
    let replayed = answer.replayed;
    let receipt: TransferReceipt = read(answer)?;
    Ok(Paid {
        receipt,
        replayed,
        attempts,
    })
}

/// A final answer that is not a success: a refusal the same request would
/// get again, or a server failure.
fn refusal(answer: Answer) -> Error {
    match serde_json::from_slice::<Problem>(&answer.body) {
        Ok(problem) if problem.slug() == "outcome-unknown" => Error::OutcomeUnknown(problem.detail),
        // A 503 that is not an unknown outcome changed nothing: it ends a
        // call that may not be retried (a keyless transfer) like a refusal.
        Ok(problem) if answer.status < 500 || answer.status == 503 => Error::Refused(Box::new(problem)),
        _ => Error::Unexpected {
            status: answer.status,
            body: String::from_utf8_lossy(&answer.body).into_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// What an observer is told of one answer with `status` and `body`.
    fn seen(status: u16, body: &str) -> AttemptSeen {
        let told: Arc<Mutex<Vec<AttemptSeen>>> = Arc::default();
        let keep = told.clone();
        let client = Client::new("http://127.0.0.1:1", RetryPolicy::default())
            .expect("a client")
            .observed_by(Arc::new(move |attempt: &AttemptSeen| {
                keep.lock().expect("the attempts").push(attempt.clone())
            }));
        let answer = Answer {
            status,
            retry_after: None,
            replayed: false,
            decision: None,
            body: body.as_bytes().to_vec(),
        };
        client.observe(&Ok(answer), Duration::ZERO);
        told.lock().expect("the attempts").pop().expect("one attempt")
    }

    #[test]
    fn an_observer_is_told_a_refusals_type_and_a_receipts_id() {
        let refused = seen(
            429,
            r#"{"type":"/problems/cooldown-active","title":"t","status":429,"detail":"d","layer":"cooldown"}"#,
        );
        assert_eq!(refused.problem.as_deref(), Some("cooldown-active"));
        assert_eq!(refused.transfer_id, None);

        let id = Uuid::now_v7();
        let receipt = format!(r#"{{"id":"{id}","amount_minor":100,"nested":{{"id":1}}}}"#);
        let made = seen(201, &receipt);
        assert_eq!((made.problem, made.transfer_id), (None, Some(id)));
        assert_eq!(made.body, receipt.into_bytes());

        // An id that is no UUID, or an answer that is no JSON, tells nothing.
        assert_eq!(seen(201, r#"{"id":"not-a-uuid"}"#).transfer_id, None);
        let garbled = seen(502, "<html>bad gateway</html>");
        assert_eq!((garbled.status, garbled.problem), (Some(502), None));
    }
}
