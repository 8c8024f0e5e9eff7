//! The caller's decision feed: `GET /api/v1/decisions?after=` for recent
//! entries and `GET /api/v1/decisions/stream` for a live Server-Sent Events
//! stream, each of real transfers or, with `?source=lab`, of race-lab runs. Both read the shared Redis streams, so they show the decisions of
//! every instance. A user sees only their own. The browser's live feed page
//! calls the same endpoints, authenticated by its session cookie.

use std::time::{Duration, Instant};

use actix_web::http::header;
use actix_web::web::Bytes;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};

use tokio::sync::OwnedSemaphorePermit;

use crate::auth::{self, VerifiedToken};
use crate::domain::UserId;
use crate::feed::stream_slots::{StreamSlot, StreamsPer};
use crate::feed::{self, StoredEntry};
use crate::problem::{Problem, ProblemType};
use crate::redis_store::StreamConnection;
use crate::routes::authenticate;
use crate::state::AppState;

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

/// What a live stream carries from one read to the next.
struct LiveStream {
    connection: StreamConnection,
    /// The last entry id delivered (never `$`: see `open_stream`).
    last_id: String,
    token: VerifiedToken,
    opened: Instant,
    /// When the stream last delivered an entry (or opened).
    delivered: Instant,
    next_token_check: Instant,
    ended: bool,
    _slots: (
        OwnedSemaphorePermit,
        StreamSlot<crate::domain::UserId>,
        Option<StreamSlot<std::net::IpAddr>>,
    ),
}

/// The Server-Sent Events response over the caller's stream.
async fn open_stream(
    request: &HttpRequest,
    state: &AppState,
    token: VerifiedToken,
) -> Result<HttpResponse, Problem> {
    let config = state.config.clone();
    let query = parse_query(request, config.feed.page_entries_max)?;
    let last_event_id = request
        .headers()
        .get("last-event-id")
        .and_then(|value| value.to_str().ok())
        .filter(|id| feed::is_stream_id(id))
        .map(str::to_owned);

    let user_slot = StreamsPer::claim(
        &state.streams_per_user,
        token.user_id,
        config.feed.streams_per_user_max,
    )
    .ok_or_else(|| {
        Problem::new(
            ProblemType::TooManyStreams,
            format!(
                "You have {} live feeds open already. Close one and try again.",
                config.feed.streams_per_user_max
            ),
        )
        .detail_is_for_people()
        .with_retry_after_s(1)
    })?;
    let address_slot = match state.account_limits.client_address(request) {
        Some(address) => Some(
            StreamsPer::claim(
                &state.streams_per_address,
                address,
                config.feed.streams_per_address_max,
            )
            .ok_or_else(|| {
                Problem::new(
                    ProblemType::TooManyStreams,
                    format!(
                        "{} live feeds are open from your address already. Close one and try again.",
                        config.feed.streams_per_address_max
                    ),
                )
                .detail_is_for_people()
                .with_retry_after_s(1)
            })?,
        ),
        None => None,
    };
    let slot = state
        .stream_slots
        .clone()
        .try_acquire_owned()
        .map_err(|_| Problem::unavailable("Too many live streams on this instance. Retry shortly."))?;
    let keepalive = config.feed.stream_keepalive;
    let unavailable = |error: String| {
        tracing::warn!(error, "could not open a decision stream");
        Problem::unavailable("The decision feed is unavailable. Retry shortly.")
    };
    let mut connection = state
        .feed
        .stream_connection(keepalive + Duration::from_secs(5))
        .await
        .map_err(unavailable)?;
    let key = state
        .feed
        .stream_key(token.user_id, query.source.unwrap_or_default());
    // "Only what comes next" is pinned to the stream's current last id now:
    // reading from `$` again after a quiet read would skip whatever arrived
    // between two reads.
    let start = match last_event_id.or(query.after) {
        Some(id) => id,
        None => newest_id(&mut connection, &key).await.map_err(unavailable)?,
    };

    let token_check = config.feed.stream_token_check;
    let lifetime = config.feed.stream_lifetime;
    let idle = config.feed.stream_idle;
    let db = state.db.clone();
    let draining = state.draining.clone();
    let now = Instant::now();
    let live = LiveStream {
        connection,
        last_id: start,
        token,
        opened: now,
        delivered: now,
        next_token_check: now + token_check,
        ended: false,
        _slots: (slot, user_slot, address_slot),
    };

    // Each step blocks in Redis until new entries arrive or the next check
    // is due (at most the keep-alive interval), then yields the entries, a
    // keep-alive comment, or the end. The stream also ends when the client
    // goes away (actix drops it) or Redis fails.
    let events = futures::stream::unfold(live, move |mut live| {
        let key = key.clone();
        let db = db.clone();
        let draining = draining.clone();
        async move {
            if live.ended {
                return None;
            }
            // A stopping instance ends its streams at once, cleanly, rather
            // than hold their connections through the grace and be cut.
            if draining.is_draining() {
                live.ended = true;
                return Some((Ok(end_event("shutdown")), live));
            }
            if live.opened.elapsed() >= lifetime {
                live.ended = true;
                return Some((Ok(end_event("lifetime")), live));
            }
            if live.delivered.elapsed() >= idle {
                live.ended = true;
                return Some((Ok(end_event("idle")), live));
            }
            if Instant::now() >= live.next_token_check {
                live.next_token_check = Instant::now() + token_check;
                let still_live = live.token.expires_at > chrono::Utc::now()
                    && auth::token_is_live(&db, &live.token).await.unwrap_or(false);
                if !still_live {
                    live.ended = true;
                    return Some((Ok(end_event("token")), live));
                }
            }
            let until_due = live
                .next_token_check
                .min(live.opened + lifetime)
                .min(live.delivered + idle)
                .saturating_duration_since(Instant::now());
            let block_ms = keepalive.min(until_due).as_millis().max(1) as u64;
            let Some(reply) = read_unless_stopping(&mut live, &key, block_ms, &draining).await else {
                live.ended = true;
                return Some((Ok(end_event("shutdown")), live));
            };
            let streams = match reply {
                Ok(streams) => streams.unwrap_or_default(),
                Err(error) => {
                    tracing::info!(error = %error, "decision stream ended");
                    return None;
                }
            };
            let mut chunk = String::new();
            for (_, entries) in streams {
                for stored in entries.into_iter().filter_map(feed::decode) {
                    let data = serde_json::to_string(&stored.entry).unwrap_or_default();
                    chunk.push_str(&format!("id: {}\nevent: decision\ndata: {data}\n\n", stored.id));
                    live.last_id = stored.id;
                    live.delivered = Instant::now();
                }
            }
            if chunk.is_empty() {
                chunk.push_str(": keep-alive\n\n");
            }
            Some((Ok::<_, actix_web::Error>(Bytes::from(chunk)), live))
        }
    });
    Ok(HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "text/event-stream"))
        .insert_header((header::CACHE_CONTROL, "no-store"))
        // Tells nginx not to buffer the stream.
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(events))
}

