//! What the three defenses read: the cooldown lock, the idempotency key
//! and the row guard.

use std::time::Duration;

use crate::settings::{CooldownScope, IdempotencyMode, RowGuardMode, Settings, StoreErrorPolicy};

#[derive(Debug, Clone)]
pub struct Cooldown {
    pub enabled: bool,
    pub ttl: Duration,
    pub scope: CooldownScope,
    /// Also what the account limits do when Redis cannot be reached.
    pub on_store_error: StoreErrorPolicy,
    /// The windows an instance remembers holding, at most.
    pub windows_remembered_max: usize,
}

impl From<&Settings> for Cooldown {
    fn from(s: &Settings) -> Self {
        Self {
            enabled: s.cooldown_enabled,
            ttl: Duration::from_millis(s.cooldown_ttl_ms),
            scope: s.cooldown_scope,
            on_store_error: s.cooldown_on_store_error,
            windows_remembered_max: s.cooldown_windows_remembered_max,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Idempotency {
    pub mode: IdempotencyMode,
    pub key_required: bool,
    /// How long a request waits for another holding its key, in
    /// PostgreSQL's milliseconds.
    pub wait_ms_max: u16,
    /// How long a key is remembered, in PostgreSQL's hours.
    pub retention_hours: u16,
    pub sweep_interval: Duration,
    pub sweep_batch_rows_max: i64,
    /// The demonstration alternatives' bounds.
    pub advisory_lock_waits: bool,
    pub redis_lock_ttl: Duration,
}

impl Idempotency {
    pub fn wait_max(&self) -> Duration {
        Duration::from_millis(self.wait_ms_max.into())
    }
}

impl From<&Settings> for Idempotency {
    fn from(s: &Settings) -> Self {
        Self {
            mode: s.idempotency_mode,
            key_required: s.idempotency_key_required,
            wait_ms_max: s.idempotency_wait_ms_max,
            retention_hours: s.idempotency_retention_hours,
            sweep_interval: Duration::from_secs(s.idempotency_sweep_interval_s),
            sweep_batch_rows_max: s.idempotency_sweep_batch_rows_max,
            advisory_lock_waits: s.idempotency_advisory_lock_waits,
            redis_lock_ttl: Duration::from_millis(s.idempotency_redis_lock_ttl_ms),
        }
    }
}

#[derive(Debug, Clone)]
pub struct RowGuard {
    pub mode: RowGuardMode,
}
