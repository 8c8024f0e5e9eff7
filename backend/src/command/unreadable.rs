//! An entry that is no command, found by its issuer all the same.
//!
//! Such an entry is dead-lettered at once (no redelivery can make it
//! readable). When it carried a well-formed `command_id`, its issuer knows
//! it by that id and will look for it there: so it is recorded in the inbox
//! as `dead_lettered` under the id (`broker_command_unreadable()`), its
//! result names the id, and `GET /commands/{id}` answers it with the
//! reason. An issuer that republishes whatever has no outcome then stops.
//! An entry without a usable id can only be reported by its entry id and
//! partition, on the results stream.

use sha2::{Digest, Sha256};

use super::Command;
use super::outcome::CommandVerdict;
use super::transaction::{Applied, NotApplied};
use crate::decision::{Decision, Layer, Outcome};
use crate::defense::inbox::{InboxClaim, is_event_id};
use crate::settings::Config;

/// What an unreadable entry still says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carried<'a> {
    /// Its `command_id`, given once and well-formed.
    pub command_id: &'a str,
    /// Its `issuer`, when that is usable too.
    pub issuer: Option<&'a str>,
    /// Its fields', in order: the same entry published again replays its
    /// outcome, and another one under the same id is another command.
    pub fingerprint: [u8; 32],
}

impl<'a> Carried<'a> {
    /// The command id an entry carried, when it carried one usable id.
    pub fn of(fields: &'a [(String, String)]) -> Option<Self> {
        let only = |name: &str| {
            let mut values = fields.iter().filter(|(field, _)| field == name);
            match (values.next(), values.next()) {
                (Some((_, value)), None) => Some(value.as_str()),
                _ => None,
            }
        };
        let command_id = only("command_id").filter(|id| is_event_id(id))?;
        let issuer = only("issuer").filter(|issuer| Command::is_issuer(issuer));
        let mut hasher = Sha256::new();
        // Unlike a command's fingerprint (values only, in their fixed
        // order), this one names each field: an unreadable entry's fields
        // may be any.
        hasher.update(b"unreadable\n");
        for (name, value) in fields {
            hasher.update(name.as_bytes());
            hasher.update(b"=");
            hasher.update(value.as_bytes());
            hasher.update(b"\n");
        }
        Some(Self {
            command_id,
            issuer,
            fingerprint: hasher.finalize().into(),
        })
    }
}

#[derive(sqlx::FromRow)]
struct UnreadableRow {
    claim: InboxClaim,
    verdict: Option<String>,
    result: Option<String>,
}

/// Records the entry as dead-lettered under the id it carried, with
/// `reason`; answers the result to publish.
pub async fn record(
    db: &mut sqlx::PgConnection,
    config: &Config,
    carried: &Carried<'_>,
    reason: &str,
) -> Result<Applied, NotApplied> {
    let row: UnreadableRow = sqlx::query_as(
        "SELECT claim, verdict, result FROM broker_command_unreadable($1, $2, $3, $4, $5, $6)",
    )
    .bind(carried.command_id)
    .bind(&carried.fingerprint[..])
    .bind(carried.issuer)
    .bind(reason)
    .bind(i32::from(config.deposits.inbox_retention_hours))
    .bind(i32::from(config.deposits.inbox_wait_ms_max))
    .fetch_one(db)
    .await?;
    let verdict = match row.verdict.as_deref().map(str::parse::<CommandVerdict>) {
        Some(Ok(verdict)) => Some(verdict),
        Some(Err(unknown)) => {
            return Err(NotApplied::Protocol(format!(
                "broker_command_unreadable() answered {unknown}"
            )));
        }
        None => None,
    };
    let decided = |decision, verdict, result| Applied {
        decision,
        verdict,
        result,
        owner: None,
    };
    match (row.claim, verdict, row.result) {
        (InboxClaim::InFlight, _, _) => Err(NotApplied::InFlight),
        // The id names another command, whose outcome stands: this entry
        // is still poison, and its result says both.
        (InboxClaim::PayloadChanged, _, _) => Ok(decided(
            CommandVerdict::PayloadChanged.decision(),
            CommandVerdict::DeadLettered,
            serde_json::json!({
                "command_id": carried.command_id,
                "issuer": carried.issuer,
                "outcome": CommandVerdict::DeadLettered.as_str(),
                "reason": format!(
                    "{reason}; this command id was published before as another command, whose outcome stands"
                ),
            })
            .to_string(),
        )),
        (InboxClaim::Replayed, Some(verdict), Some(result)) => Ok(decided(
            Decision::new(Layer::Inbox, Outcome::Replayed),
            verdict,
            result,
        )),
        (InboxClaim::Started, Some(verdict), Some(result)) => {
            Ok(decided(verdict.decision(), verdict, result))
        }
        (claim, verdict, result) => Err(NotApplied::Protocol(format!(
            "broker_command_unreadable() answered {claim:?} with verdict {verdict:?} and a result: {}",
            result.is_some()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::tests::fields;

    #[test]
    fn an_entry_carries_its_id_only_when_it_is_given_once_and_well_formed() {
        let garbled = fields(&[("command_id", "cmd_1"), ("amount", "12")]);
        let carried = Carried::of(&garbled).expect("a usable id");
        assert_eq!((carried.command_id, carried.issuer), ("cmd_1", None));
        let with_issuer = fields(&[("command_id", "cmd_1"), ("issuer", "payroll")]);
        assert_eq!(
            Carried::of(&with_issuer).and_then(|carried| carried.issuer),
            Some("payroll")
        );
        assert_ne!(
            Carried::of(&with_issuer).map(|c| c.fingerprint),
            Some(carried.fingerprint)
        );
        for unusable in [
            fields(&[("amount", "12")]),
            fields(&[("command_id", "cmd 1")]),
            fields(&[("command_id", "")]),
            fields(&[("command_id", "a"), ("command_id", "b")]),
        ] {
            assert_eq!(Carried::of(&unusable), None, "{unusable:?}");
        }
    }
}
