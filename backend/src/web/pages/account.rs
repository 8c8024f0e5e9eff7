//! Signing up, in and out: the account pages and their forms.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use askama_web::WebTemplate;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use crate::problem::Problem;
use crate::routes::users::{self, Credentials};
use crate::state::AppState;
use crate::web::{self as site};

use super::*;

#[derive(Template, WebTemplate)]
#[template(path = "account.html")]
struct AccountPage {
    chrome: Chrome,
    /// `signin` or `signup`.
    form: &'static str,
    csrf: String,
    name: String,
    error: Option<String>,
}

#[derive(Template, WebTemplate)]
#[template(path = "home.html")]
struct HomePage {
    chrome: Chrome,
    demo_recipient: String,
}

/// `/`: what the three layers are, in one picture, and the way in.
pub async fn home(request: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    // A database that cannot be asked does not stop the page: it is shown
    // as to a visitor who is not signed in.
    let session = site::session(&request, &state).await.ok().flatten();
    with_page(
        StatusCode::OK,
        HomePage {
            chrome: Chrome::new(&state, "Three defenses against paying twice", session.as_ref()),
            demo_recipient: state.config.demo.recipient_name.clone(),
        },
    )
}

fn account_page(
    request: &HttpRequest,
    state: &AppState,
    form: &'static str,
    name: String,
    error: Option<String>,
    status: StatusCode,
) -> HttpResponse {
    let (csrf, new_cookie) = site::pre_session_csrf(request, &state.tokens);
    let title = if form == "signin" {
        "Sign in"
    } else {
        "Create an account"
    };
    let mut response = with_page(
        status,
        AccountPage {
            chrome: Chrome::new(state, title, None),
            form,
            csrf,
            name,
            error,
        },
    );
    if let Some(cookie) = new_cookie {
        let _ = response.add_cookie(&cookie);
    }
    response
}

pub async fn sign_in_page(request: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    account_page(&request, &state, "signin", String::new(), None, StatusCode::OK)
}

pub async fn sign_up_page(request: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    account_page(&request, &state, "signup", String::new(), None, StatusCode::OK)
}

/// Every field defaults to empty, so a tampered form gets a page that
/// says what is wrong rather than a bare 400.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct AccountForm {
    name: String,
    password: String,
    csrf: String,
}

fn signed_in(request: &HttpRequest, state: &AppState, token: &SecretString) -> HttpResponse {
    let mut response = redirect("/wallet");
    let _ = response.add_cookie(&site::session_cookie(
        request,
        token.expose_secret(),
        state.config.accounts.api_token_ttl,
    ));
    response
}

pub async fn sign_in(
    request: HttpRequest,
    form: web::Form<AccountForm>,
    state: web::Data<AppState>,
) -> HttpResponse {
    account_form(&request, &state, "signin", form.into_inner()).await
}

pub async fn sign_up(
    request: HttpRequest,
    form: web::Form<AccountForm>,
    state: web::Data<AppState>,
) -> HttpResponse {
    account_form(&request, &state, "signup", form.into_inner()).await
}

/// Both account forms: check the pre-session CSRF token, then sign in (an
/// existing user) or sign up (a new one) through the API's own functions,
/// and either set the session cookie or show the form again with the reason.
async fn account_form(
    request: &HttpRequest,
    state: &AppState,
    form_kind: &'static str,
    form: AccountForm,
) -> HttpResponse {
    let again = |error: String, status| {
        account_page(request, state, form_kind, form.name.clone(), Some(error), status)
    };
    if !site::pre_session_csrf_ok(request, &state.tokens, &form.csrf) {
        return again(
            "This form expired. Please try again.".to_owned(),
            StatusCode::FORBIDDEN,
        );
    }
    let credentials = Credentials {
        name: form.name.clone(),
        password: SecretString::from(form.password.clone()),
    };
    let limits = &state.account_limits;
    let token: Result<SecretString, Problem> = async {
        if form_kind == "signin" {
            Ok(users::sign_in_within_limits(state, request, credentials)
                .await?
                .token)
        } else {
            let name = credentials.validate(&state.config)?;
            limits.check_sign_up(request, &name.key).await?;
            let signed_up = users::create_user(state, &name, credentials.password).await?;
            Ok(SecretString::from(signed_up.token))
        }
    }
    .await;
    match token {
        Ok(token) => signed_in(request, state, &token),
        Err(problem) => again(problem.for_people().to_owned(), problem.status_code()),
    }
}

/// Every field defaults to empty, so a tampered form gets a page that
/// says what is wrong rather than a bare 400.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct CsrfForm {
    csrf: String,
}

pub async fn sign_out(
    request: HttpRequest,
    form: web::Form<CsrfForm>,
    state: web::Data<AppState>,
) -> HttpResponse {
    let session = match session_for_form(&request, &state, &form.csrf).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    if let Err(error) = users::revoke(&state, &session.token).await {
        return unavailable(&state, Some(&session), &error);
    }
    let mut response = redirect("/signin");
    let _ = response.add_cookie(&site::expired_session_cookie());
    response
}
