//! Money that leaves: payouts to a bank account through a bank gateway.
//!
//! A transaction protects the rows it writes, not a call to the outside
//! world: a gateway called inside or right after the transaction is called
//! twice by a retry, or for a debit that rolled back. So a payout is a saga
//! of local transactions around one call that may be repeated safely:
//!
//! 1. **the request** (`pipeline`) goes through the three layers as a
//!    transfer does (the cooldown, the `Idempotency-Key`, the row guard),
//!    and in one transaction (`transaction`) moves the amount from the
//!    wallet's available balance into a **hold** and writes an **outbox**
//!    row; it answers `202 Accepted`;
//! 2. **the dispatcher** (`dispatcher`) on every instance takes due outbox
//!    rows under a lease and calls the gateway (`gateway`) with the payout's
//!    id as the `Idempotency-Key`: at least once, and the gateway's
//!    deduplication makes the sending once;
//! 3. **the answer** settles the hold (sent), releases it (refused for
//!    good), or leaves it for a later attempt (unknown: the money may have
//!    left, so nothing is ever released on it). When the attempts run out
//!    the payout needs a person, and `wallet-server reconcile`
//!    (`reconcile`) asks the gateway what happened.
//!
//! The SQL of each step is in migrations/20261202000006_payouts.sql.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::domain::{AmountMinor, CanonicalBody, WalletId, wallet_id_field};
use crate::problem::{Fields, Problem};

pub mod dispatcher;
pub mod gateway;
pub mod pipeline;
pub mod reconcile;
pub mod transaction;

/// The clearing wallet a payout's amount waits in while the gateway is
/// asked (`wallets.clearing_source`).
pub const HOLDS_SOURCE: &str = "holds";
/// The clearing wallet a settled payout's amount moves to: money that left.
pub const GATEWAY_SOURCE: &str = "gateway";
/// The longest destination (a bank account's reference at the gateway).
pub const DESTINATION_CHARS_MAX: usize = 64;

/// A destination: 1 to 64 letters, digits and `_ . : -`, as the gateway
/// and the `payouts` table's CHECK take it.
pub fn is_destination(text: &str) -> bool {
    (1..=DESTINATION_CHARS_MAX).contains(&text.len())
        && text
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || b"_.:-".contains(&byte))
}

/// A payout request that passed every check needing no I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayoutRequest {
    pub from: WalletId,
    pub amount: AmountMinor,
    pub destination: String,
}

impl PayoutRequest {
    pub const FIELDS: [&'static str; 3] = ["from_wallet_id", "amount_minor", "destination"];

    /// Malformed JSON is a 400; the wrong shape or a value outside the
    /// rules is a 422 naming each field.
    pub fn parse(body: &[u8], amount_minor_max: i64) -> Result<Self, Problem> {
        let mut fields = Fields::of(body, &Self::FIELDS)?;
        let from = wallet_id_field(&mut fields, "from_wallet_id");
        let amount_minor = fields.integer("amount_minor");
        if let Some(rule) = amount_minor.and_then(|minor| AmountMinor::broken_rule(minor, amount_minor_max)) {
            fields.refuse("amount_minor", rule);
        }
        let destination = fields.string("destination");
        if destination.as_deref().is_some_and(|text| !is_destination(text)) {
            fields.refuse(
                "destination",
                "must be 1 to 64 letters, digits and _ . : - (the bank account's reference)",
            );
        }
        fields.finish("The payout body is not valid")?;
        match (from, amount_minor, destination) {
            (Some(from), Some(amount_minor), Some(destination)) => {
                Self::new(WalletId(from), amount_minor, destination, amount_minor_max)
            }
            // `finish` refused any body missing one of them.
            _ => Err(Problem::validation("The payout body is not valid.")),
        }
    }

    /// The same rules for a request that did not come as JSON (the
    /// browser's form).
    pub fn new(
        from: WalletId,
        amount_minor: i64,
        destination: String,
        amount_minor_max: i64,
    ) -> Result<Self, Problem> {
        if !is_destination(&destination) {
            return Err(Problem::validation(
                "destination must be 1 to 64 letters, digits and _ . : - (the bank account's reference).",
            ));
        }
        Ok(Self {
            from,
            amount: AmountMinor::parse(amount_minor, amount_minor_max)?,
            destination,
        })
    }

    /// This payout's body in its one spelling. Part of every stored
    /// fingerprint, so it never changes.
    pub fn canonical_json(&self) -> CanonicalBody {
        CanonicalBody::spelled(format!(
            r#"{{"amount_minor":{},"destination":"{}","from_wallet_id":"{}"}}"#,
            self.amount.get(),
            self.destination,
            self.from.0
        ))
    }
}

/// Where a payout stands: the PostgreSQL enum `payout_state`, value for
/// value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type, Serialize, utoipa::ToSchema)]
#[sqlx(type_name = "payout_state", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum PayoutState {
    /// Held, waiting for the dispatcher; the gateway was never asked.
    Pending,
    /// The gateway was asked at least once and its answer is not known
    /// yet: the money may have left.
    Sent,
    /// The gateway sent it; the hold became a posted debit.
    Settled,
    /// The gateway refused it for good; the hold was released.
    Failed,
    /// No attempt got a known outcome; the hold stays until reconciled.
    NeedsAttention,
}

