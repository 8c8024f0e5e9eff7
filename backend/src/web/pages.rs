//! The pages and the forms behind them.

use std::time::{Duration, Instant};

use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, Responder, web};
use askama::Template;
use askama_web::WebTemplate;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use uuid::Uuid;

use crate::decision::{Layer, Outcome};
use crate::defense::idempotency::{self, IdempotencyKey, StoredResponse};
use crate::domain::{TransferRequest, WalletId};
use crate::routes::transfers::{self, Answer, Decided};
use crate::routes::users::{self, Credentials};
use crate::state::AppState;
use crate::telemetry::RequestContext;
use crate::web::{self as site, Session, money};

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
            unsafe_modes: state.settings.unsafe_modes(),
        }
    }
}

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
#[template(path = "wallet.html")]
struct WalletPage {
    chrome: Chrome,
    balance: String,
    wallet_id: Uuid,
    idempotency_key: Uuid,
    notice: Option<Notice>,
    history: Vec<HistoryRow>,
    recipient: String,
    amount: String,
}

/// The result of a form submission, as the page states it.
pub struct Notice {
    /// `success`, `replay` or `refused`: the notice's style.
    kind: &'static str,
    /// Which defense decided, for a refusal.
    layer: Option<&'static str>,
    text: String,
}

struct HistoryRow {
    when: String,
    direction: &'static str,
    counterparty: String,
    amount: String,
}

#[derive(Template, WebTemplate)]
#[template(path = "race_lab.html")]
struct RaceLabPage {
    chrome: Chrome,
    wallet_id: Uuid,
    balance: String,
    currency: String,
    trace_ui_url: String,
    safe: bool,
}

#[derive(Template, WebTemplate)]
#[template(path = "feed.html")]
struct FeedPage {
    chrome: Chrome,
}

#[derive(Template, WebTemplate)]
#[template(path = "error.html")]
struct ErrorPage {
    chrome: Chrome,
    status: u16,
    heading: String,
    message: String,
}

#[derive(Template, WebTemplate)]
#[template(path = "problem_type.html")]
struct ProblemTypePage {
    chrome: Chrome,
    slug: String,
    heading: &'static str,
    description: &'static str,
}

fn error_page(state: &AppState, status: StatusCode, heading: &str, message: &str) -> HttpResponse {
    let page = ErrorPage {
        chrome: Chrome::new(state, heading, None),
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

fn unavailable(state: &AppState, error: &sqlx::Error) -> HttpResponse {
    tracing::error!(error = %error, "database error while rendering a page");
    error_page(
        state,
        StatusCode::SERVICE_UNAVAILABLE,
        "The wallet is unavailable",
        "We could not reach the database. Nothing was changed; please try again in a moment.",
    )
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
        Err(error) => Err(unavailable(state, &error)),
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
            StatusCode::FORBIDDEN,
            "Form expired",
            "This form expired. Go back, reload the page and try again.",
        ));
    }
    Ok(session)
}

pub async fn home(request: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    match site::session(&request, &state).await {
        Ok(Some(_)) => redirect("/wallet"),
        Ok(None) => redirect("/signin"),
        Err(error) => unavailable(&state, &error),
    }
}

