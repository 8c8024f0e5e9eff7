//! The demo recipient: an account that exists so that a visitor alone can
//! send money without creating a second account. Nobody can sign in as it:
//! its password is 32 random bytes, hashed and forgotten.

use rand::RngCore;
use sqlx::PgPool;
use uuid::Uuid;

use crate::names::ComparableName;
use crate::settings::Config;

/// Makes the demo recipient if `demo_recipient_name` is set and no account
/// has that name. Safe to run on every start, by several instances at once.
pub async fn ensure(db: &PgPool, config: &Config) -> anyhow::Result<()> {
    let name = &config.demo.recipient_name;
    if name.is_empty() {
        return Ok(());
    }
    let name = ComparableName::parse(name, config.accounts.user_name_chars_max)
        .map_err(|problem| anyhow::anyhow!("demo_recipient_name: {}", problem.detail))?;
    let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM users WHERE name_key = $1)")
        .bind(&name.key)
        .fetch_one(db)
        .await?;
    if exists {
        return Ok(());
    }
    let mut secret = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut secret);
    let password_hash = tokio::task::spawn_blocking(move || crate::auth::phc_string(&secret)).await??;
    let user_id = Uuid::now_v7();
    let mut tx = db.begin().await?;
    let inserted = sqlx::query(
        "INSERT INTO users (id, name, name_key, name_skeleton, password_hash) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT DO NOTHING",
    )
    .bind(user_id)
    .bind(&name.display)
    .bind(&name.key)
    .bind(&name.skeleton)
    .bind(&password_hash)
    .execute(&mut *tx)
    .await?;
    if inserted.rows_affected() == 1 {
        sqlx::query(
            "INSERT INTO wallets (id, user_id, currency, opening_balance_minor, balance_minor) VALUES ($1, $2, $3, 0, 0)",
        )
        .bind(Uuid::now_v7())
        .bind(user_id)
        .bind(&config.money.currency)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}