impl PayoutState {
    /// How a person reads it.
    pub fn for_people(self) -> &'static str {
        match self {
            PayoutState::Pending => "waiting to be sent",
            PayoutState::Sent => "sent to the bank, waiting for its answer",
            PayoutState::Settled => "paid out",
            PayoutState::Failed => "refused by the bank; the money is back",
            PayoutState::NeedsAttention => "outcome unknown; the money stays set aside until it is checked",
        }
    }
}

/// A payout as `GET /api/v1/payouts/{id}` shows it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Payout {
    pub id: Uuid,
    #[sqlx(rename = "wallet_id")]
    pub from_wallet_id: Uuid,
    pub amount_minor: i64,
    pub currency: String,
    pub destination: String,
    pub state: PayoutState,
    /// Gateway calls made so far.
    pub attempts: i32,
    /// Why the gateway refused it, or why it needs a person.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The gateway's id for the sending, once settled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway_reference: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// The columns `Payout` reads, in every query that reads one (a macro, so
/// that `concat!` makes each query one static string).
#[macro_export]
macro_rules! payout_columns {
    () => {
        "id, wallet_id, amount_minor, currency, destination, state, attempts, reason, gateway_reference, \
         created_at, updated_at"
    };
}

/// What a wallet's payouts hold now: set aside from its available balance,
/// not yet settled or released. The posted balance is the available
/// balance plus this.
pub async fn held_minor(db: &sqlx::PgPool, wallet: WalletId) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT payouts_held_minor($1)")
        .bind(wallet.0)
        .fetch_one(db)
        .await
}

/// The body of a `202 Accepted`, as `payout_receipt()` writes it (this
/// type documents it in the OpenAPI document).
#[derive(Debug, utoipa::ToSchema)]
pub struct PayoutReceipt {
    pub id: Uuid,
    pub from_wallet_id: Uuid,
    pub amount_minor: i64,
    pub currency: String,
    pub destination: String,
    /// Always `pending` here; `GET /api/v1/payouts/{id}` shows where it is now.
    pub state: String,
    pub created_at: DateTime<Utc>,
    /// The wallet's available balance right after the hold.
    pub available_balance_minor_after: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payout_reads_and_every_wrong_field_is_named() {
        let good = r#"{"from_wallet_id":"0190f0a0-0000-7000-8000-000000000001","amount_minor":500,
            "destination":"acct-42"}"#;
        let payout = PayoutRequest::parse(good.as_bytes(), 1_000).expect("valid");
        assert_eq!(payout.amount.get(), 500);
        let reordered = r#"{"destination":"acct-42","amount_minor":500,
            "from_wallet_id":"0190f0a0-0000-7000-8000-000000000001"}"#;
        let same = PayoutRequest::parse(reordered.as_bytes(), 1_000).expect("valid");
        assert_eq!(
            pipeline::fingerprint_of(&payout.canonical_json()),
            pipeline::fingerprint_of(&same.canonical_json())
        );

        let bad = r#"{"from_wallet_id":"{0190f0a0-0000-7000-8000-000000000001}","amount_minor":1001,
            "destination":"acct 42","extra":1}"#;
        let problem = PayoutRequest::parse(bad.as_bytes(), 1_000).expect_err("invalid");
        let pointers: Vec<_> = problem
            .errors
            .iter()
            .flat_map(|errors| errors.iter())
            .map(|error| error.pointer.as_str())
            .collect();
        assert_eq!(
            pointers,
            ["#/extra", "#/from_wallet_id", "#/amount_minor", "#/destination"]
        );
    }

    #[test]
    fn destinations_are_plain_and_bounded() {
        assert!(is_destination("closed-1"));
        assert!(is_destination(&"a".repeat(DESTINATION_CHARS_MAX)));
        for bad in ["", "a b", "ü", "a/b", &"a".repeat(DESTINATION_CHARS_MAX + 1)] {
            assert!(!is_destination(bad), "{bad:?}");
        }
    }
}
