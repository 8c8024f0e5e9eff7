//! The statement-by-statement transaction, for the naive demonstration
//! variants only: a race-lab run with a layer made naive, or a deployment
//! started in an unsafe demonstration mode. Each statement runs on its own
//! so that a naive variant (check-then-insert, read-decide-write) can stand
//! in for its layer. With every layer at full strength a call never comes
//! here: it runs the production `transfer()` (`transaction::Variants::of`).

use std::time::Instant;

use actix_web::http::StatusCode;
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::call::{Call, Settled, TransactionError, Variants, decision_of, ended_by_claim, not_your_wallet};
use crate::auth;
use crate::decision::Layer;
use crate::decision::Outcome;
use crate::defense::Refusal;
use crate::defense::idempotency::{self, Claim, IdempotencyKey, StoredResponse};
use crate::defense::key_lock::KeyLock;
use crate::defense::row_guard;
use crate::problem::Problem;
use crate::settings::{IdempotencyMode, RowGuardMode};

/// The demonstration path, for naive variants and alternatives only: one
/// statement at a time, so that a variant can stand in for either layer.
/// With every layer at full strength a call never comes here
/// (`Variants::of`). A Redis lock on the key is taken before the
/// transaction and let go after it, however it ended.
pub(super) async fn run(call: &Call<'_>, variants: Variants) -> Result<Settled, TransactionError> {
    let key = call
        .key
        .filter(|_| variants.idempotency == IdempotencyMode::RedisKeyLock);
    let Some(key) = key else {
        return in_steps(call, variants).await;
    };
    let Some(store) = call.state.redis.clone() else {
        return Err(TransactionError::Refused(Refusal::new(
            Problem::unavailable(
                "The Redis lock on idempotency keys needs Redis, and this deployment has none. Nothing was changed.",
            ),
            Layer::Idempotency,
            Outcome::Error,
        )));
    };
    let lock = KeyLock::new(&call.state.config, store);
    let permit = match lock.acquire(call.caller.user_id, key).await {
        Ok(Some(permit)) => permit,
        Ok(None) => return Err(TransactionError::Refused(Claim::in_flight())),
        Err(error) => {
            tracing::warn!(error, "could not ask Redis for an idempotency key's lock");
            return Err(TransactionError::Refused(Refusal::new(
                Problem::unavailable(
                    "Redis, which holds the locks on idempotency keys here, did not answer. Nothing was changed.",
                ),
                Layer::Idempotency,
                Outcome::Error,
            )));
        }
    };
    let settled = in_steps(call, variants).await;
    lock.release(permit).await;
    settled
}

