//! The wallet page, the review of a typed transfer (`review`), and Send
//! (`send`): the browser's way through the transfer pipeline.

mod payout;
mod review;
mod send;
mod shown;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use askama_web::WebTemplate;
use std::collections::HashMap;

use serde::Deserialize;
use uuid::Uuid;

use crate::defense::idempotency::{self, IdempotencyKey, StoredResponse};
use crate::problem::ProblemType;
use crate::state::AppState;
use crate::transfer::{history, recipient};
use crate::web::{Session, money};

use super::*;
use shown::Shown;

pub use payout::{pay_out, payout_review_shown, review_payout};
pub use review::{review, review_shown};
pub use send::transfer;

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
    currency_name: String,
    /// Set aside for payouts still on their way, when there are any.
    held: Option<String>,
    /// The available balance plus what is held.
    posted: String,
    payouts_offered: bool,
    payouts: Vec<PayoutRow>,
}

struct PayoutRow {
    when: String,
    destination: String,
    amount: String,
    state: &'static str,
}

/// How many payouts the wallet page lists.
const WALLET_PAGE_PAYOUT_ROWS: i64 = 10;

async fn payouts(state: &AppState, session: &Session) -> Result<(i64, Vec<PayoutRow>), sqlx::Error> {
    if !state.config.payouts.offered() {
        return Ok((0, Vec::new()));
    }
    let held = crate::payout::held_minor(&state.db, crate::domain::WalletId(session.wallet_id)).await?;
    let rows = crate::routes::payouts::list_for_user(
        &state.db,
        session.token.user_id.0,
        None,
        WALLET_PAGE_PAYOUT_ROWS,
    )
    .await?;
    let rows = rows
        .into_iter()
        .map(|payout| PayoutRow {
            when: payout.created_at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
            destination: payout.destination,
            amount: money::format(payout.amount_minor, &payout.currency),
            state: payout.state.for_people(),
        })
        .collect();
    Ok((held, rows))
}

