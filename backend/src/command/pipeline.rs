//! The command pipeline: one delivered entry goes through the layers in
//! order, and every exit is one way it was handled:
//!
//! 1. the partition's lease (`defense::partition_lease`), held by the
//!    partition's worker (`partition`), which renews it before it hands
//!    an entry over;
//!
//! then the entry is read as a command; one that is not is poison,
//! recorded under the command id it carried when it carried a usable one
//! (`unreadable`);
//!
//! 2. and 3. the inbox claim and the row guard, in one PostgreSQL call
//!    (`transaction`);
//!
//! then the ending: poison to the dead-letter stream (`dead_letter`), the
//! outcome to the results stream (`results`), and the decision reported
//! (log line, metrics, the source wallet owner's feed). The worker
//! acknowledges the entry after.

use std::time::{Duration, Instant};

use sqlx::Postgres;
use sqlx::pool::PoolConnection;

use super::consumer::Delivered;
use super::dead_letter::DeadLetters;
use super::outcome::CommandVerdict;
use super::results::ResultStream;
use super::transaction::{self, Applied, NotApplied};
use super::unreadable::{self, Carried};
use super::{Command, Unreadable, published_at};
use crate::defense::idempotency::StoredResponse;
use crate::ending::{self, Decided, Settled, Subject};
use crate::feed::EntryPoint;
use crate::problem::DatabaseFailure;
use crate::redis_store::StreamConnection;
use crate::state::AppState;
use crate::telemetry::RequestContext;

/// What became of one entry.
#[derive(Debug)]
pub enum Handled {
    /// An outcome is stored (or the entry was dead-lettered): acknowledge.
    Done,
    /// Not yet, for a reason that passes (the database is unavailable,
    /// another consumer still holds the command): try again, for as long
    /// as it takes.
    NotYet(String),
    /// Not applied, for a reason that may not pass (the database refused it,
    /// or answered what it never should): try again, counting the attempt
    /// as a delivery, so that it is dead-lettered in the end.
    Failed(String),
}

/// Where one partition's entries end besides PostgreSQL.
pub struct Outlets {
    pub partition: u16,
    pub dead_letters: DeadLetters,
    pub results: ResultStream,
}

/// One entry through the layers. `database` is the batch's connection:
/// taken at the first command, and given back when one is not applied,
/// so that the next attempt takes a fresh one.
pub async fn through_the_layers(
    state: &AppState,
    outlets: &Outlets,
    connection: &mut StreamConnection,
    database: &mut Option<PoolConnection<Postgres>>,
    entry: Delivered<'_>,
) -> Result<Handled, String> {
    let started = Instant::now();
    let Outlets {
        partition: _,
        dead_letters,
        results,
    } = outlets;
    // Layer 1, the partition's lease, is held: the worker renewed it.

    // An entry that is not a command never becomes one: poison at once.
    let command = match Command::parse(entry.fields) {
        Ok(command) => command,
        Err(Unreadable(reason)) => {
            return poison_at_once(state, outlets, connection, database, entry, &reason).await;
        }
    };
    let Some(published) = published_at(entry.entry_id) else {
        return Ok(Handled::Failed(format!("{} is not a stream id", entry.entry_id)));
    };
    let dead_letter_reason = dead_letters.reason_for(entry.deliveries);

    // Layers 2 and 3: the inbox claim and the row guard, in one call.
    let db = match batch_connection(state, database).await {
        Ok(db) => db,
        Err(error) => return Ok(Handled::NotYet(error.to_string())),
    };
    let poison = dead_letter_reason.as_deref();
    let applied = match transaction::apply(db, &state.config, &command, published, poison).await {
        Ok(applied) => applied,
        Err(not_applied) => {
            // Broken, or about to wait out a retry: either way not held.
            *database = None;
            return Ok(Handled::from(not_applied));
        }
    };

    // The ending: poison aside, the outcome for the issuer, the report.
    if applied.verdict == CommandVerdict::DeadLettered {
        let reason = dead_letter_reason.unwrap_or_else(|| "dead-lettered before".to_owned());
        dead_letters.move_aside(connection, &entry, &reason).await?;
    }
    results
        .publish(connection, &command.command_id, applied.verdict, &applied.result)
        .await?;
    report(state, &command, &applied, started.elapsed());
    Ok(Handled::Done)
}

