//! `POST /api/v1/transfers` and the caller's transfer history.
//!
//! The create handler reads top to bottom as the request's path: cheap
//! checks that need no I/O, then layer 1 (cooldown, Redis), then layers 2
//! and 3 (idempotency key and row guard, one PostgreSQL transaction).

use std::time::Instant;

use actix_web::http::StatusCode;
use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::auth::VerifiedToken;
use crate::decision::feed::FeedEntry;
use crate::decision::{Decision, Layer, Outcome};
use crate::defense::cooldown::{self, Cooldown, CooldownLock, CooldownUnavailable};
use crate::defense::idempotency::{IdempotencyKey, StoredResponse};
use crate::domain::{TransferRequest, UserId};
use crate::problem::{self, PROBLEM_CONTENT_TYPE, Problem, ProblemType};
use crate::routes::{authenticate, read_json_body};
use crate::settings::CooldownScope;
use crate::state::AppState;
use crate::telemetry::RequestContext;
use crate::transfer::{self, TransferOutcome};

/// The action name the cooldown window is scoped to.
const COOLDOWN_ACTION: &str = "transfer";

/// Move money from one of your wallets to any other wallet.
#[utoipa::path(
    post, path = "/api/v1/transfers", tag = "transfers",
    request_body = crate::domain::TransferBody,
    params(("Idempotency-Key" = Option<Uuid>, Header,
        description = "A UUID naming this transfer; retries with the same key replay the first response")),
    responses(
        (status = 201, description = "Transferred (or replayed, with Idempotent-Replayed: true)", body = transfer::TransferReceipt),
    ),
    security(("bearer" = []))
)]
pub async fn create_transfer(
    request: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    let context = RequestContext::of(&request);
    let decided = decide(&request, payload, &state, &context).await;
    report(&state, &context, &decided);
    decided.into_response(&context)
}

/// How a transfer request ended: the one decision, the answer, and what
/// the report needs to know.
pub struct Decided {
    pub decision: Decision,
    pub answer: Answer,
    pub user: Option<UserId>,
    pub key: Option<IdempotencyKey>,
}

pub enum Answer {
    /// A response the transaction produced (and stored, with a key): a 201
    /// or a business refusal, fresh or replayed.
    Stored {
        response: StoredResponse,
        replayed: bool,
    },
    /// A refusal that was not stored.
    Refused(Problem),
}

impl Decided {
    fn refused(
        problem: Problem,
        layer: Layer,
        outcome: Outcome,
        user: Option<UserId>,
        key: Option<IdempotencyKey>,
    ) -> Self {
        Self {
            decision: Decision::new(layer, outcome),
            answer: Answer::Refused(problem),
            user,
            key,
        }
    }

    /// Refused, unstored, with a problem of this type.
    pub fn is_refusal(&self, kind: ProblemType) -> bool {
        matches!(&self.answer, Answer::Refused(problem) if problem.kind == kind)
    }

    pub fn status(&self) -> u16 {
        match &self.answer {
            Answer::Stored { response, .. } => response.status,
            Answer::Refused(problem) => problem.status,
        }
    }

    /// The HTTP response, with the `Defense-Decision` header. A refusal's
    /// problem body names the layer and the trace.
    pub fn into_response(self, context: &RequestContext) -> HttpResponse {
        let mut response = match self.answer {
            Answer::Stored { response, replayed } => stored_response(&response, replayed),
            Answer::Refused(problem) => problem
                .with_layer(self.decision.layer)
                .with_trace_id(&context.trace_id)
                .into_response(),
        };
        if let Ok(value) = header::HeaderValue::from_str(&self.decision.header_value()) {
            response
                .headers_mut()
                .insert(header::HeaderName::from_static("defense-decision"), value);
        }
        response
    }
}

