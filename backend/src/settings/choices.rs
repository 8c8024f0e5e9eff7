//! The settings that pick one of a few behaviours, and the values a file
//! writes for each.

use serde::Deserialize;

use super::declare::{SettingValue, Shown, shown_choice};

/// What the cooldown lock is keyed on besides the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CooldownScope {
    /// One window per user and action: any second transfer inside the window
    /// is refused, whatever its body.
    UserAction,
    /// One window per user, action and request body: only an identical
    /// transfer is refused, a different one goes through.
    UserActionBody,
}

/// What the cooldown layer does when Redis cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreErrorPolicy {
    /// Let the request through; the PostgreSQL layers alone keep correctness.
    FailOpen,
    /// Answer 503: for deployments that would rather refuse than lose the
    /// edge's load shedding.
    FailClosed,
}

/// How the idempotency layer claims a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum IdempotencyMode {
    /// The claim is an insert under a unique key, in the transfer's
    /// transaction. The only safe mode.
    Atomic,
    /// DEMO ONLY (an alternative, for comparison): a transaction-scoped
    /// advisory lock on a hash of the user and key
    /// (`pg_try_advisory_xact_lock`), then a point read, then the claim.
    /// Contention answers 409, or waits (`idempotency_advisory_lock_waits`);
    /// the 32-bit hash makes different keys collide now and then, which is
    /// contention that is not real.
    AdvisoryLock,
    /// DEMO ONLY (an alternative, for comparison): a Redis lock on the key
    /// (`SET … NX PX idempotency_redis_lock_ttl_ms`), then a point read,
    /// the transaction with the claim, and an owner-checked release. A
    /// holder paused past the lock's lifetime, or a Redis failover, lets a
    /// second request in: then the claim in PostgreSQL decides.
    RedisKeyLock,
    /// DEMO ONLY: look the key up, do the transfer, record the key
    /// afterwards. Two requests that look at once both see no key.
    CheckThenInsert,
    /// DEMO ONLY: keys are ignored.
    Off,
}

/// How the inbox claims a deposit event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum InboxMode {
    /// The claim is an insert under the event's primary key, in the credit's
    /// transaction. The only safe mode.
    Atomic,
    /// DEMO ONLY: look the event up, credit, record the event afterwards.
    /// Two deliveries that look at once both see nothing, and both credit.
    CheckThenInsert,
}

/// How a payout reaches the bank gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PayoutMode {
    /// The request holds the money and writes an outbox row in one
    /// transaction; a dispatcher calls the gateway afterwards, with the
    /// payout's id as the key of every attempt. The only safe mode.
    Outbox,
    /// DEMO ONLY: the request calls the gateway inside its transaction and
    /// rolls back when the call fails: a sending whose answer was lost
    /// leaves money gone without a debit, and a retry sends it again.
    CallInTransaction,
    /// DEMO ONLY: the dispatcher sends each attempt under a new key: an
    /// answer lost after the sending makes the retry a second payment.
    NewKeyPerAttempt,
}

/// How the debit checks the balance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RowGuardMode {
    /// Check and write in one guarded `UPDATE`, wallets locked in id order.
    /// The only safe mode.
    Guarded,
    /// DEMO ONLY (an alternative, for comparison): lock both wallets with
    /// `SELECT … FOR UPDATE` in id order, decide in Rust, write. Safe, but
    /// the lock is held across the round trips between the read and the
    /// commit.
    ForUpdate,
    /// DEMO ONLY (an alternative, for comparison): read the balance and the
    /// wallet's version, decide in Rust, then `UPDATE … WHERE version =
    /// $read`. No lock is waited for; a write that finds the version moved
    /// is a conflict, answered 409 `version-conflict` with nothing changed,
    /// for the client to retry.
    OptimisticVersion,
    /// DEMO ONLY (the row guard switched off): read the balance, compare in
    /// Rust, write the computed balance back, with no lock: a
    /// time-of-check-to-time-of-use race and lost updates.
    ReadDecideWrite,
}

/// How log lines are written: for people, or for a log collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    Text,
    Json,
}

/// Each choice's values as a file writes them (serde's names); a test
/// checks that each one parses.
macro_rules! choice_values {
    ($($choice:ty => [$($value:literal),+]),* $(,)?) => {$(
        impl SettingValue for $choice {
            const TYPE_NAME: &'static str = "choice";
            const VALUES: &'static [&'static str] = &[$($value),+];

            fn shown(&self) -> Shown {
                shown_choice(self)
            }
        }
    )*};
}

choice_values! {
    CooldownScope => ["user_action", "user_action_body"],
    StoreErrorPolicy => ["fail_open", "fail_closed"],
    IdempotencyMode => ["atomic", "advisory_lock", "redis_key_lock", "check_then_insert", "off"],
    InboxMode => ["atomic", "check_then_insert"],
    PayoutMode => ["outbox", "call_in_transaction", "new_key_per_attempt"],
    RowGuardMode => ["guarded", "for_update", "optimistic_version", "read_decide_write"],
    LogFormat => ["text", "json"],
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every listed value parses, each to a different variant.
    fn values_parse<T>()
    where
        T: SettingValue + PartialEq + std::fmt::Debug + for<'de> Deserialize<'de>,
    {
        let parsed: Vec<T> = T::VALUES
            .iter()
            .map(|value| {
                T::deserialize(
                    serde::de::IntoDeserializer::<serde::de::value::Error>::into_deserializer(*value),
                )
                .unwrap_or_else(|error| panic!("{value}: {error}"))
            })
            .collect();
        for (index, choice) in parsed.iter().enumerate() {
            assert_eq!(shown_choice(choice), Shown::Value(T::VALUES[index].to_owned()));
        }
    }

    #[test]
    fn every_listed_value_parses() {
        values_parse::<CooldownScope>();
        values_parse::<StoreErrorPolicy>();
        values_parse::<IdempotencyMode>();
        values_parse::<InboxMode>();
        values_parse::<PayoutMode>();
        values_parse::<RowGuardMode>();
        values_parse::<LogFormat>();
    }
}