fn account_page(
    request: &HttpRequest,
    state: &AppState,
    form: &'static str,
    name: String,
    error: Option<String>,
    status: StatusCode,
) -> HttpResponse {
    let (csrf, new_cookie) = site::pre_session_csrf(request);
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
        state.settings.api_token_ttl_hours,
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
    if !site::pre_session_csrf_ok(request, &form.csrf) {
        return again(
            "This form expired. Please try again.".to_owned(),
            StatusCode::FORBIDDEN,
        );
    }
    let credentials = Credentials {
        name: form.name.clone(),
        password: SecretString::from(form.password.clone()),
    };
    let token = if form_kind == "signin" {
        users::issue_token_for(state, credentials)
            .await
            .map(|issued| issued.token)
    } else {
        match credentials.validate(&state.settings) {
            Ok(()) => users::create_user(state, credentials)
                .await
                .map(|signed_up| SecretString::from(signed_up.token)),
            Err(problem) => Err(problem),
        }
    };
    match token {
        Ok(token) => signed_in(request, state, &token),
        Err(problem) => again(problem.detail.clone(), problem.status_code()),
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
    if let Err(error) = crate::auth::revoke_token(&state.db, &session.token).await {
        return unavailable(&state, &error);
    }
    let mut response = redirect("/signin");
    let _ = response.add_cookie(&site::expired_session_cookie());
    response
}

async fn history(state: &AppState, session: &Session) -> Result<Vec<HistoryRow>, sqlx::Error> {
    let rows = sqlx::query_as::<_, (chrono::DateTime<chrono::Utc>, i64, bool, String)>(
        "SELECT t.created_at, t.amount_minor, f.user_id = $1 AS sent,
                CASE WHEN f.user_id = $1 THEN tu.name ELSE fu.name END
         FROM transfers t
         JOIN wallets f ON f.id = t.from_wallet_id
         JOIN wallets tw ON tw.id = t.to_wallet_id
         JOIN users fu ON fu.id = f.user_id
         JOIN users tu ON tu.id = tw.user_id
         WHERE f.user_id = $1 OR tw.user_id = $1
         ORDER BY t.created_at DESC, t.id DESC
         LIMIT 20",
    )
    .bind(session.token.user_id.0)
    .fetch_all(&state.db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(when, amount, sent, counterparty)| HistoryRow {
            when: when.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
            direction: if sent { "Sent to" } else { "Received from" },
            counterparty,
            amount: money::format(if sent { -amount } else { amount }, &session.currency),
        })
        .collect())
}

async fn wallet_page(
    state: &AppState,
    session: &Session,
    notice: Option<Notice>,
    recipient: String,
    amount: String,
) -> HttpResponse {
    let history = match history(state, session).await {
        Ok(history) => history,
        Err(error) => return unavailable(state, &error),
    };
    with_page(
        StatusCode::OK,
        WalletPage {
            chrome: Chrome::new(state, "Wallet", Some(session)),
            balance: money::format(session.balance_minor, &session.currency),
            wallet_id: session.wallet_id,
            // A new key per render: submitting this form twice, or the
            // browser resubmitting it, is one transfer.
            idempotency_key: Uuid::new_v4(),
            notice,
            history,
            recipient,
            amount,
        },
    )
}

pub async fn wallet(request: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    match require_session(&request, &state).await {
        Ok(session) => wallet_page(&state, &session, None, String::new(), String::new()).await,
        Err(response) => response,
    }
}

/// Every field defaults to empty, so a tampered form gets a page that
/// says what is wrong rather than a bare 400.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct TransferForm {
    recipient: String,
    amount: String,
    idempotency_key: String,
    csrf: String,
}

/// The transfer form: parsed like the API's body, then sent through the
/// same three layers.
pub async fn transfer(
    request: HttpRequest,
    form: web::Form<TransferForm>,
    state: web::Data<AppState>,
) -> HttpResponse {
    let form = form.into_inner();
    let session = match session_for_form(&request, &state, &form.csrf).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let refusal = |text: String| Notice {
        kind: "refused",
        layer: None,
        text,
    };
    let Some(amount_minor) = money::parse_major(&form.amount) else {
        let notice = refusal("Enter an amount such as 12.50: positive, at most two decimals.".into());
        return wallet_page(&state, &session, Some(notice), form.recipient, form.amount).await;
    };
    let recipient = match resolve_recipient(&state, form.recipient.trim()).await {
        Ok(Some(recipient)) => recipient,
        Ok(None) => {
            let notice = refusal(format!("No user or wallet called “{}”.", form.recipient.trim()));
            return wallet_page(&state, &session, Some(notice), form.recipient, form.amount).await;
        }
        Err(error) => return unavailable(&state, &error),
    };
    let request_body = match TransferRequest::new(
        WalletId(session.wallet_id),
        WalletId(recipient.0),
        amount_minor,
        state.settings.transfer_amount_minor_max,
    ) {
        Ok(parsed) => parsed,
        Err(problem) => {
            let notice = refusal(problem.detail);
            return wallet_page(&state, &session, Some(notice), form.recipient, form.amount).await;
        }
    };
    let key = IdempotencyKey::parse(&form.idempotency_key).ok();
    let context = RequestContext::of(&request);
    let decided = transfers::through_the_layers(&state, &context, &session.token, &request_body, key).await;
    transfers::report(&state, &context, &decided);
    let header = decided.decision.header_value();

    let mut notice = notice_for(&decided, &recipient.1, &session.currency);
    // A double submit: the cooldown refused this copy while the first one
    // ran. Show the first one's result rather than a refusal.
    if let (Some(key), Layer::Cooldown, Outcome::Rejected) =
        (key, decided.decision.layer, decided.decision.outcome)
    {
        let fingerprint = transfers::fingerprint_of(&request_body);
        if let Some(original) = wait_for_original(&state, &session, key, &fingerprint).await {
            notice = replay_notice(&original, &recipient.1, &session.currency);
        }
    }
    // Show the balance after the transfer.
    let session = match site::session(&request, &state).await {
        Ok(Some(session)) => session,
        Ok(None) => return redirect("/signin"),
        Err(error) => return unavailable(&state, &error),
    };
    let (recipient_text, amount_text) = if notice.kind == "refused" {
        (form.recipient, form.amount)
    } else {
        (String::new(), String::new())
    };
    let mut response = wallet_page(&state, &session, Some(notice), recipient_text, amount_text).await;
    if let Ok(value) = header::HeaderValue::from_str(&header) {
        response
            .headers_mut()
            .insert(header::HeaderName::from_static("defense-decision"), value);
    }
    response
}

