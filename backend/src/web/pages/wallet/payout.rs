//! Paying out to a bank account from the browser: the typed payout read
//! back for confirmation (`review`), then sent through the same pipeline as
//! `POST /api/v1/payouts` (`send`). As for a transfer, the confirmation
//! carries a key derived from the form, so confirming twice holds once.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use askama_web::WebTemplate;
use serde::Deserialize;
use uuid::Uuid;

use super::super::*;
use super::review::confirmation_key;
use super::shown::{self, PayoutDraft, Shown};
use super::{lead_to, problem_text, refused_notice, result_unavailable};
use crate::defense::idempotency::IdempotencyKey;
use crate::domain::{WalletId, parse_uuid};
use crate::ending::{self, Answer, Decided};
use crate::payout::pipeline;
use crate::payout::{PayoutRequest, is_destination};
use crate::problem::ProblemType;
use crate::state::AppState;
use crate::telemetry::RequestContext;
use crate::web::{Session, money};

#[derive(Template, WebTemplate)]
#[template(path = "payout_review.html")]
struct PayoutReviewPage {
    chrome: Chrome,
    notice: Option<Notice>,
    amount_text: String,
    destination: String,
    typed_amount: String,
    available_text: String,
    available_after_text: String,
    /// The wallet cannot spend the amount: said instead of a negative
    /// balance, and Pay out is disabled.
    short_of_money: Option<String>,
    idempotency_key: Uuid,
    amount_minor: i64,
    wait_s: Option<u64>,
}

/// The payout form, as typed. Every field defaults to empty, so a tampered
/// form gets a page that says what is wrong rather than a bare 400.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct PayoutReviewForm {
    destination: String,
    amount: String,
    form_key: String,
    csrf: String,
}

/// `POST /wallet/payout/review`: read the typed amount and destination and
/// lead to the confirmation, or back to the wallet with why not. Nothing
/// is set aside here.
pub async fn review_payout(
    request: HttpRequest,
    form: web::Form<PayoutReviewForm>,
    state: web::Data<AppState>,
) -> HttpResponse {
    let form = form.into_inner();
    let session = match session_for_form(&request, &state, &form.csrf).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let refused = |text: String| Shown::Wallet {
        notice: refused_notice(text),
        recipient: String::new(),
        amount: String::new(),
    };
    let destination = form.destination.trim();
    let shown = if !state.config.payouts.offered() {
        refused(ProblemType::PayoutsNotOffered.for_people().to_owned())
    } else if !is_destination(destination) {
        refused(
            "The bank account reference must be 1 to 64 letters, digits, dots, colons, dashes or underscores, \
             for example acct-42. Nothing was set aside."
                .to_owned(),
        )
    } else {
        match money::parse_typed(
            &form.amount,
            state.config.payouts.amount_minor_max,
            &session.currency,
        ) {
            Err(refusal) => refused(refusal.0),
            Ok(amount_minor) => {
                let form_key = parse_uuid(&form.form_key).unwrap_or_else(Uuid::new_v4);
                Shown::PayoutReview {
                    draft: PayoutDraft {
                        destination: destination.to_owned(),
                        amount_minor,
                        typed_amount: form.amount.trim().to_owned(),
                        idempotency_key: confirmation_key(
                            b"payout-form",
                            form_key,
                            &[destination.as_bytes(), &amount_minor.to_be_bytes()],
                        ),
                    },
                    notice: None,
                    send_again_at_ms: None,
                }
            }
        }
    };
    lead_to(&state, &session, shown)
        .await
        .unwrap_or_else(|error| unavailable(&state, Some(&session), &error))
}

