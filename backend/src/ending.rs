//! How every request that moves money ends, whatever its entry point: one
//! [`Decided`] (which layer decided, and how), one [`Answer`] (a response
//! the transaction stored, or a refusal that stored nothing), and one
//! [`report`] of it to the request's span, the metrics, a log line and the
//! owner's live feed. Transfers, deposits, broker commands and payouts end
//! here; so do the race lab's requests, which go through the same layers.
//!
//! The pieces the wings' transactions share live here too, so that each is
//! defined once: what a transaction settles on ([`Settled`]), how a layer
//! that ran inside PostgreSQL is reported ([`layer_span`]), why access was
//! refused before the layers ([`AccessRefusal`]), and when a request gives
//! its cooldown window back ([`give_the_window_back_if_unused`]).

use actix_web::HttpResponse;
use actix_web::http::{StatusCode, header};
use chrono::Utc;
use uuid::Uuid;

use crate::decision::{Decision, Layer, Outcome};
use crate::defense::Refusal;
use crate::defense::cooldown::CooldownPass;
use crate::defense::idempotency::{IdempotencyKey, StoredResponse};
use crate::defense::row_guard::GuardVerdict;
use crate::domain::UserId;
use crate::feed::{EntryPoint, FeedEntry};
use crate::problem::{self, PROBLEM_CONTENT_TYPE, Problem, ProblemType, SqlState};
use crate::state::AppState;
use crate::telemetry::RequestContext;

/// What a request was about, once it parsed: for the log line and the feed.
#[derive(Debug, Clone, Default)]
pub struct Subject {
    pub amount_minor: Option<i64>,
    /// The wallet money went to: a transfer's target, a deposit's wallet.
    pub to_wallet_id: Option<Uuid>,
    /// A deposit's event id, or a command's.
    pub event_id: Option<String>,
    /// Who sent it, when that is not the caller: a command's issuer.
    pub sender: Option<String>,
}

/// How one request ended: the one decision, the answer, and what the
/// report needs to know.
pub struct Decided {
    pub entry_point: EntryPoint,
    pub decision: Decision,
    pub answer: Answer,
    /// Whose feed gets the entry: the caller, or a deposit's wallet owner.
    /// `None` for a caller whose token was not live: they speak for nobody.
    pub user: Option<UserId>,
    pub key: Option<IdempotencyKey>,
    pub subject: Subject,
    /// Sent by a race-lab run: the feed keeps it in the visitor's lab
    /// stream.
    pub lab: bool,
}

pub enum Answer {
    /// A response the transaction produced (and stored, with a key or an
    /// event id): a success or a business refusal, fresh or replayed.
    Stored {
        response: StoredResponse,
        replayed: bool,
    },
    /// A refusal that was not stored.
    Refused(Problem),
}

/// A response the layers in PostgreSQL settled on: the transaction made it
/// (a success, or a business refusal stored with the key like a success),
/// or the key replayed it.
#[derive(Debug)]
pub struct Settled {
    pub decision: Decision,
    pub response: StoredResponse,
    /// A retry of a completed request, answered with its stored response.
    pub replayed: bool,
    /// Whose wallet it concerns, when the caller is not the one to tell: a
    /// deposit's wallet owner.
    pub owner: Option<UserId>,
}

impl Settled {
    /// The edge could not be asked (its store was unavailable): an accepted
    /// request went through with only the PostgreSQL layers deciding.
    pub fn degraded_if(mut self, without_store: bool) -> Self {
        if without_store && self.decision.outcome == Outcome::Accepted {
            self.decision.outcome = Outcome::Degraded;
        }
        self
    }
}

impl Decided {
    /// Refused before or by a layer, storing nothing.
    pub fn refused(entry_point: EntryPoint, refusal: Refusal, user: Option<UserId>) -> Self {
        Self {
            entry_point,
            decision: refusal.decision,
            answer: Answer::Refused(refusal.problem),
            user,
            key: None,
            subject: Subject::default(),
            lab: false,
        }
    }

    /// What the layers in PostgreSQL settled on, or their refusal.
    pub fn of(entry_point: EntryPoint, settled: Result<Settled, Refusal>, user: Option<UserId>) -> Self {
        match settled {
            Ok(settled) => Self {
                entry_point,
                decision: settled.decision,
                answer: Answer::Stored {
                    response: settled.response,
                    replayed: settled.replayed,
                },
                user: settled.owner.or(user),
                key: None,
                subject: Subject::default(),
                lab: false,
            },
            Err(refusal) => Self::refused(entry_point, refusal, user),
        }
    }

