//! The pages and the forms behind them: what every page shares here, and
//! one module per part of the site.

mod account;
mod problem_types;
mod race_lab;
mod wallet;

pub use account::{home, sign_in, sign_in_page, sign_out, sign_up, sign_up_page};
pub use problem_types::{not_found_page, problem_type};
pub use race_lab::{
    feed, fire as fire_race_lab_run, fire_comparison as fire_race_lab_comparison, race_lab,
    show_comparison as show_race_lab_comparison, show_run as show_race_lab_run,
};
pub use wallet::{pay_out, payout_review_shown, review, review_payout, review_shown, transfer, wallet};

use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse};
use askama::Template;
use askama_web::WebTemplate;

use crate::state::AppState;
use crate::web::{self as site, Session};

/// What every page shows around its content.
pub struct Chrome {
    pub title: String,
    pub user: Option<String>,
    /// The session's CSRF token, for the sign-out form and scripts.
    pub csrf: String,
    /// Unsafe demonstration switches in effect; shown on every page.
    pub unsafe_modes: Vec<&'static str>,
}

impl Chrome {
    fn new(state: &AppState, title: &str, session: Option<&Session>) -> Self {
        Self {
            title: title.to_owned(),
            user: session.map(|s| s.name.clone()),
            csrf: session
                .map(|s| state.tokens.csrf_token(&s.token))
                .unwrap_or_default(),
            unsafe_modes: state.config.unsafe_modes(),
        }
    }
}

/// The result of a form submission, as the page states it. Kept with the
/// page it is on, so that a form can redirect to it.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Notice {
    /// `success`, `replayed` or `refused`: the notice's style.
    kind: String,
    /// Which defense decided, for a refusal.
    layer: Option<String>,
    text: String,
}

#[derive(Template, WebTemplate)]
#[template(path = "error.html")]
struct ErrorPage {
    chrome: Chrome,
    status: u16,
    heading: String,
    message: String,
}

/// An error page, with the visitor's signed-in state when it is known.
fn error_page(
    state: &AppState,
    session: Option<&Session>,
    status: StatusCode,
    heading: &str,
    message: &str,
) -> HttpResponse {
    let page = ErrorPage {
        chrome: Chrome::new(state, heading, session),
        status: status.as_u16(),
        heading: heading.to_owned(),
        message: message.to_owned(),
    };
    match page.render() {
        Ok(html) => HttpResponse::build(status)
            .content_type("text/html; charset=utf-8")
            .body(html),
        Err(_) => HttpResponse::build(status)
            .content_type("text/plain; charset=utf-8")
            .body(message.to_owned()),
    }
}

/// The answer to a browser form whose body cannot be read at all (a field
/// missing or mangled): a page for people, never the form parser's own
/// text. Nothing was done with the form. The page cannot look up the
/// session here, so it shows none.
pub fn unreadable_form(error: actix_web::error::UrlencodedError, request: &HttpRequest) -> actix_web::Error {
    tracing::info!(error = %error, path = request.path(), "a browser form could not be read");
    let too_slow = matches!(&error, actix_web::error::UrlencodedError::Payload(payload)
        if crate::body_deadline::is_deadline(payload));
    let response = match request.app_data::<actix_web::web::Data<AppState>>() {
        Some(state) if too_slow => error_page(
            state,
            None,
            StatusCode::REQUEST_TIMEOUT,
            "This form took too long to arrive",
            "Your browser's connection was too slow to send the form, so nothing was done with it. Go back and try \
             again.",
        ),
        Some(state) => error_page(
            state,
            None,
            StatusCode::BAD_REQUEST,
            "This form could not be read",
            "Something in the form your browser sent was missing or damaged, so nothing was done with it. Go back, \
             reload the page and try again.",
        ),
        None => HttpResponse::BadRequest().finish(),
    };
    actix_web::error::InternalError::from_response(error, response).into()
}

fn unavailable(state: &AppState, session: Option<&Session>, error: &sqlx::Error) -> HttpResponse {
    tracing::error!(error = %error, "database error while rendering a page");
    error_page(
        state,
        session,
        StatusCode::SERVICE_UNAVAILABLE,
        "The wallet is unavailable",
        "We could not reach the database. Nothing was changed; please try again in a moment.",
    )
}

/// `GET` on an address that only takes a form's post: the page the form
/// is on, rather than a bare 405.
pub async fn to_wallet() -> HttpResponse {
    redirect("/wallet")
}

/// `GET /race-lab/runs`: the lab, where runs are fired and listed.
pub async fn to_race_lab() -> HttpResponse {
    redirect("/race-lab")
}

fn redirect(to: &str) -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, to.to_owned()))
        .finish()
}

fn with_page(status: StatusCode, page: impl Template) -> HttpResponse {
    match page.render() {
        Ok(html) => HttpResponse::build(status)
            .content_type("text/html; charset=utf-8")
            .body(html),
        Err(error) => {
            tracing::error!(error = %error, "template rendering failed");
            HttpResponse::InternalServerError()
                .content_type("text/plain")
                .body("The page could not be shown.")
        }
    }
}

/// Resolves the session or answers with a redirect to sign-in or an error page.
async fn require_session(request: &HttpRequest, state: &AppState) -> Result<Session, HttpResponse> {
    match site::session(request, state).await {
        Ok(Some(session)) => Ok(session),
        Ok(None) => Err(redirect("/signin")),
        Err(error) => Err(unavailable(state, None, &error)),
    }
}

/// The session behind a form that changes state, with the form's CSRF token
/// checked against it.
async fn session_for_form(
    request: &HttpRequest,
    state: &AppState,
    csrf: &str,
) -> Result<Session, HttpResponse> {
    let session = require_session(request, state).await?;
    if !state.tokens.verify_csrf(&session.token, csrf) {
        return Err(error_page(
            state,
            Some(&session),
            StatusCode::FORBIDDEN,
            "Form expired",
            "This form expired. Go back, reload the page and try again.",
        ));
    }
    Ok(session)
}
