//! The wallet page, the review of a typed transfer, and Send: the
//! browser's way through the transfer pipeline.

use std::time::{Duration, Instant};

use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use askama_web::WebTemplate;
use serde::Deserialize;
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use crate::decision::{Layer, Outcome};
use crate::defense::idempotency::{self, IdempotencyKey, StoredResponse};
use crate::domain::{TransferRequest, WalletId, parse_uuid};
use crate::names::{self, MATCHES_NAME};
use crate::problem::{Problem, ProblemType};
use crate::state::AppState;
use crate::telemetry::RequestContext;
use crate::transfer::history;
use crate::transfer::pipeline::{self, Answer, Decided};
use crate::web::{self as site, Session, money};

use super::*;

#[derive(Template, WebTemplate)]
#[template(path = "wallet.html")]
struct WalletPage {
    chrome: Chrome,
    balance: String,
    wallet_id: Uuid,
    form_key: Uuid,
    notice: Option<Notice>,
    history: Vec<HistoryRow>,
    recipient: String,
    amount: String,
    amount_pattern: &'static str,
    currency_name: String,
}

#[derive(Template, WebTemplate)]
#[template(path = "review.html")]
struct ReviewPage {
    chrome: Chrome,
    notice: Option<Notice>,
    amount_text: String,
    recipient_name: String,
    to_wallet_id: Uuid,
    to_wallet_short: String,
    typed_recipient: String,
    typed_amount: String,
    balance_text: String,
    balance_after_text: String,
    warning: Option<String>,
    idempotency_key: Uuid,
    amount_minor: i64,
    wait_s: Option<u64>,
}

struct HistoryRow {
    when: String,
    direction: &'static str,
    counterparty: String,
    amount: String,
}

/// How many transfers the wallet page lists.
const WALLET_PAGE_HISTORY_ROWS: i64 = 20;

async fn history(state: &AppState, session: &Session) -> Result<Vec<HistoryRow>, sqlx::Error> {
    let rows = history::list_for_user(
        &state.db,
        session.token.user_id.0,
        None,
        WALLET_PAGE_HISTORY_ROWS.min(state.config.money.transfers_page_rows_max),
    )
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| HistoryRow {
            when: row.created_at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
            direction: if row.sent { "Sent to" } else { "Received from" },
            counterparty: row.counterpart_name,
            amount: money::format(
                if row.sent {
                    -row.amount_minor
                } else {
                    row.amount_minor
                },
                &session.currency,
            ),
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
        Err(error) => return unavailable(state, Some(session), &error),
    };
    with_page(
        StatusCode::OK,
        WalletPage {
            chrome: Chrome::new(state, "Wallet", Some(session)),
            balance: money::format(session.balance_minor, &session.currency),
            wallet_id: session.wallet_id,
            // A new form key per render: the confirmation's idempotency key
            // is derived from it and from what the form asks, so the same
            // form sent twice is one transfer, and a changed form is a new
            // one without anyone choosing a key.
            form_key: Uuid::new_v4(),
            notice,
            history,
            recipient,
            amount,
            amount_pattern: money::AMOUNT_PATTERN,
            currency_name: money::currency_name(&session.currency),
        },
    )
}

/// What the wallet form may be pre-filled with (the review page's Change).
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct Prefill {
    recipient: String,
    amount: String,
    /// The key of a transfer just sent: the page shows its result, so the
    /// address after Send can be reloaded or bookmarked.
    sent: String,
}

pub async fn wallet(
    request: HttpRequest,
    prefill: web::Query<Prefill>,
    state: web::Data<AppState>,
) -> HttpResponse {
    let Prefill {
        recipient,
        amount,
        sent,
    } = prefill.into_inner();
    let session = match require_session(&request, &state).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let notice = match IdempotencyKey::parse(&sent) {
        Ok(key) => match sent_notice(&state, &session, key).await {
            Ok(notice) => notice,
            Err(error) => return unavailable(&state, Some(&session), &error),
        },
        Err(_) => None,
    };
    wallet_page(&state, &session, notice, recipient, amount).await
}

