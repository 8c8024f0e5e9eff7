//! N requests really in flight together.
//!
//! A browser keeps at most six connections per host, so a burst fired from
//! the page is at most six wide. The server fires it instead, at its own
//! public listener, through `POST /api/v1/transfers` like any client:
//!
//! 1. every request gets its own connection, opened before anything is sent;
//! 2. each request is written but for its last byte;
//! 3. a barrier releases all of them, and each writes its last byte.
//!
//! It builds each request's body from the workspace's client crate
//! (`wallet_client::TransferOrder`) but writes the bytes itself: holding
//! back each request's last byte is below what an HTTP client offers, and
//! a burst must never retry (it counts answers).
//!
//! A request is complete, and can be decided, only once its last byte
//! arrives, so the N requests reach the layers within the time it takes to
//! write N bytes. The most requests in flight at once is measured from the
//! send and answer times, and shown with the results.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Barrier;
use uuid::Uuid;

use crate::auth::lab_pass::LabPasses;
use crate::decision::Decision;
use crate::domain::UserId;

/// An answer is read up to this many bytes: a transfer's answer is a few
/// hundred.
const ANSWER_BYTES_MAX: usize = 64 * 1024;

/// One request of a burst.
#[derive(Debug, Clone)]
pub struct Shot {
    pub from: Uuid,
    pub to: Uuid,
    pub amount_minor: i64,
    pub key: Option<Uuid>,
}

/// How one request ended, as the client saw it.
#[derive(Debug, Clone)]
pub struct Answer {
    pub shot: Shot,
    /// Since the burst was released.
    pub sent: Duration,
    pub answered: Duration,
    /// 0 when no answer came (the connection failed or timed out).
    pub status: u16,
    pub decision: Option<Decision>,
    pub replayed: bool,
    /// The problem body of a refusal, as sent.
    pub body: String,
    pub trace_id: Option<String>,
}

impl Answer {
    pub fn latency(&self) -> Duration {
        self.answered.saturating_sub(self.sent)
    }
}

/// What a burst gives back.
#[derive(Debug)]
pub struct Burst {
    pub answers: Vec<Answer>,
    /// The most requests in flight at once.
    pub overlap_max: usize,
}

/// What every request of a burst carries besides its shot.
pub struct Target<'a> {
    pub address: SocketAddr,
    /// The visitor's own bearer token: the burst speaks for them.
    pub bearer_token: &'a str,
    /// The run's switches, with a pass for each shot.
    pub switches: Option<SwitchesWithPasses<'a>>,
    pub give_up_after: Duration,
}

/// A run's switches header, and what mints each shot's pass for it.
pub struct SwitchesWithPasses<'a> {
    pub header: String,
    pub passes: &'a LabPasses,
    pub user: UserId,
    pub run: Uuid,
    pub pass_lifetime: Duration,
    /// Numbers the shots of the whole run, across its waves.
    pub next_shot: AtomicU32,
}

