//! The first step of sending: the typed transfer read back to the person,
//! with the exact recipient, before any money moves.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use askama_web::WebTemplate;
use serde::Deserialize;
use uuid::Uuid;

use super::super::*;
use super::shown::{self, Draft, Shown};
use super::{lead_to, refused_notice};
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
    /// The wallet cannot spend the amount: said instead of a negative
    /// balance, and Send is disabled.
    short_of_money: Option<String>,
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

/// The first step of sending: read the typed amount with the one grammar,
/// find the exact recipient, and lead to a page that shows what will
/// happen (or why it cannot). Nothing moves here.
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
    let refused = |text: String| Shown::Wallet {
        notice: refused_notice(text),
        recipient: form.recipient.clone(),
        amount: form.amount.clone(),
    };
    let shown = match money::parse_typed(
        &form.amount,
        state.config.money.transfer_amount_minor_max,
        &session.currency,
    ) {
        Err(refusal) => refused(refusal.0),
        Ok(amount_minor) => {
            let typed_recipient = form.recipient.trim();
            match recipient::resolve(&state.db, typed_recipient).await {
                Ok(None) => refused(format!("We found no user or wallet called “{typed_recipient}”.")),
                Ok(Some((to_wallet_id, _))) if to_wallet_id == session.wallet_id => {
                    refused("That is your own wallet. Choose someone else to send to.".to_owned())
                }
                Ok(Some((to_wallet_id, recipient_name))) => {
                    let form_key = parse_uuid(&form.form_key).unwrap_or_else(Uuid::new_v4);
                    Shown::Review {
                        draft: Draft {
                            to_wallet_id,
                            recipient_name,
                            amount_minor,
                            typed_recipient: typed_recipient.to_owned(),
                            typed_amount: form.amount.trim().to_owned(),
                            idempotency_key: confirmation_key(
                                b"wallet-form",
                                form_key,
                                &[to_wallet_id.as_bytes(), &amount_minor.to_be_bytes()],
                            ),
                        },
                        notice: None,
                        send_again_at_ms: None,
                    }
                }
                Err(error) => return unavailable(&state, Some(&session), &error),
            }
        }
    };
    // Nothing was sent here, so a failure to keep the page says so.
    lead_to(&state, &session, shown)
        .await
        .unwrap_or_else(|error| unavailable(&state, Some(&session), &error))
}

/// `GET /wallet/review?shown=…`: the confirmation a form led to; any other
/// visit goes to the wallet.
pub async fn review_shown(
    request: HttpRequest,
    query: web::Query<ShownQuery>,
    state: web::Data<AppState>,
) -> HttpResponse {
    let session = match require_session(&request, &state).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    match shown::load(&state, session.token.user_id, &query.shown).await {
        Ok(Some(Shown::Review {
            draft,
            notice,
            send_again_at_ms,
        })) => review_page(
            &state,
            &session,
            &draft,
            notice,
            shown::seconds_until(send_again_at_ms),
        ),
        Ok(_) if query.shown.is_empty() => redirect("/wallet"),
        // Replaced, expired or not a review: the wallet says which.
        Ok(_) => redirect(&format!("/wallet?shown={}", query.shown)),
        Err(error) => unavailable(&state, Some(&session), &error),
    }
}

/// Which kept page to show.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct ShownQuery {
    shown: String,
}

impl ShownQuery {
    /// The kept page's id, as given.
    pub(super) fn id(&self) -> &str {
        &self.shown
    }
}

/// The idempotency key of one confirmation: the same form (`form`, a
/// transfer's or a payout's) asking the same thing (`asked`) gives the same
/// key (a double submit is one transfer or payout), and any change gives
/// another (never "key reused").
pub(super) fn confirmation_key(form: &[u8], form_key: Uuid, asked: &[&[u8]]) -> Uuid {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new()
        .chain_update(form)
        .chain_update(b"\n")
        .chain_update(form_key.as_bytes());
    for part in asked {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    let digest = hasher.finalize();
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
    let short_of_money = super::more_than_held(session, draft.amount_minor, "transfer");
    let warning = (short_of_money.is_none() && draft.amount_minor > session.balance_minor / 2).then(|| {
        format!(
            "This is more than half of your balance. Check the amount: {} is what will leave your wallet.",
            money::format(draft.amount_minor, currency)
        )
    });
    let amount_text = money::format(draft.amount_minor, currency);
    // While Send counts down, the notice's own "Try again in N s." is
    // replaced by the live count the page keeps (`#countdown`).
    let notice = match (notice, wait_s) {
        (Some(mut notice), Some(_)) => {
            if let Some((before, _)) = notice.text.rsplit_once(" Try again in ") {
                notice.text = before.to_owned();
            }
            Some(notice)
        }
        (notice, _) => notice,
    };
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
            short_of_money,
            warning,
            idempotency_key: draft.idempotency_key,
            amount_minor: draft.amount_minor,
            wait_s,
        },
    )
}
