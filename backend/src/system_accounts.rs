//! The accounts the service makes for itself, which nobody can sign in as:
//! the demo recipient, so that a visitor alone can send money without
//! creating a second account, and the payment provider's clearing account,
//! which deposits come from.

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
    make_account_nobody_signs_in_as(db, config, &name, None).await
}

/// The name the payment provider's clearing account shows under: deposits
/// in a person's history come from it.
pub const PROVIDER_CLEARING_NAME: &str = "Payment provider";

/// Makes the payment provider's clearing account, whose wallet deposits
/// come from (`clearing_source = 'provider'`), if the deployment accepts
/// deposits (`provider_webhook_secrets`) and there is none. Safe to run on
/// every start, by several instances at once.
pub async fn ensure_provider_clearing(db: &PgPool, config: &Config) -> anyhow::Result<()> {
    if config.deposits.provider_webhook_secrets.is_empty() {
        return Ok(());
    }
    ensure_clearing(db, config, crate::deposit::SOURCE, PROVIDER_CLEARING_NAME).await
}

/// The names the payouts' clearing accounts show under: a payout in a
/// person's history goes to the first, and comes back from it if refused.
pub const HOLDS_NAME: &str = "Bank payouts";
pub const GATEWAY_NAME: &str = "Bank gateway";

/// Makes the payouts' two clearing accounts (the holds wallet and the
/// gateway's wallet) if the deployment sends payouts
/// (`payout_gateway_url`) and they are missing. Safe to run on every
/// start, by several instances at once.
pub async fn ensure_payout_accounts(db: &PgPool, config: &Config) -> anyhow::Result<()> {
    if !config.payouts.offered() {
        return Ok(());
    }
    for (source, name) in [
        (crate::payout::HOLDS_SOURCE, HOLDS_NAME),
        (crate::payout::GATEWAY_SOURCE, GATEWAY_NAME),
    ] {
        ensure_clearing(db, config, source, name).await?;
    }
    Ok(())
}

/// Makes `source`'s clearing account under `display_name` unless it exists.
async fn ensure_clearing(
    db: &PgPool,
    config: &Config,
    source: &str,
    display_name: &str,
) -> anyhow::Result<()> {
    let exists = || async {
        sqlx::query_scalar::<_, bool>("SELECT EXISTS (SELECT 1 FROM wallets WHERE clearing_source = $1)")
            .bind(source)
            .fetch_one(db)
            .await
    };
    if exists().await? {
        return Ok(());
    }
    let name = ComparableName::parse(display_name, config.accounts.user_name_chars_max)
        .map_err(|problem| anyhow::anyhow!("the clearing account's name: {}", problem.detail))?;
    make_account_nobody_signs_in_as(db, config, &name, Some(source)).await?;
    anyhow::ensure!(
        exists().await?,
        "an account named {display_name:?} exists and is not the {source} clearing account; rename it"
    );
    Ok(())
}

/// An account with one wallet of the deployment's currency that nobody can
/// sign in as: its password is 32 random bytes, hashed and forgotten. With
/// `clearing_source`, its wallet is that source's clearing wallet. Another
/// instance making it first is not an error.
async fn make_account_nobody_signs_in_as(
    db: &PgPool,
    config: &Config,
    name: &ComparableName,
    clearing_source: Option<&str>,
) -> anyhow::Result<()> {
    let mut secret = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut secret);
    let password_hash = tokio::task::spawn_blocking(move || crate::auth::phc_string(&secret)).await??;
    let user_id = UserId(Uuid::now_v7());
    let wallet_id = WalletId(Uuid::now_v7());
    let mut tx = db.begin().await?;
    match users::insert_account(&mut tx, user_id, name, &password_hash).await {
        Ok(()) => {}
        // Another instance made it first.
        Err(sqlx::Error::Database(error)) if error.is_unique_violation() => return Ok(()),
        Err(error) => return Err(error.into()),
    }
    users::insert_wallet(&mut tx, wallet_id, user_id, &config.money.currency, 0).await?;
    if let Some(source) = clearing_source {
        sqlx::query("UPDATE wallets SET clearing_source = $1 WHERE id = $2")
            .bind(source)
            .bind(wallet_id.0)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}
