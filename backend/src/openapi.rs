//! The OpenAPI 3 document, generated from the handlers' annotations and
//! served at `/api/openapi.json`.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::routes::{decisions, health, transfers, users, wallets};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Layered Wallet",
        description = "Wallet transfers behind three stacked defenses: a Redis cooldown lock, \
                       a PostgreSQL idempotency key and a guarded balance update. Errors are \
                       RFC 9457 problem details."
    ),
    paths(
        users::sign_up,
        users::sign_in,
        users::revoke_current,
        wallets::get_wallet,
        transfers::create_transfer,
        transfers::list_transfers,
        transfers::get_transfer,
        decisions::list_decisions,
        decisions::stream_decisions,
        health::healthz,
        health::readyz,
    ),
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

pub async fn serve() -> actix_web::HttpResponse {
    actix_web::HttpResponse::Ok()
        .content_type("application/json")
        .body(ApiDoc::openapi().to_json().unwrap_or_default())
}
