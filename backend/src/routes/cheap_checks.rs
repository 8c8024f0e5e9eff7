//! The ladder of cheap checks every create handler climbs before the
//! layers, in one order: who is calling (a MAC, no I/O), the CSRF header,
//! the body and its rules, the `Idempotency-Key`. Each rung that refuses
//! ends the request with one decision (`crate::ending`), storing nothing.

use actix_web::{HttpRequest, web};

use crate::auth::VerifiedToken;
use crate::decision::{Layer, Outcome};
use crate::defense::Refusal;
use crate::defense::idempotency::IdempotencyKey;
use crate::ending::Decided;
use crate::feed::EntryPoint;
use crate::problem::Problem;
use crate::routes::read_json_body;
use crate::state::AppState;

/// A request that passed the ladder.
pub struct Checked<T> {
    pub caller: VerifiedToken,
    pub request: T,
    pub key: Option<IdempotencyKey>,
}

/// Climbs the ladder for `entry_point`. `closed` is asked after the caller
/// is known and before the body is read: an entry point this deployment
/// does not offer says so first. `parse` applies the body's rules.
pub async fn climb<T>(
    request: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
    entry_point: EntryPoint,
    closed: impl FnOnce(&AppState) -> Option<Refusal>,
    parse: impl FnOnce(&[u8]) -> Result<T, Problem>,
) -> Result<Checked<T>, Decided> {
    let refused = |problem, layer, outcome, user| {
        Decided::refused(entry_point, Refusal::new(problem, layer, outcome), user)
    };
    let caller = match state.tokens.verify_request(request) {
        Ok(caller) => caller,
        Err(problem) => return Err(refused(problem, Layer::NoLayer, Outcome::Unauthorized, None)),
    };
    let user = Some(caller.user_id);
    if let Err(problem) = state.tokens.require_csrf_header(request, &caller) {
        return Err(refused(problem, Layer::NoLayer, Outcome::Unauthorized, user));
    }
    if let Some(refusal) = closed(state) {
        return Err(Decided::refused(entry_point, refusal, user));
    }
    let body = match read_json_body(request, payload, &state.config).await {
        Ok(body) => body,
        Err(problem) => return Err(refused(problem, Layer::NoLayer, Outcome::Invalid, user)),
    };
    let parsed = match parse(&body) {
        Ok(parsed) => parsed,
        Err(problem) => return Err(refused(problem, Layer::NoLayer, Outcome::Invalid, user)),
    };
    let key = match IdempotencyKey::from_request(request, state.config.idempotency.key_required) {
        Ok(key) => key,
        Err(problem) => return Err(refused(problem, Layer::Idempotency, Outcome::Invalid, user)),
    };
    Ok(Checked {
        caller,
        request: parsed,
        key,
    })
}