/// The result of the visitor's own transfer sent with `key`, as a notice.
async fn sent_notice(
    state: &AppState,
    session: &Session,
    key: IdempotencyKey,
) -> Result<Option<Notice>, sqlx::Error> {
    let Some(stored) = idempotency::completed_response(&state.db, session.token.user_id, key, None).await?
    else {
        return Ok(None);
    };
    let to_wallet = serde_json::from_str::<serde_json::Value>(&stored.body)
        .ok()
        .and_then(|receipt| {
            receipt["to_wallet_id"]
                .as_str()
                .and_then(|id| Uuid::try_parse(id).ok())
        });
    let recipient = match to_wallet {
        Some(wallet) => owner_name(state, wallet).await?,
        None => None,
    }
    .unwrap_or_else(|| "that wallet".to_owned());
    Ok(Some(if stored.status == 201 {
        Notice {
            kind: "success",
            layer: None,
            text: receipt_text(&stored, &recipient, &session.currency)
                .unwrap_or_else(|| "The transfer was made.".into()),
        }
    } else {
        refused_notice(problem_text(&stored.body))
    }))
}

/// The wallet form, as typed. Every field defaults to empty, so a tampered
/// form gets a page that says what is wrong rather than a bare 400.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct ReviewForm {
    recipient: String,
    amount: String,
    form_key: String,
    csrf: String,
}

fn refused_notice(text: impl Into<String>) -> Notice {
    Notice {
        kind: "refused",
        layer: None,
        text: text.into(),
    }
}

/// A transfer read back to the person before any money moves.
struct Draft {
    to_wallet_id: Uuid,
    recipient_name: String,
    amount_minor: i64,
    typed_recipient: String,
    typed_amount: String,
    idempotency_key: Uuid,
}

/// The first step of sending: read the typed amount with the one grammar,
/// find the exact recipient, and show what will happen. Nothing moves here.
pub async fn review(
    request: HttpRequest,
    form: web::Form<ReviewForm>,
    state: web::Data<AppState>,
) -> HttpResponse {
    let form = form.into_inner();
    let session = match session_for_form(&request, &state, &form.csrf).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let refused = |text: String| {
        wallet_page(
            &state,
            &session,
            Some(refused_notice(text)),
            form.recipient.clone(),
            form.amount.clone(),
        )
    };
    let amount_minor = match money::parse_typed(
        &form.amount,
        state.config.money.transfer_amount_minor_max,
        &session.currency,
    ) {
        Ok(minor) => minor,
        Err(refusal) => return refused(refusal.0).await,
    };
    let typed_recipient = form.recipient.trim();
    let (to_wallet_id, recipient_name) = match resolve_recipient(&state, typed_recipient).await {
        Ok(Some(recipient)) => recipient,
        Ok(None) => return refused(format!("We found no user or wallet called “{typed_recipient}”.")).await,
        Err(error) => return unavailable(&state, Some(&session), &error),
    };
    if to_wallet_id == session.wallet_id {
        return refused("That is your own wallet. Choose someone else to send to.".to_owned()).await;
    }
    let form_key = parse_uuid(&form.form_key).unwrap_or_else(Uuid::new_v4);
    let draft = Draft {
        to_wallet_id,
        recipient_name,
        amount_minor,
        typed_recipient: typed_recipient.to_owned(),
        typed_amount: form.amount.trim().to_owned(),
        idempotency_key: confirmation_key(form_key, to_wallet_id, amount_minor),
    };
    review_page(&state, &session, &draft, None, None)
}

/// The idempotency key of one confirmation: the same wallet form asking the
/// same thing gives the same key (a double submit is one transfer), and any
/// change gives another (never "key reused").
fn confirmation_key(form_key: Uuid, to_wallet_id: Uuid, amount_minor: i64) -> Uuid {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(b"wallet-form\n")
        .chain_update(form_key.as_bytes())
        .chain_update(to_wallet_id.as_bytes())
        .chain_update(amount_minor.to_be_bytes())
        .finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_random_bytes(bytes).into_uuid()
}

/// The confirmation page. `wait_s` is a cooldown still running: the Send
/// button counts it down.
fn review_page(
    state: &AppState,
    session: &Session,
    draft: &Draft,
    notice: Option<Notice>,
    wait_s: Option<u64>,
) -> HttpResponse {
    let currency = &session.currency;
    let after = session.balance_minor - draft.amount_minor;
    let warning = if after < 0 {
        Some(format!(
            "This is more than your balance of {}: it will be refused.",
            money::format(session.balance_minor, currency)
        ))
    } else if draft.amount_minor > session.balance_minor / 2 {
        Some(format!(
            "This is more than half of your balance. Check the amount: {} is what will leave your wallet.",
            money::format(draft.amount_minor, currency)
        ))
    } else {
        None
    };
    let amount_text = money::format(draft.amount_minor, currency);
    with_page(
        StatusCode::OK,
        ReviewPage {
            chrome: Chrome::new(state, &format!("Send {amount_text}?"), Some(session)),
            notice,
            amount_text,
            recipient_name: draft.recipient_name.clone(),
            to_wallet_id: draft.to_wallet_id,
            to_wallet_short: draft.to_wallet_id.simple().to_string()[..8].to_owned(),
            typed_recipient: draft.typed_recipient.clone(),
            typed_amount: draft.typed_amount.clone(),
            balance_text: money::format(session.balance_minor, currency),
            balance_after_text: money::format(after, currency),
            warning,
            idempotency_key: draft.idempotency_key,
            amount_minor: draft.amount_minor,
            wait_s,
        },
    )
}

