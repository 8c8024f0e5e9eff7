//! The route table: one list of every public path, the methods it takes
//! and the handler of each. The same list registers the routes and answers
//! `Allow` on a 405, so the two cannot drift apart.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};

use crate::listener::Listener;
use crate::problem::Problem;
use crate::routes::{commands, decisions, deposits, health, payouts, transfers, users, wallets};
use crate::state::AppState;
use crate::web::{self as site, pages};

/// Declares the public routes once. Each line is a path and its methods,
/// each method with its handler; methods are written as HTTP spells them.
macro_rules! route_table {
    ($($path:literal => $($method:ident $handler:path),+;)*) => {
        /// Every public path (a `{…}` segment matches any one segment) and
        /// the methods it takes, as `Allow` lists them.
        pub const ROUTE_METHODS: &[(&str, &str)] = &[
            $(($path, route_table!(@allow $($method),+)),)*
        ];

        /// Registers the public routes and the fallback for everything else.
        pub fn configure(config: &mut web::ServiceConfig) {
            $($(config.route($path, route_table!(@method $method).to($handler));)+)*
            config.default_service(web::to(not_found));
        }
    };
    (@allow $first:ident $(, $rest:ident)*) => { concat!(stringify!($first) $(, ", ", stringify!($rest))*) };
    (@method GET) => { web::get() };
    (@method POST) => { web::post() };
    (@method DELETE) => { web::delete() };
}

route_table! {
    "/healthz" => GET health::healthz;
    "/readyz" => GET health::readyz;
    "/api/openapi.json" => GET crate::openapi::serve;
    "/api/v1/users" => POST users::sign_up;
    "/api/v1/tokens" => POST users::sign_in;
    "/api/v1/tokens/current" => DELETE users::revoke_current;
    "/api/v1/wallets/{id}" => GET wallets::get_wallet;
    "/api/v1/transfers" => GET transfers::list_transfers, POST transfers::create_transfer;
    "/api/v1/transfers/{id}" => GET transfers::get_transfer;
    "/api/v1/webhooks/deposits" => POST deposits::receive_deposit;
    "/api/v1/payouts" => GET payouts::list_payouts, POST payouts::create_payout;
    "/api/v1/payouts/{id}" => GET payouts::get_payout;
    "/api/v1/decisions" => GET decisions::list_decisions;
    "/api/v1/decisions/stream" => GET decisions::stream_decisions;
    "/" => GET pages::home;
    "/signin" => GET pages::sign_in_page, POST pages::sign_in;
    "/signup" => GET pages::sign_up_page, POST pages::sign_up;
    "/signout" => POST pages::sign_out;
    "/wallet" => GET pages::wallet;
    "/wallet/review" => GET pages::review_shown, POST pages::review;
    "/wallet/transfer" => GET pages::to_wallet, POST pages::transfer;
    "/wallet/payout/review" => GET pages::payout_review_shown, POST pages::review_payout;
    "/wallet/payout" => GET pages::to_wallet, POST pages::pay_out;
    "/race-lab" => GET pages::race_lab;
    "/race-lab/runs" => GET pages::to_race_lab, POST pages::fire_race_lab_run;
    "/race-lab/runs/{id}" => GET pages::show_race_lab_run;
    "/race-lab/comparisons" => GET pages::show_race_lab_comparison, POST pages::fire_race_lab_comparison;
    "/feed" => GET pages::feed;
    "/problems/{slug}" => GET pages::problem_type;
    "/static/{file}" => GET site::static_file;
}

/// The methods `path` takes, if it is a public path.
pub fn methods_of(path: &str) -> Option<&'static str> {
    route_of(path).map(|(_, methods)| methods)
}

/// The route table's pattern that `path` matches, e.g.
/// `/api/v1/wallets/{id}`: what metrics and spans are labelled with, from
/// a fixed set, whatever the client sends.
pub fn pattern_of(path: &str) -> Option<&'static str> {
    route_of(path).map(|(pattern, _)| pattern)
}

/// The public route `path` matches, and its methods. A `{…}` segment of a
/// pattern matches any one segment.
fn route_of(path: &str) -> Option<(&'static str, &'static str)> {
    // Most routes have no `{…}` segment: those are found by one lookup,
    // not by trying the table in order (every request asks, for its
    // span and metrics).
    static LITERAL_ROUTES: std::sync::OnceLock<std::collections::HashMap<&'static str, &'static str>> =
        std::sync::OnceLock::new();
    let literal = LITERAL_ROUTES.get_or_init(|| {
        ROUTE_METHODS
            .iter()
            .filter(|(pattern, _)| !pattern.contains('{'))
            .copied()
            .collect()
    });
    if let Some((pattern, methods)) = literal.get_key_value(path) {
        return Some((pattern, methods));
    }
    let matches = |pattern: &str| {
        let (mut want, mut have) = (pattern.split('/'), path.split('/'));
        loop {
            match (want.next(), have.next()) {
                (None, None) => return true,
                (Some(w), Some(h)) if w == h || (w.starts_with('{') && !h.is_empty()) => {}
                _ => return false,
            }
        }
    };
    ROUTE_METHODS
        .iter()
        .find(|(pattern, _)| matches(pattern))
        .copied()
}

/// The admin listener's routes: for operators and scrapers on the private
/// network, never exposed by the load balancer. They match only requests
/// that came in on the admin listener (`listener::keep_listeners_apart`).
pub fn configure_admin(config: &mut web::ServiceConfig) {
    config.service(
        web::scope("")
            .guard(actix_web::guard::fn_guard(|ctx| {
                ctx.req_data().get::<Listener>() == Some(&Listener::Admin)
            }))
            .route("/healthz", web::get().to(health::healthz))
            .route("/readyz", web::get().to(health::readyz_detailed))
            .route("/metrics", web::get().to(health::metrics))
            .route("/commands/{id}", web::get().to(commands::command_outcome)),
    );
}

/// Any route we do not serve: a 405 with `Allow` when the path exists for
/// other methods; otherwise a page for a browser, problem details for
/// everyone else.
async fn not_found(request: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    if let Some(allow) = methods_of(request.path()) {
        return Problem::method_not_allowed(request.method().as_str(), request.path(), allow).into_response();
    }
    let wants_html = request
        .headers()
        .get(header::ACCEPT)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|accept| accept.contains("text/html"));
    if wants_html && !request.path().starts_with("/api/") {
        return pages::not_found_page(&request, &state).await;
    }
    Problem::not_found(format!(
        "There is nothing at {} {}.",
        request.method(),
        request.path()
    ))
    .into_response()
}
