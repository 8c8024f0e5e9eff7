//! The race lab: a visitor fires N transfers at once through the real
//! public endpoint and watches which defense decides each one.
//!
//! - **Lab wallets** (`migrations/20261202000008_race_lab.sql`): two per
//!   visitor, A and B, holding lab money (the currency `LAB`), and a third
//!   that holds what the visitor's lab payouts hold; emptied and refilled
//!   at the start of each run. The currency guard keeps lab money and real
//!   money apart on every path that moves money.
//! - **Switches** (`switches`): per run, a layer can be switched off or made
//!   naive, for lab wallets only.
//! - **Presets** (`presets`): the shapes of burst that reach each layer, each
//!   with what it should show, checked after the run against the database.
//! - **The burst** (`burst`): N requests over N connections opened first,
//!   released together, the last byte of each written at once.
//! - **Deliveries** (`deliveries`) and **payouts** (`payouts`): money that
//!   arrives, through the deposit pipeline, and money that leaves, through
//!   the payout saga to the lab's own bank.
//! - **Comparisons** (`compare`): one preset fired at each alternative of a
//!   layer in turn, to read them side by side.

pub mod bank;
pub mod burst;
pub mod compare;
pub mod deliveries;
pub mod judgement;
pub mod payouts;
pub mod presets;
pub mod run;
pub mod switches;
pub mod transfer_path;

use uuid::Uuid;

use crate::domain::{TransferRequest, UserId};

pub use switches::Switches;

pub use crate::domain::LAB_CURRENCY;

/// A visitor's two lab wallets.
#[derive(Debug, Clone, Copy)]
pub struct LabWallets {
    pub a: Uuid,
    pub b: Uuid,
}

/// Makes the visitor's lab wallets on first use and empties them for a new
/// run: both start again at `balance_minor`.
pub async fn reset(db: &sqlx::PgPool, user: UserId, balance_minor: i64) -> Result<LabWallets, sqlx::Error> {
    let (a, b): (Uuid, Uuid) = sqlx::query_as("SELECT wallet_a, wallet_b FROM race_lab_reset($1, $2)")
        .bind(user.0)
        .bind(balance_minor)
        .fetch_one(db)
        .await?;
    Ok(LabWallets { a, b })
}

/// What a run did to the lab wallets, read from the database after it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct LabState {
    pub wallet_a_balance_minor: i64,
    pub wallet_b_balance_minor: i64,
    /// The sum of the transfers recorded between the lab wallets.
    pub moved_minor: i64,
    pub transfers: i64,
    /// Balances minus opening balances: zero when no money was created.
    pub money_created_minor: i64,
    pub negative_balances: i64,
    /// Wallets whose balance their ledger does not explain (lost updates).
    pub unexplained_balances: i64,
    pub unbalanced_transfers: i64,
    /// What the visitor's lab payouts hold now.
    pub held_minor: i64,
    pub payouts_settled: i64,
    /// What lab payouts took from A and kept: held or settled.
    pub payouts_debited_minor: i64,
    /// Money sent by the lab's bank, each time, and in all.
    pub bank_sendings: i64,
    pub bank_sent_minor: i64,
    /// Payouts the bank sent money for more than once, and what it sent
    /// beyond once each.
    pub orders_paid_twice: i64,
    pub sent_twice_minor: i64,
    /// What the bank sent for payouts whose transaction rolled back.
    pub sent_without_a_debit_minor: i64,
    /// Settled payouts the bank did not send exactly once.
    pub settled_not_sent_once: i64,
    pub unbalanced_payouts: i64,
    pub unexplained_payout_accounts: i64,
}

impl LabState {
    pub async fn read(db: &sqlx::PgPool, user: UserId) -> Result<Self, sqlx::Error> {
        sqlx::query_as("SELECT * FROM race_lab_state($1)")
            .bind(user.0)
            .fetch_one(db)
            .await
    }

    /// Each money invariant, in words, and whether it held.
    pub fn invariants(&self) -> [(&'static str, bool); 4] {
        [
            ("No money was created or destroyed", self.money_created_minor == 0),
            ("No balance is negative", self.negative_balances == 0),
            (
                "Each balance matches its ledger (no lost update)",
                self.unexplained_balances == 0,
            ),
            (
                "Each transfer is two ledger entries that sum to zero",
                self.unbalanced_transfers == 0,
            ),
        ]
    }

    pub fn invariants_hold(&self) -> bool {
        self.invariants().iter().all(|(_, held)| *held)
            && self.payout_accounts().iter().all(|(_, held)| *held)
    }

    /// The payouts' own double entry, in words, and whether it held.
    pub fn payout_accounts(&self) -> [(&'static str, bool); 2] {
        [
            (
                "Each payout's transfers match its state: a hold, then a settlement or a release",
                self.unbalanced_payouts == 0,
            ),
            (
                "The holds wallet holds exactly what the payouts still hold",
                self.unexplained_payout_accounts == 0,
            ),
        ]
    }

    /// What the lab's bank's ledger says about each payout, in words, and
    /// whether it held.
    pub fn bank_checks(&self) -> [(&'static str, bool); 3] {
        [
            (
                "Every settled payout was sent by the bank exactly once",
                self.settled_not_sent_once == 0,
            ),
            ("No payout was sent twice", self.orders_paid_twice == 0),
            (
                "No money left without a debit",
                self.sent_without_a_debit_minor == 0,
            ),
        ]
    }
}

/// Whether both wallets of a transfer are the caller's own two lab
/// wallets: asked before any layer of a request that carries race-lab
/// switches. Another visitor's lab wallet is refused like a real one, so
/// one visitor's run can never reach into another's sandbox.
pub async fn both_are_own_lab_wallets(
    db: &sqlx::PgPool,
    caller: UserId,
    request: &TransferRequest,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT count(*) = 2 FROM wallets WHERE id IN ($1, $2) AND lab_slot IN (1, 2) AND user_id = $3",
    )
    .bind(request.from.0)
    .bind(request.to.0)
    .bind(caller.0)
    .fetch_one(db)
    .await
}
