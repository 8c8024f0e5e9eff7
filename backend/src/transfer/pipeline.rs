//! The transfer pipeline, shared by the API and the browser form: a request
//! that passed the cheap checks (caller, body, key) goes through the three
//! layers in order, and every exit is one decision:
//!
//! 1. the cooldown lock (Redis), which refuses without touching PostgreSQL;
//!    then admission (`admission`), which counts only what the cooldown let
//!    through, so that a burst of copies meets the cooldown's 429s, not
//!    the 503 of a full instance;
//! 2. and 3. the idempotency claim and the row guard, in one PostgreSQL
//!    transaction (`transaction`);
//!
//! then the decision is reported (span, log line, metrics, feed) and turned
//! into an answer by the caller: JSON for the API, a page for the form.

use std::borrow::Cow;
use std::time::Instant;

use actix_web::HttpResponse;
use actix_web::http::{StatusCode, header};
use chrono::Utc;

use crate::auth::VerifiedToken;
use crate::decision::{Decision, Layer, Outcome};
use crate::defense::Refusal;
use crate::defense::cooldown::CooldownPass;
use crate::defense::idempotency::{IdempotencyKey, StoredResponse};
use crate::domain::{TransferRequest, UserId};
use crate::feed::{EntryPoint, FeedEntry};
use crate::problem::{PROBLEM_CONTENT_TYPE, Problem, ProblemType};
use crate::race_lab::Switches;
use crate::state::AppState;
use crate::telemetry::RequestContext;
use crate::transfer::{self, Settled};

/// The action name the cooldown window is scoped to.
pub const COOLDOWN_ACTION: &str = "transfer";
/// ...and for race-lab requests, so that a lab run and the visitor's real
/// transfers never hold each other's window.
const LAB_COOLDOWN_ACTION: &str = "race-lab-transfer";

/// How a transfer request ended: the one decision, the answer, and what
/// the report needs to know.
pub struct Decided {
    pub decision: Decision,
    pub answer: Answer,
    pub user: Option<UserId>,
    pub key: Option<IdempotencyKey>,
    /// What was asked, once it parsed: for the feed's context.
    pub transfer: Option<TransferRequest>,
    /// Sent by a race-lab run (with its switches): the feed keeps it in
    /// the visitor's lab stream.
    pub lab: bool,
}

pub enum Answer {
    /// A response the transaction produced (and stored, with a key): a 201
    /// or a business refusal, fresh or replayed.
    Stored {
        response: StoredResponse,
        replayed: bool,
    },
    /// A refusal that was not stored.
    Refused(Problem),
}

impl Decided {
    /// Refused before or by a layer, without storing anything.
    pub fn refused(
        problem: Problem,
        layer: Layer,
        outcome: Outcome,
        user: Option<UserId>,
        key: Option<IdempotencyKey>,
    ) -> Self {
        Self::of_refusal(Refusal::new(problem, layer, outcome), user, key)
    }

    fn of_refusal(refusal: Refusal, user: Option<UserId>, key: Option<IdempotencyKey>) -> Self {
        Self {
            decision: refusal.decision,
            answer: Answer::Refused(refusal.problem),
            user,
            key,
            transfer: None,
            lab: false,
        }
    }

    fn of_settled(settled: Settled, user: Option<UserId>, key: Option<IdempotencyKey>) -> Self {
        Self {
            decision: settled.decision,
            answer: Answer::Stored {
                response: settled.response,
                replayed: settled.replayed,
            },
            user,
            key,
            transfer: None,
            lab: false,
        }
    }

    /// The problem type of a refusal, stored or not; `None` for a success.
    pub fn problem_type(&self) -> Option<ProblemType> {
        self.answer.problem_type()
    }

    /// Refused, unstored, with a problem of this type.
    pub fn is_refusal(&self, kind: ProblemType) -> bool {
        self.answer.is_refusal(kind)
    }

    pub fn status(&self) -> u16 {
        self.answer.status()
    }

    /// The HTTP response, with the `Defense-Decision` header.
    pub fn into_response(self, context: &RequestContext) -> HttpResponse {
        self.answer.into_response(self.decision, context)
    }
}

impl Answer {
    pub fn status(&self) -> u16 {
        match self {
            Answer::Stored { response, .. } => response.status,
            Answer::Refused(problem) => problem.status,
        }
    }

    /// Refused, unstored, with a problem of this type.
    pub fn is_refusal(&self, kind: ProblemType) -> bool {
        matches!(self, Answer::Refused(problem) if problem.kind == kind)
    }