struct HistoryRow {
    when: String,
    /// What the row was, in words: sent to or received from someone, or a
    /// payout and where it stands.
    what: String,
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
    let ids: Vec<Uuid> = rows.iter().map(|row| row.id).collect();
    let payouts = payouts_behind(state, &ids).await?;
    Ok(rows
        .into_iter()
        .map(|row| HistoryRow {
            when: row.created_at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
            what: match payouts.get(&row.id) {
                Some(payout) => payout.in_words(),
                None if row.sent => format!("Sent to {}", row.counterpart_name),
                None => format!("Received from {}", row.counterpart_name),
            },
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

/// The payout behind a transfer of the history: the transfer is its hold,
/// or the release of a payout the bank refused.
#[derive(sqlx::FromRow)]
struct PayoutBehind {
    transfer_id: Uuid,
    is_hold: bool,
    destination: String,
    state: crate::payout::PayoutState,
}

impl PayoutBehind {
    /// The history's line for the transfer: "sent" only for a payout the
    /// bank sent.
    fn in_words(&self) -> String {
        use crate::payout::PayoutState;
        let payout = format!("Payout to bank account {}", self.destination);
        if !self.is_hold {
            return format!(
                "Money back from the payout to bank account {}, which was not sent",
                self.destination
            );
        }
        match self.state {
            PayoutState::Settled => format!("Sent to bank account {}", self.destination),
            PayoutState::Pending => format!("{payout}, set aside and waiting to be sent"),
            PayoutState::Sent => format!("{payout}, passed to the bank and waiting for its answer"),
            PayoutState::Failed => format!("{payout}, not sent: the bank refused it, and the money is back"),
            PayoutState::NeedsAttention => format!(
                "{payout}: whether the bank sent it is not known yet, so the money stays set aside until it is \
                 checked"
            ),
        }
    }
}

/// The payouts whose hold or release is among `transfers`, by transfer.
async fn payouts_behind(
    state: &AppState,
    transfers: &[Uuid],
) -> Result<HashMap<Uuid, PayoutBehind>, sqlx::Error> {
    let payouts: Vec<PayoutBehind> = sqlx::query_as(
        "SELECT t.id AS transfer_id, t.id = p.hold_transfer_id AS is_hold, p.destination, p.state
           FROM unnest($1::uuid[]) AS t (id)
           JOIN payouts p ON t.id IN (p.hold_transfer_id, p.release_transfer_id)",
    )
    .bind(transfers)
    .fetch_all(&state.db)
    .await?;
    Ok(payouts
        .into_iter()
        .map(|payout| (payout.transfer_id, payout))
        .collect())
}

pub(super) async fn wallet_page(
    state: &AppState,
    session: &Session,
    notice: Option<Notice>,
    recipient: String,
    amount: String,
) -> HttpResponse {
    let (history, (held_minor, payouts)) =
        match (history(state, session).await, payouts(state, session).await) {
            (Ok(history), Ok(payouts)) => (history, payouts),
            (Err(error), _) | (_, Err(error)) => return unavailable(state, Some(session), &error),
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
            currency_name: money::currency_name(&session.currency),
            held: (held_minor > 0).then(|| money::format(held_minor, &session.currency)),
            posted: money::format(session.balance_minor + held_minor, &session.currency),
            payouts_offered: state.config.payouts.offered(),
            payouts,
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
    /// A page a form led to (`shown`): a refusal, a replay, a cooldown.
    shown: String,
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
        shown,
    } = prefill.into_inner();
    let session = match require_session(&request, &state).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    if !shown.is_empty() {
        return match shown::load(&state, session.token.user_id, &shown).await {
            Ok(Some(Shown::Wallet {
                notice,
                recipient,
                amount,
            })) => wallet_page(&state, &session, Some(notice), recipient, amount).await,
            Ok(Some(review)) => redirect(&review.address(&shown)),
            Ok(None) => {
                let notice = Notice {
                    kind: "info".into(),
                    layer: None,
                    text:
                        "That page is no longer kept here, so it cannot be shown again. Nothing was sent by \
                           opening it: the history below lists every transfer that was made."
                            .into(),
                };
                wallet_page(&state, &session, Some(notice), String::new(), String::new()).await
            }
            Err(error) => result_unavailable(&state, &session, &error),
        };
    }
    let notice = match IdempotencyKey::parse(&sent) {
        Ok(key) => match sent_notice(&state, &session, key).await {
            Ok(notice) => notice,
            Err(error) => return result_unavailable(&state, &session, &error),
        },
        Err(_) => None,
    };
    wallet_page(&state, &session, notice, recipient, amount).await
}

/// The database failed while showing what a transfer did: what happened is
/// not known here, so the page says where to find out, and that sending
/// the same confirmation again is safe.
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

/// Keeps the page a form leads to and redirects there.
async fn lead_to(state: &AppState, session: &Session, shown: Shown) -> Result<HttpResponse, sqlx::Error> {
    let id = shown::keep(state, session.token.user_id, &shown).await?;
    Ok(redirect(&shown.address(&id)))
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
        Some(wallet) => recipient::owner_name(&state.db, wallet).await?,
        None => None,
    }
    .unwrap_or_else(|| "that wallet".to_owned());
    Ok(Some(if stored.status == 201 {
        Notice {
            kind: "success".into(),
            layer: None,
            text: receipt_text(&stored, &recipient, &session.currency)
                .unwrap_or_else(|| "The transfer was made.".into()),
        }
    } else {
        refused_notice(problem_text(&stored.body))
    }))
}

/// Why an amount cannot leave the wallet, when it is more than the wallet
/// can spend: the review pages say so in place of a negative balance and
/// offer no Send. The row guard still refuses it if it is sent anyway.
pub(super) fn more_than_held(session: &Session, amount_minor: i64, what: &str) -> Option<String> {
    (amount_minor > session.balance_minor).then(|| {
        format!(
            "Your wallet does not hold enough for this {what}: you can spend {}, and this {what} is {}. Change the \
             amount to go on.",
            money::format(session.balance_minor, &session.currency),
            money::format(amount_minor, &session.currency),
        )
    })
}

pub(super) fn refused_notice(text: impl Into<String>) -> Notice {
    Notice {
        kind: "refused".into(),
        layer: None,
        text: text.into(),
    }
}

pub(super) fn receipt_text(stored: &StoredResponse, recipient: &str, currency: &str) -> Option<String> {
    let receipt: serde_json::Value = serde_json::from_str(&stored.body).ok()?;
    Some(format!(
        "Sent {} to {recipient}. Your balance after it: {}.",
        money::format(receipt["amount_minor"].as_i64()?, currency),
        money::format(receipt["balance_minor_after"].as_i64()?, currency),
    ))
}

/// A stored refusal (a replay's body) in a sentence for people.
pub(super) fn problem_text(body: &str) -> String {
    ProblemType::of_body(body)
        .unwrap_or(ProblemType::InternalError)
        .for_people()
        .to_owned()
}

pub(super) fn replay_notice(original: &StoredResponse, recipient: &str, currency: &str) -> Notice {
    let result = if original.status == 201 {
        receipt_text(original, recipient, currency).unwrap_or_else(|| "The transfer was made.".into())
    } else {
        problem_text(&original.body)
    };
    Notice {
        kind: "replayed".into(),
        layer: Some("Idempotency key".into()),
        text: format!("Already processed — showing the original result. {result}"),
    }
}
