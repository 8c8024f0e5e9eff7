//! The OpenAPI 3 document, generated from the handlers' annotations and
//! served at `/api/openapi.json`.
//!
//! The annotations give each operation its parameters, bodies and success.
//! `contract` then adds what the annotations cannot say once for all: every
//! failure an operation can answer, grouped by status with the problem
//! types from the catalogue (`problem::ProblemType`), the headers every
//! response carries, the limits this deployment enforces (from its
//! settings, `bounds`), and the links that lead from one operation's answer
//! to the next.

use serde_json::{Map, Value, json};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::problem::ProblemType::{self, *};
use crate::routes::{decisions, deposits, health, payouts, transfers, users, wallets};
use crate::settings::Config;
use crate::state::AppState;

mod bounds;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Layered Wallet",
        description = "Wallet transfers behind three stacked defenses: a Redis cooldown lock, \
                       a PostgreSQL idempotency key and a guarded balance update. Errors are \
                       RFC 9457 problem details; `GET /problems/{slug}` explains each type. \
                       A method a path does not take answers 405 with `Allow`."
    ),
    paths(
        users::sign_up,
        users::sign_in,
        users::revoke_current,
        wallets::get_wallet,
        transfers::create_transfer,
        transfers::list_transfers,
        transfers::get_transfer,
        deposits::receive_deposit,
        payouts::create_payout,
        payouts::list_payouts,
        payouts::get_payout,
        decisions::list_decisions,
        decisions::stream_decisions,
        health::healthz,
        health::readyz,
    ),
    components(schemas(crate::problem::Problem, crate::problem::FieldError, crate::feed::Source)),
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Failures a JSON body can meet before the operation looks at it.
const BODY: [ProblemType; 5] = [
    MalformedRequest,
    PayloadTooLarge,
    BodyTooSlow,
    UnsupportedMediaType,
    ValidationFailed,
];
/// Failures of the stores, or of the service itself.
const STORES: [ProblemType; 2] = [ServiceUnavailable, InternalError];

/// A payout's own failures, after its body's.
const PAYOUT: [ProblemType; 9] = [
    Unauthorized,
    CsrfTokenInvalid,
    NotYourWallet,
    PayoutsNotOffered,
    IdempotencyKeyInFlight,
    IdempotencyKeyReused,
    InsufficientFunds,
    CooldownActive,
    OutcomeUnknown,
];
/// A transfer's own failures, after its body's.
const TRANSFER: [ProblemType; 15] = [
    Unauthorized,
    CsrfTokenInvalid,
    NotYourWallet,
    IdempotencyKeyInFlight,
    IdempotencyKeyReused,
    InsufficientFunds,
    UnknownTargetWallet,
    CurrencyMismatch,
    SameWallet,
    CooldownActive,
    Overloaded,
    OutcomeUnknown,
    RaceLabSwitchesOff,
    LabPassInvalid,
    LabWalletsOnly,
];
/// A deposit notification's own failures, after its body's.
const DEPOSIT: [ProblemType; 9] = [
    ProviderSignatureInvalid,
    EventPayloadChanged,
    EventInFlight,
    DepositWalletUnknown,
    DepositCurrencyMismatch,
    DepositAmountOverLimit,
    DepositEventTooOld,
    DepositEventInFuture,
    OutcomeUnknown,
];

/// Every failure each operation can answer, besides `STORES`.
fn failures(method: &str, path: &str) -> Vec<ProblemType> {
    let specific: Vec<ProblemType> = match (method, path) {
        ("post", "/api/v1/users") => [&BODY[..], &[NameTaken, TooManyAttempts]].concat(),
        // A sign-in with a body of the wrong shape is a wrong name or
        // password (401), so as to say nothing about which.
        ("post", "/api/v1/tokens") => vec![
            MalformedRequest,
            PayloadTooLarge,
            BodyTooSlow,
            UnsupportedMediaType,
            Unauthorized,
            TooManyAttempts,
        ],
        ("delete", "/api/v1/tokens/current") => vec![Unauthorized, CsrfTokenInvalid],
        ("get", "/api/v1/wallets/{id}")
        | ("get", "/api/v1/transfers/{id}")
        | ("get", "/api/v1/payouts/{id}") => {
            vec![Unauthorized, NotFound]
        }
        ("post", "/api/v1/payouts") => [&BODY[..], &PAYOUT[..]].concat(),
        ("post", "/api/v1/transfers") => [&BODY[..], &TRANSFER[..]].concat(),
        ("post", "/api/v1/webhooks/deposits") => [&BODY[..], &DEPOSIT[..]].concat(),
        ("get", "/api/v1/transfers") | ("get", "/api/v1/payouts") | ("get", "/api/v1/decisions") => {
            vec![Unauthorized, ValidationFailed]
        }
        ("get", "/api/v1/decisions/stream") => vec![Unauthorized, ValidationFailed, TooManyStreams],
        _ => return Vec::new(),
    };
    [specific, STORES.to_vec()].concat()
}

/// A header as a response documents it.
fn header(description: &str) -> Value {
    json!({ "description": description, "schema": { "type": "string" } })
}

