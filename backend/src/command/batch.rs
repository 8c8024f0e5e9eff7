//! A partition's entries through the layers together: the commands read
//! together go to PostgreSQL in one call (`transaction::apply_batch`, one
//! `broker_command_batch()`), each decided exactly as it would be alone,
//! its own inbox claim, refusal and stored outcome; then each ends as it
//! would alone: poison to the dead-letter stream, every outcome to the
//! results stream (in one round trip), each decision reported. The worker
//! acknowledges them after, in one round trip.
//!
//! Only the leading run of entries that read as commands goes together,
//! at most `commands_apply_batch_max` of them: the rest of the run goes in
//! the next call.
//! An entry that is no command, the first one the batch left without an
//! outcome (another consumer holds it, or it failed), and every entry of
//! a batch PostgreSQL refused as a whole go alone (`pipeline`), in order:
//! nothing behind an entry is applied before it.

use std::time::Instant;

use chrono::{DateTime, Utc};
use sqlx::Postgres;
use sqlx::pool::PoolConnection;

use super::consumer::Delivered;
use super::outcome::CommandVerdict;
use super::pipeline::{self, Outlets};
use super::transaction::{self, Queued};
use super::{Command, published_at};
use crate::redis_store::StreamConnection;
use crate::state::AppState;

/// The leading entries of a read batch that are commands, with what the
/// transaction takes for each.
pub struct Together<'a> {
    entries: Vec<Delivered<'a>>,
    commands: Vec<Command>,
    published: Vec<DateTime<Utc>>,
    /// Why each is poison, when it was delivered too often.
    dead_letter_reasons: Vec<Option<String>>,
}

/// What became of a batch.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The first `n` entries have their outcomes stored, published and
    /// reported: acknowledge them. The entry after them, if any, goes
    /// alone.
    Decided(usize),
    /// PostgreSQL refused the call as a whole, so nothing of it was
    /// written: the entries go alone.
    Refused(String),
    /// No connection, or it broke: each outcome is unknown, nothing is
    /// acknowledged, and the batch is tried again in place, where the inbox
    /// replays what committed.
    NotYet(String),
}

impl<'a> Together<'a> {
    /// The leading entries of `entries` that read as commands, at most
    /// `most` of them.
    pub fn leading(entries: impl IntoIterator<Item = Delivered<'a>>, outlets: &Outlets, most: usize) -> Self {
        let mut together = Self {
            entries: Vec::new(),
            commands: Vec::new(),
            published: Vec::new(),
            dead_letter_reasons: Vec::new(),
        };
        for entry in entries.into_iter().take(most) {
            let (Ok(command), Some(published)) = (Command::parse(entry.fields), published_at(entry.entry_id))
            else {
                break;
            };
            together.entries.push(entry);
            together.commands.push(command);
            together.published.push(published);
            together
                .dead_letter_reasons
                .push(outlets.dead_letters.reason_for(entry.deliveries));
        }
        together
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry ids of the first `n`, to acknowledge.
    pub fn entry_ids(&self, n: usize) -> Vec<&'a str> {
        self.entries[..n].iter().map(|entry| entry.entry_id).collect()
    }

    fn queued(&self) -> Vec<Queued<'_>> {
        (0..self.len())
            .map(|i| Queued {
                command: &self.commands[i],
                published_at: self.published[i],
                dead_letter_reason: self.dead_letter_reasons[i].as_deref(),
            })
            .collect()
    }
}

