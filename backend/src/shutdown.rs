//! How an instance stops, so that every request it accepted is answered
//! with a status and the process is gone within a known time.
//!
//! On SIGTERM (or SIGINT) `main` calls [`Stopper::stop`]. First the doors
//! shut ([`Doors`]): new handshakes go unanswered, and the connections the
//! kernel had already completed are still accepted and served, since
//! closing a listener resets those, requests and all. Then the listeners
//! close, and for `shutdown_grace_s` the requests in flight finish. While
//! it lasts, each response closes its connection (`Connection: close`), so
//! a client sends its next request on a new connection, which is refused
//! before anything is sent: a safe retry elsewhere, where a request on a
//! connection cut at the end of the grace would leave its client not
//! knowing. Live decision streams end at once with an `end` event, instead
//! of holding their connections until the grace is over and being cut.
//!
//! A request still running when the grace ends is answered then, 503
//! (`outcome-unknown` for a write, which may have been done), rather than
//! cut: actix drops the connections left [`LAST_ANSWERS`] later. The
//! process then has `shutdown_cleanup_ms_max` more to stop its background
//! tasks and flush its spans, and exits whatever still runs (`main`'s
//! watchdog), so a task stuck in a store call or a blocking thread cannot
//! keep it alive.

use std::sync::Arc;
use std::time::Duration;

use actix_web::body::MessageBody;
use actix_web::dev::{ServerHandle, ServiceRequest, ServiceResponse};
use actix_web::http::{ConnectionType, Method};
use actix_web::middleware::Next;
use tokio::sync::watch;

use crate::problem::{Problem, ProblemType};

/// How long after the grace the answers given at its end have to be
/// written before actix drops the connections left. One second was not
/// always enough on a machine busy with other work: a client then saw its
/// connection cut instead of its 503.
pub const LAST_ANSWERS: Duration = Duration::from_secs(3);

/// Whether this instance is stopping, and when its grace ends; cheap to
/// clone and to ask.
#[derive(Clone)]
pub struct Draining(Arc<watch::Sender<Option<tokio::time::Instant>>>);

impl Default for Draining {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(None)))
    }
}

impl Draining {
    pub fn begin(&self, grace: Duration) {
        self.0.send_replace(Some(tokio::time::Instant::now() + grace));
    }

    pub fn is_draining(&self) -> bool {
        self.0.borrow().is_some()
    }

    /// Resolves once the instance starts stopping (at once if it has).
    pub async fn started(&self) {
        self.grace_end().await;
    }

    /// Resolves when the grace is over.
    async fn grace_over(&self) {
        tokio::time::sleep_until(self.grace_end().await).await;
    }

    async fn grace_end(&self) -> tokio::time::Instant {
        let mut receiver = self.0.subscribe();
        match receiver.wait_for(Option::is_some).await {
            Ok(end) => end.unwrap_or_else(tokio::time::Instant::now),
            // The sender lives as long as the state: never.
            Err(_) => std::future::pending().await,
        }
    }
}

/// Stops one instance: what `main` calls on a signal, and tests may too.
#[derive(Clone)]
pub struct Stopper {
    pub(crate) server: ServerHandle,
    pub(crate) draining: Draining,
    pub(crate) doors: Arc<Doors>,
    /// `shutdown_grace_s`.
    pub grace: Duration,
    /// `shutdown_cleanup_ms_max`.
    pub cleanup: Duration,
}

impl Stopper {
    /// Closes the listeners, lets the requests in flight finish within the
    /// grace, and resolves when the workers have stopped.
    pub async fn stop(&self) {
        self.draining.begin(self.grace);
        self.doors.shut();
        // Normally a few milliseconds; past the grace, `main`'s bound on
        // the exit ends it.
        self.doors.wait_until_taken(self.grace).await;
        // Ours are duplicates: once they and actix's are closed, the ports
        // refuse new clients outright instead of leaving them to retry.
        self.doors.close();
        self.server.stop(true).await;
    }

    /// The longest the process may take to exit once `stop` is called.
    pub fn exit_bound(&self) -> Duration {
        self.grace + LAST_ANSWERS + self.cleanup
    }
}