/// Completes the generated document: failures, headers, limits, links.
fn contract(document: &mut Value, config: &Config) {
    let Some(paths) = document["paths"].as_object_mut() else {
        return;
    };
    for (path, item) in paths.iter_mut() {
        let Some(operations) = item.as_object_mut() else {
            continue;
        };
        for (method, operation) in operations.iter_mut() {
            let responses = operation["responses"]
                .as_object_mut()
                .expect("every operation has responses");
            add_failures(responses, &failures(method, path));
            for (status, response) in responses.iter_mut() {
                if response.get("description").is_none() {
                    response["description"] = json!(if status.starts_with('2') {
                        "Success"
                    } else {
                        "See the body"
                    });
                }
                add_headers(response, method, path, status);
            }
            add_links(responses, method, path);
            bounds::constrain_parameters(operation, config);
            // An operation anyone may call says so, rather than leaving a
            // reader (or a linter) to guess: signing up and in, the probes,
            // and the provider's webhook, which its signature authenticates.
            if operation.get("security").is_none() {
                operation["security"] = json!([]);
            }
        }
    }
    // Relative to wherever the document was fetched from: every instance
    // serves it about itself.
    document["servers"] = json!([{ "url": "/", "description": "The instance that served this document" }]);
    bounds::state(document, config);
}

fn add_failures(responses: &mut Map<String, Value>, failures: &[ProblemType]) {
    let mut by_status: std::collections::BTreeMap<u16, Vec<ProblemType>> = Default::default();
    for kind in failures {
        by_status.entry(kind.status().as_u16()).or_default().push(*kind);
    }
    for (status, kinds) in by_status {
        let description = kinds
            .iter()
            .map(|kind| format!("`/problems/{}`: {}", kind.slug(), kind.title()))
            .collect::<Vec<_>>()
            .join("; ");
        responses.insert(
            status.to_string(),
            json!({
                "description": description,
                "content": { "application/problem+json": {
                    "schema": { "$ref": "#/components/schemas/Problem" }
                } }
            }),
        );
    }
}

fn add_headers(response: &mut Value, method: &str, path: &str, status: &str) {
    let mut headers = Map::new();
    headers.insert(
        "X-Request-Id".into(),
        header("This request's id: the one the client sent (up to 64 of [A-Za-z0-9-_.:]), or a new UUID"),
    );
    headers.insert(
        "traceparent".into(),
        header("W3C trace context of this request's server span"),
    );
    // Every 429 and 503 problem says when to come back; a 503 readiness
    // report is not a problem, and says nothing of the kind.
    let is_problem = response.pointer("/content/application~1problem+json").is_some();
    if matches!(status, "429" | "503") && is_problem {
        headers.insert("Retry-After".into(), header("Seconds to wait before retrying"));
    }
    if status == "401" && path != "/api/v1/webhooks/deposits" {
        headers.insert(
            "WWW-Authenticate".into(),
            header("`Bearer`, with `error=\"invalid_token\"` for a bad token"),
        );
    }
    if method == "post" && ["/api/v1/transfers", "/api/v1/webhooks/deposits"].contains(&path) {
        headers.insert(
            "Defense-Decision".into(),
            header("Which layer decided and how, e.g. `layer=cooldown, outcome=refused`"),
        );
        if status == "201" {
            headers.insert(
                "Idempotent-Replayed".into(),
                header("`true` when this is the stored response of an earlier request with the same key"),
            );
        }
    }
    if let Some(object) = response.as_object_mut() {
        object.insert("headers".into(), Value::Object(headers));
    }
}

/// Links from one answer to the operations it enables, so that a client
/// (or a stateful fuzzer) can follow them.
fn add_links(responses: &mut Map<String, Value>, method: &str, path: &str) {
    let authenticated = || {
        json!({
            "ListTransfers": { "operationId": "list_transfers" },
            "ListDecisions": { "operationId": "list_decisions" },
        })
    };
    let links = match (method, path) {
        ("post", "/api/v1/users") => {
            let mut links = authenticated();
            links["GetWallet"] = json!({
                "operationId": "get_wallet",
                "parameters": { "id": "$response.body#/wallet_id" }
            });
            links
        }
        ("post", "/api/v1/tokens") => authenticated(),
        ("post", "/api/v1/transfers") => json!({
            "GetTransfer": { "operationId": "get_transfer", "parameters": { "id": "$response.body#/id" } },
            "GetSourceWallet": {
                "operationId": "get_wallet",
                "parameters": { "id": "$response.body#/from_wallet_id" }
            },
        }),
        _ => return,
    };
    if let Some(success) = responses.get_mut("201") {
        success["links"] = links;
    }
}

/// The document as this deployment serves it. Built once, at start-up
/// (`AppState::api_document`): it depends only on the settings.
pub fn document(config: &Config) -> Value {
    let mut document = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
    contract(&mut document, config);
    document
}

/// `GET /api/openapi.json`: the document built once, at start-up.
pub async fn serve(state: actix_web::web::Data<AppState>) -> actix_web::HttpResponse {
    actix_web::HttpResponse::Ok()
        .content_type("application/json")
        .body(state.api_document.clone())
}
