//! A taken outbox row: what one attempt sends, under which key, and
//! whether it may still be sent.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use super::millis;
use crate::payout::gateway::GatewayPayout;
use crate::settings::PayoutMode;

/// A taken outbox row: `payout_taken`'s columns (`payout_take()`).
#[derive(Debug, sqlx::FromRow)]
pub struct Taken {
    pub payout_id: Uuid,
    pub lease_token: Uuid,
    pub user_id: Uuid,
    pub wallet_id: Uuid,
    pub amount_minor: i64,
    pub currency: String,
    pub destination: String,
    /// This attempt's number, from 1.
    pub attempts: i32,
    pub traceparent: Option<String>,
    pub created_at: DateTime<Utc>,
}

impl Taken {
    /// Whether this is a retry (an earlier attempt may have reached the
    /// gateway) of a payout made `retention` or longer ago: the gateway may
    /// have forgotten its key, and would send it again. Counted from the
    /// payout's creation, no later than its first attempt, so the count
    /// errs towards not sending.
    pub fn retry_past_key_retention(&self, retention: Duration, now: DateTime<Utc>) -> bool {
        let age = now.signed_duration_since(self.created_at);
        self.attempts > 1 && age.to_std().is_ok_and(|age| age >= retention)
    }

    /// The payout as the gateway's API takes it.
    pub fn as_gateway_payout(&self) -> GatewayPayout<'_> {
        GatewayPayout {
            amount_minor: self.amount_minor,
            currency: &self.currency,
            destination: &self.destination,
            reference: self.payout_id,
        }
    }
}

/// The `Idempotency-Key` of one attempt: the payout's id, on every attempt.
pub fn attempt_key(mode: PayoutMode, row: &Taken) -> String {
    match mode {
        // DEMO ONLY: a retry after a lost answer is a new payment.
        PayoutMode::NewKeyPerAttempt => format!("{}.{}", row.payout_id, row.attempts),
        PayoutMode::Outbox | PayoutMode::CallInTransaction => row.payout_id.to_string(),
    }
}

/// Takes up to `rows` due outbox rows of real money, each under a fresh
/// lease (`payout_take()`).
pub async fn take(db: &PgPool, rows: u32, lease: Duration) -> Result<Vec<Taken>, sqlx::Error> {
    sqlx::query_as(
        "SELECT payout_id, lease_token, user_id, wallet_id, amount_minor, currency, destination, attempts,
                traceparent, created_at
           FROM payout_take($1, $2)",
    )
    .bind(i32::try_from(rows).unwrap_or(i32::MAX))
    .bind(millis(lease))
    .fetch_all(db)
    .await
}
