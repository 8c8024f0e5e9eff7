//! `POST /api/v1/webhooks/deposits`: the payment provider's deposit
//! webhook.
//!
//! The handler is read → verify → parse → pipeline → answer: the body's
//! bytes, the provider's signature over them (nothing unsigned is even
//! parsed, and a user's bearer token means nothing here), the event, then
//! `deposit::pipeline`, which runs the three layers in order.

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::Utc;

use crate::auth::provider_signature;
use crate::decision::{Layer, Outcome};
use crate::defense::Refusal;
use crate::deposit::pipeline;
use crate::deposit::{DepositEvent, DepositReceipt};
use crate::ending::{self, Decided};
use crate::feed::EntryPoint;
use crate::problem::{Problem, ProblemType};
use crate::routes::read_json_body;
use crate::state::AppState;
use crate::telemetry::RequestContext;

/// Credit a wallet with money a payment provider received (called by the
/// provider, signed with a shared secret). Every delivery of one event gets
/// the same status and the same body; 200 and 422 are final, so a provider
/// may stop retrying on them.
#[utoipa::path(
    post, path = "/api/v1/webhooks/deposits", tag = "deposits",
    request_body(content = DepositEventBody, description = "The provider's event"),
    params(
        ("Provider-Signature" = Option<String>, Header, nullable = false,
            description = "Our scheme: `t=<unix seconds>,v1=<hex HMAC-SHA256 of t, a dot and the body>` under a secret in provider_webhook_secrets; several v1 values may be sent during a rotation. Send either this header or the three Standard Webhooks headers, never both: a delivery with neither, or with both schemes, is refused 401 provider-signature-invalid"),
        ("webhook-id" = Option<String>, Header, nullable = false,
            description = "Standard Webhooks: the message id, which must equal the body's event_id. Sent with webhook-timestamp and webhook-signature, all three or none"),
        ("webhook-timestamp" = Option<String>, Header, nullable = false,
            description = "Standard Webhooks: when it was signed, in unix seconds; refused when further than provider_signature_tolerance_s from the server's clock, either way"),
        ("webhook-signature" = Option<String>, Header, nullable = false,
            description = "Standard Webhooks: a space-separated list of `v1,<base64 HMAC-SHA256 of webhook-id, a dot, webhook-timestamp, a dot and the body>` under the key a `whsec_<base64>` secret in provider_webhook_secrets encodes; several signatures may be sent during a rotation"),
    ),
    responses(
        (status = 200, description = "Credited (by this delivery or an earlier one of the same event)", body = DepositReceipt),
    )
)]
pub async fn receive_deposit(
    request: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    let context = RequestContext::of(&request);
    let decided = decide(&request, payload, &state, &context).await;
    ending::report(&state, &context, &decided);
    decided.into_response(&context)
}

async fn decide(
    request: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
    context: &RequestContext,
) -> Decided {
    let refuse = |problem, outcome| {
        Decided::refused(
            EntryPoint::Deposit,
            Refusal::new(problem, Layer::NoLayer, outcome),
            None,
        )
    };
    let invalid = |problem| refuse(problem, Outcome::Invalid);
    let body = match read_json_body(request, payload, &state.config).await {
        Ok(body) => body,
        Err(problem) => return invalid(problem),
    };
    // A signature header sent twice is refused, as every single-valued
    // header is: a proxy in front might check one and this server the other.
    let headers = match provider_signature::SignatureHeaders::of(request) {
        Ok(headers) => headers,
        Err(problem) => return invalid(problem),
    };
    if let Err(refused) = state.provider_signatures.verify(&headers, &body, Utc::now()) {
        tracing::warn!(reason = refused.as_str(), "refused a deposit's signature");
        let problem = Problem::new(
            ProblemType::ProviderSignatureInvalid,
            format!("The deposit was refused because {refused}. Nothing was stored."),
        );
        return refuse(problem, Outcome::Unauthorized);
    }
    let event = match DepositEvent::parse(&body) {
        Ok(event) => event,
        Err(problem) => return invalid(problem),
    };
    pipeline::through_the_layers(state, context, event).await
}

/// The provider's event, as it is sent (documentation only: the body is
/// read field by field, `DepositEvent::parse`).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct DepositEventBody {
    /// The provider's id of this event: 1 to 128 of `[A-Za-z0-9_.:-]`. Every
    /// delivery of one event carries the same id and the same contents.
    event_id: String,
    wallet_id: uuid::Uuid,
    /// Minor units; positive.
    amount_minor: i64,
    /// Three upper-case letters; the wallet's currency.
    currency: String,
    /// When the provider received the money (RFC 3339).
    occurred_at: chrono::DateTime<Utc>,
}
