//! Transfer commands from a broker: another service (a payroll run, a
//! batch) publishes them to Redis Streams, and every instance consumes
//! them as a member of one consumer group.
//!
//! A broker delivers at least once. A command comes again when a consumer's
//! claim time (`commands_claim_idle_ms`, the visibility timeout) runs out
//! while it is still working, when a consumer crashes between its commit
//! and its acknowledgement, and when a deployment restarts consumers. So
//! two consumers can hold one command at once, by construction. The layers,
//! each in its own file:
//!
//! 1. the **stream partition's lease** (`defense::partition_lease`, Redis):
//!    one consumer at a time works a partition, in order, and a stalled one
//!    loses it;
//! 2. the **inbox** (`defense::inbox`, PostgreSQL): the command id claimed
//!    insert-first, in the same transaction as the transfer, in the same
//!    table as deposits (source `broker`). The second holder of a command
//!    only acknowledges it;
//! 3. the **row guard**: the transfer itself, exactly as for a client's.
//!
//! `pipeline` runs one entry through them, and `batch` the commands a
//! partition read together, each decided exactly as alone; either way the
//! inbox claim and the row guard are one PostgreSQL call (`transaction`),
//! for one command or for the batch. Around them: the worker of
//! each partition (`partition`), the stream transport (`consumer`), the
//! census that shares the partitions (`census`), the dead-letter stream
//! (`dead_letter`), the results stream (`results`), the outcomes'
//! vocabulary (`outcome`), and how an entry that is no command is still
//! found by the command id it carried (`unreadable`).
//!
//! Acknowledged (`XACK`) only after the commit; a command's outcome is
//! stored in the inbox, published to the results stream, and readable by
//! its id on the admin listener.
//!
//! **Trust.** Whoever can write to the command streams can move money
//! between any two wallets: the streams are an internal interface, to be
//! closed with Redis ACLs, never exposed.

use chrono::{DateTime, TimeZone, Utc};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::defense::inbox::is_event_id;
use crate::domain::{WalletId, parse_uuid};

pub mod batch;
pub mod census;
pub mod consumer;
pub mod dead_letter;
pub mod outcome;
pub mod partition;
pub mod pipeline;
pub mod results;
pub mod transaction;
pub mod unreadable;

/// The consumer group every instance joins.
pub const GROUP: &str = "appliers";

/// The stream keys of a deployment's commands, under its Redis prefix.
/// Each partition's stream and lease share a hash tag, so that a Redis
/// Cluster keeps each partition in one slot and spreads the partitions.
#[derive(Debug, Clone)]
pub struct Streams {
    prefix: String,
    partitions: u16,
}

impl Streams {
    pub fn new(prefix: &str, partitions: u16) -> Self {
        Self {
            prefix: prefix.to_owned(),
            partitions: partitions.max(1),
        }
    }

    pub fn partitions(&self) -> u16 {
        self.partitions
    }

    /// The partition a source wallet's commands go to: the last eight bytes
    /// of its id, big-endian, modulo the partitions. One wallet's commands
    /// share a partition, so they apply in the order they were published.
    pub fn partition_of(&self, from: WalletId) -> u16 {
        let bytes = from.0.as_bytes();
        let mut tail = [0u8; 8];
        tail.copy_from_slice(&bytes[8..]);
        u16::try_from(u64::from_be_bytes(tail) % u64::from(self.partitions)).unwrap_or(0)
    }

    /// Where an issuer publishes a command from `from`.
    pub fn stream_for(&self, from: WalletId) -> String {
        self.stream(self.partition_of(from))
    }

    pub fn stream(&self, partition: u16) -> String {
        format!("{}commands:{{p{partition}}}", self.prefix)
    }

    /// The lease on one partition: who works it now.
    pub fn lease(&self, partition: u16) -> String {
        format!("{}commands:{{p{partition}}}:lease", self.prefix)
    }

    /// The live consumers, each with when it stops counting as alive: the
    /// partitions are shared among them.
    pub fn consumers(&self) -> String {
        format!("{}commands:{{consumers}}", self.prefix)
    }

