//! The second step: the reviewed transfer sent through the same three
//! layers as the API. What the page shows next is chosen from the decision
//! alone (`after_send`), then rendered.

use std::time::{Duration, Instant};

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;

use super::super::*;
use super::shown::{Draft, Shown};
use super::{lead_to, problem_text, receipt_text, refused_notice, replay_notice, result_unavailable};
use crate::decision::{Layer, Outcome};
use crate::defense::idempotency::{self, IdempotencyKey, StoredResponse};
use crate::domain::{TransferRequest, WalletId, parse_uuid};
use crate::ending::{self, Answer, Decided};
use crate::state::AppState;
use crate::telemetry::RequestContext;
use crate::transfer::pipeline;
use crate::transfer::recipient;
use crate::web::Session;

/// How often a double submit looks for its first copy's stored result,
/// within `idempotency_wait_ms_max`.
const ORIGINAL_RESULT_POLL_MS: u64 = 50;

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

/// What the page shows after Send, chosen from the decision alone.
#[derive(Debug, PartialEq, Eq)]
enum AfterSend {
    /// Sent: the wallet shows the receipt from the stored answer, and the
    /// balance after it.
    Receipt,
    /// A double submit the cooldown refused while the first copy ran: the
    /// first copy's result, not a refusal.
    Original(StoredResponse),
    /// Nothing was made yet, or nobody knows: the same confirmation, with
    /// the same key, so sending it again is safe. After a cooldown refusal
    /// its Send button counts down the window.
    Review { wait_s: Option<u64> },
    /// A final answer, on the wallet; a refusal keeps what was typed so
    /// that it can be corrected.
    Wallet { keep_typed: bool },
}

/// `original` is the stored result of the key's first request, looked up
/// only after a cooldown refusal.
fn after_send(decided: &Decided, original: Option<StoredResponse>) -> AfterSend {
    if matches!(&decided.answer, Answer::Stored { response, replayed: false } if response.status == 201) {
        return AfterSend::Receipt;
    }
    if let Some(original) = original {
        return AfterSend::Original(original);
    }
    match &decided.answer {
        Answer::Refused(problem) if let Some(wait_s) = problem.send_again() => AfterSend::Review { wait_s },
        Answer::Stored { replayed: true, .. } => AfterSend::Wallet { keep_typed: false },
        Answer::Stored { response, .. } => AfterSend::Wallet {
            keep_typed: response.status != 201,
        },
        Answer::Refused(_) => AfterSend::Wallet { keep_typed: true },
    }
}

/// The confirmation's fields, parsed: the transfer as reviewed, and the key
/// it was reviewed with.
struct Confirmed {
    to_wallet_id: uuid::Uuid,
    amount_minor: i64,
    key: IdempotencyKey,
    transfer: TransferRequest,
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
    let confirmed = match confirmed(&form, &session, &state) {
        Ok(confirmed) => confirmed,
        Err(notice) => return nothing_sent(&state, &session, notice, form).await,
    };
    let recipient_name = match recipient::owner_name(&state.db, confirmed.to_wallet_id).await {
        Ok(found) => found.unwrap_or_else(|| "that wallet".to_owned()),
        Err(error) => return unavailable(&state, Some(&session), &error),
    };
    let context = RequestContext::of(&request);
    let key = confirmed.key;
    let decided =
        pipeline::through_the_layers(&state, &context, &session.token, &confirmed.transfer, Some(key)).await;
    ending::report(&state, &context, &decided);

    let original = match (decided.decision.layer, decided.decision.outcome) {
        (Layer::Cooldown, Outcome::Rejected) => {
            let fingerprint = pipeline::fingerprint_of(&confirmed.transfer.canonical_json());
            wait_for_original(&state, &session, key, &fingerprint).await
        }
        _ => None,
    };
    // Every answer leads to a page of its own (post/redirect/get), so that
    // reloading it sends nothing: a receipt's is the stored answer itself
    // (`/wallet?sent=`); any other is kept as a page (`shown`).
    let after = after_send(&decided, original);
    let mut response = match page_after_send(
        after,
        &decided,
        &confirmed,
        recipient_name,
        &session.currency,
        form,
    ) {
        None => redirect(&format!("/wallet?sent={}", key.as_uuid())),
        Some(shown) => lead_to(&state, &session, shown)
            .await
            .unwrap_or_else(|error| result_unavailable(&state, &session, &error)),
    };
    decided.decision.mark(&mut response);
    response
}

/// The confirmation's fields, or what the wallet says when they are
/// damaged or describe no transfer that may be made.
fn confirmed(form: &TransferForm, session: &Session, state: &AppState) -> Result<Confirmed, Notice> {
    let (Ok(to_wallet_id), Ok(amount_minor), Ok(key)) = (
        parse_uuid(&form.to_wallet_id).ok_or(()),
        form.amount_minor.parse::<i64>(),
        IdempotencyKey::parse(&form.idempotency_key),
    ) else {
        return Err(refused_notice(
            "This confirmation was damaged, so nothing was sent. Please fill in the form again.",
        ));
    };
    let transfer = TransferRequest::new(
        WalletId(session.wallet_id),
        WalletId(to_wallet_id),
        amount_minor,
        state.config.money.transfer_amount_minor_max,
    )
    .map_err(|problem| refused_notice(problem.for_people()))?;
    Ok(Confirmed {
        to_wallet_id,
        amount_minor,
        key,
        transfer,
    })
}

