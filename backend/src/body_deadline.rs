//! A request body must arrive whole within `http_request_body_wait_ms_max`
//! of its head. actix bounds the head (`http_request_head_wait_ms_max`) and
//! nothing after it: a body sent one byte a second would hold a connection,
//! and a handler waiting on it, for as long as its sender likes.
//!
//! The bound is on the body as the handler reads it, not on the handler:
//! once the body is in, a transfer may take as long as its stores do, and
//! cutting it short there would leave its outcome unknown. A body still
//! arriving at the deadline ends in an error the handler answers (408
//! `body-too-slow` from the API), and the connection is closed after the
//! answer, since the rest of the body is still on it.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::HttpMessage;
use actix_web::body::MessageBody;
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::error::PayloadError;
use actix_web::http::ConnectionType;
use actix_web::middleware::Next;
use actix_web::web::Bytes;
use futures::Stream;

/// `http_request_body_wait_ms_max`, as the app's data: how long a body
/// may take to arrive.
#[derive(Clone, Copy)]
pub struct BodyWait(pub std::time::Duration);

/// Puts the deadline on the request's body, if it has one.
pub async fn bound_body_wait(
    mut request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let wait = request.app_data::<BodyWait>().map(|wait| wait.0);
    let expired = Arc::new(AtomicBool::new(false));
    match (request.take_payload(), wait) {
        (Payload::None, _) => {}
        (payload, None) => request.set_payload(payload),
        (payload, Some(wait)) => request.set_payload(Payload::Stream {
            payload: Box::pin(Deadline {
                body: payload,
                ends: tokio::time::Instant::now() + wait,
                timer: None,
                wait,
                expired: expired.clone(),
            }),
        }),
    }
    let mut response = next.call(request).await?;
    if expired.load(Ordering::Relaxed) {
        response
            .response_mut()
            .head_mut()
            .set_connection_type(ConnectionType::Close);
    }
    Ok(response)
}

/// Whether a body error is this deadline's.
pub fn is_deadline(error: &PayloadError) -> bool {
    matches!(error, PayloadError::Io(error) if error.kind() == io::ErrorKind::TimedOut)
}

struct Deadline {
    body: Payload,
    /// When the body must be in by.
    ends: tokio::time::Instant,
    /// Set only once the body keeps the handler waiting: a body that came
    /// with its head, as nearly every one does, never starts a timer.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    wait: Duration,
    expired: Arc<AtomicBool>,
}

impl Stream for Deadline {
    type Item = Result<Bytes, PayloadError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.expired.load(Ordering::Relaxed) {
            return Poll::Ready(None);
        }
        // The body first: one that is complete is never refused because
        // the handler came to read it late.
        if let Poll::Ready(item) = Pin::new(&mut self.body).poll_next(cx) {
            return Poll::Ready(item);
        }
        let ends = self.ends;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(ends)));
        if timer.as_mut().poll(cx).is_ready() {
            self.expired.store(true, Ordering::Relaxed);
            let wait_ms = self.wait.as_millis();
            return Poll::Ready(Some(Err(PayloadError::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the body did not arrive within {wait_ms} ms of the request's head"),
            )))));
        }
        Poll::Pending
    }
}
