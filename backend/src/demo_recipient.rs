//! The demo recipient: an account that exists so that a visitor alone can
//! send money without creating a second account. Nobody can sign in as it:
//! its password is 32 random bytes, hashed and forgotten.

use rand::RngCore;
use sqlx::PgPool;
use uuid::Uuid;

use crate::domain::{UserId, WalletId};
use crate::names::ComparableName;
use crate::routes::users;
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
    let user_id = UserId(Uuid::now_v7());
    let mut tx = db.begin().await?;
    match users::insert_account(&mut tx, user_id, &name, &password_hash).await {
        Ok(()) => {}
        // Another instance made it first.
        Err(sqlx::Error::Database(error)) if error.is_unique_violation() => return Ok(()),
        Err(error) => return Err(error.into()),
    }
    users::insert_wallet(
        &mut tx,
        WalletId(Uuid::now_v7()),
        user_id,
        &config.money.currency,
        0,
    )
    .await?;
    tx.commit().await?;
    Ok(())
}
