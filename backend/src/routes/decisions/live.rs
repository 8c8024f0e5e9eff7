//! One live decision stream: Server-Sent Events over the caller's Redis
//! stream, from a pinned id on, until the server ends it (`end_event`), the
//! client goes away (actix drops it) or Redis fails.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use actix_web::HttpResponse;
use actix_web::http::header;
use actix_web::web::Bytes;
use tokio::sync::OwnedSemaphorePermit;

use crate::auth::{self, VerifiedToken};
use crate::domain::UserId;
use crate::feed::{self, stream_slots::StreamSlot};
use crate::redis_store::StreamConnection;
use crate::settings::Config;
use crate::shutdown::Draining;
use crate::state::AppState;

/// The places a stream holds while it lives, freed when it ends: one of the
/// instance's, one of its user's and one of its client address's.
pub(super) struct Slots {
    pub _instance: OwnedSemaphorePermit,
    pub _user: StreamSlot<UserId>,
    pub _address: Option<StreamSlot<IpAddr>>,
}

/// What a live stream carries from one read to the next.
pub(super) struct LiveStream {
    connection: StreamConnection,
    key: String,
    /// The last entry id delivered (never `$`: see `newest_id`).
    last_id: String,
    token: VerifiedToken,
    db: sqlx::PgPool,
    draining: Draining,
    config: std::sync::Arc<Config>,
    opened: Instant,
    /// When the stream last delivered an entry (or opened).
    delivered: Instant,
    next_token_check: Instant,
    ended: bool,
    _slots: Slots,
}

impl LiveStream {
    /// A stream of `key` after `start`, for `token`'s holder.
    pub(super) fn new(
        state: &AppState,
        connection: StreamConnection,
        key: String,
        start: String,
        token: VerifiedToken,
        slots: Slots,
    ) -> Self {
        let now = Instant::now();
        Self {
            connection,
            key,
            last_id: start,
            token,
            db: state.db.clone(),
            draining: state.draining.clone(),
            config: state.config.clone(),
            opened: now,
            delivered: now,
            next_token_check: now + state.config.feed.stream_token_check,
            ended: false,
            _slots: slots,
        }
    }

    /// The Server-Sent Events response that carries this stream.
    pub(super) fn into_response(self) -> HttpResponse {
        HttpResponse::Ok()
            .insert_header((header::CONTENT_TYPE, "text/event-stream"))
            .insert_header((header::CACHE_CONTROL, "no-store"))
            // Tells nginx not to buffer the stream.
            .insert_header(("X-Accel-Buffering", "no"))
            .streaming(futures::stream::unfold(self, Self::next_event))
    }

    /// One step: blocks in Redis until new entries arrive or the next check
    /// is due (at most the keep-alive interval), then yields the entries, a
    /// keep-alive comment, or the end; `None` once it has ended.
    async fn next_event(mut self) -> Option<(Result<Bytes, actix_web::Error>, Self)> {
        if self.ended {
            return None;
        }
        if let Some(reason) = self.end_reason().await {
            self.ended = true;
            return Some((Ok(end_event(reason)), self));
        }
        let Some(reply) = self.read_unless_stopping().await else {
            self.ended = true;
            return Some((Ok(end_event("shutdown")), self));
        };
        let streams = match reply {
            Ok(streams) => streams.unwrap_or_default(),
            Err(error) => {
                tracing::info!(error = %error, "decision stream ended");
                return None;
            }
        };
        let chunk = self.deliver(streams);
        Some((Ok(Bytes::from(chunk)), self))
    }

    /// Why the server ends the stream now, if it does.
    async fn end_reason(&mut self) -> Option<&'static str> {
        let feed = &self.config.feed;
        // A stopping instance ends its streams at once, cleanly, rather
        // than hold their connections through the grace and be cut.
        if self.draining.is_draining() {
            return Some("shutdown");
        }
        if self.opened.elapsed() >= feed.stream_lifetime {
            return Some("lifetime");
        }
        if self.delivered.elapsed() >= feed.stream_idle {
            return Some("idle");
        }
        if Instant::now() >= self.next_token_check {
            self.next_token_check = Instant::now() + feed.stream_token_check;
            let still_live = self.token.expires_at > chrono::Utc::now()
                && auth::token_is_live(&self.db, &self.token).await.unwrap_or(false);
            if !still_live {
                return Some("token");
            }
        }
        None
    }

    /// How long the next read may wait: until the keep-alive or the next
    /// check, whichever comes first.
    fn block_ms(&self) -> u64 {
        let feed = &self.config.feed;
        let until_due = self
            .next_token_check
            .min(self.opened + feed.stream_lifetime)
            .min(self.delivered + feed.stream_idle)
            .saturating_duration_since(Instant::now());
        feed.stream_keepalive.min(until_due).as_millis().max(1) as u64
    }

    /// The entries after the stream's last id, waiting up to `block_ms` for
    /// some; `None` if the instance starts stopping first.
    async fn read_unless_stopping(&mut self) -> Option<redis::RedisResult<feed::XreadReply>> {
        let mut command = redis::cmd("XREAD");
        command
            .arg("BLOCK")
            .arg(self.block_ms())
            .arg("COUNT")
            .arg(100)
            .arg("STREAMS")
            .arg(&self.key)
            .arg(&self.last_id);
        tokio::select! {
            reply = command.query_async::<feed::XreadReply>(&mut self.connection) => Some(reply),
            () = self.draining.started() => None,
        }
    }

    /// The events of the entries read, or a keep-alive comment when none
    /// came; the stream moves past them.
    fn deliver(&mut self, streams: Vec<(String, Vec<feed::RawEntry>)>) -> String {
        let mut chunk = String::new();
        for (_, entries) in streams {
            for stored in entries.into_iter().filter_map(feed::decode) {
                let data = serde_json::to_string(&stored.entry).unwrap_or_default();
                chunk.push_str(&format!("id: {}\nevent: decision\ndata: {data}\n\n", stored.id));
                self.last_id = stored.id;
                self.delivered = Instant::now();
            }
        }
        if chunk.is_empty() {
            chunk.push_str(": keep-alive\n\n");
        }
        chunk
    }
}

/// Where "only what comes next" starts: the last entry's id in the stream,
/// or `0-0` when it has none yet. Pinned when the stream opens, because
/// reading from `$` again after a quiet read would skip whatever arrived
/// between two reads.
pub(super) async fn newest_id(connection: &mut StreamConnection, key: &str) -> Result<String, String> {
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

/// The connection a stream reads on: its reads block up to the keep-alive
/// interval, so its timeout allows that and a margin.
pub(super) fn read_timeout(config: &Config) -> Duration {
    config.feed.stream_keepalive + Duration::from_secs(5)
}

/// The last event of a stream that the server ends: `reason` is `token`
/// (revoked or expired: sign in again), `lifetime`, `idle` or `shutdown`
/// (the instance is stopping; reconnect with `Last-Event-ID`).
fn end_event(reason: &str) -> Bytes {
    Bytes::from(format!("event: end\ndata: {{\"reason\":\"{reason}\"}}\n\n"))
}
