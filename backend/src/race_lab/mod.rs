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
    /// What each of A and B should hold by its ledger: its opening balance
    /// plus its ledger entries. A balance that a lost update left behind
    /// disagrees with it, and an overdraft shows here below zero even when
    /// the balance column does not.
    #[sqlx(default)]
    pub wallet_a_ledger_minor: i64,
    #[sqlx(default)]
    pub wallet_b_ledger_minor: i64,
    /// What moved between the lab wallets, each way.
    #[sqlx(default)]
    pub moved_a_to_b_minor: i64,
    #[sqlx(default)]
    pub moved_b_to_a_minor: i64,
}

impl LabState {
    pub async fn read(db: &sqlx::PgPool, user: UserId) -> Result<Self, sqlx::Error> {
        let mut state: Self = sqlx::query_as("SELECT * FROM race_lab_state($1)")
            .bind(user.0)
            .fetch_one(db)
            .await?;
        (
            state.wallet_a_ledger_minor,
            state.wallet_b_ledger_minor,
            state.moved_a_to_b_minor,
            state.moved_b_to_a_minor,
        ) = sqlx::query_as(
            "WITH lab AS (
                 SELECT (array_agg(id) FILTER (WHERE lab_slot = 1))[1] AS a,
                        (array_agg(id) FILTER (WHERE lab_slot = 2))[1] AS b
                   FROM wallets WHERE user_id = $1 AND lab_slot IN (1, 2)
             ),
             by_ledger AS (
                 SELECT w.id, w.opening_balance_minor
                        + coalesce((SELECT sum(l.amount_minor) FROM ledger_entries l WHERE l.wallet_id = w.id), 0)
                        AS minor
                   FROM wallets w, lab WHERE w.id IN (lab.a, lab.b)
             )
             SELECT coalesce((SELECT minor FROM by_ledger, lab WHERE id = lab.a), 0)::bigint,
                    coalesce((SELECT minor FROM by_ledger, lab WHERE id = lab.b), 0)::bigint,
                    (SELECT coalesce(sum(t.amount_minor), 0) FROM transfers t, lab
                      WHERE t.from_wallet_id = lab.a AND t.to_wallet_id = lab.b)::bigint,
                    (SELECT coalesce(sum(t.amount_minor), 0) FROM transfers t, lab
                      WHERE t.from_wallet_id = lab.b AND t.to_wallet_id = lab.a)::bigint",
        )
        .bind(user.0)
        .fetch_one(db)
        .await?;
        Ok(state)
    }

    /// What left wallets A and B beyond what they held, by their ledgers.
    pub fn overdrawn_minor(&self) -> i64 {
        (-self.wallet_a_ledger_minor).max(0) + (-self.wallet_b_ledger_minor).max(0)
    }

    /// How far the balances stray from their ledgers, in all: what lost
    /// updates misstated.
    pub fn misstated_minor(&self) -> i64 {
        (self.wallet_a_balance_minor - self.wallet_a_ledger_minor).abs()
            + (self.wallet_b_balance_minor - self.wallet_b_ledger_minor).abs()
    }

    /// Each money invariant, and whether it held.
    pub fn invariants(&self) -> [Invariant; 4] {
        [
            Invariant {
                held: "No money was created or destroyed",
                broken: None,
                holds: self.money_created_minor == 0,
            },
            Invariant {
                held: "No wallet is below zero, by its balance or by its ledger",
                broken: None,
                holds: self.negative_balances == 0 && self.overdrawn_minor() == 0,
            },
            Invariant {
                held: "Each balance matches its ledger (no lost update)",
                broken: None,
                holds: self.unexplained_balances == 0,
            },
            Invariant {
                held: "Each transfer is two ledger entries that sum to zero",
                broken: Some("Some transfers are not two ledger entries that sum to zero"),
                holds: self.unbalanced_transfers == 0,
            },
        ]
    }

    pub fn invariants_hold(&self) -> bool {
        self.invariants().iter().all(|invariant| invariant.holds)
            && self.payout_accounts().iter().all(|invariant| invariant.holds)
    }

    /// The payouts' own double entry, and whether it held.
    pub fn payout_accounts(&self) -> [Invariant; 2] {
        [
            Invariant {
                held: "Each payout's transfers match its state: a hold, then a settlement or a release",
                broken: Some("Some payouts' transfers do not match their state"),
                holds: self.unbalanced_payouts == 0,
            },
            Invariant {
                held: "The holds wallet holds exactly what the payouts still hold",
                broken: Some("The holds wallet does not hold what the payouts still hold"),
                holds: self.unexplained_payout_accounts == 0,
            },
        ]
    }

    /// What the lab's bank's ledger says about each payout, and whether it
    /// held. With no payout settled there is nothing to check a settlement
    /// against, and the first check is left out rather than ticked.
    pub fn bank_checks(&self) -> Vec<Invariant> {
        let mut checks = Vec::new();
        if self.payouts_settled > 0 {
            checks.push(Invariant {
                held: "Every settled payout was sent by the bank exactly once",
                broken: Some("Some settled payouts were not sent by the bank exactly once"),
                holds: self.settled_not_sent_once == 0,
            });
        }
        checks.push(Invariant {
            held: "No payout was sent twice",
            broken: None,
            holds: self.orders_paid_twice == 0,
        });
        checks.push(Invariant {
            held: "No money left without a debit",
            broken: None,
            holds: self.sent_without_a_debit_minor == 0,
        });
        checks
    }
}

/// One money invariant: the sentence that says it held, the one that says
/// it broke (`None` when the damage's own sentence already says so, with
/// its amount), and whether it held.
#[derive(Debug, Clone, Copy)]
pub struct Invariant {
    pub held: &'static str,
    pub broken: Option<&'static str>,
    pub holds: bool,
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
