//! The caller's decision feed: `GET /api/v1/decisions?after=` for recent
//! entries and `GET /api/v1/decisions/stream` for a live Server-Sent Events
//! stream. Both read the shared Redis streams, so they show the decisions of
//! every instance. A user sees only their own. The browser's live feed page
//! calls the same endpoints, authenticated by its session cookie.

use std::time::Duration;

use actix_web::http::header;
use actix_web::web::Bytes;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};

use crate::decision::feed::{self, StoredEntry};
use crate::domain::UserId;
use crate::problem::Problem;
use crate::routes::authenticate;
use crate::state::AppState;

#[derive(Deserialize, utoipa::IntoParams)]
pub struct FeedQuery {
    /// A stream id from an earlier page or event: only newer entries.
    pub after: Option<String>,
    /// Default 100, at most `decisions_page_entries_max`.
    pub limit: Option<usize>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct FeedPage {
    pub items: Vec<StoredEntry>,
    /// Pass as `after` to continue; absent when there were no entries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_id: Option<String>,
}

fn parse_query(request: &HttpRequest, max: usize) -> Result<FeedQuery, Problem> {
    let query = web::Query::<FeedQuery>::from_query(request.query_string())
        .map_err(|error| Problem::validation(format!("Invalid query: {error}.")))?
        .into_inner();
    if let Some(after) = &query.after {
        if !feed::is_stream_id(after) {
            return Err(Problem::validation(
                "after must be an entry id such as 1700000000000-0.",
            ));
        }
    }
    if query.limit.is_some_and(|limit| limit == 0 || limit > max) {
        return Err(Problem::validation(format!("limit must be between 1 and {max}.")));
    }
    Ok(query)
}

/// Your recent transfer decisions, oldest first, from every instance.
#[utoipa::path(
    get, path = "/api/v1/decisions", tag = "decisions",
    params(FeedQuery),
    responses(
        (status = 200, body = FeedPage),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 503, body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_decisions(
    request: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, Problem> {
    let caller = authenticate(&request, &state).await?;
    let page = read_page(&request, &state, caller.user_id).await?;
    Ok(HttpResponse::Ok().json(page))
}

/// One page of `user`'s stream after `?after=`.
async fn read_page(request: &HttpRequest, state: &AppState, user: UserId) -> Result<FeedPage, Problem> {
    let max = state.settings.decisions_page_entries_max;
    let query = parse_query(request, max)?;
    let items = state
        .feed
        .read_after(user, query.after.as_deref(), query.limit.unwrap_or(100.min(max)))
        .await
        .map_err(|error| {
            tracing::warn!(error, "could not read the decision feed");
            Problem::unavailable("The decision feed is unavailable. Retry shortly.")
        })?;
    let last_id = items.last().map(|item| item.id.clone());
    Ok(FeedPage { items, last_id })
}

/// Your transfer decisions as they happen, as Server-Sent Events (`event:
/// decision`, `id:` the entry id, `data:` the entry as JSON). Resumes after
/// `Last-Event-ID` or `?after=`; otherwise starts with new entries.
#[utoipa::path(
    get, path = "/api/v1/decisions/stream", tag = "decisions",
    params(FeedQuery),
    responses(
        (status = 200, description = "text/event-stream"),
        (status = 401, body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Too many live streams, or the feed is off", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn stream_decisions(
    request: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, Problem> {
    let caller = authenticate(&request, &state).await?;
    open_stream(&request, &state, caller.user_id).await
}

/// The Server-Sent Events response over `user`'s stream.
async fn open_stream(request: &HttpRequest, state: &AppState, user: UserId) -> Result<HttpResponse, Problem> {
    let query = parse_query(request, state.settings.decisions_page_entries_max)?;
    let last_event_id = request
        .headers()
        .get("last-event-id")
        .and_then(|value| value.to_str().ok())
        .filter(|id| feed::is_stream_id(id))
        .map(str::to_owned);
    let start = last_event_id.or(query.after).unwrap_or_else(|| "$".to_owned());

    let slot = state
        .stream_slots
        .clone()
        .try_acquire_owned()
        .map_err(|_| Problem::unavailable("Too many live streams on this instance. Retry shortly."))?;
    let keepalive = Duration::from_millis(state.settings.decision_stream_keepalive_ms);
    let connection = state
        .feed
        .stream_connection(keepalive + Duration::from_secs(5))
        .await
        .map_err(|error| {
            tracing::warn!(error, "could not open a decision stream");
            Problem::unavailable("The decision feed is unavailable. Retry shortly.")
        })?;
    let key = state.feed.stream_key(user);
    let block_ms = state.settings.decision_stream_keepalive_ms;

    // Each step blocks in Redis for up to the keep-alive interval, then
    // yields either the new entries or a keep-alive comment. The stream ends
    // when the client goes away (actix drops it) or Redis fails.
    let events = futures::stream::unfold(
        (connection, start, slot),
        move |(mut connection, last_id, slot)| {
            let key = key.clone();
            async move {
                let reply: Result<feed::XreadReply, _> = redis::cmd("XREAD")
                    .arg("BLOCK")
                    .arg(block_ms)
                    .arg("COUNT")
                    .arg(100)
                    .arg("STREAMS")
                    .arg(&key)
                    .arg(&last_id)
                    .query_async(&mut connection)
                    .await;
                let streams = match reply {
                    Ok(streams) => streams.unwrap_or_default(),
                    Err(error) => {
                        tracing::info!(error = %error, "decision stream ended");
                        return None;
                    }
                };
                let mut chunk = String::new();
                let mut next_id = last_id;
                for (_, entries) in streams {
                    for stored in entries.into_iter().filter_map(feed::decode) {
                        let data = serde_json::to_string(&stored.entry).unwrap_or_default();
                        chunk.push_str(&format!("id: {}\nevent: decision\ndata: {data}\n\n", stored.id));
                        next_id = stored.id;
                    }
                }
                if chunk.is_empty() {
                    chunk.push_str(": keep-alive\n\n");
                }
                Some((
                    Ok::<_, actix_web::Error>(Bytes::from(chunk)),
                    (connection, next_id, slot),
                ))
            }
        },
    );
    Ok(HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "text/event-stream"))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        // Tells nginx not to buffer the stream.
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(events))
}
