//! The settings of the three defenses: the cooldown lock, the
//! idempotency key and the row guard.
//!
//! Declared as `declared.rs` says: this file's macro adds its sections to
//! those gathered before it. The types it names are in scope where the
//! declaration expands, in `declared.rs`.

/// Adds this file's sections to the declaration (`declare_settings!`'s
/// `@gather`).
macro_rules! layers_settings {
    ([$($files:ident)*] $($sections:tt)*) => {
        $crate::settings::declare::declare_settings! { @gather [$($files)*] $($sections)*
            section "Layer 1: cooldown lock" {
                /// The cooldown lock on or off; off, keyless double clicks pay twice
                /// (an unsafe demonstration mode).
                cooldown_enabled: bool = true;
                /// The cooldown window: how long a further transfer under the same
                /// lock is refused.
                cooldown_ttl_ms: u64 = 5_000, within 1..=86_400_000 "ms";
                /// What the lock is keyed on besides the user: the action
                /// (`user_action`), or the action and the request body
                /// (`user_action_body`).
                cooldown_scope: CooldownScope = CooldownScope::UserAction;
                /// What the cooldown and the account limits do when Redis cannot be
                /// reached: let the request through (`fail_open`) or answer 503
                /// (`fail_closed`).
                cooldown_on_store_error: StoreErrorPolicy = StoreErrorPolicy::FailOpen;
                /// The windows an instance remembers its own requests took, to refuse
                /// a further attempt at one without asking Redis (about 200 bytes
                /// each); past it, attempts ask Redis. 0 always asks Redis.
                cooldown_windows_remembered_max: usize = 10_000, within 0..=1_000_000 "windows";
            }

            section "Layer 2: idempotency key" {
                /// How a key is claimed. `advisory_lock` and `redis_key_lock` are the
                /// common alternatives, kept to compare with; `check_then_insert` is
                /// the naive one and `off` ignores keys. Each is a demonstration
                /// mode.
                idempotency_mode: IdempotencyMode = IdempotencyMode::Atomic;
                /// With `idempotency_mode = advisory_lock`: wait for a key's lock
                /// held by another request (bounded by `wallet_lock_wait_ms_max`)
                /// instead of answering 409 at once.
                idempotency_advisory_lock_waits: bool = false;
                /// With `idempotency_mode = redis_key_lock`: how long a key's Redis
                /// lock lives. A holder paused longer loses it to the next request.
                idempotency_redis_lock_ttl_ms: u64 = 5_000, within 10..=600_000 "ms";
                /// A transfer without an `Idempotency-Key` header gets 400.
                idempotency_key_required: bool = false;
                /// How long a request waits for a concurrent request with the same key
                /// to finish before answering 409.
                idempotency_wait_ms_max: u16 = 2_000, within 1..=60_000 "ms";
                /// How long a key is remembered.
                idempotency_retention_hours: u16 = 24, within 1..=8_760 "hours";
                /// How often expired keys are deleted.
                idempotency_sweep_interval_s: u64 = 900, within 1..=86_400 "s";
                /// Rows one sweep statement deletes at most.
                idempotency_sweep_batch_rows_max: i64 = 10_000, within 1..=100_000 "rows";
            }

            section "Layer 3: row guard" {
                /// How the debit checks the balance. `for_update` and
                /// `optimistic_version` are the common alternatives, kept to compare
                /// with; `read_decide_write` is the naive one. Each is a
                /// demonstration mode.
                row_guard_mode: RowGuardMode = RowGuardMode::Guarded;
            }

        }
    };
}

pub(super) use layers_settings;
