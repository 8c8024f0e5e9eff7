//! `GET /commands/{id}` on the admin listener: a broker command's outcome,
//! for its issuer and for operators. The admin listener is the internal
//! network's, like the command streams themselves.

use actix_web::http::header;
use actix_web::{HttpResponse, web};

use crate::command::outcome;
use crate::problem::{self, Problem};
use crate::state::AppState;

/// The stored result (`{"command_id","issuer","outcome",…}`), or 404 while
/// the command has none: not published, not yet applied, or forgotten
/// after `inbox_retention_hours`.
pub async fn command_outcome(path: web::Path<String>, state: web::Data<AppState>) -> HttpResponse {
    let command_id = path.into_inner();
    match outcome::outcome_of(&state.db, &command_id).await {
        Ok(Some(stored)) => HttpResponse::Ok()
            .insert_header((header::CONTENT_TYPE, "application/json"))
            .body(stored.result),
        Ok(None) => Problem::not_found(
            "No outcome is stored for this command id: it was not published, is not applied yet, or is older than \
             inbox_retention_hours.",
        )
        .into_response(),
        Err(error) => problem::from_database_error(&error, "reading a command's outcome").into_response(),
    }
}
