//! `/problems/{slug}`: each problem type explained, and the 404 page.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, Responder, web};
use askama::Template;
use askama_web::WebTemplate;

use crate::problem::ProblemType;
use crate::state::AppState;

use super::*;

#[derive(Template, WebTemplate)]
#[template(path = "problem_type.html")]
struct ProblemTypePage {
    chrome: Chrome,
    slug: String,
    heading: String,
    description: &'static str,
    for_people: &'static str,
}

/// `GET /problems/{slug}`: what each problem `type` means.
pub async fn problem_type(
    request: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> impl Responder {
    let slug = path.into_inner();
    let session = site::session(&request, &state).await.ok().flatten();
    let Some(kind) = ProblemType::from_slug(&slug) else {
        return error_page(
            &state,
            session.as_ref(),
            StatusCode::NOT_FOUND,
            "Unknown problem type",
            "There is no problem type by this name.",
        );
    };
    let heading = format!("{} ({})", kind.title(), kind.status().as_u16());
    with_page(
        StatusCode::OK,
        ProblemTypePage {
            chrome: Chrome::new(&state, &heading, session.as_ref()),
            slug,
            heading,
            description: kind.description(),
            for_people: kind.for_people(),
        },
    )
}

/// A person's 404: an HTML page for browsers, problem details otherwise.
pub async fn not_found_page(request: &HttpRequest, state: &AppState) -> HttpResponse {
    let session = site::session(request, state).await.ok().flatten();
    error_page(
        state,
        session.as_ref(),
        StatusCode::NOT_FOUND,
        "Page not found",
        "There is nothing at this address.",
    )
}
