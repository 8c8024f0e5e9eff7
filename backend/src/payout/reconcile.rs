//! `wallet-server reconcile`: for each payout that needs a person, ask the
//! gateway what became of it, by the key every attempt carried, and settle
//! or release it from the answer.
//!
//! - **sent**: settle, as the dispatcher would have;
//! - **refused**: release the hold;
//! - **never received** (404): the gateway keeps a record of every key it
//!   applied, in the same transaction as the sending, so no sending
//!   happened: release. A payout is asked only once its last attempt is
//!   `payout_reconcile_quiet_ms` old, so that a call given up on cannot
//!   still be at work in the gateway;
//! - **anything else** (the gateway is down, or answers what no retry
//!   changes): left as it is, to be run again.

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
    let waiting: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM payouts
          WHERE state = 'needs_attention' AND currency <> 'LAB' AND updated_at <= now() - make_interval(secs => $1)
          ORDER BY created_at
          LIMIT $2",
    )
    .bind(payouts.reconcile_quiet.as_secs_f64())
    .bind(RECONCILE_BATCH_PAYOUTS_MAX)
    .fetch_all(db)
    .await?;
    let mut reconciled = Reconciled::default();
    for payout_id in waiting {
        let answer = gateway.look_up(&payout_id.to_string()).await;
        let recorded = match &answer {
            GatewayAnswer::Sent { reference } => dispatcher::settle(db, payout_id, reference).await?,
            GatewayAnswer::Refused { reason } => {
                dispatcher::release(db, payout_id, reason, config.database.wallet_lock_wait_ms_max).await?
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
                reconciled
                    .left
                    .push((payout_id, format!("the gateway could not say: {why}")));
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
