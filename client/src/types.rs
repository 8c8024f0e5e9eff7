//! The API's bodies, as the client reads and sends them. A test holds each
//! to the schema the server serves (`tests/contract.rs`), so the two
//! cannot drift apart.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// `POST /api/v1/users`: the new account, its wallet and a first token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedUp {
    pub user_id: Uuid,
    pub wallet_id: Uuid,
    pub token: String,
    pub balance_minor: i64,
}

/// `POST /api/v1/tokens`: a bearer token and when it expires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedIn {
    pub token: String,
    pub expires_at: DateTime<Utc>,
}

/// `GET /api/v1/wallets/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wallet {
    pub id: Uuid,
    /// The available balance: what the wallet can spend.
    pub balance_minor: i64,
    /// Set aside for payouts on their way to the bank.
    pub held_minor: i64,
    /// The available balance plus what is held.
    pub posted_balance_minor: i64,
    pub currency: String,
}

/// What to pay: the body of `POST /api/v1/transfers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferOrder {
    pub from_wallet_id: Uuid,
    pub to_wallet_id: Uuid,
    /// Minor units (cents); positive.
    pub amount_minor: i64,
}

/// A transfer that was made: `201` to `POST /api/v1/transfers`, and its
/// replays, byte for byte.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferReceipt {
    pub id: Uuid,
    pub from_wallet_id: Uuid,
    pub to_wallet_id: Uuid,
    pub amount_minor: i64,
    pub created_at: DateTime<Utc>,
    pub balance_minor_after: i64,
}

/// A payment that is known to have been made exactly once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paid {
    pub receipt: TransferReceipt,
    /// The answer was the stored one (`Idempotent-Replayed: true`): an
    /// earlier attempt made the transfer, and this is its receipt.
    pub replayed: bool,
    /// Requests sent, the last included.
    pub attempts: u32,
}

/// What to pay out: the body of `POST /api/v1/payouts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayoutOrder {
    pub from_wallet_id: Uuid,
    /// Minor units (cents); positive.
    pub amount_minor: i64,
    /// The bank account's reference at the gateway.
    pub destination: String,
}

/// A payout the service accepted: `202` to `POST /api/v1/payouts`, and its
/// replays, byte for byte. The money is held; the bank is asked later.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayoutReceipt {
    pub id: Uuid,
    pub from_wallet_id: Uuid,
    pub amount_minor: i64,
    pub currency: String,
    pub destination: String,
    /// `pending` when accepted.
    pub state: String,
    pub created_at: DateTime<Utc>,
    pub available_balance_minor_after: i64,
}

/// A payout accepted exactly once, however many attempts it took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayoutAccepted {
    pub receipt: PayoutReceipt,
    pub replayed: bool,
    pub attempts: u32,
}

/// `GET /api/v1/payouts/{id}`: where a payout stands now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payout {
    pub id: Uuid,
    pub from_wallet_id: Uuid,
    pub amount_minor: i64,
    pub currency: String,
    pub destination: String,
    /// `pending`, `sent`, `settled`, `failed` or `needs_attention`.
    pub state: String,
    pub attempts: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_reference: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// One transfer in `GET /api/v1/transfers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferItem {
    pub id: Uuid,
    pub from_wallet_id: Uuid,
    pub to_wallet_id: Uuid,
    pub amount_minor: i64,
    pub created_at: DateTime<Utc>,
    /// `sent` or `received`, from the caller's point of view.
    pub direction: String,
}

/// A page of `GET /api/v1/transfers`, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferPage {
    pub items: Vec<TransferItem>,
    /// Pass as `before` for the next page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_before: Option<Uuid>,
}

/// Which of a user's decision streams: their transfers, or the requests
/// their race-lab runs sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecisionSource {
    #[default]
    Real,
    Lab,
}

impl DecisionSource {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DecisionSource::Real => "real",
            DecisionSource::Lab => "lab",
        }
    }
}

/// One decision in `GET /api/v1/decisions`: which layer decided a request,
/// and how. Layers and outcomes are kept as the server names them
/// (`row_guard`, `accepted`), so that a new one reads as itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// The entry's position: pass it as `after` to read what came next.
    pub id: String,
    pub time: DateTime<Utc>,
    pub instance_id: String,
    pub request_id: String,
    pub trace_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<Uuid>,
    pub layer: String,
    pub outcome: String,
    pub status: u16,
    pub latency_ms: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount_minor: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_wallet_id: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem_type: Option<String>,
    #[serde(default)]
    pub lab: bool,
    /// How the money moved: `transfer` (sent as absent), `deposit`,
    /// `command` or `payout`.
    #[serde(default = "transfer_entry_point")]
    pub entry_point: String,
}

fn transfer_entry_point() -> String {
    "transfer".to_owned()
}

/// A page of `GET /api/v1/decisions`, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionPage {
    pub items: Vec<Decision>,
    /// Pass as `after` to continue; absent when the page is empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_id: Option<String>,
}
