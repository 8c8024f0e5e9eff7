//! The race lab and the live feed pages.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use askama_web::WebTemplate;
use serde::Deserialize;
use uuid::Uuid;

use crate::state::AppState;
use crate::web::money;

use super::wallet::resolve_recipient;
use super::*;

#[derive(Template, WebTemplate)]
#[template(path = "race_lab.html")]
struct RaceLabPage {
    chrome: Chrome,
    wallet_id: Uuid,
    balance: String,
    currency: String,
    trace_ui_url: String,
    safe: bool,
    amount_pattern: &'static str,
}

#[derive(Template, WebTemplate)]
#[template(path = "feed.html")]
struct FeedPage {
    chrome: Chrome,
}

pub async fn race_lab(request: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let session = match require_session(&request, &state).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    with_page(
        StatusCode::OK,
        RaceLabPage {
            chrome: Chrome::new(&state, "Race lab", Some(&session)),
            wallet_id: session.wallet_id,
            balance: money::format(session.balance_minor, &session.currency),
            currency: session.currency.clone(),
            trace_ui_url: state.settings.trace_ui_url.clone(),
            safe: state.settings.unsafe_modes().is_empty(),
            amount_pattern: money::AMOUNT_PATTERN,
        },
    )
}

pub async fn feed(request: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    match require_session(&request, &state).await {
        Ok(session) => with_page(
            StatusCode::OK,
            FeedPage {
                chrome: Chrome::new(&state, "Live feed", Some(&session)),
            },
        ),
        Err(response) => response,
    }
}

#[derive(Deserialize)]
pub struct RecipientQuery {
    name: String,
}

/// `GET /race-lab/recipient?name=`: the race lab's name → wallet id lookup.
pub async fn recipient(
    request: HttpRequest,
    query: web::Query<RecipientQuery>,
    state: web::Data<AppState>,
) -> HttpResponse {
    if let Err(response) = require_session(&request, &state).await {
        return response;
    }
    match resolve_recipient(&state, query.name.trim()).await {
        Ok(Some((wallet_id, _))) => HttpResponse::Ok().json(serde_json::json!({ "wallet_id": wallet_id })),
        Ok(None) => HttpResponse::NotFound().json(serde_json::json!({ "error": "no such user" })),
        Err(error) => unavailable(&state, &error),
    }
}
