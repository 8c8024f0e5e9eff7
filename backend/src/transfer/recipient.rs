//! Who money goes to: a wallet's owner by name, and what a person typed
//! (a name or a wallet id) resolved to one real wallet. The one definition
//! for every page that names a recipient.

use sqlx::{AssertSqlSafe, PgPool};
use uuid::Uuid;

use crate::names::{self, MATCHES_NAME};

/// The name of a wallet's owner, as the account spells it.
pub async fn owner_name(db: &PgPool, wallet_id: Uuid) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar::<_, String>(
        "SELECT u.name FROM wallets w JOIN users u ON u.id = w.user_id WHERE w.id = $1",
    )
    .bind(wallet_id)
    .fetch_optional(db)
    .await
}

/// A user name or a wallet id → (wallet id, name to show). A name finds
/// the account's real wallet, never a race-lab one.
pub async fn resolve(db: &PgPool, typed: &str) -> Result<Option<(Uuid, String)>, sqlx::Error> {
    if let Ok(wallet_id) = Uuid::try_parse(typed) {
        let name = owner_name(db, wallet_id).await?;
        return Ok(name.map(|name| (wallet_id, name)));
    }
    // By the name's key (case and width do not matter), an exact name
    // first; the name shown is the account's own, never what was typed.
    sqlx::query_as::<_, (Uuid, String)>(AssertSqlSafe(format!(
        "SELECT w.id, u.name FROM users u JOIN wallets w ON w.user_id = u.id
         WHERE {MATCHES_NAME} AND w.lab_slot IS NULL
         ORDER BY u.name = $1 DESC, w.created_at LIMIT 1"
    )))
    .bind(typed)
    .bind(names::key_of(typed))
    .fetch_optional(db)
    .await
}