    /// The problem type of a refusal, stored or not; `None` for a success.
    pub fn problem_type(&self) -> Option<ProblemType> {
        match self {
            Answer::Refused(problem) => Some(problem.kind),
            Answer::Stored { response, .. } if response.status >= 400 => ProblemType::of_body(&response.body),
            Answer::Stored { .. } => None,
        }
    }

    /// The HTTP response, with the `Defense-Decision` header: a stored
    /// answer exactly as stored, or a refusal's problem naming the layer
    /// and the trace. The one way a transfer's or a deposit's decision is
    /// sent.
    pub fn into_response(self, decision: Decision, context: &RequestContext) -> HttpResponse {
        let mut response = match self {
            Answer::Stored { response, replayed } => stored_response(&response, replayed),
            Answer::Refused(problem) => problem
                .with_layer(decision.layer)
                .with_trace_id(&context.trace_id)
                .into_response(),
        };
        decision.mark(&mut response);
        response
    }
}

/// The idempotency fingerprint of a transfer: the same operation whether it
/// came from a script or the browser's form.
pub fn fingerprint_of(transfer_request: &TransferRequest) -> [u8; 32] {
    transfer_request.fingerprint("POST", "/api/v1/transfers")
}

/// The three layers in order, for a request that passed the cheap checks.
/// Every exit is one decision. Shared by the API and the browser form.
/// `lab` is a race-lab request's switches; the transaction refuses them
/// for anything but lab wallets.
pub async fn through_the_layers(
    state: &AppState,
    context: &RequestContext,
    caller: &VerifiedToken,
    transfer_request: &TransferRequest,
    key: Option<IdempotencyKey>,
    lab: Option<Switches>,
) -> Decided {
    let mut decided = decide(state, context, caller, transfer_request, key, lab).await;
    decided.transfer = Some(*transfer_request);
    decided.lab = lab.is_some();
    decided
}

async fn decide(
    state: &AppState,
    context: &RequestContext,
    caller: &VerifiedToken,
    transfer_request: &TransferRequest,
    key: Option<IdempotencyKey>,
    lab: Option<Switches>,
) -> Decided {
    let user = Some(caller.user_id);

    // Layer 1: the cooldown lock. A refusal here touches no database.
    let started = Instant::now();
    let cooldown = match cooldown_action(lab) {
        Some(action) => {
            let body = transfer_request.canonical_json();
            state.cooldown.pass(caller, &action, &body).await
        }
        None => Ok(CooldownPass::OFF),
    };
    state
        .metrics
        .observe_layer(Layer::Cooldown.as_str(), started.elapsed());
    let cooldown = match cooldown {
        Ok(pass) => pass,
        Err(refusal) => return Decided::of_refusal(refusal, user, key).for_a_live_token(),
    };

    // Admission, after the cooldown and before the transaction: a copy of
    // a transfer already in its window was refused above in one Redis
    // round trip, and is no load; only what passed is counted against what
    // this instance takes at once (`transfer::admission`). A transfer
    // refused here changed nothing, so it gives its window back. The place
    // is held until the decision is made. The race lab's requests have
    // bounds of their own (`lab_requests`, `lab_db_slots`), and a run must
    // show the layers, not this limit.
    let _place = match lab {
        None => match state.transfer_admission.admit().await {
            Ok(place) => Some(place),
            Err(overloaded) => {
                let decided = Decided::of_refusal(overloaded, user, key);
                give_the_window_back_if_unused(state, cooldown, &decided.answer).await;
                return decided;
            }
        },
        Some(_) => None,
    };

    // Layers 2 and 3: the idempotency claim and the row guard, in one
    // transaction.
    let fingerprint = fingerprint_of(transfer_request);
    let settled = transfer::execute(
        state,
        caller,
        transfer_request,
        key,
        &fingerprint,
        &context.trace_id,
        lab,
    )
    .await;
    let decided = match settled {
        Ok(settled) if cooldown.without_store => Decided::of_settled(settled.degraded(), user, key),
        Ok(settled) => Decided::of_settled(settled, user, key),
        Err(refusal) => Decided::of_refusal(refusal, user, key),
    };
    give_the_window_back_if_unused(state, cooldown, &decided.answer).await;
    decided.for_a_live_token()
}