async fn in_steps(call: &Call<'_>, variants: Variants) -> Result<Settled, TransactionError> {
    let Call {
        state,
        caller,
        request,
        key,
        fingerprint,
        trace_id,
        lab: _,
    } = *call;
    let config = &state.config;
    let naive_window = variants.naive_window;
    let wallet_wait_ms = config.database.wallet_lock_wait_ms_max;
    let mut tx = state
        .db
        .begin_with(AssertSqlSafe(format!(
            "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = '{wallet_wait_ms}ms'"
        )))
        .await?;

    if !auth::token_is_live(&mut *tx, caller).await? {
        return Err(TransactionError::Refused(Refusal::token_not_live()));
    }

    // Layer 2: claim the key.
    let key = key.filter(|_| variants.idempotency != IdempotencyMode::Off);
    if let Some(key) = key {
        let started = Instant::now();
        let claim = match variants.idempotency {
            IdempotencyMode::CheckThenInsert => {
                let seen = idempotency::look_up(&mut tx, caller.user_id, key, fingerprint).await?;
                tokio::time::sleep(naive_window).await;
                seen.unwrap_or(Claim::Started)
            }
            // The insert-first claim; for the alternatives, under the key's
            // lock and after a point read. The claim's insert still decides
            // if the lock failed to keep another request out (a Redis lock
            // expired under a paused holder).
            mode => {
                let under_a_lock = matches!(
                    mode,
                    IdempotencyMode::AdvisoryLock | IdempotencyMode::RedisKeyLock
                );
                if mode == IdempotencyMode::AdvisoryLock
                    && !idempotency::advisory_lock(
                        &mut tx,
                        caller.user_id,
                        key,
                        config.idempotency.advisory_lock_waits,
                    )
                    .await?
                {
                    return Err(TransactionError::Refused(Claim::in_flight()));
                }
                let seen = match under_a_lock {
                    true => idempotency::look_up(&mut tx, caller.user_id, key, fingerprint).await?,
                    false => None,
                };
                match seen {
                    Some(seen) => seen,
                    None => {
                        if under_a_lock {
                            tokio::time::sleep(naive_window).await;
                        }
                        idempotency::claim(
                            &mut tx,
                            caller.user_id,
                            key,
                            fingerprint,
                            config.idempotency.retention_hours,
                            config.idempotency.wait_ms_max,
                        )
                        .await?
                    }
                }
            }
        };
        state
            .metrics
            .observe_layer(Layer::Idempotency.as_str(), started.elapsed());
        if let Some(ended) = ended_by_claim(claim) {
            return ended;
        }
    }

    // Layer 3: the row guard.
    let transfer_id = Uuid::now_v7();
    let started = Instant::now();
    let key_uuid = key.map(IdempotencyKey::as_uuid);
    let guarded = match variants.row_guard {
        RowGuardMode::Guarded => {
            row_guard::apply(
                &mut tx,
                transfer_id,
                request,
                caller.user_id,
                key_uuid,
                i32::from(wallet_wait_ms),
            )
            .await?
        }
        mode => row_guard::apply_step_by_step(
            &mut tx,
            transfer_id,
            request,
            caller.user_id,
            key_uuid,
            row_guard::StepByStep {
                mode,
                race_window: naive_window,
                lab_only: variants.lab_only,
            },
        )
        .await?
        // The transaction rolls back: the key's claim goes with it.
        .ok_or_else(|| TransactionError::Refused(row_guard::version_conflict()))?,
    };
    state
        .metrics
        .observe_layer(Layer::RowGuard.as_str(), started.elapsed());
    let decision =
        decision_of(guarded.verdict).ok_or_else(|| TransactionError::Refused(not_your_wallet()))?;
    let response = match guarded.applied {
        // The same receipt the one-call path stores: one format.
        Some(applied) => StoredResponse {
            status: StatusCode::CREATED.as_u16(),
            body: sqlx::query_scalar::<_, String>("SELECT transfer_receipt($1, $2, $3, $4, $5, $6)")
                .bind(transfer_id)
                .bind(request.from.0)
                .bind(request.to.0)
                .bind(request.amount.get())
                .bind(applied.created_at)
                .bind(applied.balance_minor_after)
                .fetch_one(&mut *tx)
                .await?,
        },
        None => StoredResponse::refusal(guarded.verdict, Some(trace_id))?,
    };
    let receipt = guarded.applied.map(|_| response.body.as_str());

    match (key, variants.idempotency) {
        (Some(key), IdempotencyMode::CheckThenInsert) => {
            tx.commit().await.map_err(TransactionError::at_commit)?;
            idempotency::naive_record(
                &state.db,
                caller.user_id,
                key,
                fingerprint,
                guarded.verdict,
                receipt,
                trace_id,
                transfer_id,
                config.idempotency.retention_hours,
            )
            .await
            // The transfer is committed; only its key's record failed.
            .map_err(TransactionError::at_commit)?;
        }
        (Some(key), _) => {
            idempotency::complete(
                &mut tx,
                caller.user_id,
                key,
                guarded.verdict,
                receipt,
                trace_id,
                transfer_id,
            )
            .await?;
            tx.commit().await.map_err(TransactionError::at_commit)?;
        }
        (None, _) => tx.commit().await.map_err(TransactionError::at_commit)?,
    }
    Ok(Settled {
        response,
        decision,
        replayed: false,
    })
}