/// The API's path: cheap checks, then the layers.
async fn decide(
    request: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
    context: &RequestContext,
) -> Decided {
    // Cheap checks, no I/O: who is calling (a MAC), what they ask, which key.
    let caller = match state.tokens.verify_request(request) {
        Ok(caller) => caller,
        Err(problem) => return Decided::refused(problem, Layer::NoLayer, Outcome::Unauthorized, None, None),
    };
    let user = Some(caller.user_id);
    if let Err(problem) = state.tokens.require_csrf_header(request, &caller) {
        return Decided::refused(problem, Layer::NoLayer, Outcome::Unauthorized, user, None);
    }
    let body = match read_json_body(request, payload, &state.settings).await {
        Ok(body) => body,
        Err(problem) => return Decided::refused(problem, Layer::NoLayer, Outcome::Invalid, user, None),
    };
    let transfer_request = match TransferRequest::parse(&body, state.settings.transfer_amount_minor_max) {
        Ok(parsed) => parsed,
        Err(problem) => return Decided::refused(problem, Layer::NoLayer, Outcome::Invalid, user, None),
    };
    let key = match IdempotencyKey::from_request(request, state.settings.idempotency_key_required) {
        Ok(key) => key,
        Err(problem) => return Decided::refused(problem, Layer::Idempotency, Outcome::Invalid, user, None),
    };
    through_the_layers(state, context, &caller, &transfer_request, key).await
}

/// The idempotency fingerprint of a transfer: the same operation whether it
/// came from a script or the browser's form.
pub fn fingerprint_of(transfer_request: &TransferRequest) -> [u8; 32] {
    transfer_request.fingerprint("POST", "/api/v1/transfers")
}

/// The three layers in order, for a request that passed the cheap checks.
/// Every exit is one decision. Shared by the API and the browser form.
pub async fn through_the_layers(
    state: &AppState,
    context: &RequestContext,
    caller: &VerifiedToken,
    transfer_request: &TransferRequest,
    key: Option<IdempotencyKey>,
) -> Decided {
    let user = Some(caller.user_id);

    // Layer 1: the cooldown lock. A refusal here touches no database.
    let started = Instant::now();
    let cooldown = state
        .cooldown
        .try_acquire(caller, COOLDOWN_ACTION, &transfer_request.canonical_json())
        .await;
    state
        .metrics
        .observe_layer(Layer::Cooldown.as_str(), started.elapsed());
    let (permit, degraded) = match cooldown {
        Ok(Cooldown::Acquired(permit)) => (Some(permit), false),
        Ok(Cooldown::Active {
            retry_after_ms,
            elapsed_ms,
        }) => {
            let problem = cooldown_active(&state.cooldown, retry_after_ms, elapsed_ms);
            return Decided::refused(problem, Layer::Cooldown, Outcome::Rejected, user, key);
        }
        // A dead token speaks for nobody: no window, no entry in the
        // owner's feed.
        Ok(Cooldown::TokenRevoked) => return revoked_token_refused(),
        Ok(Cooldown::PassedWithoutStore) => (None, true),
        Ok(Cooldown::Disabled) => (None, false),
        Err(CooldownUnavailable) => {
            let problem = Problem::unavailable(
                "The cooldown store is unavailable and this deployment fails closed. Retry shortly.",
            );
            return Decided::refused(problem, Layer::Cooldown, Outcome::Error, user, key);
        }
    };

    // Layers 2 and 3: the idempotency claim and the row guard, in one
    // transaction.
    let fingerprint = fingerprint_of(transfer_request);
    let outcome = transfer::execute(
        state,
        caller,
        transfer_request,
        key,
        &fingerprint,
        &context.trace_id,
    )
    .await;
    let mut decided = match outcome {
        Ok(TransferOutcome::Decided {
            response,
            mut decision,
        }) => {
            if degraded && decision.outcome == Outcome::Accepted {
                decision.outcome = Outcome::Degraded;
            }
            Decided {
                decision,
                answer: Answer::Stored {
                    response,
                    replayed: false,
                },
                user,
                key,
            }
        }
        Ok(TransferOutcome::Replayed(response)) => Decided {
            decision: Decision::new(Layer::Idempotency, Outcome::Replayed),
            answer: Answer::Stored {
                response,
                replayed: true,
            },
            user,
            key,
        },
        Ok(TransferOutcome::KeyReused) => {
            Decided::refused(key_reused(), Layer::Idempotency, Outcome::KeyReused, user, key)
        }
        Ok(TransferOutcome::InFlight) => {
            Decided::refused(key_in_flight(), Layer::Idempotency, Outcome::InFlight, user, key)
        }
        Err(refusal) => Decided::refused(
            refusal.problem,
            refusal.decision.layer,
            refusal.decision.outcome,
            user,
            key,
        ),
    };

    // Give the window back when the transfer is known not to have
    // happened and the request should not hold it: our failure that
    // changed nothing (so an honest retry is not blocked for the rest of
    // the TTL), or a token the transaction found revoked (whose owner it
    // must not lock out). When the outcome is unknown the window stays: a
    // keyless retry inside it could pay twice.
    let token_was_dead = decided.is_refusal(ProblemType::Unauthorized);
    let changed_nothing = decided.status() >= 500 && !decided.is_refusal(ProblemType::OutcomeUnknown);
    if changed_nothing || token_was_dead {
        if let Some(permit) = &permit {
            state.cooldown.release(permit).await;
        }
    }
    if token_was_dead {
        decided.user = None;
    }
    decided
}

