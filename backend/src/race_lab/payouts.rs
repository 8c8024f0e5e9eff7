//! The race lab's payouts: money that leaves, through the payout saga, to
//! the lab's own bank (`race_lab::bank`), which sends each payout and
//! then loses its first answer.
//!
//! 1. **The orders**: N payouts of lab money from wallet A at once, each
//!    with a key of its own, released together by a barrier. Each goes
//!    through the payout's transaction itself (`payout::transaction`:
//!    the key's claim, the hold on A, the outbox row), in the mode the
//!    run's switch chose. They skip the cooldown, whose window is per
//!    person and action: N different orders are not duplicates.
//! 2. **The sending**: the lab plays the dispatcher for its visitor's lab
//!    payouts only. It takes their outbox rows under a lease
//!    (`race_lab_payout_take()`), asks the lab's bank with each attempt's key, and
//!    records each answer as the dispatcher does
//!    (`payout::dispatcher::record_answer`): sent settles, unknown waits for
//!    the next attempt under the deployment's retry policy.
//!
//! With the bank called inside the transaction there is no outbox: the
//! lost answer rolls the transaction back after the money left.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use tokio::sync::Barrier;

use super::Switches;
use super::burst::{Answer, Shot, overlap_max};
use super::deliveries::Delivered;
use crate::auth::VerifiedToken;
use crate::decision::{Layer, Outcome};
use crate::defense::Refusal;
use crate::defense::idempotency::IdempotencyKey;
use crate::domain::{AmountMinor, WalletId};
use crate::payout::dispatcher::{self, Taken};
use crate::payout::transaction::{self, PayoutCall};
use crate::payout::{self, PayoutRequest};
use crate::problem::Problem;
use crate::race_lab::bank::{BankCounts, LabBank};
use crate::settings::PayoutMode;
use crate::state::AppState;
use crate::weakened;

/// The destination each lab payout names: the lab bank's account number
/// `i`.
fn destination(index: usize) -> String {
    format!("lab-bank-account-{}", index + 1)
}

/// Sends the run's orders, then, unless the bank was called inside each
/// transaction, sends their payouts to the lab's bank until each has an
/// ending or the run's time is up.
pub async fn pay_out(
    state: &AppState,
    caller: &VerifiedToken,
    switches: Switches,
    orders: &[Shot],
    run_max: Duration,
) -> (Delivered, BankCounts) {
    let bank = LabBank::new(state.db.clone(), caller.user_id, switches.bank_deduplicates);
    let released = Instant::now();
    let barrier = Arc::new(Barrier::new(orders.len().max(1)));
    let tasks = orders.iter().enumerate().map(|(index, shot)| {
        let (barrier, bank) = (barrier.clone(), &bank);
        async move {
            barrier.wait().await;
            one_order(state, caller, bank, switches.payout_mode, index, shot, released).await
        }
    });
    let mut answers = join_all(tasks).await;
    answers.sort_by_key(|answer| answer.sent);
    if switches.payout_mode != PayoutMode::CallInTransaction {
        let deadline = released + run_max;
        if let Err(error) = dispatch(state, caller, &bank, switches.payout_mode, deadline).await {
            // What was recorded stays; the page reads it from the database.
            tracing::warn!(error = %error, "a race-lab payout run lost the database while sending");
        }
    }
    let overlap_max = overlap_max(&answers);
    (Delivered { answers, overlap_max }, bank.counts())
}

