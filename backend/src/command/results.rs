//! The results stream: every command's outcome, for its issuer. Published
//! before the entry is acknowledged, so an issuer may read a result twice,
//! never miss one; the stream keeps about `commands_results_entries_max`
//! entries, and the inbox keeps each outcome for `inbox_retention_hours`
//! (`GET /commands/{id}` on the admin listener).

use super::Streams;
use super::outcome::CommandVerdict;
use crate::redis_store::StreamConnection;
use crate::settings::Config;

/// The results stream, as the consumers write it.
pub struct ResultStream {
    key: String,
    entries_max: u64,
}

impl ResultStream {
    pub fn new(streams: &Streams, config: &Config) -> Self {
        Self {
            key: streams.results(),
            entries_max: config.commands.results_entries_max,
        }
    }

    /// Publishes that an entry without a usable command id was
    /// dead-lettered: its entry id in its partition's stream and the reason
    /// say which. (One that carried a usable id is published under it.)
    pub async fn publish_unreadable(
        &self,
        connection: &mut StreamConnection,
        entry_id: &str,
        partition: u16,
        reason: &str,
    ) -> Result<(), String> {
        let verdict = CommandVerdict::DeadLettered;
        let result = serde_json::json!({
            "entry_id": entry_id,
            "partition": partition,
            "outcome": verdict.as_str(),
            "reason": reason,
        });
        self.publish(connection, "", verdict, &result.to_string()).await
    }

    /// Publishes a command's `result` body with its verdict; `command_id`
    /// is empty for an entry that was no command.
    pub async fn publish(
        &self,
        connection: &mut StreamConnection,
        command_id: &str,
        verdict: CommandVerdict,
        result: &str,
    ) -> Result<(), String> {
        self.addition(command_id, verdict, result)
            .query_async::<String>(connection)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// Publishes a batch's outcomes, each as `publish` would, in order, in
    /// one round trip.
    pub async fn publish_all(
        &self,
        connection: &mut StreamConnection,
        outcomes: &[(&str, CommandVerdict, &str)],
    ) -> Result<(), String> {
        let mut pipeline = redis::pipe();
        for (command_id, verdict, result) in outcomes {
            pipeline.add_command(self.addition(command_id, *verdict, result));
        }
        pipeline
            .query_async::<Vec<String>>(connection)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// The `XADD` of one outcome.
    fn addition(&self, command_id: &str, verdict: CommandVerdict, result: &str) -> redis::Cmd {
        let mut add = redis::cmd("XADD");
        add.arg(&self.key)
            .arg("MAXLEN")
            .arg("~")
            .arg(self.entries_max)
            .arg("*")
            .arg("command_id")
            .arg(command_id)
            .arg("outcome")
            .arg(verdict.as_str())
            .arg("result")
            .arg(result);
        add
    }
}