/// The confirmation, exactly as reviewed. Every field defaults to empty, so
/// a tampered form gets a page that says what is wrong rather than a bare
/// 400.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct TransferForm {
    to_wallet_id: String,
    amount_minor: String,
    idempotency_key: String,
    csrf: String,
    /// What was typed, to fill the form in again after a refusal.
    recipient: String,
    amount: String,
}

/// The second step: send the reviewed transfer through the same three
/// layers as the API, and say what happened.
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
    let (Ok(to_wallet_id), Ok(amount_minor), Ok(key)) = (
        parse_uuid(&form.to_wallet_id).ok_or(()),
        form.amount_minor.parse::<i64>(),
        IdempotencyKey::parse(&form.idempotency_key),
    ) else {
        let notice = refused_notice(
            "This confirmation was damaged, so nothing was sent. Please fill in the form again.",
        );
        return wallet_page(&state, &session, Some(notice), form.recipient, form.amount).await;
    };
    let request_body = match TransferRequest::new(
        WalletId(session.wallet_id),
        WalletId(to_wallet_id),
        amount_minor,
        state.config.money.transfer_amount_minor_max,
    ) {
        Ok(parsed) => parsed,
        Err(problem) => {
            let notice = refused_notice(problem.for_people());
            return wallet_page(&state, &session, Some(notice), form.recipient, form.amount).await;
        }
    };
    let recipient_name = match owner_name(&state, to_wallet_id).await {
        Ok(found) => found.unwrap_or_else(|| "that wallet".to_owned()),
        Err(error) => return unavailable(&state, Some(&session), &error),
    };
    let context = RequestContext::of(&request);
    let decided =
        pipeline::through_the_layers(&state, &context, &session.token, &request_body, Some(key), None).await;
    pipeline::report(&state, &context, &decided);
    let header = decided.decision.header_value();
    let currency = session.currency.clone();

    // A double submit: the cooldown refused this copy while the first one
    // ran. Show the first one's result rather than a refusal.
    let mut original = None;
    if let (Layer::Cooldown, Outcome::Rejected) = (decided.decision.layer, decided.decision.outcome) {
        let fingerprint = pipeline::fingerprint_of(&request_body);
        original = wait_for_original(&state, &session, key, &fingerprint).await;
    }
    let sent =
        matches!(&decided.answer, Answer::Stored { response, replayed: false } if response.status == 201);
    // Every other answer is shown here, with the balance after it.
    let session = if sent {
        session
    } else {
        match site::session(&request, &state).await {
            Ok(Some(session)) => session,
            Ok(None) => return redirect("/signin"),
            Err(error) => return result_unavailable(&state, &session, &error),
        }
    };
    let mut response = if sent {
        // Sent: post/redirect/get, so that the address can be reloaded or
        // bookmarked without sending again. The page it leads to reads the
        // balance after it.
        redirect(&format!("/wallet?sent={}", key.as_uuid()))
    } else if let Some(original) = original {
        let notice = replay_notice(&original, &recipient_name, &currency);
        wallet_page(&state, &session, Some(notice), String::new(), String::new()).await
    } else if let Some(problem) = safe_to_send_again(&decided) {
        // Nothing was made yet, or nobody knows: the same confirmation, with
        // the same key, so sending it again is safe. After a cooldown
        // refusal its Send button counts down the window.
        let wait_s = problem
            .retry_after_s()
            .filter(|_| problem.kind == ProblemType::CooldownActive);
        let draft = Draft {
            to_wallet_id,
            recipient_name: recipient_name.clone(),
            amount_minor,
            typed_recipient: form.recipient,
            typed_amount: form.amount,
            idempotency_key: key.as_uuid(),
        };
        let notice = notice_for(&decided, &recipient_name, &currency);
        review_page(&state, &session, &draft, Some(notice), wait_s)
    } else {
        let notice = notice_for(&decided, &recipient_name, &currency);
        let (recipient_text, amount_text) = if notice.kind == "refused" {
            (form.recipient, form.amount)
        } else {
            (String::new(), String::new())
        };
        wallet_page(&state, &session, Some(notice), recipient_text, amount_text).await
    };
    if let Ok(value) = header::HeaderValue::from_str(&header) {
        response
            .headers_mut()
            .insert(header::HeaderName::from_static(crate::decision::HEADER), value);
    }
    response
}