/// The entries after the stream's last id, waiting up to `block_ms` for
/// some; `None` if the instance starts stopping first.
async fn read_unless_stopping(
    live: &mut LiveStream,
    key: &str,
    block_ms: u64,
    draining: &crate::shutdown::Draining,
) -> Option<redis::RedisResult<feed::XreadReply>> {
    let mut command = redis::cmd("XREAD");
    command
        .arg("BLOCK")
        .arg(block_ms)
        .arg("COUNT")
        .arg(100)
        .arg("STREAMS")
        .arg(key)
        .arg(&live.last_id);
    tokio::select! {
        reply = command.query_async::<feed::XreadReply>(&mut live.connection) => Some(reply),
        () = draining.started() => None,
    }
}

/// The last entry's id in the stream, or `0-0` when it has none yet.
async fn newest_id(connection: &mut StreamConnection, key: &str) -> Result<String, String> {
    let newest: Vec<feed::RawEntry> = redis::cmd("XREVRANGE")
        .arg(key)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query_async(connection)
        .await
        .map_err(|error| error.to_string())?;
    Ok(newest
        .into_iter()
        .next()
        .map_or_else(|| "0-0".to_owned(), |(id, _)| id))
}

/// The last event of a stream that the server ends: `reason` is `token`
/// (revoked or expired: sign in again), `lifetime`, `idle` or `shutdown`
/// (the instance is stopping; reconnect with `Last-Event-ID`).
fn end_event(reason: &str) -> Bytes {
    Bytes::from(format!("event: end\ndata: {{\"reason\":\"{reason}\"}}\n\n"))
}
