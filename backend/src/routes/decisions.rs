//! The caller's decision feed: `GET /api/v1/decisions?after=` for recent
//! entries and `GET /api/v1/decisions/stream` for a live Server-Sent Events
//! stream (`live`), each of real transfers or, with `?source=lab`, of
//! race-lab runs. Both read the shared Redis streams, so they show the
//! decisions of every instance. A user sees only their own. The browser's
//! live feed page calls the same endpoints, authenticated by its session
//! cookie.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};

use crate::auth::VerifiedToken;
use crate::domain::UserId;
use crate::feed::stream_slots::StreamsPer;
use crate::feed::{self, StoredEntry};
use crate::problem::{Problem, ProblemType};
use crate::routes::authenticate;
use crate::state::AppState;

mod live;

use live::{LiveStream, Slots};

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FeedQuery {
    /// A stream id from an earlier page or event: only newer entries.
    pub after: Option<String>,
    /// Default 100, at most `decisions_page_entries_max`.
    pub limit: Option<usize>,
    /// `real` (the default): your transfers; `lab`: the requests your
    /// race-lab runs sent. Each is a stream of its own with its own cap, so
    /// that a lab burst never pushes a real decision out; an `after` id
    /// belongs to one of them.
    pub source: Option<feed::Source>,
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
    let max = state.config.feed.page_entries_max;
    let query = parse_query(request, max)?;
    let items = state
        .feed
        .read_after(
            user,
            query.source.unwrap_or_default(),
            query.after.as_deref(),
            query.limit.unwrap_or(100.min(max)),
        )
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
///
/// A stream ends with `event: end` and a reason when its token is revoked
/// or expires (checked every `decision_stream_token_check_s`), or when it
/// has lived `decision_stream_lifetime_s`; the client reconnects with
/// `Last-Event-ID` and loses nothing.
#[utoipa::path(
    get, path = "/api/v1/decisions/stream", tag = "decisions",
    params(FeedQuery),
    responses(
        (status = 200, description = "text/event-stream"),
    ),
    security(("bearer" = []))
)]
pub async fn stream_decisions(
    request: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, Problem> {
    let caller = authenticate(&request, &state).await?;
    open_stream(&request, &state, caller).await
}

/// The Server-Sent Events response over the caller's stream.
async fn open_stream(
    request: &HttpRequest,
    state: &AppState,
    token: VerifiedToken,
) -> Result<HttpResponse, Problem> {
    let query = parse_query(request, state.config.feed.page_entries_max)?;
    let last_event_id = request
        .headers()
        .get("last-event-id")
        .and_then(|value| value.to_str().ok())
        .filter(|id| feed::is_stream_id(id))
        .map(str::to_owned);
    let slots = claim_slots(request, state, token.user_id)?;
    let unavailable = |error: String| {
        tracing::warn!(error, "could not open a decision stream");
        Problem::unavailable("The decision feed is unavailable. Retry shortly.")
    };
    let mut connection = state
        .feed
        .stream_connection(live::read_timeout(&state.config))
        .await
        .map_err(unavailable)?;
    let key = state
        .feed
        .stream_key(token.user_id, query.source.unwrap_or_default());
    let start = match last_event_id.or(query.after) {
        Some(id) => id,
        None => live::newest_id(&mut connection, &key)
            .await
            .map_err(unavailable)?,
    };
    Ok(LiveStream::new(state, connection, key, start, token, slots).into_response())
}

/// A place for one more stream: within its user's and its address's
/// limits, and the instance's.
fn claim_slots(request: &HttpRequest, state: &AppState, user: UserId) -> Result<Slots, Problem> {
    let feed = &state.config.feed;
    let user_slot =
        StreamsPer::claim(&state.streams_per_user, user, feed.streams_per_user_max).ok_or_else(|| {
            too_many_streams(format!(
                "You have {} live feeds open already. Close one and try again.",
                feed.streams_per_user_max
            ))
        })?;
    let address_slot = match state.account_limits.client_address(request) {
        Some(address) => Some(
            StreamsPer::claim(&state.streams_per_address, address, feed.streams_per_address_max).ok_or_else(
                || {
                    too_many_streams(format!(
                        "{} live feeds are open from your address already. Close one and try again.",
                        feed.streams_per_address_max
                    ))
                },
            )?,
        ),
        None => None,
    };
    let instance_slot = state
        .stream_slots
        .clone()
        .try_acquire_owned()
        .map_err(|_| Problem::unavailable("Too many live streams on this instance. Retry shortly."))?;
    Ok(Slots {
        _instance: instance_slot,
        _user: user_slot,
        _address: address_slot,
    })
}

/// The refusal of a stream over its user's or address's limit.
fn too_many_streams(detail: String) -> Problem {
    Problem::new(ProblemType::TooManyStreams, detail)
        .detail_is_for_people()
        .with_retry_after_s(1)
}
