//! The browser demo: server-rendered pages (askama templates under
//! `web/templates`) and a little plain JavaScript (`web/static`, compiled
//! into the binary so the demo works offline and from any directory).
//!
//! Sessions: signing in stores a bearer token in the `lw_session` cookie
//! (`HttpOnly`, `SameSite=Strict`, `Secure` over TLS). Every form that
//! changes state carries a CSRF token: before sign-in a double-submit
//! cookie, after it a MAC of the session. The race lab and the live feed
//! call the same REST endpoints as API clients, authenticated by that
//! cookie (and, for transfers, the CSRF header).

use crate::auth::TokenSigner;
use actix_web::cookie::{Cookie, SameSite, time};
use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};

use crate::auth::{self, VerifiedToken};
use crate::state::AppState;

pub mod money;
pub mod pages;

/// The double-submit cookie that protects the forms shown before sign-in.
const PRE_SESSION_CSRF_COOKIE: &str = "lw_csrf";

/// The signed-in user behind a request's session cookie.
pub struct Session {
    pub token: VerifiedToken,
    pub name: String,
    pub wallet_id: uuid::Uuid,
    pub balance_minor: i64,
    pub currency: String,
}

/// The session, if the cookie holds a live token. One query.
pub async fn session(request: &HttpRequest, state: &AppState) -> Result<Option<Session>, sqlx::Error> {
    let Some(cookie) = request.cookie(auth::SESSION_COOKIE) else {
        return Ok(None);
    };
    let Ok(token) = state.tokens.verify(cookie.value()) else {
        return Ok(None);
    };
    let token = VerifiedToken {
        via_session: true,
        ..token
    };
    let row = sqlx::query_as::<_, (String, uuid::Uuid, i64, String)>(
        "SELECT u.name, w.id, w.balance_minor, w.currency
         FROM api_tokens t
         JOIN users u ON u.id = t.user_id
         JOIN wallets w ON w.user_id = u.id AND w.lab_slot IS NULL
         WHERE t.token_hash = $1 AND t.user_id = $2 AND t.expires_at > now()
         ORDER BY w.created_at LIMIT 1",
    )
    .bind(&token.hash[..])
    .bind(token.user_id.0)
    .fetch_optional(&state.db)
    .await?;
    Ok(row.map(|(name, wallet_id, balance_minor, currency)| Session {
        token,
        name,
        wallet_id,
        balance_minor,
        currency,
    }))
}

/// Whether this deployment's cookies carry `Secure` (`cookies_secure`).
/// Not the request's scheme: `X-Forwarded-Proto` is any client's to send.
fn cookies_secure(request: &HttpRequest) -> bool {
    request
        .app_data::<web::Data<AppState>>()
        .is_some_and(|state| state.config.http.cookies_secure)
}

/// The session cookie for a fresh token; `Secure` per `cookies_secure`.
pub fn session_cookie(request: &HttpRequest, token: &str, ttl: chrono::TimeDelta) -> Cookie<'static> {
    Cookie::build(auth::SESSION_COOKIE, token.to_owned())
        .path("/")
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(cookies_secure(request))
        .max_age(time::Duration::seconds(ttl.num_seconds()))
        .finish()
}

pub fn expired_session_cookie() -> Cookie<'static> {
    let mut cookie = Cookie::build(auth::SESSION_COOKIE, "")
        .path("/")
        .http_only(true)
        .finish();
    cookie.make_removal();
    cookie
}

/// The pre-session CSRF value: the cookie's when this server made it, or a
/// new one to set.
pub fn pre_session_csrf(request: &HttpRequest, tokens: &TokenSigner) -> (String, Option<Cookie<'static>>) {
    if let Some(cookie) = request.cookie(PRE_SESSION_CSRF_COOKIE)
        && tokens.pre_session_csrf_is_ours(cookie.value())
    {
        return (cookie.value().to_owned(), None);
    }
    let value = tokens.pre_session_csrf();
    let cookie = Cookie::build(PRE_SESSION_CSRF_COOKIE, value.clone())
        .path("/")
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(cookies_secure(request))
        .finish();
    (value, Some(cookie))
}

/// A form posted before sign-in carries the cookie's value, and this
/// server made that value.
pub fn pre_session_csrf_ok(request: &HttpRequest, tokens: &TokenSigner, presented: &str) -> bool {
    request.cookie(PRE_SESSION_CSRF_COOKIE).is_some_and(|cookie| {
        constant_time_eq(cookie.value().as_bytes(), presented.as_bytes())
            && tokens.pre_session_csrf_is_ours(cookie.value())
    })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

const APP_CSS: &str = include_str!("../../../web/static/app.css");
const RACE_LAB_JS: &str = include_str!("../../../web/static/race-lab.js");
const FEED_JS: &str = include_str!("../../../web/static/feed.js");
const COUNTDOWN_JS: &str = include_str!("../../../web/static/countdown.js");

/// The static assets, compiled in.
pub async fn static_file(path: web::Path<String>) -> HttpResponse {
    let (body, content_type) = match path.as_str() {
        "app.css" => (APP_CSS, "text/css; charset=utf-8"),
        "race-lab.js" => (RACE_LAB_JS, "text/javascript; charset=utf-8"),
        "feed.js" => (FEED_JS, "text/javascript; charset=utf-8"),
        "countdown.js" => (COUNTDOWN_JS, "text/javascript; charset=utf-8"),
        _ => {
            return HttpResponse::NotFound()
                .content_type("text/plain")
                .body("no such file");
        }
    };
    HttpResponse::Ok()
        .content_type(content_type)
        .insert_header((header::CACHE_CONTROL, "public, max-age=300"))
        .body(body)
}
