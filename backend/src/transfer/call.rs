//! What both transaction paths share: a transfer request's inputs (`Call`),
//! the variants a demonstration asks for (`Variants`), what the paths end
//! in (`Settled`, or a `TransactionError`), and how the layers' verdicts
//! become that end.

use crate::auth::VerifiedToken;
use crate::decision::{Decision, Layer, Outcome};
use crate::defense::Refusal;
use crate::defense::idempotency::{Claim, IdempotencyKey, StoredResponse};
use crate::defense::row_guard::GuardVerdict;
use crate::domain::TransferRequest;
use crate::problem::{Problem, ProblemType};
use crate::race_lab::Switches;
use crate::settings::{IdempotencyMode, RowGuardMode};
use crate::state::AppState;

/// A response layers 2 and 3 settled on: the transaction made it (a 201,
/// or a business refusal stored with the key like a success), or the key
/// replayed it.
#[derive(Debug)]
pub struct Settled {
    pub response: StoredResponse,
    pub decision: Decision,
    /// A retry of a completed request, answered with its stored response.
    pub replayed: bool,
}

impl Settled {
    /// The cooldown could not be asked (fail-open): an accepted transfer
    /// went through with only the PostgreSQL layers deciding.
    pub fn degraded(mut self) -> Self {
        if self.decision.outcome == Outcome::Accepted {
            self.decision.outcome = Outcome::Degraded;
        }
        self
    }
}

pub(super) enum TransactionError {
    Database {
        error: sqlx::Error,
        /// The error came from the call that commits (the one-call
        /// statement, or `COMMIT`): if the connection broke, the transfer
        /// may have been made.
        may_have_committed: bool,
    },
    /// Refused without storing anything; the transaction rolls back.
    Refused(Refusal),
    /// The database answered with a combination the protocol rules out: a
    /// bug on one side, never guessed at.
    Protocol(String),
}

impl TransactionError {
    pub(super) fn at_commit(error: sqlx::Error) -> Self {
        TransactionError::Database {
            error,
            may_have_committed: true,
        }
    }
}

/// Any statement before the commit: a broken connection there rolls back.
/// A protocol error from reading an answer is a bug, not a failure.
impl From<sqlx::Error> for TransactionError {
    fn from(error: sqlx::Error) -> Self {
        match error {
            sqlx::Error::Protocol(what) => TransactionError::Protocol(what),
            error => TransactionError::Database {
                error,
                may_have_committed: false,
            },
        }
    }
}

/// One transfer request's inputs to the transaction.
pub(super) struct Call<'a> {
    pub(super) state: &'a AppState,
    pub(super) caller: &'a VerifiedToken,
    pub(super) request: &'a TransferRequest,
    pub(super) key: Option<IdempotencyKey>,
    pub(super) fingerprint: &'a [u8; 32],
    pub(super) trace_id: &'a str,
    /// A race-lab request's switches: honoured for lab wallets only.
    pub(super) lab: Option<Switches>,
}

/// The naive variants a demonstration runs instead of the production
/// transaction, and on which wallets.
#[derive(Clone, Copy)]
pub(super) struct Variants {
    pub(super) idempotency: IdempotencyMode,
    pub(super) row_guard: RowGuardMode,
    pub(super) naive_window: std::time::Duration,
    /// A race-lab run's switches: the naive row-guard statements match lab
    /// rows only.
    pub(super) lab_only: bool,
}

impl Variants {
    /// The naive variants this call asks for, or `None` when every layer
    /// runs at full strength: then the call takes the production path,
    /// whether it came from a client or from the race lab.
    pub(super) fn of(call: &Call<'_>) -> Option<Self> {
        let config = &call.state.config;
        let variants = match call.lab {
            Some(switches) => Variants {
                idempotency: switches.idempotency,
                row_guard: switches.row_guard,
                naive_window: config.race_lab.naive_window,
                lab_only: true,
            },
            None => Variants {
                idempotency: config.idempotency.mode,
                row_guard: config.row_guard.mode,
                naive_window: config.demo.naive_window,
                lab_only: false,
            },
        };
        let full_strength =
            variants.idempotency == IdempotencyMode::Atomic && variants.row_guard == RowGuardMode::Guarded;
        (!full_strength).then_some(variants)
    }
}

pub(super) fn not_your_wallet() -> Refusal {
    Refusal::new(
        Problem::new(
            ProblemType::NotYourWallet,
            "You can only send money from a wallet you own.",
        ),
        Layer::NoLayer,
        Outcome::Unauthorized,
    )
}

/// A claim that ends the request before the row guard: a replay, or one of
/// the key's refusals. `None` when the claim is ours.
pub(super) fn ended_by_claim(claim: Claim) -> Option<Result<Settled, TransactionError>> {
    match claim {
        Claim::Started => None,
        Claim::Replayed(response) => Some(Ok(Settled {
            response,
            decision: Decision::new(Layer::Idempotency, Outcome::Replayed),
            replayed: true,
        })),
        Claim::KeyReused => Some(Err(TransactionError::Refused(Claim::key_reused()))),
        Claim::InFlight => Some(Err(TransactionError::Refused(Claim::in_flight()))),
    }
}

/// The decision the row guard's answer makes; `None` for a caller who does
/// not own the source wallet, refused without storing anything.
pub(super) fn decision_of(outcome: GuardVerdict) -> Option<Decision> {
    (outcome != GuardVerdict::NotOwner).then(|| Decision::new(Layer::RowGuard, outcome.decision_outcome()))
}
