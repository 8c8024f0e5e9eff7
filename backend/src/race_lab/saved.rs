//! Each run's results, kept at an address of their own
//! (`/race-lab/runs/{id}`) for `race_lab_result_retention_hours`, at most
//! `race_lab_results_per_user_max` per visitor. The page after a run
//! redirects there, so reloading it never fires again, and the address can
//! be shared.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use crate::domain::UserId;

/// Keeps `view` as run `id` of `user`, and pushes out that visitor's
/// oldest results beyond `per_user_max`, in one transaction.
pub async fn save(
    db: &sqlx::PgPool,
    user: UserId,
    id: Uuid,
    view: &impl Serialize,
    retention: Duration,
    per_user_max: i64,
) -> Result<(), sqlx::Error> {
    let view = serde_json::to_value(view).map_err(|error| sqlx::Error::Encode(Box::new(error)))?;
    let mut transaction = db.begin().await?;
    sqlx::query(
        "INSERT INTO race_lab_results (id, user_id, expires_at, view)
         VALUES ($1, $2, now() + make_interval(secs => $3), $4)",
    )
    .bind(id)
    .bind(user.0)
    .bind(retention.as_secs_f64())
    .bind(view)
    .execute(&mut *transaction)
    .await?;
    sqlx::query(
        "DELETE FROM race_lab_results WHERE id IN (
             SELECT id FROM race_lab_results WHERE user_id = $1
              ORDER BY created_at DESC, id OFFSET $2)",
    )
    .bind(user.0)
    .bind(per_user_max)
    .execute(&mut *transaction)
    .await?;
    transaction.commit().await
}

/// The results kept as run `id`, unless they have expired or were pushed
/// out; `None` too when what is stored no longer reads as `T`.
pub async fn load<T: DeserializeOwned>(db: &sqlx::PgPool, id: Uuid) -> Result<Option<T>, sqlx::Error> {
    let view: Option<serde_json::Value> =
        sqlx::query_scalar("SELECT view FROM race_lab_results WHERE id = $1 AND expires_at > now()")
            .bind(id)
            .fetch_optional(db)
            .await?;
    Ok(view.and_then(|view| match serde_json::from_value(view) {
        Ok(view) => Some(view),
        Err(error) => {
            tracing::warn!(error = %error, run = %id, "a kept race-lab run no longer reads as a page");
            None
        }
    }))
}
