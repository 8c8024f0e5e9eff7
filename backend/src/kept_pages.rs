//! Pages a browser form leads to, kept so that the form can redirect to
//! them (post/redirect/get): reloading the address shows the same page and
//! never does the form's work again (`migrations/…10_kept_pages.sql`).
//!
//! Each page is kept until it expires, and each person keeps at most
//! `per_user_max` of a kind: a newer page pushes out their oldest.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use crate::domain::UserId;

/// What a kept page is, and who may read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A race-lab run's results: anyone with the address may read them.
    RaceLabRun,
    /// The review of a typed transfer, or what happened after Send: only
    /// its owner may read it.
    Wallet,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::RaceLabRun => "race_lab_run",
            Kind::Wallet => "wallet",
        }
    }
}

/// How long a kind of page is kept, and how many one person keeps.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub retention: Duration,
    pub per_user_max: i64,
}

/// Keeps `page` for `user`, pushes out their oldest pages of the kind
/// beyond the bound, and returns the new page's id.
pub async fn keep(
    db: &sqlx::PgPool,
    user: UserId,
    kind: Kind,
    page: &impl Serialize,
    bounds: Bounds,
) -> Result<Uuid, sqlx::Error> {
    let id = Uuid::new_v4();
    let page = serde_json::to_value(page).map_err(|error| sqlx::Error::Encode(Box::new(error)))?;
    let mut transaction = db.begin().await?;
    sqlx::query(
        "INSERT INTO kept_pages (id, user_id, kind, expires_at, page)
         VALUES ($1, $2, $3, now() + make_interval(secs => $4), $5)",
    )
    .bind(id)
    .bind(user.0)
    .bind(kind.as_str())
    .bind(bounds.retention.as_secs_f64())
    .bind(page)
    .execute(&mut *transaction)
    .await?;
    sqlx::query(
        "DELETE FROM kept_pages WHERE id IN (
             SELECT id FROM kept_pages WHERE user_id = $1 AND kind = $2
              ORDER BY created_at DESC, id OFFSET $3)",
    )
    .bind(user.0)
    .bind(kind.as_str())
    .bind(bounds.per_user_max)
    .execute(&mut *transaction)
    .await?;
    transaction.commit().await?;
    Ok(id)
}

/// The page of `kind` kept as `id`, unless it expired or was pushed out;
/// for a kind only its owner may read, only when `reader` is that owner.
/// `None` too when what is kept no longer reads as `T`.
pub async fn load<T: DeserializeOwned>(
    db: &sqlx::PgPool,
    kind: Kind,
    id: Uuid,
    reader: Option<UserId>,
) -> Result<Option<T>, sqlx::Error> {
    let owner = match kind {
        Kind::RaceLabRun => None,
        Kind::Wallet => match reader {
            Some(reader) => Some(reader.0),
            None => return Ok(None),
        },
    };
    let page: Option<serde_json::Value> = sqlx::query_scalar(
        "SELECT page FROM kept_pages
          WHERE id = $1 AND kind = $2 AND ($3::uuid IS NULL OR user_id = $3) AND expires_at > now()",
    )
    .bind(id)
    .bind(kind.as_str())
    .bind(owner)
    .fetch_optional(db)
    .await?;
    Ok(page.and_then(|page| match serde_json::from_value(page) {
        Ok(page) => Some(page),
        Err(error) => {
            tracing::warn!(error = %error, page = %id, "a kept page no longer reads as its page");
            None
        }
    }))
}