/// The stored result of the key's first request, waiting for it at most
/// `idempotency_wait_ms_max`.
async fn wait_for_original(
    state: &AppState,
    session: &Session,
    key: IdempotencyKey,
    fingerprint: &[u8; 32],
) -> Option<StoredResponse> {
    let deadline = Instant::now() + Duration::from_millis(state.settings.idempotency_wait_ms_max);
    loop {
        match idempotency::completed_response(&state.db, session.token.user_id, key, fingerprint).await {
            Ok(Some(stored)) => return Some(stored),
            Ok(None) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            _ => return None,
        }
    }
}

/// A user name or a wallet id → (wallet id, name to show).
async fn resolve_recipient(state: &AppState, recipient: &str) -> Result<Option<(Uuid, String)>, sqlx::Error> {
    if let Ok(wallet_id) = Uuid::try_parse(recipient) {
        let name = sqlx::query_scalar::<_, String>(
            "SELECT u.name FROM wallets w JOIN users u ON u.id = w.user_id WHERE w.id = $1",
        )
        .bind(wallet_id)
        .fetch_optional(&state.db)
        .await?;
        return Ok(name.map(|name| (wallet_id, name)));
    }
    let wallet = sqlx::query_scalar::<_, Uuid>(
        "SELECT w.id FROM users u JOIN wallets w ON w.user_id = u.id WHERE u.name = $1 ORDER BY w.created_at LIMIT 1",
    )
    .bind(recipient)
    .fetch_optional(&state.db)
    .await?;
    Ok(wallet.map(|wallet_id| (wallet_id, recipient.to_owned())))
}

fn layer_label(layer: Layer) -> Option<&'static str> {
    match layer {
        Layer::Cooldown => Some("Cooldown"),
        Layer::Idempotency => Some("Idempotency key"),
        Layer::RowGuard => Some("Balance guard"),
        Layer::NoLayer => None,
    }
}

fn receipt_text(stored: &StoredResponse, recipient: &str, currency: &str) -> Option<String> {
    let receipt: serde_json::Value = serde_json::from_str(&stored.body).ok()?;
    Some(format!(
        "Sent {} to {recipient}. Your balance after it: {}.",
        money::format(receipt["amount_minor"].as_i64()?, currency),
        money::format(receipt["balance_minor_after"].as_i64()?, currency),
    ))
}

fn problem_text(body: &str) -> String {
    let problem: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    let title = problem["title"].as_str().unwrap_or("Refused");
    let detail = problem["detail"].as_str().unwrap_or("");
    format!("{title}. {detail}")
}

fn replay_notice(original: &StoredResponse, recipient: &str, currency: &str) -> Notice {
    let result = if original.status == 201 {
        receipt_text(original, recipient, currency).unwrap_or_else(|| "The transfer was made.".into())
    } else {
        problem_text(&original.body)
    };
    Notice {
        kind: "replay",
        layer: Some("Idempotency key"),
        text: format!("Already processed — showing the original result. {result}"),
    }
}