fn revoked_token_refused() -> Decided {
    Decided::refused(
        Problem::invalid_token("The bearer token has been revoked or has expired."),
        Layer::NoLayer,
        Outcome::Unauthorized,
        None,
        None,
    )
}

/// Reports the decision everywhere, the same way: the request's span, the
/// metrics, one log line and the decision feed. (The response header is
/// added by `Decided::into_response`.)
pub fn report(state: &AppState, context: &RequestContext, decided: &Decided) {
    let Decided {
        decision, user, key, ..
    } = *decided;
    let status = decided.status();
    let latency_ms = context.started.elapsed().as_secs_f64() * 1000.0;
    let span = tracing::Span::current();
    span.record("defense.layer", decision.layer.as_str());
    span.record("defense.outcome", decision.outcome.as_str());
    state.metrics.count_decision(decision);
    tracing::info!(
        decision.layer = decision.layer.as_str(),
        decision.outcome = decision.outcome.as_str(),
        http.status = status,
        latency_ms,
        request.id = %context.request_id,
        trace.id = %context.trace_id,
        user.id = user.map(|user| user.to_string()),
        idempotency.key_hash = key.map(IdempotencyKey::hash_hex),
        instance.id = %state.instance_id,
        "transfer decided"
    );
    if let Some(user) = user {
        state.feed.publish(
            user,
            FeedEntry {
                time: Utc::now(),
                instance_id: state.instance_id.to_string(),
                request_id: context.request_id.clone(),
                trace_id: context.trace_id.clone(),
                idempotency_key: key.map(IdempotencyKey::as_uuid),
                layer: decision.layer,
                outcome: decision.outcome,
                status,
                latency_ms,
            },
        );
    }
}

/// Sends a response exactly as stored: the same status and the same bytes.
fn stored_response(stored: &StoredResponse, replayed: bool) -> HttpResponse {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let content_type = if status.is_success() {
        "application/json"
    } else {
        PROBLEM_CONTENT_TYPE
    };
    let mut response = HttpResponse::build(status);
    response.insert_header((header::CONTENT_TYPE, content_type));
    if replayed {
        response.insert_header(("Idempotent-Replayed", "true"));
    }
    response.body(stored.body.clone())
}

/// The 429, saying what happened and when the next transfer is possible.
fn cooldown_active(cooldown: &CooldownLock, retry_after_ms: u64, elapsed_ms: u64) -> Problem {
    let seconds = cooldown::retry_after_s(retry_after_ms);
    let ago = if elapsed_ms < 1_000 {
        "less than a second ago".to_owned()
    } else {
        format!("{} s ago", elapsed_ms / 1_000)
    };
    let spacing = human_duration(cooldown.ttl_ms());
    let detail = match cooldown.scope() {
        CooldownScope::UserAction => format!(
            "You sent a transfer {ago}. Transfers are spaced at least {spacing} apart so that duplicates cannot \
             slip through. Try again in {seconds} s."
        ),
        CooldownScope::UserActionBody => format!(
            "You sent this same transfer {ago}. Identical transfers are spaced at least {spacing} apart so that \
             duplicates cannot slip through. Try again in {seconds} s."
        ),
    };
    Problem::new(ProblemType::CooldownActive, detail)
        .detail_is_for_people()
        .with_retry_after_s(seconds)
}