/// The batch through layers 2 and 3 in one call, then each decided
/// command's ending. `database` is the read batch's connection, given back
/// when the call fails.
pub async fn through_the_layers(
    state: &AppState,
    outlets: &Outlets,
    connection: &mut StreamConnection,
    database: &mut Option<PoolConnection<Postgres>>,
    together: &Together<'_>,
) -> Result<Ended, String> {
    let started = Instant::now();
    // Layer 1, the partition's lease, is held: the worker renewed it.
    // Layers 2 and 3: each command's inbox claim and row guard, together.
    let db = match pipeline::batch_connection(state, database).await {
        Ok(db) => db,
        Err(error) => return Ok(Ended::NotYet(error.to_string())),
    };
    let decided = match transaction::apply_batch(db, &state.config, &together.queued()).await {
        Ok(decided) => decided,
        Err(error) => {
            *database = None;
            return Ok(match error {
                sqlx::Error::Database(refused) => {
                    tracing::warn!(error = %refused, "the database refused a batch of commands; they go one by one");
                    Ended::Refused(refused.to_string())
                }
                broken => Ended::NotYet(broken.to_string()),
            });
        }
    };

    // The ending: poison aside, the outcomes for their issuers, the reports.
    for (i, applied) in decided.iter().enumerate() {
        if applied.verdict == CommandVerdict::DeadLettered {
            let reason = together.dead_letter_reasons[i]
                .clone()
                .unwrap_or_else(|| "dead-lettered before".to_owned());
            outlets
                .dead_letters
                .move_aside(connection, &together.entries[i], &reason)
                .await?;
        }
    }
    let outcomes: Vec<(&str, CommandVerdict, &str)> = decided
        .iter()
        .zip(&together.commands)
        .map(|(applied, command)| {
            (
                command.command_id.as_str(),
                applied.verdict,
                applied.result.as_str(),
            )
        })
        .collect();
    if !outcomes.is_empty() {
        outlets.results.publish_all(connection, &outcomes).await?;
    }
    for (applied, command) in decided.iter().zip(&together.commands) {
        pipeline::report(state, command, applied, started.elapsed());
    }
    Ok(Ended::Decided(decided.len()))
}

#[cfg(test)]
mod tests {
    use prometheus::IntCounter;
    use uuid::Uuid;

    use super::*;
    use crate::command::Streams;
    use crate::command::dead_letter::DeadLetters;
    use crate::command::results::ResultStream;
    use crate::domain::WalletId;
    use crate::settings::Settings;

    /// A read batch's fields: `commands` commands, then an entry that is
    /// no command, then one more command.
    fn read_batch(commands: usize) -> Vec<(String, Vec<(String, String)>)> {
        let command = |i: usize| Command {
            command_id: format!("cmd_{i}"),
            issuer: "payroll".into(),
            from: WalletId(Uuid::now_v7()),
            to: WalletId(Uuid::now_v7()),
            amount_minor: 100,
        };
        let fields = |command: Command| {
            command
                .fields()
                .into_iter()
                .map(|(name, value)| (name.to_owned(), value))
                .collect()
        };
        let mut entries: Vec<_> = (0..commands)
            .map(|i| (format!("{}-0", 1_700_000_000_000 + i), fields(command(i))))
            .collect();
        entries.push(("1800000000000-0".into(), vec![("amount".into(), "12".into())]));
        entries.push(("1800000000001-0".into(), fields(command(commands))));
        entries
    }

    #[test]
    fn a_run_of_commands_goes_in_calls_of_at_most_the_bound() {
        let config = Settings::default().validate().expect("defaults must validate");
        let streams = Streams::new("lw:", 4);
        let counter = IntCounter::new("dead_lettered", "unregistered").expect("a counter");
        let outlets = Outlets {
            partition: 0,
            dead_letters: DeadLetters::new(&streams, 0, &config, counter),
            results: ResultStream::new(&streams, &config),
        };
        let entries = read_batch(7);
        let from = |next: usize| {
            entries[next..].iter().map(|(entry_id, fields)| Delivered {
                entry_id,
                fields,
                deliveries: 1,
            })
        };

        assert_eq!(Together::leading(from(0), &outlets, 3).len(), 3);
        assert_eq!(Together::leading(from(3), &outlets, 3).len(), 3);
        // The run ends at the entry that is no command, bound or not.
        assert_eq!(Together::leading(from(6), &outlets, 3).len(), 1);
        assert_eq!(Together::leading(from(0), &outlets, 32).len(), 7);
        assert!(Together::leading(from(7), &outlets, 3).is_empty());
        assert_eq!(
            Together::leading(from(0), &outlets, 3).entry_ids(3),
            ["1700000000000-0", "1700000000001-0", "1700000000002-0"]
        );
    }
}