/// The page to lead to after Send, as `after_send` chose it; `None` for a
/// receipt, which is the stored answer's own page.
fn page_after_send(
    after: AfterSend,
    decided: &Decided,
    confirmed: &Confirmed,
    recipient_name: String,
    currency: &str,
    form: TransferForm,
) -> Option<Shown> {
    match after {
        AfterSend::Receipt => None,
        AfterSend::Original(original) => Some(Shown::Wallet {
            notice: replay_notice(&original, &recipient_name, currency),
            recipient: String::new(),
            amount: String::new(),
        }),
        AfterSend::Review { wait_s } => Some(Shown::Review {
            notice: Some(notice_for(decided, &recipient_name, currency)),
            draft: Draft {
                to_wallet_id: confirmed.to_wallet_id,
                recipient_name,
                amount_minor: confirmed.amount_minor,
                typed_recipient: form.recipient,
                typed_amount: form.amount,
                idempotency_key: confirmed.key.as_uuid(),
            },
            send_again_at_ms: wait_s.map(|seconds| {
                chrono::Utc::now().timestamp_millis() + i64::try_from(seconds * 1000).unwrap_or(0)
            }),
        }),
        AfterSend::Wallet { keep_typed } => {
            let notice = notice_for(decided, &recipient_name, currency);
            let (recipient, amount) = if keep_typed {
                (form.recipient, form.amount)
            } else {
                (String::new(), String::new())
            };
            Some(Shown::Wallet {
                notice,
                recipient,
                amount,
            })
        }
    }
}

/// A confirmation refused before any layer: nothing was sent, and the
/// wallet says why, with what was typed.
async fn nothing_sent(
    state: &AppState,
    session: &Session,
    notice: Notice,
    form: TransferForm,
) -> HttpResponse {
    let shown = Shown::Wallet {
        notice,
        recipient: form.recipient,
        amount: form.amount,
    };
    lead_to(state, session, shown)
        .await
        .unwrap_or_else(|error| unavailable(state, Some(session), &error))
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
            Ok(None) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(ORIGINAL_RESULT_POLL_MS)).await
            }
            _ => return None,
        }
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
            kind: "success".into(),
            layer: None,
            text: receipt_text(response, recipient, currency)
                .unwrap_or_else(|| "The transfer was made.".into()),
        },
        Answer::Stored { response, .. } => Notice {
            kind: "refused".into(),
            layer: decided.decision.layer.name_for_people().map(str::to_owned),
            text: problem_text(&response.body),
        },
        Answer::Refused(problem) => Notice {
            kind: "refused".into(),
            layer: decided.decision.layer.name_for_people().map(str::to_owned),
            text: problem.for_people().to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Decision;
    use crate::defense::Refusal;
    use crate::ending::Settled;
    use crate::feed::EntryPoint;
    use crate::problem::{Problem, ProblemType};

    fn stored(status: u16, replayed: bool) -> Decided {
        let settled = Settled {
            decision: Decision::new(Layer::RowGuard, Outcome::Accepted),
            response: StoredResponse {
                status,
                body: "{}".into(),
            },
            replayed,
            owner: None,
        };
        Decided::of(EntryPoint::Transfer, Ok(settled), None)
    }

    fn refused(kind: ProblemType, layer: Layer) -> Decided {
        let problem = Problem::new(kind, "refused").with_retry_after_s(3);
        Decided::refused(
            EntryPoint::Transfer,
            Refusal::new(problem, layer, Outcome::Rejected),
            None,
        )
    }

    #[test]
    fn a_transfer_made_now_redirects_and_a_replay_of_one_does_not() {
        assert_eq!(after_send(&stored(201, false), None), AfterSend::Receipt);
        assert_eq!(
            after_send(&stored(201, true), None),
            AfterSend::Wallet { keep_typed: false }
        );
    }

    #[test]
    fn a_stored_refusal_keeps_what_was_typed_for_correction() {
        assert_eq!(
            after_send(&stored(422, false), None),
            AfterSend::Wallet { keep_typed: true }
        );
        assert_eq!(
            after_send(
                &refused(ProblemType::IdempotencyKeyReused, Layer::Idempotency),
                None
            ),
            AfterSend::Wallet { keep_typed: true }
        );
    }

    #[test]
    fn a_double_submit_shows_the_first_copys_result() {
        let original = StoredResponse {
            status: 201,
            body: "{}".into(),
        };
        let decided = refused(ProblemType::CooldownActive, Layer::Cooldown);
        assert_eq!(
            after_send(&decided, Some(original.clone())),
            AfterSend::Original(original)
        );
    }

    #[test]
    fn what_may_be_sent_again_is_reviewed_again_and_only_the_cooldown_counts_down() {
        assert_eq!(
            after_send(&refused(ProblemType::CooldownActive, Layer::Cooldown), None),
            AfterSend::Review { wait_s: Some(3) }
        );
        for kind in [
            ProblemType::IdempotencyKeyInFlight,
            ProblemType::VersionConflict,
            ProblemType::ServiceUnavailable,
            ProblemType::OutcomeUnknown,
        ] {
            assert_eq!(
                after_send(&refused(kind, Layer::NoLayer), None),
                AfterSend::Review { wait_s: None },
                "{kind:?}"
            );
        }
    }
}