/// While the instance drains, each response closes its connection: the
/// client's next request goes out on a new connection, which a stopped
/// listener refuses before anything is sent.
pub async fn close_connections_while_draining(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let draining = request.app_data::<Draining>().cloned();
    let mut response = next.call(request).await?;
    if draining.is_some_and(|draining| draining.is_draining()) {
        response
            .response_mut()
            .head_mut()
            .set_connection_type(ConnectionType::Close);
    }
    Ok(response)
}

/// A request still running when the grace ends is answered then, before
/// actix drops its connection: a read with 503 `service-unavailable`, a
/// write with 503 `outcome-unknown`, since it may have been done.
pub async fn answer_before_the_grace_ends(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let Some(draining) = request.app_data::<Draining>().cloned() else {
        return next.call(request).await;
    };
    let reads = matches!(*request.method(), Method::GET | Method::HEAD);
    tokio::select! {
        response = next.call(request) => response,
        () = draining.grace_over() => {
            let problem = if reads {
                Problem::unavailable("This instance stopped before it could answer. Retry.")
            } else {
                Problem::new(
                    ProblemType::OutcomeUnknown,
                    "This instance stopped before this request finished, so we cannot tell whether it was done. \
                     Retry with the same Idempotency-Key; without one, look for the transfer in \
                     GET /api/v1/transfers first.",
                )
                .with_retry_after_s(1)
            };
            let mut response = problem.into_response();
            response.head_mut().set_connection_type(ConnectionType::Close);
            // The request went with the handler's future, so the answer
            // leaves as an error that carries its own response.
            Err(actix_web::error::InternalError::from_response("the shutdown grace ended", response).into())
        }
    }
}

/// The instance's listening sockets, as the kernel holds them (duplicates
/// of the ones actix accepts from), until `close`.
pub struct Doors(std::sync::Mutex<Vec<std::net::TcpListener>>);

/// A classic BPF program of one instruction, `ret #0`: every packet to the
/// socket is dropped. On a listener that is every new handshake; the
/// connections already completed are sockets of their own and unaffected.
const DROP_EVERY_PACKET: [socket2::SockFilter; 1] = [socket2::SockFilter::new(0x06, 0, 0, 0)];

/// A listening socket's state in `/proc/net/tcp`.
const TCP_LISTEN: &str = "0A";

impl Doors {
    pub fn of(listeners: &[&std::net::TcpListener]) -> std::io::Result<Self> {
        listeners
            .iter()
            .map(|listener| listener.try_clone())
            .collect::<Result<_, _>>()
            .map(|listeners| Self(std::sync::Mutex::new(listeners)))
    }

    fn listeners(&self) -> std::sync::MutexGuard<'_, Vec<std::net::TcpListener>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn close(&self) {
        self.listeners().clear();
    }

    /// From now on a new client's handshake goes unanswered; its retry,
    /// a second later, finds the port closed: refused before anything was
    /// sent.
    fn shut(&self) {
        for listener in self.listeners().iter() {
            if let Err(error) = socket2::SockRef::from(listener).attach_filter(&DROP_EVERY_PACKET) {
                tracing::warn!(%error, "could not shut a listener to new connections before closing it");
            }
        }
    }

    /// Waits, at most `within`, until actix has accepted every connection
    /// the kernel queued on these listeners.
    async fn wait_until_taken(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        let ports: Vec<u16> = self
            .listeners()
            .iter()
            .filter_map(|listener| listener.local_addr().ok())
            .map(|address| address.port())
            .collect();
        while queued(&ports).is_some_and(|queued| queued > 0) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Connections completed by the kernel and not yet accepted on listeners
/// at `ports`: for a listening socket, the `rx_queue` of
/// `/proc/net/tcp{,6}` is its accept queue. `None` where there is no such
/// file.
fn queued(ports: &[u16]) -> Option<usize> {
    let mut total = None;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        let total = total.get_or_insert(0);
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(queues)) = (fields.get(1), fields.get(3), fields.get(4))
            else {
                continue;
            };
            let port = local
                .rsplit(':')
                .next()
                .and_then(|hex| u16::from_str_radix(hex, 16).ok());
            if *state != TCP_LISTEN || !port.is_some_and(|port| ports.contains(&port)) {
                continue;
            }
            *total += queues
                .split(':')
                .nth(1)
                .and_then(|hex| usize::from_str_radix(hex, 16).ok())
                .unwrap_or(0);
        }
    }
    total
}