    pub fn with_key(mut self, key: Option<IdempotencyKey>) -> Self {
        self.key = key;
        self
    }

    pub fn about(mut self, subject: Subject) -> Self {
        self.subject = subject;
        self
    }

    /// A token found revoked or expired speaks for nobody: the decision
    /// goes in no one's feed.
    pub fn for_a_live_token(mut self) -> Self {
        if self.is_refusal(ProblemType::Unauthorized) {
            self.user = None;
        }
        self
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

    /// The id of the payout a `202` is about.
    pub fn payout_id(&self) -> Option<Uuid> {
        #[derive(serde::Deserialize)]
        struct Receipt {
            id: Uuid,
        }
        match &self.answer {
            Answer::Stored { response, .. }
                if self.entry_point == EntryPoint::Payout && response.status == 202 =>
            {
                serde_json::from_str::<Receipt>(&response.body)
                    .ok()
                    .map(|receipt| receipt.id)
            }
            _ => None,
        }
    }

    /// The HTTP response, with the `Defense-Decision` header, and for a
    /// payout's `202` (fresh or replayed) the payout's `Location`.
    pub fn into_response(self, context: &RequestContext) -> HttpResponse {
        let location = self.payout_id().map(|id| format!("/api/v1/payouts/{id}"));
        let mut response = self.answer.into_response(self.decision, context);
        if let Some(location) = location
            && let Ok(value) = header::HeaderValue::from_str(&location)
        {
            response.headers_mut().insert(header::LOCATION, value);
        }
        response
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
    /// and the trace.
    pub fn into_response(self, decision: Decision, context: &RequestContext) -> HttpResponse {
        let mut response = match self {
            Answer::Stored { response, replayed } => stored_response(response, replayed),
            Answer::Refused(problem) => problem
                .with_layer(decision.layer)
                .with_trace_id(&context.trace_id)
                .into_response(),
        };
        decision.mark(&mut response);
        response
    }
}

/// Sends a response exactly as stored: the same status and the same bytes.
fn stored_response(stored: StoredResponse, replayed: bool) -> HttpResponse {
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
    response.body(stored.body)
}

/// The entry point as the metrics and the log line name it.
pub fn entry_point_label(entry_point: EntryPoint) -> &'static str {
    match entry_point {
        EntryPoint::Transfer => "transfer",
        EntryPoint::Deposit => "deposit",
        EntryPoint::Command => "command",
        EntryPoint::Payout => "payout",
    }
}

/// Reports the decision everywhere, the same way for every entry point:
/// the request's span, the metrics, one log line and the owner's feed.
/// (The response header is added by `Decided::into_response`.)
pub fn report(state: &AppState, context: &RequestContext, decided: &Decided) {
    let Decided {
        entry_point,
        decision,
        user,
        key,
        ..
    } = *decided;
    let entry = entry_point_label(entry_point);
    let status = decided.status();
    let latency_ms = context.started.elapsed().as_secs_f64() * 1000.0;
    let span = tracing::Span::current();
    span.record("defense.layer", decision.layer.as_str());
    span.record("defense.outcome", decision.outcome.as_str());
    state.metrics.count_decision(entry, decision);
    if let Some(kind) = decided.problem_type() {
        state.metrics.count_problem(entry, kind.slug());
    }
    tracing::info!(
        entry_point = entry,
        decision.layer = decision.layer.as_str(),
        decision.outcome = decision.outcome.as_str(),
        http.status = status,
        latency_ms,
        request.id = %context.request_id,
        trace.id = %context.trace_id,
        user.id = user.map(|user| user.to_string()),
        idempotency.key_hash = key.map(IdempotencyKey::hash_hex),
        event.id = decided.subject.event_id.as_deref(),
        event.sender = decided.subject.sender.as_deref(),
        payout.id = decided.payout_id().map(|id| id.to_string()),
        instance.id = %state.instance_id,
        "{entry} decided"
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
                instance_id: String::from(&*state.instance_id),
                request_id: context.request_id.clone(),
                trace_id: context.trace_id.clone(),
                idempotency_key: key.map(IdempotencyKey::as_uuid),
                layer: decision.layer,
                outcome: decision.outcome,
                status,
                latency_ms,
                amount_minor: decided.subject.amount_minor,
                to_wallet_id: decided.subject.to_wallet_id,
                problem_type: decided.problem_type().map(|kind| kind.slug().to_owned()),
                lab: decided.lab,
                entry_point,
            },
        );
    }
}