/// The action the cooldown window is scoped to, or `None` when a race-lab
/// run switched the layer off. A named lab run has windows of its own.
/// Borrowed for a client's transfer, so that the hot path allocates nothing.
fn cooldown_action(lab: Option<Switches>) -> Option<Cow<'static, str>> {
    match lab {
        None => Some(Cow::Borrowed(COOLDOWN_ACTION)),
        Some(switches) if !switches.cooldown => None,
        Some(Switches { run: Some(run), .. }) => Some(Cow::Owned(format!("{LAB_COOLDOWN_ACTION}:{run}"))),
        Some(_) => Some(Cow::Borrowed(LAB_COOLDOWN_ACTION)),
    }
}

/// Gives the window back when the transfer is known not to have happened
/// and the request should not hold it: our failure that changed nothing
/// (so an honest retry is not blocked for the rest of the TTL), or a token
/// the transaction found revoked (whose owner it must not lock out). When
/// the outcome is unknown the window stays: a keyless retry inside it
/// could pay twice. A refusal keeps its window too (a burst of the same
/// refused request must still meet the edge), marked so that the next 429
/// says the last attempt was refused.
/// The rule is a payout's too.
pub(crate) async fn give_the_window_back_if_unused(
    state: &AppState,
    cooldown: CooldownPass,
    answer: &Answer,
) {
    let Some(permit) = cooldown.permit else {
        return;
    };
    let status = answer.status();
    let changed_nothing = status >= 500 && !answer.is_refusal(ProblemType::OutcomeUnknown);
    if changed_nothing || answer.is_refusal(ProblemType::Unauthorized) {
        state.cooldown.release(&permit).await;
    } else if (400..500).contains(&status) {
        state.cooldown.mark_refused(&permit).await;
    }
}

impl Decided {
    /// A token found revoked or expired speaks for nobody: the decision
    /// goes in no one's feed.
    fn for_a_live_token(mut self) -> Self {
        if self.is_refusal(ProblemType::Unauthorized) {
            self.user = None;
        }
        self
    }
}

/// Reports the decision everywhere, the same way: the request's span, the
/// metrics, one log line and the decision feed. (The response header is
/// added by `Decided::into_response`.)
pub fn report(state: &AppState, context: &RequestContext, decided: &Decided) {
    let Decided {
        decision, user, key, ..
    } = *decided;
    let status = decided.status();
    let latency_ms = context.started.elapsed().as_secs_f64() * 1000.0;
    let span = tracing::Span::current();
    span.record("defense.layer", decision.layer.as_str());
    span.record("defense.outcome", decision.outcome.as_str());
    state.metrics.count_decision(decision);
    if let Some(kind) = decided.problem_type() {
        state
            .metrics
            .transfer_problems
            .with_label_values(&[kind.slug()])
            .inc();
    }
    tracing::info!(
        decision.layer = decision.layer.as_str(),
        decision.outcome = decision.outcome.as_str(),
        http.status = status,
        latency_ms,
        request.id = %context.request_id,
        trace.id = %context.trace_id,
        user.id = user.map(|user| user.to_string()),
        idempotency.key_hash = key.map(IdempotencyKey::hash_hex),
        instance.id = %state.instance_id,
        "transfer decided"
    );
    // An overloaded instance does as little as it can for what it sheds:
    // those refusals are counted above, and stay out of the feed, whose
    // Redis writes they would multiply when it can least afford them.
    let shed = decided.is_refusal(ProblemType::Overloaded);
    if let Some(user) = user.filter(|_| !shed) {
        state.feed.publish(
            user,
            FeedEntry {
                time: Utc::now(),
                instance_id: state.instance_id.to_string(),
                request_id: context.request_id.clone(),
                trace_id: context.trace_id.clone(),
                idempotency_key: key.map(IdempotencyKey::as_uuid),
                layer: decision.layer,
                outcome: decision.outcome,
                status,
                latency_ms,
                amount_minor: decided.transfer.map(|transfer| transfer.amount.get()),
                to_wallet_id: decided.transfer.map(|transfer| transfer.to.0),
                problem_type: decided.problem_type().map(|kind| kind.slug().to_owned()),
                lab: decided.lab,
                entry_point: EntryPoint::Transfer,
            },
        );
    }
}

/// Sends a response exactly as stored: the same status and the same bytes.
fn stored_response(stored: &StoredResponse, replayed: bool) -> HttpResponse {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let content_type = if status.is_success() {
        "application/json"
    } else {
        PROBLEM_CONTENT_TYPE
    };
    let mut response = HttpResponse::build(status);
    response.insert_header((header::CONTENT_TYPE, content_type));
    if replayed {
        response.insert_header(("Idempotent-Replayed", "true"));
    }
    response.body(stored.body.clone())
}
