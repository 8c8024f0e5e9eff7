//! DEMO ONLY: a payout's bank called inside its transaction
//! (`payout_mode = call_in_transaction`, or a race-lab run's switch). The
//! production payout holds the money and writes an outbox row in one
//! transaction, and the dispatcher calls the gateway afterwards
//! (`crate::payout::transaction`, `crate::payout::dispatcher`).
//!
//! Here the hold, the call and the settlement share one transaction, rolled
//! back when the call fails. The rollback undoes the debit, not the
//! sending: a call whose answer was lost leaves money gone without a debit,
//! and the client's retry sends it again under a new payout id. Never copy
//! this into a service.

use uuid::Uuid;

use crate::decision::{Layer, Outcome};
use crate::defense::Refusal;
use crate::ending::Settled;
use crate::payout::dispatcher;
use crate::payout::gateway::{GatewayAnswer, GatewayPayout, PayoutBank};
use crate::payout::transaction::{PAYOUT_STATEMENT, PayoutCall, PayoutRow, bind, database_refusal, settle};
use crate::problem::Problem;
use crate::state::AppState;

/// Holds, calls `bank` and settles, in one transaction.
pub async fn execute(
    state: &AppState,
    call: &PayoutCall<'_>,
    bank: &impl PayoutBank,
) -> Result<Settled, Refusal> {
    let payout_id = Uuid::now_v7();
    let mut tx = state
        .db
        .begin()
        .await
        .map_err(|error| database_refusal(&error, false))?;
    let row: PayoutRow = bind(sqlx::query_as(PAYOUT_STATEMENT), state, call, payout_id)
        .fetch_one(&mut *tx)
        .await
        .map_err(|error| database_refusal(&error, false))?;
    let settled = settle(state, call.key, row).await?;
    if settled.replayed || settled.decision.outcome != Outcome::Accepted {
        tx.commit()
            .await
            .map_err(|error| database_refusal(&error, true))?;
        return Ok(settled);
    }
    let answer = call_the_bank(&mut tx, state, call, bank, payout_id).await?;
    let recorded = match &answer {
        GatewayAnswer::Sent { reference } => dispatcher::settle(&mut *tx, payout_id, reference).await,
        GatewayAnswer::Refused { reason } => {
            dispatcher::release(
                &mut *tx,
                payout_id,
                reason,
                state.config.database.wallet_lock_wait_ms_max,
            )
            .await
        }
        GatewayAnswer::Unknown { .. } | GatewayAnswer::Rejected { .. } | GatewayAnswer::NeverReceived => {
            tracing::warn!(
                payout.id = %payout_id,
                gateway.answer = answer.label(),
                "UNSAFE: rolled a payout back after a gateway call whose outcome is unknown"
            );
            drop(tx);
            return Err(Refusal::new(
                Problem::unavailable(
                    "The bank did not answer in time, so this payout's hold was rolled back. Unsafe demonstration \
                     mode: the bank may have sent the money anyway, and a retry may send it again.",
                ),
                Layer::NoLayer,
                Outcome::Error,
            ));
        }
    };
    recorded.map_err(|error| database_refusal(&error, false))?;
    tx.commit()
        .await
        .map_err(|error| database_refusal(&error, true))?;
    Ok(settled)
}

/// The call, inside the transaction that holds the money.
async fn call_the_bank(
    tx: &mut sqlx::PgConnection,
    state: &AppState,
    call: &PayoutCall<'_>,
    bank: &impl PayoutBank,
    payout_id: Uuid,
) -> Result<GatewayAnswer, Refusal> {
    let currency: String = sqlx::query_scalar("SELECT currency FROM payouts WHERE id = $1")
        .bind(payout_id)
        .fetch_one(&mut *tx)
        .await
        .map_err(|error| database_refusal(&error, false))?;
    let payout = GatewayPayout {
        amount_minor: call.request.amount.get(),
        currency: &currency,
        destination: &call.request.destination,
        reference: payout_id,
    };
    let answer = bank
        .send_payout(&payout_id.to_string(), &payout, call.traceparent)
        .await;
    if bank.is_the_gateway() {
        state
            .metrics
            .payout_attempts
            .with_label_values(&[answer.label()])
            .inc();
    }
    Ok(answer)
}