/// The database failed after the transfer was decided, while reading the
/// page to show: what happened is not known here, so the page says where
/// to find out, and that sending the same confirmation again is safe.
fn result_unavailable(state: &AppState, session: &Session, error: &sqlx::Error) -> HttpResponse {
    tracing::error!(error = %error, "database error while showing a transfer's result");
    error_page(
        state,
        Some(session),
        StatusCode::SERVICE_UNAVAILABLE,
        "The result cannot be shown",
        "We could not load your wallet to show what happened to this transfer. Open your wallet in a moment: its \
         history shows whether the transfer went through. Sending the same confirmation again is safe, because it \
         carries the same key.",
    )
}

/// The refusal, when the confirmation should be shown again as it is: a
/// cooldown refusal, a key still in flight, a store unavailable or an
/// unknown outcome. Nothing final happened that the person must change the
/// form for, and the same key makes sending it again safe.
fn safe_to_send_again(decided: &Decided) -> Option<&Problem> {
    match &decided.answer {
        Answer::Refused(problem)
            if matches!(
                problem.kind,
                ProblemType::CooldownActive
                    | ProblemType::IdempotencyKeyInFlight
                    | ProblemType::ServiceUnavailable
                    | ProblemType::OutcomeUnknown
            ) =>
        {
            Some(problem)
        }
        _ => None,
    }
}

/// The stored result of the key's first request, waiting for it at most
/// `idempotency_wait_ms_max`.
async fn wait_for_original(
    state: &AppState,
    session: &Session,
    key: IdempotencyKey,
    fingerprint: &[u8; 32],
) -> Option<StoredResponse> {
    let deadline = Instant::now() + state.config.idempotency.wait_max();
    loop {
        match idempotency::completed_response(&state.db, session.token.user_id, key, Some(fingerprint)).await
        {
            Ok(Some(stored)) => return Some(stored),
            Ok(None) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            _ => return None,
        }
    }
}

/// The name of a wallet's owner, as the account spells it.
async fn owner_name(state: &AppState, wallet_id: Uuid) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar::<_, String>(
        "SELECT u.name FROM wallets w JOIN users u ON u.id = w.user_id WHERE w.id = $1",
    )
    .bind(wallet_id)
    .fetch_optional(&state.db)
    .await
}

/// A user name or a wallet id → (wallet id, name to show).
pub(super) async fn resolve_recipient(
    state: &AppState,
    recipient: &str,
) -> Result<Option<(Uuid, String)>, sqlx::Error> {
    if let Ok(wallet_id) = Uuid::try_parse(recipient) {
        let name = owner_name(state, wallet_id).await?;
        return Ok(name.map(|name| (wallet_id, name)));
    }
    // By the name's key (case and width do not matter), an exact name
    // first; the name shown is the account's own, never what was typed.
    sqlx::query_as::<_, (Uuid, String)>(AssertSqlSafe(format!(
        "SELECT w.id, u.name FROM users u JOIN wallets w ON w.user_id = u.id
         WHERE {MATCHES_NAME} AND w.lab_slot IS NULL
         ORDER BY u.name = $1 DESC, w.created_at LIMIT 1"
    )))
    .bind(recipient)
    .bind(names::key_of(recipient))
    .fetch_optional(&state.db)
    .await
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

/// A stored refusal (a replay's body) in a sentence for people.
fn problem_text(body: &str) -> String {
    ProblemType::of_body(body)
        .unwrap_or(ProblemType::InternalError)
        .for_people()
        .to_owned()
}

fn replay_notice(original: &StoredResponse, recipient: &str, currency: &str) -> Notice {
    let result = if original.status == 201 {
        receipt_text(original, recipient, currency).unwrap_or_else(|| "The transfer was made.".into())
    } else {
        problem_text(&original.body)
    };
    Notice {
        kind: "replayed",
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
            text: problem.for_people().to_owned(),
        },
    }
}