/// `5000` → `5 s`, `1500` → `1.5 s`, `300` → `300 ms`.
fn human_duration(ms: u64) -> String {
    match ms {
        ms if ms < 1_000 => format!("{ms} ms"),
        ms if ms % 1_000 == 0 => format!("{} s", ms / 1_000),
        ms => format!("{:.1} s", ms as f64 / 1_000.0),
    }
}

fn key_reused() -> Problem {
    Problem::new(
        ProblemType::IdempotencyKeyReused,
        "This Idempotency-Key was already used for a different request. Use a new key for a new transfer.",
    )
}

fn key_in_flight() -> Problem {
    Problem::new(
        ProblemType::IdempotencyKeyInFlight,
        "A request with this Idempotency-Key is still being processed. Retry shortly to get its result.",
    )
    .with_retry_after_s(1)
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HistoryQuery {
    /// At most `transfers_page_rows_max` (default 100); default 20.
    pub limit: Option<i64>,
    /// A transfer id: return only transfers older than it.
    pub before: Option<Uuid>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct TransferItem {
    pub id: Uuid,
    pub from_wallet_id: Uuid,
    pub to_wallet_id: Uuid,
    pub amount_minor: i64,
    pub created_at: DateTime<Utc>,
    /// `sent` or `received`, from the caller's point of view.
    pub direction: &'static str,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct TransferPage {
    pub items: Vec<TransferItem>,
    /// Pass as `before` to get the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_before: Option<Uuid>,
}

/// Your transfers, sent or received, newest first.
#[utoipa::path(
    get, path = "/api/v1/transfers", tag = "transfers",
    params(HistoryQuery),
    responses(
        (status = 200, body = TransferPage),
    ),
    security(("bearer" = []))
)]
pub async fn list_transfers(
    request: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, Problem> {
    let caller = authenticate(&request, &state).await?;
    let query = web::Query::<HistoryQuery>::from_query(request.query_string())
        .map_err(|error| Problem::validation(format!("Invalid query: {error}.")))?;
    let max = state.settings.transfers_page_rows_max;
    let limit = query.limit.unwrap_or(20.min(max));
    if !(1..=max).contains(&limit) {
        return Err(Problem::validation(format!("limit must be between 1 and {max}.")));
    }
    let rows = list_for_user(&state.db, caller.user_id.0, query.before, limit + 1)
        .await
        .map_err(|error| problem::from_database_error(&error, "listing transfers"))?;
    let has_more = rows.len() as i64 > limit;
    let items: Vec<TransferItem> = rows.into_iter().take(limit as usize).map(to_item).collect();
    let next_before = if has_more {
        items.last().map(|item| item.id)
    } else {
        None
    };
    Ok(HttpResponse::Ok().json(TransferPage { items, next_before }))
}

/// One page of a user's history: sent and received, newest first.
///
/// Each direction is its own bounded index scan (`transfers_from_wallet_idx`,
/// `transfers_to_wallet_idx`, each stopping after `$3` rows past the
/// cursor), merged: an `OR` of the two could use neither index for order and
/// would sort all of a busy wallet's transfers for every page.
///
/// The cursor counts only if it is one of the user's own transfers: another
/// user's transfer id gives the same empty page as an id that does not
/// exist, so it reveals nothing.
pub const HISTORY_PAGE_SQL: &str = "
WITH mine AS (SELECT id FROM wallets WHERE user_id = $1),
cursor AS (
    SELECT 'infinity'::timestamptz AS created_at, 'ffffffff-ffff-ffff-ffff-ffffffffffff'::uuid AS id
    WHERE $2::uuid IS NULL
    UNION ALL
    SELECT t.created_at, t.id FROM transfers t
    WHERE t.id = $2
      AND (t.from_wallet_id IN (SELECT id FROM mine) OR t.to_wallet_id IN (SELECT id FROM mine))
),
page AS (
    SELECT sent.* FROM mine m CROSS JOIN LATERAL (
        SELECT t.id, t.from_wallet_id, t.to_wallet_id, t.amount_minor, t.created_at, true AS sent
        FROM transfers t
        WHERE t.from_wallet_id = m.id
          AND (t.created_at, t.id) < ((SELECT created_at FROM cursor), (SELECT id FROM cursor))
        ORDER BY t.created_at DESC, t.id DESC
        LIMIT $3) sent
    UNION ALL
    SELECT received.* FROM mine m CROSS JOIN LATERAL (
        SELECT t.id, t.from_wallet_id, t.to_wallet_id, t.amount_minor, t.created_at, false AS sent
        FROM transfers t
        WHERE t.to_wallet_id = m.id
          AND (t.created_at, t.id) < ((SELECT created_at FROM cursor), (SELECT id FROM cursor))
        ORDER BY t.created_at DESC, t.id DESC
        LIMIT $3) received
)
SELECT p.id, p.from_wallet_id, p.to_wallet_id, p.amount_minor, p.created_at, p.sent,
       u.name AS counterpart_name
FROM page p
JOIN wallets w ON w.id = CASE WHEN p.sent THEN p.to_wallet_id ELSE p.from_wallet_id END
JOIN users u ON u.id = w.user_id
ORDER BY p.created_at DESC, p.id DESC
LIMIT $3";

/// A row of `HISTORY_PAGE_SQL`.
#[derive(sqlx::FromRow)]
pub struct HistoryRow {
    pub id: Uuid,
    pub from_wallet_id: Uuid,
    pub to_wallet_id: Uuid,
    pub amount_minor: i64,
    pub created_at: DateTime<Utc>,
    /// Sent by the user (else received).
    pub sent: bool,
    /// The other side's name.
    pub counterpart_name: String,
}

/// The transfers touching `user_id`'s wallets, newest first, older than
/// `before` (one of the user's own transfers) when given.
pub async fn list_for_user(
    db: &sqlx::PgPool,
    user_id: Uuid,
    before: Option<Uuid>,
    limit: i64,
) -> Result<Vec<HistoryRow>, sqlx::Error> {
    sqlx::query_as::<_, HistoryRow>(HISTORY_PAGE_SQL)
        .bind(user_id)
        .bind(before)
        .bind(limit)
        .fetch_all(db)
        .await
}

fn to_item(row: HistoryRow) -> TransferItem {
    TransferItem {
        id: row.id,
        from_wallet_id: row.from_wallet_id,
        to_wallet_id: row.to_wallet_id,
        amount_minor: row.amount_minor,
        created_at: row.created_at,
        direction: if row.sent { "sent" } else { "received" },
    }
}

/// One of your transfers. Anyone else's is a 404.
#[utoipa::path(
    get, path = "/api/v1/transfers/{id}", tag = "transfers",
    params(("id" = Uuid, Path)),
    responses(
        (status = 200, body = TransferItem),
    ),
    security(("bearer" = []))
)]
pub async fn get_transfer(
    request: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, Problem> {
    let caller = authenticate(&request, &state).await?;
    let not_found = || Problem::not_found("You have no transfer with this id.");
    let id = crate::domain::parse_uuid(&path.into_inner()).ok_or_else(not_found)?;
    let row = sqlx::query_as::<_, HistoryRow>(
        "SELECT t.id, t.from_wallet_id, t.to_wallet_id, t.amount_minor, t.created_at,
                f.user_id = $2 AS sent,
                CASE WHEN f.user_id = $2 THEN ru.name ELSE fu.name END AS counterpart_name
         FROM transfers t
         JOIN wallets f ON f.id = t.from_wallet_id
         JOIN wallets r ON r.id = t.to_wallet_id
         JOIN users fu ON fu.id = f.user_id
         JOIN users ru ON ru.id = r.user_id
         WHERE t.id = $1 AND (f.user_id = $2 OR r.user_id = $2)",
    )
    .bind(id)
    .bind(caller.user_id.0)
    .fetch_optional(&state.db)
    .await
    .map_err(|error| problem::from_database_error(&error, "reading a transfer"))?
    .ok_or_else(not_found)?;
    Ok(HttpResponse::Ok().json(to_item(row)))
}
