//! DEMO ONLY: layers 2 and 3 one statement at a time, so that a weakened
//! variant (`crate::weakened::idempotency`, `crate::weakened::row_guard`)
//! can stand in for either layer: a race-lab run with a layer made naive,
//! or a deployment started in a demonstration mode. With every layer at
//! full strength a transfer never comes here: it runs the production
//! `transfer()` in one call (`crate::transfer::transaction`).

use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use sqlx::{AssertSqlSafe, PgConnection};
use uuid::Uuid;

use super::idempotency;
use super::idempotency_key_lock::KeyLock;
use super::row_guard::{self, StepByStep};
use crate::decision::{Layer, Outcome};
use crate::defense::Refusal;
use crate::defense::idempotency::{Claim, IdempotencyKey, StoredResponse};
use crate::defense::row_guard::{GuardVerdict, Guarded};
use crate::ending::{AccessRefusal, Settled};
use crate::problem::Problem;
use crate::settings::{Config, IdempotencyMode, RowGuardMode};
use crate::transfer::transaction::{
    Call, NOT_YOUR_WALLET, TransactionError, decision_of, ended_by_claim, with_retries,
};

/// The weakened variants a demonstration runs instead of the production
/// transaction, and on which wallets.
#[derive(Clone, Copy)]
pub struct Variants {
    pub idempotency: IdempotencyMode,
    pub row_guard: RowGuardMode,
    /// The pause inside a naive variant's race window.
    pub naive_window: Duration,
    /// A race-lab run's: the naive row-guard statements match lab rows only.
    pub lab_only: bool,
}

impl Variants {
    /// The variants a deployment was started in, or `None` when every
    /// layer runs at full strength (production).
    pub fn of_deployment(config: &Config) -> Option<Self> {
        Variants {
            idempotency: config.idempotency.mode,
            row_guard: config.row_guard.mode,
            naive_window: config.demo.naive_window,
            lab_only: false,
        }
        .weakened()
    }

    /// `None` when these variants are the production layers after all.
    pub fn weakened(self) -> Option<Self> {
        let full_strength =
            self.idempotency == IdempotencyMode::Atomic && self.row_guard == RowGuardMode::Guarded;
        (!full_strength).then_some(self)
    }
}

/// Runs the step-by-step transaction, retried and ended as the production
/// one is. A Redis lock on the key (`redis_key_lock`) is taken before the
/// transaction and let go after it, however it ended.
pub async fn execute(call: Call<'_>, variants: Variants) -> Result<Settled, Refusal> {
    let key = call
        .key
        .filter(|_| variants.idempotency == IdempotencyMode::RedisKeyLock);
    let Some(key) = key else {
        return with_retries(call.state, || in_steps(call, variants)).await;
    };
    let Some(store) = call.state.redis.clone() else {
        return Err(Refusal::new(
            Problem::unavailable(
                "The Redis lock on idempotency keys needs Redis, and this deployment has none. Nothing was changed.",
            ),
            Layer::Idempotency,
            Outcome::Error,
        ));
    };
    let lock = KeyLock::new(&call.state.config, store);
    let permit = match lock.acquire(call.caller.user_id, key).await {
        Ok(Some(permit)) => permit,
        Ok(None) => return Err(Claim::in_flight()),
        Err(error) => {
            tracing::warn!(error, "could not ask Redis for an idempotency key's lock");
            return Err(Refusal::new(
                Problem::unavailable(
                    "Redis, which holds the locks on idempotency keys here, did not answer. Nothing was changed.",
                ),
                Layer::Idempotency,
                Outcome::Error,
            ));
        }
    };
    let settled = with_retries(call.state, || in_steps(call, variants)).await;
    lock.release(permit).await;
    settled
}

/// One attempt: token, claim, guard, record, each a statement of its own.
async fn in_steps(call: Call<'_>, variants: Variants) -> Result<Settled, TransactionError> {
    let state = call.state;
    let wallet_wait_ms = state.config.database.wallet_lock_wait_ms_max;
    let mut tx = state
        .db
        .begin_with(AssertSqlSafe(format!(
            "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = '{wallet_wait_ms}ms'"
        )))
        .await?;
    access(&mut tx, call).await?;

    // Layer 2: claim the key, as the variant does.
    let key = call.key.filter(|_| variants.idempotency != IdempotencyMode::Off);
    if let Some(key) = key {
        let started = Instant::now();
        let claim = claim(&mut tx, call, key, variants).await?;
        state.metrics.observe_layer(Layer::Idempotency, started.elapsed());
        if let Some(ended) = ended_by_claim(claim) {
            return ended;
        }
    }

    // Layer 3: the row guard, as the variant does.
    let transfer_id = Uuid::now_v7();
    let started = Instant::now();
    let guarded = guard(&mut tx, call, key, transfer_id, variants).await?;
    state.metrics.observe_layer(Layer::RowGuard, started.elapsed());
    let decision = decision_of(guarded.verdict)?;
    let response = response_of(&mut tx, call, transfer_id, &guarded).await?;
    let receipt = guarded.applied.map(|_| response.body.as_str());

    record_and_commit(tx, call, key, variants, transfer_id, guarded.verdict, receipt).await?;
    Ok(Settled {
        response,
        decision,
        replayed: false,
        owner: None,
    })
}

