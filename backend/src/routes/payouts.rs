//! `POST /api/v1/payouts`, and the caller's payouts.
//!
//! The create handler is parse → pipeline → answer, as a transfer's is:
//! the cheap checks that need no I/O (caller, CSRF, body, key), then
//! `payout::pipeline`, which runs the three layers in order and answers
//! `202 Accepted`: the gateway is asked afterwards, by the dispatcher.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::ending::{self, Decided};
use crate::feed::EntryPoint;
use crate::payout::pipeline;
use crate::payout::{Payout, PayoutRequest};
use crate::payout_columns;
use crate::problem::{self, Problem};
use crate::routes::authenticate;
use crate::routes::cheap_checks::{self, Checked};
use crate::state::AppState;
use crate::telemetry::RequestContext;

/// The body of `POST /api/v1/payouts` (documentation only).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct PayoutBody {
    pub from_wallet_id: Uuid,
    /// Minor units, at most `payout_amount_minor_max`.
    pub amount_minor: i64,
    /// The bank account's reference at the gateway: 1 to 64 letters,
    /// digits and `_ . : -`.
    pub destination: String,
}

/// Pay money out of one of your wallets to a bank account.
#[utoipa::path(
    post, path = "/api/v1/payouts", tag = "payouts",
    request_body = PayoutBody,
    params(("Idempotency-Key" = Option<Uuid>, Header,
        description = "A UUID naming this payout; retries with the same key replay the first response")),
    responses(
        (status = 202, description = "Held and queued for the bank gateway (or replayed, with Idempotent-Replayed: true); Location names the payout", body = crate::payout::PayoutReceipt),
    ),
    security(("bearer" = []))
)]
pub async fn create_payout(
    request: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    let context = RequestContext::of(&request);
    let decided = decide(&request, payload, &state, &context).await;
    ending::report(&state, &context, &decided);
    decided.into_response(&context)
}

/// The API's path: cheap checks, then the layers.
async fn decide(
    request: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
    context: &RequestContext,
) -> Decided {
    let closed = |state: &AppState| (!state.config.payouts.offered()).then(pipeline::not_offered);
    let amount_minor_max = state.config.payouts.amount_minor_max;
    let parse = |body: &[u8]| PayoutRequest::parse(body, amount_minor_max);
    match cheap_checks::climb(request, payload, state, EntryPoint::Payout, closed, parse).await {
        Ok(Checked { caller, request, key }) => {
            pipeline::through_the_layers(state, context, &caller, request, key).await
        }
        Err(decided) => decided,
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PayoutsQuery {
    /// At most `transfers_page_rows_max` (default 100); default 20.
    pub limit: Option<i64>,
    /// A payout id: return only payouts older than it.
    pub before: Option<Uuid>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct PayoutPage {
    pub items: Vec<Payout>,
    /// Pass as `before` to get the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_before: Option<Uuid>,
}

/// Your payouts, newest first, each in its current state.
#[utoipa::path(
    get, path = "/api/v1/payouts", tag = "payouts",
    params(PayoutsQuery),
    responses((status = 200, body = PayoutPage)),
    security(("bearer" = []))
)]
pub async fn list_payouts(request: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, Problem> {
    let caller = authenticate(&request, &state).await?;
    let query = web::Query::<PayoutsQuery>::from_query(request.query_string())
        .map_err(|error| Problem::validation(format!("Invalid query: {error}.")))?;
    let max = state.config.money.transfers_page_rows_max;
    let limit = query.limit.unwrap_or(20.min(max));
    if !(1..=max).contains(&limit) {
        return Err(Problem::validation(format!("limit must be between 1 and {max}.")));
    }
    let items = list_for_user(&state.db, caller.user_id.0, query.before, limit + 1)
        .await
        .map_err(|error| problem::from_database_error(&error, "listing payouts"))?;
    let has_more = items.len() as i64 > limit;
    let items: Vec<Payout> = items.into_iter().take(limit as usize).collect();
    let next_before = if has_more {
        items.last().map(|item| item.id)
    } else {
        None
    };
    Ok(HttpResponse::Ok().json(PayoutPage { items, next_before }))
}

/// A person's payouts, newest first, before the one named, if any. The
/// race lab's payouts of lab money are the lab's, never listed here.
///
/// The cursor counts only if it is one of the person's own listed
/// payouts: another person's payout id gives the same empty page as an id
/// that does not exist, so it reveals nothing (not even when it was made).
pub async fn list_for_user(
    db: &sqlx::PgPool,
    user: Uuid,
    before: Option<Uuid>,
    limit: i64,
) -> Result<Vec<Payout>, sqlx::Error> {
    sqlx::query_as(concat!(
        "SELECT ",
        payout_columns!(),
        " FROM payouts
          WHERE user_id = $1 AND currency <> 'LAB'
            AND ($2::uuid IS NULL OR (created_at, id) < (
                SELECT created_at, id FROM payouts WHERE id = $2 AND user_id = $1 AND currency <> 'LAB'))
          ORDER BY created_at DESC, id DESC
          LIMIT $3"
    ))
    .bind(user)
    .bind(before)
    .bind(limit)
    .fetch_all(db)
    .await
}

/// One of your payouts, in its current state. Anyone else's is a 404.
#[utoipa::path(
    get, path = "/api/v1/payouts/{id}", tag = "payouts",
    params(("id" = Uuid, Path)),
    responses((status = 200, body = Payout)),
    security(("bearer" = []))
)]
pub async fn get_payout(
    request: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, Problem> {
    let caller = authenticate(&request, &state).await?;
    let not_found = || Problem::not_found("You have no payout with this id.");
    let id = crate::domain::parse_uuid(&path.into_inner()).ok_or_else(not_found)?;
    let payout: Payout = sqlx::query_as(concat!(
        "SELECT ",
        payout_columns!(),
        " FROM payouts WHERE id = $1 AND user_id = $2 AND currency <> 'LAB'"
    ))
    .bind(id)
    .bind(caller.user_id.0)
    .fetch_optional(&state.db)
    .await
    .map_err(|error| problem::from_database_error(&error, "reading a payout"))?
    .ok_or_else(not_found)?;
    Ok(HttpResponse::Ok().json(payout))
}
