//! What became of a command, in one vocabulary: the verdict
//! `broker_command()` stores in the inbox and publishes to the results
//! stream, and the stored outcome an issuer reads back by the command's id.

use std::fmt;
use std::str::FromStr;

use crate::decision::{Decision, Layer, Outcome};

/// A command's verdict: the PostgreSQL enum `command_verdict`
/// (migrations/20261202000012_broker_commands.sql), which the inbox stores
/// as its name, value for value; and `payload_changed`, said of a command
/// id published again for another command, which is never stored (the
/// first command stands).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandVerdict {
    /// The transfer was made.
    Applied,
    /// The row guard refused the debit.
    InsufficientFunds,
    /// No real wallet has the source id.
    UnknownSource,
    /// No wallet can receive it (as for transfers).
    UnknownTarget,
    /// The wallets hold different currencies.
    CurrencyMismatch,
    /// Published longer ago than `commands_age_hours_max`.
    TooOld,
    /// Published (by its entry id) further ahead of the database's clock
    /// than `commands_future_tolerance_s`.
    PublishedInFuture,
    /// Delivered `commands_deliveries_max` times without an outcome, or
    /// unreadable: moved to the dead-letter stream.
    DeadLettered,
    /// The command id was published before as another command.
    PayloadChanged,
}

impl CommandVerdict {
    const ALL: [Self; 9] = [
        Self::Applied,
        Self::InsufficientFunds,
        Self::UnknownSource,
        Self::UnknownTarget,
        Self::CurrencyMismatch,
        Self::TooOld,
        Self::PublishedInFuture,
        Self::DeadLettered,
        Self::PayloadChanged,
    ];

    /// The name stored in the inbox and published as `outcome`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::InsufficientFunds => "insufficient_funds",
            Self::UnknownSource => "unknown_source",
            Self::UnknownTarget => "unknown_target",
            Self::CurrencyMismatch => "currency_mismatch",
            Self::TooOld => "too_old",
            Self::PublishedInFuture => "published_in_future",
            Self::DeadLettered => "dead_lettered",
            Self::PayloadChanged => "payload_changed",
        }
    }

    /// The decision a fresh verdict stands for: the inbox's for a reused
    /// command id, the row guard's for every other.
    pub fn decision(self) -> Decision {
        match self {
            Self::Applied => Decision::new(Layer::RowGuard, Outcome::Accepted),
            Self::InsufficientFunds => Decision::new(Layer::RowGuard, Outcome::InsufficientFunds),
            Self::PayloadChanged => Decision::new(Layer::Inbox, Outcome::PayloadChanged),
            _ => Decision::new(Layer::RowGuard, Outcome::Rejected),
        }
    }

    /// The status the command would have had as a client's transfer, for
    /// the feed: 200 when applied, 422 for every refusal.
    pub fn status(self) -> u16 {
        if self == Self::Applied { 200 } else { 422 }
    }
}

/// A name that is no command verdict: the database broke the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a command verdict")]
pub struct UnknownVerdict(pub String);

impl FromStr for CommandVerdict {
    type Err = UnknownVerdict;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|verdict| verdict.as_str() == name)
            .ok_or_else(|| UnknownVerdict(name.to_owned()))
    }
}

/// How a row's text column decodes into a verdict.
impl TryFrom<String> for CommandVerdict {
    type Error = UnknownVerdict;

    fn try_from(name: String) -> Result<Self, Self::Error> {
        name.parse()
    }
}

impl fmt::Display for CommandVerdict {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// A verdict compares with its name, as the issuer reads it.
impl PartialEq<&str> for CommandVerdict {
    fn eq(&self, name: &&str) -> bool {
        self.as_str() == *name
    }
}

/// A command's stored outcome, as its issuer reads it back.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StoredOutcome {
    #[sqlx(try_from = "String")]
    pub verdict: CommandVerdict,
    /// The result body (`{"command_id","issuer","outcome",…}`), the same
    /// bytes as published to the results stream.
    pub result: String,
}

/// A command's stored outcome, by its id; `None` when the inbox has none
/// (never published, not yet applied, or forgotten).
pub async fn outcome_of(db: &sqlx::PgPool, command_id: &str) -> Result<Option<StoredOutcome>, sqlx::Error> {
    sqlx::query_as(
        "SELECT verdict, response_body AS result FROM inbox
         WHERE source = 'broker' AND event_id = $1 AND verdict IS NOT NULL AND expires_at > now()",
    )
    .bind(command_id)
    .fetch_optional(db)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_verdict_reads_back_from_its_name() {
        for verdict in CommandVerdict::ALL {
            assert_eq!(verdict.as_str().parse(), Ok(verdict));
            assert_eq!(verdict, verdict.as_str());
        }
        assert_eq!(
            "credited".parse::<CommandVerdict>(),
            Err(UnknownVerdict("credited".into()))
        );
    }
}
