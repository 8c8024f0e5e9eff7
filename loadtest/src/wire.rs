//! The load test's lean HTTP/1.1 path, for runs that send every request
//! once (`--attempts-max 1`, the default and every measured run).
//!
//! Why it exists: a generator on the same two cores as the server spends
//! the machine's CPU that the server and PostgreSQL would otherwise have,
//! so whatever it costs per request is taken from the figures it measures.
//! Through the workspace's client (reqwest's pool, its middleware, the
//! retry loop and the observer) one `/healthz` cost the generator about
//! 34 µs, `wrk` 14. Here each request goes straight down a kept hyper
//! connection: one per request in flight, taken from a stack and put back
//! after the answer, so a closed loop of N workers holds N connections.
//!
//! What it sends and reads is what the client sends and reads for one
//! attempt (the bearer token, the JSON body, `Idempotency-Key`; the status,
//! `Defense-Decision`, `Idempotent-Replayed`, a refusal's problem type, the
//! body). Runs that retry (`--attempts-max` above 1) go through the client,
//! which owns the retry policy.

use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use http::{HeaderMap, HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;

/// How long one request may take, from taking a connection to the whole
/// answer, before it counts as a transport error (the client's own bound).
const REQUEST_TIME_MAX: Duration = Duration::from_secs(30);

/// One answer, read whole.
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// The lean path to every target of a run.
pub struct Wire {
    targets: Vec<Target>,
}

/// One server: where to connect, what to send as `Host`, the path its API
/// lives under, and the connections not in use.
struct Target {
    address: String,
    host: HeaderValue,
    path_prefix: String,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
}

impl Wire {
    /// The lean path to `targets`, or `None` when one of them is not plain
    /// `http://` (the client handles TLS).
    pub fn over(targets: &[String]) -> anyhow::Result<Option<Self>> {
        let mut parsed = Vec::with_capacity(targets.len());
        for target in targets {
            let uri: Uri = target.parse().with_context(|| format!("the target {target}"))?;
            if uri.scheme_str() != Some("http") {
                return Ok(None);
            }
            let authority = uri
                .authority()
                .with_context(|| format!("the target {target} has no host"))?;
            let address = match authority.port_u16() {
                Some(_) => authority.as_str().to_owned(),
                None => format!("{}:80", authority.host()),
            };
            parsed.push(Target {
                address,
                host: HeaderValue::from_str(authority.as_str())?,
                path_prefix: uri.path().trim_end_matches('/').to_owned(),
                idle: Mutex::new(Vec::new()),
            });
        }
        Ok(Some(Self { targets: parsed }))
    }

    /// A request to `path` on target `target`, with the bearer `token` and
    /// a JSON `body` when given, and `extra` headers; `None` when no answer
    /// came (a refused or broken connection, a time-out).
    pub async fn send(
        &self,
        target: usize,
        method: Method,
        path: &str,
        token: Option<&str>,
        extra: &[(&'static str, &str)],
        body: Option<Vec<u8>>,
    ) -> Option<Answer> {
        let target = &self.targets[target];
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", target.path_prefix))
            .header(HOST, target.host.clone());
        if let Some(token) = token {
            request = request.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        for (name, value) in extra {
            request = request.header(*name, *value);
        }
        let body = match body {
            Some(body) => {
                request = request.header(CONTENT_TYPE, "application/json");
                Full::new(Bytes::from(body))
            }
            None => Full::new(Bytes::new()),
        };
        let request = request.body(body).ok()?;
        tokio::time::timeout(REQUEST_TIME_MAX, target.exchange(request))
            .await
            .ok()?
    }
}

impl Target {
    /// Sends `request` down an idle connection (or a new one) and reads the
    /// whole answer; the connection goes back to the stack only then, so a
    /// broken one is dropped with its request.
    async fn exchange(&self, request: Request<Full<Bytes>>) -> Option<Answer> {
        let idle = self.idle.lock().expect("the idle connections").pop();
        let mut sender = match idle {
            Some(sender) if !sender.is_closed() => sender,
            _ => self.connect().await?,
        };
        sender.ready().await.ok()?;
        let response = sender.send_request(request).await.ok()?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.ok()?.to_bytes();
        self.idle.lock().expect("the idle connections").push(sender);
        Some(Answer {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    }

    async fn connect(&self) -> Option<SendRequest<Full<Bytes>>> {
        let stream = tokio::net::TcpStream::connect(&self.address).await.ok()?;
        stream.set_nodelay(true).ok()?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await.ok()?;
        // The connection's task ends when its sender is dropped or the
        // server closes it.
        tokio::spawn(connection);
        Some(sender)
    }
}