/// The access check `transfer()` makes, race-lab sandbox included: the
/// row guard knows nothing of the lab.
async fn access(tx: &mut PgConnection, call: Call<'_>) -> Result<(), TransactionError> {
    let refused: Option<AccessRefusal> = sqlx::query_scalar("SELECT access_refused($1, $2, $3, $4)")
        .bind(call.caller.user_id.0)
        .bind(&call.caller.hash[..])
        .bind(call.request.from.0)
        .bind(call.request.to.0)
        .fetch_one(&mut *tx)
        .await?;
    match refused {
        Some(refused) => Err(TransactionError::refused(refused.refusal(NOT_YOUR_WALLET))),
        None => Ok(()),
    }
}

/// Stores the answer with the key, as the variant does, and commits:
/// check-then-insert records the key only after the transfer committed.
async fn record_and_commit(
    mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
    call: Call<'_>,
    key: Option<IdempotencyKey>,
    variants: Variants,
    transfer_id: Uuid,
    verdict: GuardVerdict,
    receipt: Option<&str>,
) -> Result<(), TransactionError> {
    let (state, user) = (call.state, call.caller.user_id);
    match (key, variants.idempotency) {
        (Some(key), IdempotencyMode::CheckThenInsert) => {
            tx.commit().await.map_err(TransactionError::at_commit)?;
            let retention_hours = state.config.idempotency.retention_hours;
            let (fingerprint, trace_id) = (call.fingerprint, call.trace_id);
            idempotency::naive_record(
                &state.db,
                user,
                key,
                fingerprint,
                verdict,
                receipt,
                trace_id,
                transfer_id,
                retention_hours,
            )
            .await
            // The transfer is committed; only its key's record failed.
            .map_err(TransactionError::at_commit)
        }
        (Some(key), _) => {
            idempotency::complete(&mut tx, user, key, verdict, receipt, call.trace_id, transfer_id).await?;
            tx.commit().await.map_err(TransactionError::at_commit)
        }
        (None, _) => tx.commit().await.map_err(TransactionError::at_commit),
    }
}

/// Layer 2 in the variant's way: check-then-insert looks and pauses; the
/// alternatives claim under a lock after a point read, and the claim's
/// insert still decides if the lock failed to keep another request out (a
/// Redis lock expired under a paused holder); the atomic claim inserts.
async fn claim(
    tx: &mut PgConnection,
    call: Call<'_>,
    key: IdempotencyKey,
    variants: Variants,
) -> Result<Claim, TransactionError> {
    let config = &call.state.config;
    let user = call.caller.user_id;
    let mode = variants.idempotency;
    if mode == IdempotencyMode::CheckThenInsert {
        let seen = idempotency::look_up(tx, user, key, call.fingerprint).await?;
        tokio::time::sleep(variants.naive_window).await;
        return Ok(seen.unwrap_or(Claim::Started));
    }
    let under_a_lock = matches!(
        mode,
        IdempotencyMode::AdvisoryLock | IdempotencyMode::RedisKeyLock
    );
    if mode == IdempotencyMode::AdvisoryLock
        && !idempotency::advisory_lock(tx, user, key, config.idempotency.advisory_lock_waits).await?
    {
        return Err(TransactionError::refused(Claim::in_flight()));
    }
    if under_a_lock {
        if let Some(seen) = idempotency::look_up(tx, user, key, call.fingerprint).await? {
            return Ok(seen);
        }
        tokio::time::sleep(variants.naive_window).await;
    }
    let retention_hours = config.idempotency.retention_hours;
    let wait_ms = config.idempotency.wait_ms_max;
    Ok(idempotency::claim(tx, user, key, call.fingerprint, retention_hours, wait_ms).await?)
}

/// Layer 3 in the variant's way: the production guard's SQL on its own, or
/// a weakened guard.
async fn guard(
    tx: &mut PgConnection,
    call: Call<'_>,
    key: Option<IdempotencyKey>,
    transfer_id: Uuid,
    variants: Variants,
) -> Result<Guarded, TransactionError> {
    let key_uuid = key.map(IdempotencyKey::as_uuid);
    let (request, user) = (call.request, call.caller.user_id);
    match variants.row_guard {
        RowGuardMode::Guarded => {
            let wait_ms = i32::from(call.state.config.database.wallet_lock_wait_ms_max);
            Ok(crate::defense::row_guard::apply(tx, transfer_id, request, user, key_uuid, wait_ms).await?)
        }
        mode => {
            let step = StepByStep {
                mode,
                race_window: variants.naive_window,
                lab_only: variants.lab_only,
            };
            row_guard::apply_step_by_step(tx, transfer_id, request, user, key_uuid, step)
                .await?
                // The transaction rolls back: the key's claim goes with it.
                .ok_or_else(|| TransactionError::refused(row_guard::version_conflict()))
        }
    }
}

/// The same receipt the one-call path stores (one format), or the guard's
/// refusal.
async fn response_of(
    tx: &mut PgConnection,
    call: Call<'_>,
    transfer_id: Uuid,
    guarded: &Guarded,
) -> Result<StoredResponse, TransactionError> {
    let Some(applied) = guarded.applied else {
        return Ok(StoredResponse::refusal(guarded.verdict, Some(call.trace_id))?);
    };
    debug_assert_eq!(guarded.verdict, GuardVerdict::Accepted);
    let request = call.request;
    let body = sqlx::query_scalar::<_, String>("SELECT transfer_receipt($1, $2, $3, $4, $5, $6)")
        .bind(transfer_id)
        .bind(request.from.0)
        .bind(request.to.0)
        .bind(request.amount.get())
        .bind(applied.created_at)
        .bind(applied.balance_minor_after)
        .fetch_one(&mut *tx)
        .await?;
    Ok(StoredResponse {
        status: StatusCode::CREATED.as_u16(),
        body,
    })
}