    /// How many partitions each live consumer holds. It shares a hash tag
    /// with `consumers`: the census reads and writes both in one pipeline,
    /// which a Redis Cluster takes only within one slot.
    pub fn consumers_held(&self) -> String {
        format!("{}commands:{{consumers}}:held", self.prefix)
    }

    /// Entries moved aside after `commands_deliveries_max` deliveries, or
    /// unreadable, with the reason.
    pub fn dead_letters(&self) -> String {
        format!("{}commands:dead-letters", self.prefix)
    }

    /// Every command's outcome, for its issuer.
    pub fn results(&self) -> String {
        format!("{}commands:results", self.prefix)
    }
}

/// A command as published: the fields of one stream entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    pub command_id: String,
    pub issuer: String,
    pub from: WalletId,
    pub to: WalletId,
    pub amount_minor: i64,
}

/// Why an entry cannot be a command; such an entry is dead-lettered at
/// once, since no redelivery can make it readable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unreadable(pub String);

impl Command {
    pub const FIELDS: [&'static str; 5] = [
        "command_id",
        "issuer",
        "from_wallet_id",
        "to_wallet_id",
        "amount_minor",
    ];

    /// The fields of a stream entry, each exactly once.
    pub fn parse(fields: &[(String, String)]) -> Result<Self, Unreadable> {
        let field = |name: &str| -> Result<&str, Unreadable> {
            let mut values = fields.iter().filter(|(field, _)| field == name);
            match (values.next(), values.next()) {
                (Some((_, value)), None) => Ok(value.as_str()),
                (None, _) => Err(Unreadable(format!("{name} is missing"))),
                (Some(_), Some(_)) => Err(Unreadable(format!("{name} is given twice"))),
            }
        };
        if let Some((unknown, _)) = fields
            .iter()
            .find(|(name, _)| !Self::FIELDS.contains(&name.as_str()))
        {
            return Err(Unreadable(format!(
                "{unknown} is not a field of a command; the fields are {}",
                Self::FIELDS.join(", ")
            )));
        }
        let command_id = field("command_id")?;
        if !is_event_id(command_id) {
            return Err(Unreadable(
                "command_id must be 1 to 128 letters, digits and _ . : -".into(),
            ));
        }
        let issuer = field("issuer")?;
        if !Self::is_issuer(issuer) {
            return Err(Unreadable(
                "issuer must be 1 to 64 characters, none of them control characters".into(),
            ));
        }
        let wallet = |name: &str| -> Result<WalletId, Unreadable> {
            parse_uuid(field(name)?).map(WalletId).ok_or_else(|| {
                Unreadable(format!(
                    "{name} must be a wallet id (8-4-4-4-12 hexadecimal digits)"
                ))
            })
        };
        let (from, to) = (wallet("from_wallet_id")?, wallet("to_wallet_id")?);
        if from == to {
            return Err(Unreadable(
                "to_wallet_id must be another wallet than from_wallet_id".into(),
            ));
        }
        let amount_minor = field("amount_minor")?
            .parse::<i64>()
            .ok()
            .filter(|amount| *amount > 0)
            .ok_or_else(|| Unreadable("amount_minor must be a positive integer".into()))?;
        Ok(Self {
            command_id: command_id.to_owned(),
            issuer: issuer.to_owned(),
            from,
            to,
            amount_minor,
        })
    }

    /// Whether `issuer` names an issuer: 1 to 64 characters, none of them
    /// control characters.
    pub fn is_issuer(issuer: &str) -> bool {
        !issuer.is_empty() && issuer.len() <= 64 && !issuer.chars().any(char::is_control)
    }

