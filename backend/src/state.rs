//! What every handler shares: settings, the PostgreSQL pool, the cooldown
//! lock (which owns the Redis pool) and the token signer.

use std::sync::Arc;

use crate::auth::TokenSigner;
use crate::defense::cooldown::CooldownLock;
use crate::settings::Settings;

#[derive(Clone)]
pub struct AppState {
    pub settings: Arc<Settings>,
    pub db: sqlx::PgPool,
    pub cooldown: CooldownLock,
    pub tokens: TokenSigner,
}
