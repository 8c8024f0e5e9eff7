//! Deleting what has expired: idempotency keys past their retention, token
//! hashes past their expiry, kept pages and inbox rows past theirs, in bounded
//! batches, on a timer.

use std::time::Duration;

use sqlx::PgPool;

/// Deletes expired idempotency keys in batches of at most
/// `batch_rows_max` until none are left; returns how many it deleted.
/// After expiry a key is a new request anyway (`idempotency_claim()` takes
/// an expired claim over), so this only reclaims space.
pub async fn expired_idempotency_keys(pool: &PgPool, batch_rows_max: i64) -> Result<u64, sqlx::Error> {
    delete_in_batches(
        pool,
        "DELETE FROM idempotency_keys WHERE ctid IN (
             SELECT ctid FROM idempotency_keys
             WHERE expires_at <= now()
             LIMIT $1
             FOR UPDATE SKIP LOCKED)",
        batch_rows_max,
    )
    .await
}

/// How long the oldest expired idempotency key has been expired, in
/// seconds; 0 when none is. What the sweeper is behind by.
pub async fn oldest_expired_idempotency_key_age_s(pool: &PgPool) -> Result<f64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT COALESCE(EXTRACT(EPOCH FROM now() - min(expires_at))::float8, 0)
         FROM idempotency_keys WHERE expires_at <= now()",
    )
    .fetch_one(pool)
    .await
}

/// Deletes expired token hashes, at most `batch_rows_max` per statement,
/// until none are left; returns how many it deleted. An expired token is
/// refused whether or not its row is still there (`token_is_live()`).
pub async fn expired_tokens(pool: &PgPool, batch_rows_max: i64) -> Result<u64, sqlx::Error> {
    delete_in_batches(
        pool,
        "DELETE FROM api_tokens WHERE token_hash IN (
             SELECT token_hash FROM api_tokens WHERE expires_at <= now()
             LIMIT $1 FOR UPDATE SKIP LOCKED)",
        batch_rows_max,
    )
    .await
}

/// Deletes kept pages past their retention (`race_lab_result_retention_hours`,
/// `wallet_page_retention_s`), at most `batch_rows_max` per statement;
/// returns how many it deleted. An expired page is not shown whether or
/// not its row is still there.
pub async fn expired_kept_pages(pool: &PgPool, batch_rows_max: i64) -> Result<u64, sqlx::Error> {
    delete_in_batches(
        pool,
        "DELETE FROM kept_pages WHERE id IN (
             SELECT id FROM kept_pages WHERE expires_at <= now()
             LIMIT $1 FOR UPDATE SKIP LOCKED)",
        batch_rows_max,
    )
    .await
}

/// Deletes inbox rows past `inbox_retention_hours`, at most
/// `batch_rows_max` per statement; returns how many it deleted. An event
/// that happened before its row could have expired is refused by
/// `deposit()`, so a swept event is never applied again.
pub async fn expired_inbox_rows(pool: &PgPool, batch_rows_max: i64) -> Result<u64, sqlx::Error> {
    delete_in_batches(
        pool,
        "DELETE FROM inbox WHERE (source, event_id) IN (
             SELECT source, event_id FROM inbox WHERE expires_at <= now()
             LIMIT $1 FOR UPDATE SKIP LOCKED)",
        batch_rows_max,
    )
    .await
}

/// Runs `statement` (a `DELETE` whose `$1` is the batch size) until a batch
/// deletes fewer rows than `batch_rows_max`; returns how many it deleted.
/// Each batch is its own statement, so no sweep holds many row locks or
/// one long transaction.
async fn delete_in_batches(
    pool: &PgPool,
    statement: &'static str,
    batch_rows_max: i64,
) -> Result<u64, sqlx::Error> {
    let mut deleted_total = 0;
    loop {
        let deleted = sqlx::query(statement)
            .bind(batch_rows_max)
            .execute(pool)
            .await?
            .rows_affected();
        deleted_total += deleted;
        if deleted < u64::try_from(batch_rows_max).unwrap_or(u64::MAX) {
            return Ok(deleted_total);
        }
    }
}

/// Deletes expired idempotency keys, token hashes and kept pages every
/// `interval`
/// until the returned handle is aborted (at shutdown). Several instances
/// may sweep at once: `SKIP LOCKED` keeps them off each other's rows.
pub fn spawn_sweeper(pool: PgPool, interval: Duration, batch_rows_max: i64) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // The first sweep is one interval after start-up, not at once: a
        // fleet restarting together should not all sweep at the same moment.
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let sweeps = [
                (
                    "idempotency keys",
                    expired_idempotency_keys(&pool, batch_rows_max).await,
                ),
                ("tokens", expired_tokens(&pool, batch_rows_max).await),
                ("kept pages", expired_kept_pages(&pool, batch_rows_max).await),
                ("inbox rows", expired_inbox_rows(&pool, batch_rows_max).await),
            ];
            for (rows, swept) in sweeps {
                match swept {
                    Ok(0) => {}
                    Ok(deleted) => {
                        tracing::info!(sweep.rows = rows, sweep.deleted = deleted, "swept expired rows")
                    }
                    Err(error) => {
                        tracing::warn!(sweep.rows = rows, error = %error, "sweep failed; will retry next interval")
                    }
                }
            }
        }
    })
}