/// An entry that is no command: recorded as dead-lettered under the
/// command id it carried, when it carried a usable one (`unreadable`),
/// then moved aside, and its result published: under that id, or else by
/// its entry id and partition.
async fn poison_at_once(
    state: &AppState,
    outlets: &Outlets,
    connection: &mut StreamConnection,
    database: &mut Option<PoolConnection<Postgres>>,
    entry: Delivered<'_>,
    reason: &str,
) -> Result<Handled, String> {
    let Some(carried) = Carried::of(entry.fields) else {
        outlets
            .dead_letters
            .move_aside(connection, &entry, reason)
            .await?;
        outlets
            .results
            .publish_unreadable(connection, entry.entry_id, outlets.partition, reason)
            .await?;
        return Ok(Handled::Done);
    };
    let db = match batch_connection(state, database).await {
        Ok(db) => db,
        Err(error) => return Ok(Handled::NotYet(error.to_string())),
    };
    let recorded = match unreadable::record(db, &state.config, &carried, reason).await {
        Ok(recorded) => recorded,
        Err(not_recorded) => {
            *database = None;
            return Ok(Handled::from(not_recorded));
        }
    };
    outlets
        .dead_letters
        .move_aside(connection, &entry, reason)
        .await?;
    outlets
        .results
        .publish(connection, carried.command_id, recorded.verdict, &recorded.result)
        .await?;
    Ok(Handled::Done)
}

/// The batch's PostgreSQL connection, taken from the pool at its first
/// command.
pub(super) async fn batch_connection<'a>(
    state: &AppState,
    database: &'a mut Option<PoolConnection<Postgres>>,
) -> Result<&'a mut PoolConnection<Postgres>, sqlx::Error> {
    Ok(match database {
        Some(held) => held,
        None => database.insert(state.db.acquire().await?),
    })
}

/// A command the transaction did not apply: a protocol error or a refusal
/// by the database counts against the entry; anything else passes.
impl From<NotApplied> for Handled {
    fn from(not_applied: NotApplied) -> Self {
        match not_applied {
            NotApplied::Protocol(what) => {
                tracing::error!(what, "the database's answer to a command broke the protocol");
                Self::Failed(what)
            }
            NotApplied::Database(error) if DatabaseFailure::of(&error) == DatabaseFailure::RolledBackBug => {
                tracing::error!(error = %error, "the database refused a command");
                Self::Failed(error.to_string())
            }
            not_yet => Self::NotYet(not_yet.to_string()),
        }
    }
}

/// The decision, reported as every entry point's is (`ending::report`):
/// the log line, the metrics, the source wallet owner's feed.
pub fn report(state: &AppState, command: &Command, applied: &Applied, took: Duration) {
    if applied.verdict == CommandVerdict::PayloadChanged {
        tracing::warn!(
            commands.command_id = %command.command_id,
            commands.issuer = %command.issuer,
            issuer.error = "payload_changed",
            "a command id was published again for another command; refused"
        );
    }
    let context = RequestContext {
        request_id: command.command_id.clone(),
        trace_id: String::new(),
        traceparent: None,
        started: Instant::now().checked_sub(took).unwrap_or_else(Instant::now),
    };
    let settled = Settled {
        decision: applied.decision,
        response: StoredResponse {
            status: applied.verdict.status(),
            body: applied.result.clone(),
        },
        replayed: false,
        owner: applied.owner,
    };
    let subject = Subject {
        amount_minor: Some(command.amount_minor),
        to_wallet_id: Some(command.to.0),
        event_id: Some(command.command_id.clone()),
        sender: Some(command.issuer.to_string()),
    };
    ending::report(
        state,
        &context,
        &Decided::of(EntryPoint::Command, Ok(settled), None).about(subject),
    );
}