fn notice_for(decided: &Decided, recipient: &str, currency: &str) -> Notice {
    match &decided.answer {
        Answer::Stored {
            response,
            replayed: true,
        } => replay_notice(response, recipient, currency),
        Answer::Stored {
            response,
            replayed: false,
        } if response.status == 201 => Notice {
            kind: "success",
            layer: None,
            text: receipt_text(response, recipient, currency)
                .unwrap_or_else(|| "The transfer was made.".into()),
        },
        Answer::Stored { response, .. } => Notice {
            kind: "refused",
            layer: layer_label(decided.decision.layer),
            text: problem_text(&response.body),
        },
        Answer::Refused(problem) => Notice {
            kind: "refused",
            layer: layer_label(decided.decision.layer),
            text: format!("{}. {}", problem.title, problem.detail),
        },
    }
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

/// `GET /problems/{slug}`: what each problem `type` means.
pub async fn problem_type(path: web::Path<String>, state: web::Data<AppState>) -> impl Responder {
    let slug = path.into_inner();
    let Some((heading, description)) = problem_description(&slug) else {
        return error_page(
            &state,
            StatusCode::NOT_FOUND,
            "Unknown problem type",
            "There is no problem type by this name.",
        );
    };
    with_page(
        StatusCode::OK,
        ProblemTypePage {
            chrome: Chrome::new(&state, heading, None),
            slug,
            heading,
            description,
        },
    )
}

fn problem_description(slug: &str) -> Option<(&'static str, &'static str)> {
    Some(match slug {
        "cooldown-active" => (
            "Cooldown active (429)",
            "Another transfer by you started within the cooldown window. The Redis cooldown lock refused this one before any database work. Retry after the Retry-After header's seconds.",
        ),
        "idempotency-key-reused" => (
            "Idempotency key reused (422)",
            "The Idempotency-Key was already used for a request with a different method, path or body. Use a new key for a new transfer.",
        ),
        "idempotency-key-in-flight" => (
            "Request with this key in progress (409)",
            "The first request with this Idempotency-Key had not finished within the wait bound. Retry shortly to get its result.",
        ),
        "insufficient-funds" => (
            "Insufficient funds (422)",
            "The guarded debit found the source balance lower than the amount. Nothing moved.",
        ),
        "unknown-target-wallet" => (
            "Unknown target wallet (422)",
            "No wallet has the id given as to_wallet_id. Nothing moved.",
        ),
        "not-your-wallet" => (
            "Not your wallet (403)",
            "Only the owner of a wallet can send money from it.",
        ),
        "validation-failed" => (
            "The request is not valid (422)",
            "A value broke a rule: amounts are positive integers of minor units up to the maximum, the wallets differ, the key is a UUID.",
        ),
        "malformed-request" => (
            "Malformed request (400)",
            "The body is not valid JSON, or a required header is missing.",
        ),
        "payload-too-large" => (
            "Request body too large (413)",
            "The body is larger than the server accepts.",
        ),
        "unsupported-media-type" => (
            "Unsupported media type (415)",
            "Send JSON with Content-Type: application/json.",
        ),
        "unauthorized" => (
            "Authentication required (401)",
            "Send a valid bearer token: from POST /api/v1/users or POST /api/v1/tokens.",
        ),
        "csrf-token-invalid" => (
            "CSRF token missing or invalid (403)",
            "A browser request authenticated by the session cookie must carry the page's CSRF token.",
        ),
        "not-found" => (
            "Not found (404)",
            "There is nothing at this address, or it is not yours.",
        ),
        "service-unavailable" => (
            "Service unavailable (503)",
            "A store the service depends on is unreachable or saturated. Nothing was changed; retrying later is safe.",
        ),
        "internal-error" => (
            "Internal error (500)",
            "Something failed on our side. Nothing was changed; retrying is safe.",
        ),
        _ => return None,
    })
}

/// A person's 404: an HTML page for browsers, problem details otherwise.
pub fn not_found_page(state: &AppState) -> HttpResponse {
    error_page(
        state,
        StatusCode::NOT_FOUND,
        "Page not found",
        "There is nothing at this address.",
    )
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
