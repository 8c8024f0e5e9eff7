//! Layers 2 and 3 for a command, in one PostgreSQL call: `broker_command()`
//! claims the command id in the inbox (source `broker`), makes the
//! transfer through the row guard, and stores the outcome with the claim;
//! or, for a command applied before, reads back its outcome.
//!
//! A command's outcome is read back by its issuer through `outcome`.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::Command;
use super::outcome::CommandVerdict;
use crate::decision::{Decision, Layer, Outcome};
use crate::defense::inbox::InboxClaim;
use crate::domain::UserId;
use crate::settings::Config;

/// What became of one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub decision: Decision,
    /// The outcome, as stored and published.
    pub verdict: CommandVerdict,
    /// The result body, as stored and published.
    pub result: String,
    /// The source wallet's owner, when it has one: their feed hears of it.
    pub owner: Option<UserId>,
}

#[derive(sqlx::FromRow)]
struct CommandRow {
    claim: InboxClaim,
    verdict: Option<String>,
    owner: Option<Uuid>,
    result: Option<String>,
}

/// Why a command has no outcome yet: it stays pending and is delivered
/// again.
#[derive(Debug, thiserror::Error)]
pub enum NotApplied {
    #[error("another consumer still holds the command (the inbox's wait ran out)")]
    InFlight,
    #[error("the database failed: {0}")]
    Database(#[from] sqlx::Error),
    #[error("the database broke the protocol: {0}")]
    Protocol(String),
}

/// Applies `command`, published at `published_at`; with
/// `dead_letter_reason`, records it as dead-lettered instead (unless it
/// has an outcome already).
pub async fn apply(
    db: &mut sqlx::PgConnection,
    config: &Config,
    command: &Command,
    published_at: DateTime<Utc>,
    dead_letter_reason: Option<&str>,
) -> Result<Applied, NotApplied> {
    let row: CommandRow = sqlx::query_as(
        "SELECT claim, verdict, owner, result
         FROM broker_command($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
    )
    .bind(&command.command_id)
    .bind(&command.fingerprint()[..])
    .bind(&command.issuer)
    .bind(command.from.0)
    .bind(command.to.0)
    .bind(command.amount_minor)
    .bind(published_at)
    .bind(dead_letter_reason)
    .bind(i32::from(config.commands.age_hours_max))
    .bind(i32::try_from(config.commands.future_tolerance.as_secs()).unwrap_or(i32::MAX))
    .bind(i32::from(config.deposits.inbox_retention_hours))
    .bind(i32::from(config.deposits.inbox_wait_ms_max))
    .bind(i32::from(config.database.wallet_lock_wait_ms_max))
    .bind(Uuid::now_v7())
    .fetch_one(db)
    .await?;
    applied(command, row)
}

/// Reads `broker_command()`'s answer (or one command's in a batch) for
/// `command`.
fn applied(command: &Command, row: CommandRow) -> Result<Applied, NotApplied> {
    let owner = row.owner.map(UserId);
    let verdict = match row.verdict.as_deref().map(str::parse::<CommandVerdict>) {
        Some(Ok(verdict)) => Some(verdict),
        Some(Err(unknown)) => {
            return Err(NotApplied::Protocol(format!(
                "broker_command() answered {unknown}"
            )));
        }
        None => None,
    };
    match (row.claim, verdict, row.result) {
        (InboxClaim::InFlight, _, _) => Err(NotApplied::InFlight),
        (InboxClaim::PayloadChanged, _, _) => Ok(Applied {
            decision: CommandVerdict::PayloadChanged.decision(),
            verdict: CommandVerdict::PayloadChanged,
            result: serde_json::json!({
                "command_id": command.command_id,
                "issuer": command.issuer,
                "outcome": CommandVerdict::PayloadChanged.as_str(),
                "reason": "this command id was published before as another command; that one stands",
            })
            .to_string(),
            owner,
        }),
        (InboxClaim::Replayed, Some(verdict), Some(result)) => Ok(Applied {
            decision: Decision::new(Layer::Inbox, Outcome::Replayed),
            verdict,
            result,
            owner,
        }),
        (InboxClaim::Started, Some(verdict), Some(result)) => Ok(Applied {
            decision: verdict.decision(),
            verdict,
            result,
            owner,
        }),
        (claim, verdict, result) => Err(NotApplied::Protocol(format!(
            "broker_command() answered {claim:?} with verdict {verdict:?} and a result: {}",
            result.is_some()
        ))),
    }
}

/// One command of a batch, with what `apply` takes besides.
#[derive(Debug)]
pub struct Queued<'a> {
    pub command: &'a Command,
    pub published_at: DateTime<Utc>,
    pub dead_letter_reason: Option<&'a str>,
}

/// One command's answer in a batch: `broker_command()`'s columns, and
/// `failure`, the SQLSTATE of an error that undid that command alone.
#[derive(sqlx::FromRow)]
struct BatchRow {
    claim: Option<InboxClaim>,
    verdict: Option<String>,
    owner: Option<Uuid>,
    result: Option<String>,
    failure: Option<String>,
}

/// Applies `queued`, in order, in one call (`broker_command_batch()`):
/// each command decided exactly as `apply` decides it. Answers the
/// outcomes of the leading commands that have one, in order; the batch
/// stops at the first without one (another consumer holds it, or it
/// failed), and nothing of it or of those behind it was written: the
/// caller applies them one by one. An error means nothing was written,
/// when PostgreSQL reported it; when the connection broke, any outcome.
pub async fn apply_batch(
    db: &mut sqlx::PgConnection,
    config: &Config,
    queued: &[Queued<'_>],
) -> Result<Vec<Applied>, sqlx::Error> {
    let commands = || queued.iter().map(|one| one.command);
    let rows: Vec<BatchRow> = sqlx::query_as(
        "SELECT claim, verdict, owner, result, failure
         FROM broker_command_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
    )
    .bind(commands().map(|c| c.command_id.clone()).collect::<Vec<_>>())
    .bind(commands().map(|c| c.fingerprint().to_vec()).collect::<Vec<_>>())
    .bind(commands().map(|c| c.issuer.clone()).collect::<Vec<_>>())
    .bind(commands().map(|c| c.from.0).collect::<Vec<_>>())
    .bind(commands().map(|c| c.to.0).collect::<Vec<_>>())
    .bind(commands().map(|c| c.amount_minor).collect::<Vec<_>>())
    .bind(queued.iter().map(|one| one.published_at).collect::<Vec<_>>())
    .bind(
        queued
            .iter()
            .map(|one| one.dead_letter_reason)
            .collect::<Vec<_>>(),
    )
    .bind(queued.iter().map(|_| Uuid::now_v7()).collect::<Vec<_>>())
    .bind(i32::from(config.commands.age_hours_max))
    .bind(i32::try_from(config.commands.future_tolerance.as_secs()).unwrap_or(i32::MAX))
    .bind(i32::from(config.deposits.inbox_retention_hours))
    .bind(i32::from(config.deposits.inbox_wait_ms_max))
    .bind(i32::from(config.database.wallet_lock_wait_ms_max))
    .fetch_all(db)
    .await?;
    // An answer that is no outcome (even one that breaks the protocol) ends
    // the batch's outcomes: applied alone, that command meets it again,
    // and is handled as `apply` handles it.
    Ok(queued
        .iter()
        .zip(rows)
        .map_while(|(one, row)| {
            let claim = row.claim.filter(|_| row.failure.is_none())?;
            let row = CommandRow {
                claim,
                verdict: row.verdict,
                owner: row.owner,
                result: row.result,
            };
            applied(one.command, row).ok()
        })
        .collect())
}
