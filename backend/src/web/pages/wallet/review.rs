//! The first step of sending: the typed transfer read back to the person,
//! with the exact recipient, before any money moves.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use askama_web::WebTemplate;
use serde::Deserialize;
use uuid::Uuid;

use super::super::*;
use super::{refused_notice, wallet_page};
use crate::domain::parse_uuid;
use crate::state::AppState;
use crate::transfer::recipient;
use crate::web::{Session, money};

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

/// A transfer read back to the person before any money moves.
pub(super) struct Draft {
    pub(super) to_wallet_id: Uuid,
    pub(super) recipient_name: String,
    pub(super) amount_minor: i64,
    pub(super) typed_recipient: String,
    pub(super) typed_amount: String,
    pub(super) idempotency_key: Uuid,
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
    let (to_wallet_id, recipient_name) = match recipient::resolve(&state.db, typed_recipient).await {
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
pub(super) fn review_page(
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
            to_wallet_short: crate::domain::short_id(draft.to_wallet_id),
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
