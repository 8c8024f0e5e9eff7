//! `POST /api/v1/transfers` and the caller's transfer history.
//!
//! The create handler is parse → pipeline → answer: the cheap checks that
//! need no I/O (caller, CSRF, body, key), then `transfer::pipeline`, which
//! runs the three layers in order.

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::auth::VerifiedToken;
use crate::auth::lab_pass::PassRefused;
use crate::decision::{Layer, Outcome};
use crate::defense::Refusal;
use crate::domain::TransferRequest;
use crate::ending::{self, Decided};
use crate::feed::EntryPoint;
use crate::problem::{self, Problem, ProblemType};
use crate::race_lab::{self, Switches, transfer_path};
use crate::routes::authenticate;
use crate::routes::cheap_checks::{self, Checked};
use crate::state::AppState;
use crate::telemetry::RequestContext;
use crate::transfer;
use crate::transfer::history::{self, HistoryRow};
use crate::transfer::pipeline;

/// Move money from one of your wallets to any other wallet.
#[utoipa::path(
    post, path = "/api/v1/transfers", tag = "transfers",
    request_body = crate::domain::TransferBody,
    params(("Idempotency-Key" = Option<Uuid>, Header,
        description = "A UUID naming this transfer; retries with the same key replay the first response"),
        ("Race-Lab-Switches" = Option<String>, Header,
        description = "Race lab only: e.g. `cooldown=off, idempotency=check_then_insert, row_guard=read_decide_write, run=<uuid>`. The pattern states the members in that order, `, ` between them; the server reads them in any order, each at most once, with any spaces around `,` and `=`. Honoured only with a valid Race-Lab-Pass, for transfers between the caller's own two race-lab wallets"),
        ("Race-Lab-Pass" = Option<String>, Header,
        description = "Race lab only: the pass a race-lab run mints for each request it sends, bound to the caller, the run, the shot and the switches, accepted once before it expires. Other clients cannot make one")),
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
    ending::report(&state, &context, &decided);
    decided.into_response(&context)
}

/// The API's path: cheap checks, then the layers; a race-lab run's
/// request, with its switches, goes beside them (`race_lab::transfer_path`).
async fn decide(
    request: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
    context: &RequestContext,
) -> Decided {
    let amount_minor_max = state.config.money.transfer_amount_minor_max;
    let parse = |body: &[u8]| TransferRequest::parse(body, amount_minor_max);
    let checked =
        match cheap_checks::climb(request, payload, state, EntryPoint::Transfer, |_| None, parse).await {
            Ok(checked) => checked,
            Err(decided) => return decided,
        };
    let Checked {
        caller,
        request: transfer_request,
        key,
    } = checked;
    match lab_switches(request, state, &caller) {
        Ok(None) => pipeline::through_the_layers(state, context, &caller, &transfer_request, key).await,
        // Boxed: the lab's path (its sandbox query, the weakened variants)
        // has a future many kilobytes large, which every production
        // transfer's future would otherwise carry and copy.
        Ok(Some(switches)) => {
            Box::pin(transfer_path::through_the_layers(
                state,
                context,
                &caller,
                &transfer_request,
                key,
                switches,
            ))
            .await
        }
        Err(problem) => {
            let outcome = match problem.kind {
                ProblemType::LabPassInvalid => Outcome::Unauthorized,
                _ => Outcome::Invalid,
            };
            let refusal = Refusal::new(problem, Layer::NoLayer, outcome);
            Decided::refused(EntryPoint::Transfer, refusal, Some(caller.user_id)).with_key(key)
        }
    }
}

/// A race-lab request's switches, from its `Race-Lab-Switches` header,
/// honoured only with a pass this instance's own burst minted for the
/// caller and this run (`race_lab::pass`). Refused here, before the
/// cooldown, so a forged header never reaches a store.
fn lab_switches(
    request: &HttpRequest,
    state: &AppState,
    caller: &VerifiedToken,
) -> Result<Option<Switches>, Problem> {
    let Some(value) = crate::headers::single(request, race_lab::switches::HEADER)? else {
        return Ok(None);
    };
    if !state.config.race_lab.switches_enabled {
        return Err(Problem::new(
            ProblemType::RaceLabSwitchesOff,
            "This deployment does not let race-lab requests switch layers off. Nothing was changed.",
        ));
    }
    let value = value.to_str().unwrap_or_default();
    let switches = Switches::parse(value).ok_or_else(|| {
        Problem::new(
            ProblemType::ValidationFailed,
            "Race-Lab-Switches must read like \"cooldown=off, idempotency=check_then_insert, \
             row_guard=read_decide_write\" (each optional). Nothing was changed.",
        )
    })?;
    let pass =
        crate::headers::single(request, crate::auth::lab_pass::HEADER)?.and_then(|pass| pass.to_str().ok());
    let accepted = state
        .lab_passes
        .accept(caller.user_id, pass, value)
        .and_then(|run| {
            (switches.run == Some(run))
                .then_some(switches)
                .ok_or(PassRefused::Forged)
        });
    accepted.map(Some).map_err(|refused| {
        if refused == PassRefused::Full {
            tracing::warn!("the race lab's used passes are at race_lab_passes_held_max");
            return Problem::unavailable("The race lab is busy. Nothing was changed; fire again in a few seconds.");
        }
        tracing::warn!(reason = %refused, "refused race-lab switches without a valid pass");
        Problem::new(
            ProblemType::LabPassInvalid,
            "Race-Lab-Switches are honoured only on the requests a race-lab run sends itself. Nothing was changed.",
        )
    })
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
    let max = state.config.money.transfers_page_rows_max;
    let limit = query.limit.unwrap_or(20.min(max));
    if !(1..=max).contains(&limit) {
        return Err(Problem::validation(format!("limit must be between 1 and {max}.")));
    }
    let rows = history::list_for_user(&state.db, caller.user_id.0, query.before, limit + 1)
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
    let row = history::find_for_user(&state.db, caller.user_id.0, id)
        .await
        .map_err(|error| problem::from_database_error(&error, "reading a transfer"))?
        .ok_or_else(not_found)?;
    Ok(HttpResponse::Ok().json(to_item(row)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future a handler returns when called with `F`'s
    /// arguments: what actix-web allocates and copies for every request.
    fn future_bytes<A, B, C, Running, F: Fn(A, B, C) -> Running>(_: F) -> usize {
        std::mem::size_of::<Running>()
    }

    /// Every transfer's future is allocated and copied whole, whatever path
    /// it takes. The paths a production transfer never takes (the race
    /// lab's, the weakened variants, the executors' fallback) are boxed
    /// where they branch off; inline, they made it 17 KiB, and the copy and
    /// the large allocation a sizeable share of a transfer's CPU.
    #[test]
    fn a_transfers_future_does_not_carry_the_paths_it_does_not_take() {
        let bytes = future_bytes::<HttpRequest, web::Payload, web::Data<AppState>, _, _>(create_transfer);
        assert!(bytes <= 4096, "create_transfer's future is {bytes} bytes");
    }
}
