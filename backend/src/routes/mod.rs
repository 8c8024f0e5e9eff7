//! HTTP routes. Handlers parse at the edge, call into the domain, and map
//! every outcome to a status and an RFC 9457 body.

use actix_web::HttpRequest;
use actix_web::http::header;
use actix_web::web::{self, Bytes, BytesMut};
use futures::StreamExt;

use crate::auth::{self, VerifiedToken};
use crate::problem::{self, Problem};
use crate::settings::Config;
use crate::state::AppState;

pub mod cheap_checks;
pub mod commands;
pub mod decisions;
pub mod deposits;
pub mod health;
pub mod payouts;
pub mod transfers;
pub mod users;
pub mod wallets;

/// Reads a JSON request body of at most `request_body_bytes_max`: 415 for a
/// body that is not declared JSON, 413 past the limit (checked against
/// `Content-Length` first, then while streaming).
///
/// Before a 413 the rest of the body is read and thrown away, up to
/// `oversized_body_drain_bytes_max` and `oversized_body_drain_ms_max`: a
/// client that sends its whole body before reading (no
/// `Expect: 100-continue`) would otherwise get a connection reset instead of
/// the answer.
pub async fn read_json_body(
    request: &HttpRequest,
    mut payload: web::Payload,
    config: &Config,
) -> Result<Bytes, Problem> {
    let limit_bytes = config.http.request_body_bytes_max;
    let is_json = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| {
            let media = media.trim();
            media.eq_ignore_ascii_case("application/json") || media.to_ascii_lowercase().ends_with("+json")
        });
    if !is_json {
        drain(&mut payload, config).await;
        return Err(Problem::unsupported_media_type());
    }
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<usize>().ok());
    if declared.is_some_and(|length| length > limit_bytes) {
        drain(&mut payload, config).await;
        return Err(Problem::payload_too_large(limit_bytes));
    }
    let mut body = BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|error| {
            if crate::body_deadline::is_deadline(&error) {
                Problem::new(
                    problem::ProblemType::BodyTooSlow,
                    format!(
                        "The body must arrive whole within {} ms of the request's head.",
                        config.http.request_body_wait_max.as_millis()
                    ),
                )
            } else {
                Problem::bad_request(format!("Could not read the body: {error}."))
            }
        })?;
        if body.len() + chunk.len() > limit_bytes {
            drain(&mut payload, config).await;
            return Err(Problem::payload_too_large(limit_bytes));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// Reads and discards what is left of a refused body, within the drain
/// bounds. Past them the connection is closed with the body unread, as
/// before: the bounds keep a client from holding a worker with an endless
/// body.
async fn drain(payload: &mut web::Payload, config: &Config) {
    let bytes_max = config.http.oversized_body_drain_bytes_max;
    let deadline = tokio::time::sleep(config.http.oversized_body_drain_max);
    tokio::pin!(deadline);
    let mut drained = 0usize;
    loop {
        tokio::select! {
            () = &mut deadline => return,
            chunk = payload.next() => match chunk {
                Some(Ok(chunk)) => {
                    drained += chunk.len();
                    if drained > bytes_max {
                        return;
                    }
                }
                Some(Err(_)) | None => return,
            },
        }
    }
}

/// Full authentication for routes that read: the MAC, then the database
/// (not revoked, not expired).
pub async fn authenticate(request: &HttpRequest, state: &AppState) -> Result<VerifiedToken, Problem> {
    let token = state.tokens.verify_request(request)?;
    let live = auth::token_is_live(&state.db, &token)
        .await
        .map_err(|error| problem::from_database_error(&error, "checking a token"))?;
    if !live {
        return Err(Problem::token_not_live());
    }
    Ok(token)
}