/// `GET /wallet/payout/review?shown=…`: the confirmation a form led to.
pub async fn payout_review_shown(
    request: HttpRequest,
    query: web::Query<super::review::ShownQuery>,
    state: web::Data<AppState>,
) -> HttpResponse {
    let session = match require_session(&request, &state).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    match shown::load(&state, session.token.user_id, query.id()).await {
        Ok(Some(Shown::PayoutReview {
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
        Ok(_) if query.id().is_empty() => redirect("/wallet"),
        Ok(_) => redirect(&format!("/wallet?shown={}", query.id())),
        Err(error) => unavailable(&state, Some(&session), &error),
    }
}

fn review_page(
    state: &AppState,
    session: &Session,
    draft: &PayoutDraft,
    notice: Option<Notice>,
    wait_s: Option<u64>,
) -> HttpResponse {
    let currency = &session.currency;
    let after = session.balance_minor - draft.amount_minor;
    let short_of_money = super::more_than_held(session, draft.amount_minor, "payout");
    let amount_text = money::format(draft.amount_minor, currency);
    with_page(
        StatusCode::OK,
        PayoutReviewPage {
            chrome: Chrome::new(state, &format!("Pay out {amount_text}?"), Some(session)),
            notice,
            amount_text,
            destination: draft.destination.clone(),
            typed_amount: draft.typed_amount.clone(),
            available_text: money::format(session.balance_minor, currency),
            available_after_text: money::format(after, currency),
            short_of_money,
            idempotency_key: draft.idempotency_key,
            amount_minor: draft.amount_minor,
            wait_s,
        },
    )
}

/// The confirmation, exactly as reviewed.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct PayoutForm {
    destination: String,
    amount_minor: String,
    idempotency_key: String,
    amount: String,
    csrf: String,
}

/// `POST /wallet/payout`: the reviewed payout through the same three layers
/// as the API, then a page that says what happened. The money is set aside
/// at once; the bank is asked in the background.
pub async fn pay_out(
    request: HttpRequest,
    form: web::Form<PayoutForm>,
    state: web::Data<AppState>,
) -> HttpResponse {
    let form = form.into_inner();
    let session = match session_for_form(&request, &state, &form.csrf).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let nothing_set_aside = |text: String| Shown::Wallet {
        notice: refused_notice(text),
        recipient: String::new(),
        amount: String::new(),
    };
    let parsed = match (
        form.amount_minor.parse::<i64>(),
        IdempotencyKey::parse(&form.idempotency_key),
    ) {
        (Ok(amount_minor), Ok(key)) => PayoutRequest::new(
            WalletId(session.wallet_id),
            amount_minor,
            form.destination.clone(),
            state.config.payouts.amount_minor_max,
        )
        .map(|request| (request, key))
        .map_err(|problem| problem.for_people().to_owned()),
        _ => Err(
            "This confirmation was damaged, so nothing was set aside. Please fill in the form again."
                .to_owned(),
        ),
    };
    let shown = match parsed {
        Err(text) => nothing_set_aside(text),
        Ok(_) if !state.config.payouts.offered() => {
            nothing_set_aside(ProblemType::PayoutsNotOffered.for_people().to_owned())
        }
        Ok((payout_request, key)) => {
            let context = RequestContext::of(&request);
            let amount_minor = payout_request.amount.get();
            let decided =
                pipeline::through_the_layers(&state, &context, &session.token, payout_request, Some(key))
                    .await;
            ending::report(&state, &context, &decided);
            after_pay_out(&decided, &session, &form, amount_minor, key)
        }
    };
    lead_to(&state, &session, shown)
        .await
        .unwrap_or_else(|error| result_unavailable(&state, &session, &error))
}

/// What the page shows after Pay out, chosen from the decision alone.
fn after_pay_out(
    decided: &Decided,
    session: &Session,
    form: &PayoutForm,
    amount_minor: i64,
    key: IdempotencyKey,
) -> Shown {
    let currency = &session.currency;
    let amount_text = money::format(amount_minor, currency);
    let layer = decided.decision.layer.name_for_people().map(str::to_owned);
    let wallet = |notice: Notice| Shown::Wallet {
        notice,
        recipient: String::new(),
        amount: String::new(),
    };
    match &decided.answer {
        Answer::Stored { response, replayed } if response.status == 202 => {
            let text = format!(
                "{amount_text} is set aside for {} and will be sent to the bank in the background. Its state shows \
                 under Payouts below.",
                form.destination
            );
            wallet(if *replayed {
                Notice {
                    kind: "replayed".into(),
                    layer: Some("Idempotency key".into()),
                    text: format!("Already processed — showing the original result. {text}"),
                }
            } else {
                Notice {
                    kind: "success".into(),
                    layer: None,
                    text,
                }
            })
        }
        Answer::Stored { response, .. } => wallet(Notice {
            kind: "refused".into(),
            layer,
            text: problem_text(&response.body),
        }),
        // Nothing was set aside yet, or nobody knows: the same
        // confirmation, with the same key, so sending it again is safe.
        Answer::Refused(problem) if let Some(wait_s) = problem.send_again() => Shown::PayoutReview {
            draft: PayoutDraft {
                destination: form.destination.clone(),
                amount_minor,
                typed_amount: form.amount.clone(),
                idempotency_key: key.as_uuid(),
            },
            notice: Some(Notice {
                kind: "refused".into(),
                layer,
                text: problem.for_people().to_owned(),
            }),
            send_again_at_ms: wait_s.map(|seconds| {
                chrono::Utc::now().timestamp_millis() + i64::try_from(seconds * 1000).unwrap_or(0)
            }),
        },
        Answer::Refused(problem) => wallet(Notice {
            kind: "refused".into(),
            layer,
            text: problem.for_people().to_owned(),
        }),
    }
}