    /// The fields to publish, in order: what an issuer sends with `XADD`.
    pub fn fields(&self) -> [(&'static str, String); 5] {
        [
            ("command_id", self.command_id.clone()),
            ("issuer", self.issuer.clone()),
            ("from_wallet_id", self.from.0.to_string()),
            ("to_wallet_id", self.to.0.to_string()),
            ("amount_minor", self.amount_minor.to_string()),
        ]
    }

    /// The `XADD` an issuer sends to publish this command to its partition
    /// of `streams`; it answers the entry's id.
    pub fn publication(&self, streams: &Streams) -> redis::Cmd {
        let mut add = redis::cmd("XADD");
        add.arg(streams.stream_for(self.from)).arg("*");
        for (name, value) in self.fields() {
            add.arg(name).arg(value);
        }
        add
    }

    /// What makes two publications the same command.
    pub fn fingerprint(&self) -> [u8; 32] {
        let mut hasher = Sha256::new();
        for (_, value) in self.fields() {
            hasher.update(value.as_bytes());
            hasher.update(b"\n");
        }
        hasher.finalize().into()
    }
}

/// When an entry was published: the milliseconds of its stream id.
pub fn published_at(entry_id: &str) -> Option<DateTime<Utc>> {
    let ms = entry_id.split_once('-')?.0.parse::<i64>().ok()?;
    Utc.timestamp_millis_opt(ms).single()
}

/// A fresh command id, as an issuer might name its commands.
pub fn new_command_id() -> String {
    format!("cmd_{}", Uuid::now_v7().simple())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An entry's fields, as a stream hands them over.
    pub(crate) fn fields(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    }

    #[test]
    fn a_command_reads_back_from_its_fields() {
        let command = Command {
            command_id: "cmd_1".into(),
            issuer: "payroll".into(),
            from: WalletId(Uuid::now_v7()),
            to: WalletId(Uuid::now_v7()),
            amount_minor: 1_500,
        };
        let published: Vec<(String, String)> = command
            .fields()
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect();
        assert_eq!(Command::parse(&published), Ok(command));
    }

    #[test]
    fn an_unreadable_entry_says_why() {
        let wallet = "0190f0a0-0000-7000-8000-000000000001";
        let other = "0190f0a0-0000-7000-8000-000000000002";
        let cases = [
            (fields(&[("command_id", "c1")]), "issuer is missing"),
            (
                fields(&[
                    ("command_id", "c 1"),
                    ("issuer", "p"),
                    ("from_wallet_id", wallet),
                    ("to_wallet_id", other),
                    ("amount_minor", "1"),
                ]),
                "command_id must be",
            ),
            (
                fields(&[
                    ("command_id", "c1"),
                    ("issuer", "p"),
                    ("from_wallet_id", wallet),
                    ("to_wallet_id", wallet),
                    ("amount_minor", "1"),
                ]),
                "another wallet",
            ),
            (
                fields(&[
                    ("command_id", "c1"),
                    ("issuer", "p"),
                    ("from_wallet_id", wallet),
                    ("to_wallet_id", other),
                    ("amount_minor", "-5"),
                ]),
                "positive integer",
            ),
            (
                fields(&[("command_id", "c1"), ("command_id", "c2")]),
                "given twice",
            ),
            (fields(&[("surprise", "x")]), "not a field"),
        ];
        for (entry, expected) in cases {
            let Err(Unreadable(reason)) = Command::parse(&entry) else {
                panic!("{entry:?} parsed");
            };
            assert!(reason.contains(expected), "{reason}");
        }
    }

    #[test]
    fn one_wallet_always_lands_in_one_partition_and_wallets_spread() {
        let streams = Streams::new("lw:", 4);
        let mut seen = [0u32; 4];
        for _ in 0..400 {
            let wallet = WalletId(Uuid::now_v7());
            let partition = streams.partition_of(wallet);
            assert_eq!(partition, streams.partition_of(wallet));
            seen[usize::from(partition)] += 1;
        }
        assert!(seen.iter().all(|count| *count > 50), "{seen:?}");
        assert_eq!(streams.stream(2), "lw:commands:{p2}");
        assert_eq!(
            published_at("1700000000000-3").map(|t| t.timestamp()),
            Some(1_700_000_000)
        );
    }
}
