//! The record of a gateway answer: settle, release or postpone, each once
//! however many holders of the row or reconciles ask.

use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use super::{Taken, millis};
use crate::payout::gateway::GatewayAnswer;
use crate::state::AppState;

/// How recording an answer ended: the PostgreSQL enum `payout_record`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "payout_record", rename_all = "snake_case")]
pub enum Recorded {
    Done,
    Already,
    Contradicted,
    LeaseLost,
}

/// Records one attempt's answer: settle, release (a definitive refusal
/// only), or postpone with backoff; `true` when the attempts ran out and
/// the payout now needs a person.
pub async fn record_answer(
    state: &AppState,
    row: &Taken,
    answer: &GatewayAnswer,
) -> Result<(Recorded, bool), sqlx::Error> {
    let db = &state.db;
    let payouts = &state.config.payouts;
    let ended = |recorded: Result<Recorded, sqlx::Error>| recorded.map(|recorded| (recorded, false));
    let attempts_max = payouts.retry.attempts_max;
    match answer {
        GatewayAnswer::Sent { reference } => ended(settle(db, row.payout_id, reference).await),
        GatewayAnswer::Refused { reason } => ended(
            release(
                db,
                row.payout_id,
                reason,
                state.config.database.wallet_lock_wait_ms_max,
            )
            .await,
        ),
        GatewayAnswer::Unknown { why, retry_after } => {
            let attempt = u32::try_from(row.attempts.max(1) - 1).unwrap_or_default();
            // Honoured up to the cap: a day's wait would outlast the key.
            let retry_after = retry_after.map(|after| after.min(payouts.retry.cap));
            let delay = payouts.retry.delay(attempt, retry_after);
            postpone(db, row, delay, why, attempts_max, false).await
        }
        GatewayAnswer::Rejected { why } => postpone(db, row, Duration::ZERO, why, attempts_max, true).await,
        GatewayAnswer::NeverReceived => {
            postpone(db, row, Duration::ZERO, "no answer", attempts_max, false).await
        }
    }
}

/// The gateway sent it: settle the hold, once.
pub async fn settle<'e>(
    db: impl sqlx::PgExecutor<'e>,
    payout_id: Uuid,
    reference: &str,
) -> Result<Recorded, sqlx::Error> {
    sqlx::query_scalar("SELECT recorded FROM payout_settle($1, $2, $3)")
        .bind(payout_id)
        .bind(Uuid::now_v7())
        .bind(reference)
        .fetch_one(db)
        .await
}

/// The gateway sent them: settle each hold, once, all in one transaction
/// (`payout_settle_all()`); how each was recorded.
pub(super) async fn settle_all(
    db: &PgPool,
    sent: &[(Uuid, &str)],
) -> Result<Vec<(Uuid, Recorded)>, sqlx::Error> {
    if sent.is_empty() {
        return Ok(Vec::new());
    }
    let payout_ids: Vec<Uuid> = sent.iter().map(|(payout_id, _)| *payout_id).collect();
    let transfer_ids: Vec<Uuid> = sent.iter().map(|_| Uuid::now_v7()).collect();
    let references: Vec<&str> = sent.iter().map(|(_, reference)| *reference).collect();
    sqlx::query_as("SELECT settled_payout_id, recorded FROM payout_settle_all($1, $2, $3)")
        .bind(payout_ids)
        .bind(transfer_ids)
        .bind(references)
        .fetch_all(db)
        .await
}

/// The gateway refused it for good: release the hold, once.
pub async fn release<'e>(
    db: impl sqlx::PgExecutor<'e>,
    payout_id: Uuid,
    reason: &str,
    wait_ms: u16,
) -> Result<Recorded, sqlx::Error> {
    sqlx::query_scalar("SELECT recorded FROM payout_release($1, $2, $3, $4)")
        .bind(payout_id)
        .bind(Uuid::now_v7())
        .bind(reason)
        .bind(i32::from(wait_ms))
        .fetch_one(db)
        .await
}

/// The outcome is unknown: due again after `delay`, or, with `give_up` or
/// the attempts spent, needing a person (`true`).
pub(super) async fn postpone(
    db: &PgPool,
    row: &Taken,
    delay: Duration,
    why: &str,
    attempts_max: u32,
    give_up: bool,
) -> Result<(Recorded, bool), sqlx::Error> {
    sqlx::query_as("SELECT recorded, needs_attention FROM payout_postpone($1, $2, $3, $4, $5, $6)")
        .bind(row.payout_id)
        .bind(row.lease_token)
        .bind(millis(delay))
        .bind(why)
        .bind(i32::try_from(attempts_max).unwrap_or(i32::MAX))
        .bind(give_up)
        .fetch_one(db)
        .await
}