/// Gives the window back when the request is known not to have changed
/// anything and should not hold it: our failure that changed nothing (so
/// an honest retry is not blocked for the rest of the TTL), or a token the
/// transaction found revoked (whose owner it must not lock out). When the
/// outcome is unknown the window stays: a keyless retry inside it could
/// pay twice. A refusal keeps its window too (a burst of the same refused
/// request must still meet the edge), marked so that the next 429 says the
/// last attempt was refused. Transfers and payouts follow this rule.
pub async fn give_the_window_back_if_unused(state: &AppState, cooldown: CooldownPass, answer: &Answer) {
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

/// Why a transaction refused before the layers: the PostgreSQL enum
/// `access_refusal`, value for value, as `transfer()` and `payout()`
/// answer it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "access_refusal", rename_all = "snake_case")]
pub enum AccessRefusal {
    TokenNotLive,
    NotOwner,
    /// The target is out of the caller's reach (another visitor's race-lab
    /// wallet, a lab payouts' holds wallet): answered as no wallet at all.
    UnknownTarget,
}

impl AccessRefusal {
    /// The refusal a client gets; `not_your_wallet` says which wallets the
    /// entry point moves money from.
    pub fn refusal(self, not_your_wallet: &str) -> Refusal {
        match self {
            AccessRefusal::TokenNotLive => Refusal::token_not_live(),
            AccessRefusal::NotOwner => Refusal::new(
                Problem::new(ProblemType::NotYourWallet, not_your_wallet.to_owned()),
                Layer::NoLayer,
                Outcome::Unauthorized,
            ),
            AccessRefusal::UnknownTarget => Refusal::new(
                GuardVerdict::UnknownTarget
                    .refusal()
                    .unwrap_or_else(Problem::internal),
                Layer::NoLayer,
                GuardVerdict::UnknownTarget.decision_outcome(),
            ),
        }
    }
}

/// A layer that ran inside the database, reported as a span of its own
/// with the time it took there (`span_name` is `defense.<layer>`).
pub fn layer_span(
    state: &AppState,
    layer: Layer,
    outcome: Outcome,
    db_ms: Option<f64>,
    key: Option<IdempotencyKey>,
) {
    let outcome = outcome.as_str();
    let db_ms = db_ms.unwrap_or(0.0);
    state
        .metrics
        .observe_layer(layer, std::time::Duration::from_secs_f64(db_ms.max(0.0) / 1000.0));
    // Span names must be static: one arm per layer that runs in SQL.
    let span = match layer {
        Layer::Idempotency => tracing::info_span!(
            "defense.idempotency",
            defense.layer = layer.as_str(),
            defense.outcome = outcome,
            defense.db_ms = db_ms,
            // Hashed only when the span is recorded: a span field's value
            // is not computed for a span no one collects.
            idempotency.key_hash = key.map(IdempotencyKey::hash_hex),
        ),
        Layer::Inbox => tracing::info_span!(
            "defense.inbox",
            defense.layer = layer.as_str(),
            defense.outcome = outcome,
            defense.db_ms = db_ms,
        ),
        _ => tracing::info_span!(
            "defense.row_guard",
            defense.layer = layer.as_str(),
            defense.outcome = outcome,
            defense.db_ms = db_ms,
        ),
    };
    drop(span.entered());
}

/// A failure of the one call that does a request's work, said as what is
/// known (`problem::of_the_work`): nothing changed, or, when the connection
/// broke after the call was sent, `unknown` (which says how to retry
/// safely). A row lock waited out is the row guard's answer.
pub fn database_refusal(
    error: &sqlx::Error,
    may_have_committed: bool,
    doing: &str,
    unknown: impl FnOnce() -> Problem,
) -> Refusal {
    let problem = problem::of_the_work(error, may_have_committed, doing, unknown);
    let layer = match SqlState::of(error) {
        Some(SqlState::LockNotAvailable) => Layer::RowGuard,
        _ => Layer::NoLayer,
    };
    Refusal::new(problem, layer, Outcome::Error)
}
