//! `wallet-server reconcile`: for each payout that needs a person, ask the
//! gateway what became of it, by the key every attempt carried, and settle
//! or release it from the answer.
//!
//! - **sent**: settle, as the dispatcher would have;
//! - **refused** (a 422 with the gateway's error body): release the hold;
//! - **never received** (the gateway protocol's unknown-key answer, a 404
//!   of problem type `UNKNOWN_KEY_PROBLEM_TYPE`): the gateway keeps a
//!   record of every key it applied, in the same transaction as the
//!   sending, so no sending happened: release. A payout is asked only once
//!   its last attempt is `payout_reconcile_quiet_ms` old, so that a call
//!   given up on cannot still be at work in the gateway. But the gateway
//!   remembers a key only for `payout_gateway_key_retention_hours`: for an
//!   older payout the same answer may mean it forgot a sending, so the
//!   hold stays;
//! - **anything else** (the gateway is down, a redirect, a 404 from a
//!   wrong path or a proxy, an answer no retry changes): left as it is,
//!   with why in the payout's `reason`, to be run again or looked at.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::dispatcher::{self, Recorded};
use super::gateway::{GatewayAnswer, GatewayClient};
use crate::settings::{Config, PayoutMode};

/// What one run did, payout by payout.
#[derive(Debug, Default, Serialize)]
pub struct Reconciled {
    pub settled: Vec<Uuid>,
    pub released: Vec<Uuid>,
    /// Still needing a person, with why.
    pub left: Vec<(Uuid, String)>,
}

/// The most payouts one run looks at; run it again for more.
pub const RECONCILE_BATCH_PAYOUTS_MAX: i64 = 1_000;

/// Reconciles every payout needing a person whose last attempt is old
/// enough.
pub async fn run(db: &PgPool, config: &Config) -> anyhow::Result<Reconciled> {
    let payouts = &config.payouts;
    anyhow::ensure!(
        payouts.offered(),
        "payout_gateway_url is empty: this deployment sends no payouts"
    );
    anyhow::ensure!(
        payouts.mode == PayoutMode::Outbox,
        "reconcile asks the gateway by the payout's own key, which only payout_mode = outbox sends"
    );
    let gateway = GatewayClient::new(&payouts.gateway_url, payouts.retry.request_timeout)?;
    let waiting = waiting(db, config).await?;
    let mut reconciled = Reconciled::default();
    for (payout_id, created_at, past_retention) in waiting {
        let answer = gateway.look_up(&payout_id.to_string()).await;
        let recorded = match &answer {
            GatewayAnswer::Sent { reference } => dispatcher::settle(db, payout_id, reference).await?,
            GatewayAnswer::Refused { reason } => {
                dispatcher::release(db, payout_id, reason, config.database.wallet_lock_wait_ms_max).await?
            }
            GatewayAnswer::NeverReceived if past_retention => {
                let why = format!(
                    "the gateway has no record of its key, but the payout was made at {} and the gateway \
                     remembers keys for {} hours (payout_gateway_key_retention_hours): it may have forgotten a \
                     sending, so the hold stays until a person checks the gateway's ledger",
                    created_at.format("%Y-%m-%d %H:%M:%S UTC"),
                    payouts.gateway_key_retention.as_secs() / 3_600,
                );
                leave(db, &mut reconciled, payout_id, why).await?;
                continue;
            }
            GatewayAnswer::NeverReceived => {
                dispatcher::release(
                    db,
                    payout_id,
                    "the gateway never received it: nothing was sent",
                    config.database.wallet_lock_wait_ms_max,
                )
                .await?
            }
            GatewayAnswer::Unknown { why, .. } | GatewayAnswer::Rejected { why } => {
                let why = format!("reconcile: the gateway could not say: {why}");
                leave(db, &mut reconciled, payout_id, why).await?;
                continue;
            }
        };
        match (recorded, &answer) {
            (Recorded::Done | Recorded::Already, GatewayAnswer::Sent { .. }) => {
                reconciled.settled.push(payout_id)
            }
            (Recorded::Done | Recorded::Already, _) => reconciled.released.push(payout_id),
            (Recorded::Contradicted | Recorded::LeaseLost, _) => reconciled.left.push((
                payout_id,
                "the gateway's answer contradicts how the payout ended".to_owned(),
            )),
        }
    }
    Ok(reconciled)
}

/// The payouts needing a person whose last attempt is quiet enough, with
/// when each was made and whether that is past the gateway's key
/// retention. The retention is counted from the payout's creation, which
/// is no later than its first attempt: the count errs towards keeping the
/// hold.
async fn waiting(db: &PgPool, config: &Config) -> sqlx::Result<Vec<(Uuid, DateTime<Utc>, bool)>> {
    sqlx::query_as(
        "SELECT id, created_at, created_at <= now() - make_interval(secs => $3)
           FROM payouts
          WHERE state = 'needs_attention' AND currency <> 'LAB' AND updated_at <= now() - make_interval(secs => $1)
          ORDER BY created_at
          LIMIT $2",
    )
    .bind(config.payouts.reconcile_quiet.as_secs_f64())
    .bind(RECONCILE_BATCH_PAYOUTS_MAX)
    .bind(config.payouts.gateway_key_retention.as_secs_f64())
    .fetch_all(db)
    .await
}

/// Leaves the payout needing a person, its hold kept, with why as its
/// `reason`. `updated_at` stays: it marks the last attempt, which the
/// quiet period is counted from.
async fn leave(db: &PgPool, reconciled: &mut Reconciled, payout_id: Uuid, why: String) -> sqlx::Result<()> {
    sqlx::query("UPDATE payouts SET reason = left($2, 300) WHERE id = $1 AND state = 'needs_attention'")
        .bind(payout_id)
        .bind(&why)
        .execute(db)
        .await?;
    reconciled.left.push((payout_id, why));
    Ok(())
}
