//! The harm a run did to money, counted against the database, and each
//! harm in a sentence that names its amount and who bore it.
//!
//! One rule decides what counts: money charged twice, a wallet that sent
//! more than it held, money created or destroyed, a balance its ledger no
//! longer explains, and a payout the bank sent twice or sent without its
//! debit. A run with any of these harmed money, whatever its switches
//! predicted; the page's colour and marks follow this, and only this.

use crate::race_lab::LabState;
use crate::race_lab::presets::Preset;

/// The damage a run did to the lab wallets, from the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Damage {
    /// Transfers beyond the one a retried or double-clicked transfer should
    /// make: duplicate charges (for deliveries, duplicate credits).
    pub duplicate_charges: i64,
    /// What those duplicates moved beyond the one transfer: the overcharge,
    /// not the total.
    pub overcharged_minor: i64,
    /// Balances minus opening balances: money made out of nothing.
    pub money_created_minor: i64,
    /// What left wallet A, and wallet B, beyond what it held, by its
    /// ledger.
    pub overdrawn_minor: [i64; 2],
    /// Wallet A's and B's balance, and what its ledger says it holds: they
    /// differ after a lost update.
    pub balance_and_ledger: [(i64, i64); 2],
    /// Payouts the lab's bank sent more than once, and what it sent beyond
    /// once each.
    pub payouts_paid_twice: i64,
    pub sent_twice_minor: i64,
    /// What the lab's bank sent for payouts whose debit rolled back.
    pub sent_without_a_debit_minor: i64,
}

/// One harm: its sentence, and its amount in lab minor units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Harm {
    pub sentence: String,
    pub minor: i64,
}

/// The lab wallets' names, in the order of `Damage`'s pairs.
const WALLETS: [&str; 2] = ["A", "B"];

impl Damage {
    /// The damage of a run of `preset` whose requests each moved
    /// `amount_minor`.
    pub fn of(preset: Preset, state: &LabState, amount_minor: i64) -> Self {
        let once_only = matches!(
            preset,
            Preset::SameKey
                | Preset::DoubleClick
                | Preset::RetryAfterWindow
                | Preset::WebhookStorm
                | Preset::Redelivery
        );
        let duplicate_charges = if once_only {
            (state.transfers - 1).max(0)
        } else {
            0
        };
        Self {
            duplicate_charges,
            overcharged_minor: if duplicate_charges > 0 {
                (state.moved_minor - amount_minor).max(0)
            } else {
                0
            },
            money_created_minor: state.money_created_minor,
            overdrawn_minor: [
                (-state.wallet_a_ledger_minor).max(0),
                (-state.wallet_b_ledger_minor).max(0),
            ],
            balance_and_ledger: [
                (state.wallet_a_balance_minor, state.wallet_a_ledger_minor),
                (state.wallet_b_balance_minor, state.wallet_b_ledger_minor),
            ],
            payouts_paid_twice: state.orders_paid_twice,
            sent_twice_minor: state.sent_twice_minor,
            sent_without_a_debit_minor: state.sent_without_a_debit_minor,
        }
    }

    /// Balances their ledger no longer explains: lost updates.
    pub fn lost_updates(&self) -> usize {
        self.balance_and_ledger
            .iter()
            .filter(|(balance, ledger)| balance != ledger)
            .count()
    }

    /// Whether money was harmed at all.
    pub fn any(&self) -> bool {
        self.duplicate_charges > 0
            || self.money_created_minor != 0
            || self.overdrawn_minor.iter().any(|minor| *minor > 0)
            || self.lost_updates() > 0
            || self.payouts_paid_twice > 0
            || self.sent_twice_minor > 0
            || self.sent_without_a_debit_minor > 0
    }

    /// Each harm in a sentence, with lab money formatted by `money`.
    pub fn harms(&self, preset: Preset, one_key: bool, money: impl Fn(i64) -> String) -> Vec<Harm> {
        let mut harms = Vec::new();
        let mut say = |sentence: String, minor: i64| harms.push(Harm { sentence, minor });
        if self.duplicate_charges > 0 {
            let times = self.duplicate_charges + 1;
            let duplicates = plural(self.duplicate_charges, "duplicate");
            let overcharge = money(self.overcharged_minor);
            let sentence = match (preset.is_delivery(), one_key) {
                (true, _) => format!(
                    "One event was credited {times} times: wallet A got {overcharge} too much ({duplicates}), \
                     taken from B, the provider's account"
                ),
                (false, true) => {
                    format!(
                        "One key was charged {times} times: wallet A paid {overcharge} too much ({duplicates})"
                    )
                }
                (false, false) => format!(
                    "One transfer was charged {times} times: wallet A paid {overcharge} too much ({duplicates})"
                ),
            };
            say(sentence, self.overcharged_minor);
        }
        for (name, overdrawn) in WALLETS.iter().zip(self.overdrawn_minor) {
            if overdrawn > 0 {
                say(
                    format!(
                        "Wallet {name} sent {} more than it held: an overdraft",
                        money(overdrawn)
                    ),
                    overdrawn,
                );
            }
        }
        if self.money_created_minor > 0 {
            say(
                format!(
                    "{} was created from nothing in wallets A and B",
                    money(self.money_created_minor)
                ),
                self.money_created_minor,
            );
        } else if self.money_created_minor < 0 {
            say(
                format!(
                    "{} vanished from wallets A and B",
                    money(-self.money_created_minor)
                ),
                -self.money_created_minor,
            );
        }
        for (name, (balance, ledger)) in WALLETS.iter().zip(self.balance_and_ledger) {
            if balance != ledger {
                say(
                    format!(
                        "Wallet {name} shows {}, but its opening balance plus its ledger is {}: lost updates \
                         misstate it by {}",
                        money(balance),
                        money(ledger),
                        money((balance - ledger).abs())
                    ),
                    (balance - ledger).abs(),
                );
            }
        }
        harms.extend(self.payout_harms(&money));
        harms
    }
}

impl Damage {
    /// The harms of money that left through the bank.
    fn payout_harms(&self, money: &impl Fn(i64) -> String) -> Vec<Harm> {
        let mut harms = Vec::new();
        let mut say = |sentence: String, minor: i64| harms.push(Harm { sentence, minor });
        if self.payouts_paid_twice > 0 || self.sent_twice_minor > 0 {
            say(
                format!(
                    "The bank sent {} twice: {} left beyond once each, which wallet A was never charged for",
                    plural(self.payouts_paid_twice, "payout"),
                    money(self.sent_twice_minor)
                ),
                self.sent_twice_minor,
            );
        }
        if self.sent_without_a_debit_minor > 0 {
            say(
                format!(
                    "{} left through the bank for payouts that do not exist: their debit was rolled back, so wallet \
                     A was never charged for it",
                    money(self.sent_without_a_debit_minor)
                ),
                self.sent_without_a_debit_minor,
            );
        }
        harms
    }
}

/// `count` of `noun`, in words: "1 payout", "3 payouts".
fn plural(count: i64, noun: &str) -> String {
    format!("{count} {noun}{}", if count == 1 { "" } else { "s" })
}