/// Fires `shots` together and waits for every answer (or `give_up_after`).
pub async fn fire(target: &Target<'_>, shots: Vec<Shot>) -> Burst {
    let barrier = Arc::new(Barrier::new(shots.len()));
    let released = Arc::new(tokio::sync::OnceCell::<Instant>::new());
    let tasks: Vec<_> = shots
        .into_iter()
        .map(|shot| {
            let request = request_bytes(target, &shot);
            let barrier = barrier.clone();
            let released = released.clone();
            let address = target.address;
            let give_up_after = target.give_up_after;
            tokio::spawn(async move {
                one_request(address, request, shot, barrier, released, give_up_after).await
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(tasks.len());
    for task in tasks {
        if let Ok(answer) = task.await {
            answers.push(answer);
        }
    }
    let overlap_max = overlap_max(&answers);
    Burst { answers, overlap_max }
}

async fn one_request(
    address: SocketAddr,
    request: Vec<u8>,
    shot: Shot,
    barrier: Arc<Barrier>,
    released: Arc<tokio::sync::OnceCell<Instant>>,
    give_up_after: Duration,
) -> Answer {
    let (head, last) = request.split_at(request.len() - 1);
    // Connect and write all but the last byte; whatever happens, reach the
    // barrier, or the others would wait for ever.
    let prepared = async {
        let mut stream = TcpStream::connect(address).await?;
        stream.set_nodelay(true)?;
        stream.write_all(head).await?;
        Ok::<_, std::io::Error>(stream)
    };
    let prepared = tokio::time::timeout(give_up_after, prepared).await;
    barrier.wait().await;
    let start = *released.get_or_init(|| async { Instant::now() }).await;
    let sent = start.elapsed();
    let mut answer = Answer {
        shot,
        sent,
        answered: sent,
        status: 0,
        decision: None,
        replayed: false,
        body: String::new(),
        trace_id: None,
    };
    let Ok(Ok(mut stream)) = prepared else {
        return answer;
    };
    let exchange = async {
        stream.write_all(last).await?;
        let mut bytes = Vec::with_capacity(1024);
        (&mut stream)
            .take(ANSWER_BYTES_MAX as u64)
            .read_to_end(&mut bytes)
            .await?;
        Ok::<_, std::io::Error>(bytes)
    };
    if let Ok(Ok(bytes)) = tokio::time::timeout(give_up_after, exchange).await {
        answer.answered = start.elapsed();
        read_answer(&bytes, &mut answer);
    }
    answer
}

/// The request as bytes: HTTP/1.1, one request per connection.
fn request_bytes(target: &Target<'_>, shot: &Shot) -> Vec<u8> {
    // The body as the workspace's client crate defines it.
    let order = wallet_client::TransferOrder {
        from_wallet_id: shot.from,
        to_wallet_id: shot.to,
        amount_minor: shot.amount_minor,
    };
    let body = serde_json::to_string(&order).unwrap_or_default();
    let mut head = format!(
        "POST /api/v1/transfers HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        target.address,
        target.bearer_token,
        body.len()
    );
    if let Some(key) = shot.key {
        head.push_str(&format!("Idempotency-Key: {key}\r\n"));
    }
    if let Some(switches) = &target.switches {
        let shot = switches.next_shot.fetch_add(1, Ordering::Relaxed);
        let pass = (switches.passes).mint(
            switches.user,
            switches.run,
            shot,
            &switches.header,
            switches.pass_lifetime,
        );
        head.push_str(&format!(
            "Race-Lab-Switches: {}\r\nRace-Lab-Pass: {pass}\r\n",
            switches.header
        ));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body.as_bytes());
    bytes
}

/// Status, decision, replay flag, trace id and body of a raw answer.
fn read_answer(bytes: &[u8], answer: &mut Answer) {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let Ok(httparse::Status::Complete(head_len)) = response.parse(bytes) else {
        return;
    };
    answer.status = response.code.unwrap_or(0);
    for header in response.headers.iter() {
        let value = String::from_utf8_lossy(header.value);
        match header.name.to_ascii_lowercase().as_str() {
            "defense-decision" => answer.decision = Decision::parse_header(&value),
            "idempotent-replayed" => answer.replayed = value.trim() == "true",
            "traceparent" => answer.trace_id = value.split('-').nth(1).map(str::to_owned),
            _ => {}
        }
    }
    answer.body = String::from_utf8_lossy(&bytes[head_len..]).into_owned();
}

/// The most intervals [sent, answered] that overlap at one instant.
pub fn overlap_max(answers: &[Answer]) -> usize {
    let mut events: Vec<(Duration, i32)> = answers
        .iter()
        .filter(|answer| answer.status != 0)
        .flat_map(|answer| [(answer.sent, 1), (answer.answered, -1)])
        .collect();
    // At one instant, count arrivals before departures: a request sent as
    // another is answered was in flight with it.
    events.sort_by(|x, y| x.0.cmp(&y.0).then(y.1.cmp(&x.1)));
    let (mut now, mut most) = (0i32, 0i32);
    for (_, change) in events {
        now += change;
        most = most.max(now);
    }
    most as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(sent_ms: u64, answered_ms: u64) -> Answer {
        Answer {
            shot: Shot {
                from: Uuid::nil(),
                to: Uuid::nil(),
                amount_minor: 1,
                key: None,
            },
            sent: Duration::from_millis(sent_ms),
            answered: Duration::from_millis(answered_ms),
            status: 201,
            decision: None,
            replayed: false,
            body: String::new(),
            trace_id: None,
        }
    }

    #[test]
    fn overlap_counts_the_requests_in_flight_at_one_instant() {
        let answers = [answered(0, 10), answered(1, 5), answered(5, 7), answered(11, 12)];
        assert_eq!(overlap_max(&answers), 3);
        assert_eq!(overlap_max(&[]), 0);
    }

    #[test]
    fn an_answer_is_read_from_raw_bytes() {
        let raw = b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 2\r\n\
            defense-decision: layer=cooldown, outcome=rejected\r\n\
            traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n\r\n{}";
        let mut answer = answered(0, 1);
        read_answer(raw, &mut answer);
        assert_eq!(answer.status, 429);
        assert_eq!(
            answer.decision,
            Some(Decision::new(
                crate::decision::Layer::Cooldown,
                crate::decision::Outcome::Rejected
            ))
        );
        assert_eq!(
            answer.trace_id.as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert_eq!(answer.body, "{}");
    }
}
