//! The dead-letter stream: where poison goes, so that it never blocks its
//! partition.
//!
//! An entry that is not a command is dead-lettered at once: no redelivery
//! can make it readable. One that reached `commands_deliveries_max`
//! deliveries without an outcome (consumers that died or stalled holding
//! it, and attempts the database refused outright) is recorded as
//! dead-lettered in the inbox, then moved here. A refusal (insufficient
//! funds) is an outcome, not poison. The stream keeps about
//! `commands_dead_letters_entries_max` entries, each with the reason, its
//! partition, its deliveries and the command's fields.

use prometheus::IntCounter;

use super::Streams;
use super::consumer::Delivered;
use crate::redis_store::StreamConnection;
use crate::settings::Config;

/// One partition's way to the dead-letter stream.
pub struct DeadLetters {
    key: String,
    entries_max: u64,
    /// `commands_deliveries_max`.
    deliveries_max: u64,
    partition: u16,
    dead_lettered: IntCounter,
}

impl DeadLetters {
    pub fn new(streams: &Streams, partition: u16, config: &Config, dead_lettered: IntCounter) -> Self {
        Self {
            key: streams.dead_letters(),
            entries_max: config.commands.dead_letters_entries_max,
            deliveries_max: u64::from(config.commands.deliveries_max),
            partition,
            dead_lettered,
        }
    }

    /// Why an entry delivered `deliveries` times is poison, when it is:
    /// past `commands_deliveries_max` without an outcome.
    pub fn reason_for(&self, deliveries: u64) -> Option<String> {
        (deliveries > self.deliveries_max).then(|| format!("delivered {deliveries} times without an outcome"))
    }

    /// Moves `entry` aside, with `reason`.
    pub async fn move_aside(
        &self,
        connection: &mut StreamConnection,
        entry: &Delivered<'_>,
        reason: &str,
    ) -> Result<(), String> {
        let mut add = redis::cmd("XADD");
        add.arg(&self.key)
            .arg("MAXLEN")
            .arg("~")
            .arg(self.entries_max)
            .arg("*")
            .arg("entry_id")
            .arg(entry.entry_id)
            .arg("partition")
            .arg(self.partition)
            .arg("reason")
            .arg(reason)
            .arg("deliveries")
            .arg(entry.deliveries);
        for (name, value) in entry.fields {
            add.arg(format!("command.{name}")).arg(value);
        }
        add.query_async::<String>(connection)
            .await
            .map_err(|e| e.to_string())?;
        self.dead_lettered.inc();
        tracing::warn!(
            commands.partition = self.partition,
            commands.entry_id = %entry.entry_id,
            reason,
            "a command was dead-lettered"
        );
        Ok(())
    }
}