async fn one_order(
    state: &AppState,
    caller: &VerifiedToken,
    bank: &LabBank,
    mode: PayoutMode,
    index: usize,
    shot: &Shot,
    released: Instant,
) -> Answer {
    let sent = released.elapsed();
    let settled = match AmountMinor::parse(shot.amount_minor, i64::MAX) {
        Ok(amount) => {
            let request = PayoutRequest {
                from: WalletId(shot.from),
                amount,
                destination: destination(index),
            };
            let trace_id = "0".repeat(32);
            let fingerprint = payout::pipeline::fingerprint_of(&request.canonical_json());
            let call = PayoutCall {
                caller,
                request: &request,
                key: shot.key.map(IdempotencyKey::from),
                fingerprint: &fingerprint,
                trace_id: &trace_id,
                traceparent: None,
                sent_by_dispatcher: false,
            };
            // The lab's own connections, as for its transfers: a run never
            // holds the whole pool.
            match state.lab_db_slots.acquire().await {
                Ok(_slot) if mode == PayoutMode::CallInTransaction => {
                    weakened::payout_transaction::execute(state, &call, bank).await
                }
                Ok(_slot) => transaction::execute(state, &call).await,
                Err(_) => Err(Refusal::new(Problem::internal(), Layer::NoLayer, Outcome::Error)),
            }
        }
        Err(problem) => Err(Refusal::new(problem, Layer::NoLayer, Outcome::Invalid)),
    };
    let answered = released.elapsed();
    let (status, decision, replayed, body) = match settled {
        Ok(settled) => (
            settled.response.status,
            settled.decision,
            settled.replayed,
            settled.response.body,
        ),
        Err(refusal) => (
            refusal.problem.status_code().as_u16(),
            refusal.decision,
            false,
            refusal.problem.body(),
        ),
    };
    Answer {
        shot: shot.clone(),
        sent,
        answered,
        status,
        decision: Some(decision),
        replayed,
        body,
        trace_id: None,
    }
}

/// The lab's dispatcher: takes the visitor's due lab payouts and sends
/// each to the lab's bank, until none is left in the outbox or `deadline`
/// passes (a payout still in the outbox then shows as held, not sent).
async fn dispatch(
    state: &AppState,
    caller: &VerifiedToken,
    bank: &LabBank,
    mode: PayoutMode,
    deadline: Instant,
) -> Result<(), sqlx::Error> {
    let payouts = &state.config.payouts;
    let rows_max = u32::try_from(state.config.race_lab.db_connections_max).unwrap_or(u32::MAX);
    while Instant::now() < deadline {
        let taken = take(state, caller, rows_max).await?;
        if taken.is_empty() {
            if outbox_rows(state, caller).await? == 0 {
                return Ok(());
            }
            tokio::time::sleep(payouts.idle.min(Duration::from_millis(50))).await;
            continue;
        }
        for recorded in join_all(taken.iter().map(|row| attempt(state, bank, mode, row))).await {
            recorded?;
        }
    }
    Ok(())
}

/// Takes up to `rows` of the visitor's due lab payouts, each under a fresh
/// lease (`race_lab_payout_take()`, whose columns `Taken` reads).
async fn take(state: &AppState, caller: &VerifiedToken, rows: u32) -> Result<Vec<Taken>, sqlx::Error> {
    sqlx::query_as("SELECT * FROM race_lab_payout_take($1, $2, $3)")
        .bind(caller.user_id.0)
        .bind(i32::try_from(rows).unwrap_or(i32::MAX))
        .bind(dispatcher::millis(state.config.payouts.lease))
        .fetch_all(&state.db)
        .await
}

async fn attempt(state: &AppState, bank: &LabBank, mode: PayoutMode, row: &Taken) -> Result<(), sqlx::Error> {
    let key = dispatcher::attempt_key(mode, row);
    let answer = bank.send(&key, &row.as_gateway_payout()).await;
    dispatcher::record_answer(state, row, &answer).await.map(|_| ())
}

/// The visitor's lab payouts still in the outbox.
async fn outbox_rows(state: &AppState, caller: &VerifiedToken) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT count(*) FROM payout_outbox o JOIN payouts p ON p.id = o.payout_id
          WHERE p.user_id = $1 AND p.currency = 'LAB'",
    )
    .bind(caller.user_id.0)
    .fetch_one(&state.db)
    .await
}
