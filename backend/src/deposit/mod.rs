//! Money that arrives: a payment provider's deposit webhooks.
//!
//! A provider retries a delivery whose answer it did not get, often while
//! the first delivery is still running, and often on another instance.
//! There is no row to lock until the deposit is applied; the only question
//! is whether this event was applied already. Three layers answer it, as
//! for transfers, each in its own file:
//!
//! 1. the **edge lock** on the event (`defense::edge_lock`, Redis): a
//!    burst of identical deliveries reaches PostgreSQL once, and the
//!    duplicates answer with the first delivery's answer;
//! 2. the **inbox** (`transaction`, PostgreSQL): `(source, event_id)`
//!    claimed insert-first in the same transaction as the credit, so an
//!    event is applied once whatever reaches it;
//! 3. the **credit** itself, under the wallet's row lock, with the currency
//!    guard (`deposit_credit()` in migrations/20261202000011_inbox_and_deposits.sql).
//!
//! Before them, the signature (`auth::provider_signature`): nothing unsigned is read.
//! `pipeline` runs the layers in order.

use chrono::{DateTime, SecondsFormat, Utc};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::defense::inbox::is_event_id;
use crate::domain::{WalletId, wallet_id_field};
use crate::problem::{Fields, Problem};

pub mod pipeline;
pub mod transaction;

/// The inbox's name for deposits, and the edge lock's.
pub const SOURCE: &str = "provider";

/// Where a deposit's money comes from: the inbox's name for the sender
/// (`inbox_source`, also the edge lock's scope) and the wallet it is moved
/// from (`None`: the sender's clearing wallet for the currency).
#[derive(Debug, Clone, Copy)]
pub struct Origin {
    pub source: &'static str,
    pub clearing: Option<WalletId>,
}

impl Origin {
    /// A payment provider's delivery.
    pub const PROVIDER: Origin = Origin {
        source: SOURCE,
        clearing: None,
    };
}

/// A deposit event that passed every check needing no I/O. Whether it is
/// over the limit or too old is decided in the transaction, after the
/// inbox, so that every delivery of one event gets the same answer even
/// if a setting or the clock moved in between.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DepositEvent {
    pub event_id: String,
    pub wallet: WalletId,
    pub amount_minor: i64,
    pub currency: String,
    pub occurred_at: DateTime<Utc>,
}

impl DepositEvent {
    pub const FIELDS: [&'static str; 5] =
        ["event_id", "wallet_id", "amount_minor", "currency", "occurred_at"];

    /// Malformed JSON is a 400; the wrong shape or a value outside the
    /// rules is a 422 naming each field.
    pub fn parse(body: &[u8]) -> Result<Self, Problem> {
        let mut fields = Fields::of(body, &Self::FIELDS)?;
        let event_id = fields.string("event_id");
        if event_id.as_deref().is_some_and(|id| !is_event_id(id)) {
            fields.refuse("event_id", "must be 1 to 128 letters, digits and _ . : -");
        }
        let wallet = wallet_id_field(&mut fields, "wallet_id");
        let amount_minor = fields.integer("amount_minor");
        if amount_minor.is_some_and(|minor| minor <= 0) {
            fields.refuse("amount_minor", "must be a positive integer");
        }
        let currency = fields.string("currency");
        if currency
            .as_deref()
            .is_some_and(|code| code.len() != 3 || !code.bytes().all(|b| b.is_ascii_uppercase()))
        {
            fields.refuse("currency", "must be three upper-case letters, e.g. USD");
        }
        let occurred_at = fields.string("occurred_at");
        let occurred_at = occurred_at.and_then(|text| match DateTime::parse_from_rfc3339(&text) {
            Ok(time) => Some(time.with_timezone(&Utc)),
            Err(_) => {
                fields.refuse(
                    "occurred_at",
                    "must be an RFC 3339 time, e.g. 2026-12-02T18:00:00Z",
                );
                None
            }
        });
        fields.finish("The deposit event is not valid")?;
        match (event_id, wallet, amount_minor, currency, occurred_at) {
            (Some(event_id), Some(wallet), Some(amount_minor), Some(currency), Some(occurred_at)) => {
                Ok(Self {
                    event_id,
                    wallet: WalletId(wallet),
                    amount_minor,
                    currency,
                    occurred_at,
                })
            }
            // `finish` refused every missing field above.
            _ => Err(Problem::validation("The deposit event is not valid.")),
        }
    }

    /// What makes two deliveries the same event: its fields as read, not
    /// the bytes (a provider may serialise a retry differently).
    pub fn fingerprint(&self) -> [u8; 32] {
        let mut hasher = Sha256::new();
        for part in [
            self.event_id.as_str(),
            &self.wallet.0.to_string(),
            &self.amount_minor.to_string(),
            &self.currency,
            &self.occurred_at.to_rfc3339_opts(SecondsFormat::Micros, true),
        ] {
            hasher.update(part.as_bytes());
            hasher.update(b"\n");
        }
        hasher.finalize().into()
    }
}

/// The body of a credited deposit, as `deposit_receipt()` writes it (this
/// type documents it in the OpenAPI document).
#[derive(Debug, utoipa::ToSchema)]
pub struct DepositReceipt {
    pub event_id: String,
    /// Always `credited`; a refusal is a problem.
    pub status: String,
    /// The id of the ledger transfer from the provider's clearing wallet.
    pub deposit_id: Uuid,
    pub wallet_id: Uuid,
    pub amount_minor: i64,
    pub currency: String,
    pub credited_at: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"event_id":"evt_1","wallet_id":"0190f0a0-0000-7000-8000-000000000001",
        "amount_minor":500,"currency":"USD","occurred_at":"2026-12-02T18:00:00Z"}"#;

    #[test]
    fn an_event_reads_and_its_fingerprint_ignores_formatting() {
        let event = DepositEvent::parse(GOOD.as_bytes()).expect("valid");
        assert_eq!(event.amount_minor, 500);
        let same = GOOD.replace("18:00:00Z", "19:00:00+01:00").replace(' ', "");
        let same = DepositEvent::parse(same.as_bytes()).expect("valid");
        assert_eq!(event.fingerprint(), same.fingerprint());
        let changed = DepositEvent::parse(GOOD.replace("500", "501").as_bytes()).expect("valid");
        assert_ne!(event.fingerprint(), changed.fingerprint());
    }

    #[test]
    fn every_wrong_field_is_named() {
        let body = r#"{"event_id":"evt {1}","wallet_id":"{0190f0a0-0000-7000-8000-000000000001}",
            "amount_minor":0,"currency":"usd","occurred_at":"yesterday","extra":1}"#;
        let problem = DepositEvent::parse(body.as_bytes()).expect_err("invalid");
        let pointers: Vec<_> = problem
            .errors
            .iter()
            .flat_map(|errors| errors.iter())
            .map(|error| error.pointer.as_str())
            .collect();
        assert_eq!(
            pointers,
            [
                "#/extra",
                "#/event_id",
                "#/wallet_id",
                "#/amount_minor",
                "#/currency",
                "#/occurred_at"
            ]
        );
    }
}
