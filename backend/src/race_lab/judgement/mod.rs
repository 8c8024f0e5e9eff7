//! What a run should have shown, given its preset and its switches, and
//! whether it did: judged against the database, never against a fixed
//! promise. With every layer that could stop the preset's race at full
//! strength, the expected result is the protection; with all of them off or
//! naive, it is the damage, counted. A weakened layer that the cooldown kept
//! out of reach is said to be hidden, not to have held.

use super::LabState;
use super::presets::{Funnel, KeyStrategy, Plan, Preset};
use super::switches::Switches;
use crate::settings::{IdempotencyMode, PayoutMode, RowGuardMode};

/// The damage a run did to the lab wallets, from the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Damage {
    /// Transfers beyond the one a retried or double-clicked transfer should
    /// make: duplicate charges.
    pub duplicate_charges: i64,
    /// Balances minus opening balances: money made out of nothing.
    pub money_created_minor: i64,
    /// Moved out of wallet A beyond what it held (the overdraw preset).
    pub overdrawn_minor: i64,
    /// Balances their ledger no longer explains: lost updates.
    pub lost_updates: i64,
    /// Payouts the lab's bank sent more than once, and what it sent beyond
    /// once each.
    pub payouts_paid_twice: i64,
    pub sent_twice_minor: i64,
    /// What the lab's bank sent for payouts whose debit rolled back.
    pub sent_without_a_debit_minor: i64,
}

impl Damage {
    pub fn of(preset: Preset, state: &LabState, balance_minor: i64) -> Self {
        let duplicates_expected_once = matches!(
            preset,
            Preset::SameKey
                | Preset::DoubleClick
                | Preset::RetryAfterWindow
                | Preset::WebhookStorm
                | Preset::Redelivery
        );
        Self {
            duplicate_charges: if duplicates_expected_once {
                (state.transfers - 1).max(0)
            } else {
                0
            },
            money_created_minor: state.money_created_minor,
            overdrawn_minor: if preset == Preset::Overdraw {
                (state.moved_minor - balance_minor).max(0)
            } else {
                0
            },
            lost_updates: state.unexplained_balances,
            payouts_paid_twice: state.orders_paid_twice,
            sent_twice_minor: state.sent_twice_minor,
            sent_without_a_debit_minor: state.sent_without_a_debit_minor,
        }
    }

    pub fn any(&self) -> bool {
        *self != Damage::default()
    }
}

/// How a run ended, against what its switches predict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judgement {
    /// The layers that could stop this race were at full strength, and
    /// they held.
    Protected,
    /// They were at full strength and did not hold: a real failure.
    NotProtected,
    /// Every layer that could stop this race was off or naive, and the
    /// damage it exists to prevent happened.
    DamageAsExpected,
    /// A layer was made naive, but the cooldown stopped every copy before
    /// the naive layer was reached.
    HiddenByCooldown,
    /// Every layer that could stop this race was off or naive, yet the race
    /// did not hit this time.
    NoDamageThisTime,
}

/// Whether a layer that could stop this preset's race is at full strength.
fn defended(preset: Preset, switches: &Switches, keys: KeyStrategy) -> bool {
    // A claim under a lock, advisory or in Redis, holds the key too.
    let key_holds = keys == KeyStrategy::Same && switches.idempotency != IdempotencyMode::CheckThenInsert;
    match preset {
        Preset::SameKey | Preset::DoubleClick => switches.cooldown || key_holds,
        // The retries come after the window: only the key can catch them.
        Preset::RetryAfterWindow => key_holds,
        // Locking first, or an optimistic version, guards the balance too.
        Preset::Overdraw | Preset::Crossing => switches.row_guard != RowGuardMode::ReadDecideWrite,
        // For deliveries the first switch is the edge lock and the second
        // the inbox; the event id is the key, on every copy.
        Preset::WebhookStorm | Preset::Redelivery => {
            switches.cooldown || switches.idempotency != IdempotencyMode::CheckThenInsert
        }
        // The outbox, one key per payout and a bank that deduplicates by
        // it: each is needed, since the bank's lost answer is certain.
        Preset::LostAnswer => switches.payout_mode == PayoutMode::Outbox && switches.bank_deduplicates,
    }
}

impl Judgement {
    pub fn of(
        preset: Preset,
        switches: &Switches,
        keys: KeyStrategy,
        funnel: &Funnel,
        kept: bool,
        damage: &Damage,
    ) -> Self {
        // A delivery's third layer, the credit, has no naive variant; a
        // payout run's switches are its own, and the cooldown is not one.
        let weakened = !preset.is_payout()
            && (switches.idempotency == IdempotencyMode::CheckThenInsert
                || (switches.row_guard == RowGuardMode::ReadDecideWrite && !preset.is_delivery()));
        let cooldown_stopped_the_rest =
            switches.cooldown && funnel.cooldown > 0 && funnel.cooldown + 1 >= funnel.sent;
        if weakened && cooldown_stopped_the_rest && !damage.any() {
            Judgement::HiddenByCooldown
        } else if defended(preset, switches, keys) {
            if kept {
                Judgement::Protected
            } else {
                Judgement::NotProtected
            }
        } else if damage.any() {
            Judgement::DamageAsExpected
        } else {
            Judgement::NoDamageThisTime
        }
    }

    /// ✓ when the run showed what its switches predict, ✗ when a layer at
    /// full strength failed, ℹ when it showed neither.
    pub fn mark(self) -> &'static str {
        match self {
            Judgement::Protected | Judgement::DamageAsExpected => "✓",
            Judgement::NotProtected => "✗",
            Judgement::HiddenByCooldown | Judgement::NoDamageThisTime => "ℹ",
        }
    }

    /// The page's class for the headline.
    pub fn class(self) -> &'static str {
        match self {
            Judgement::Protected | Judgement::DamageAsExpected => "kept",
            Judgement::NotProtected => "broken",
            Judgement::HiddenByCooldown | Judgement::NoDamageThisTime => "hidden",
        }
    }
}

/// What the damage was, in sentences, with lab money formatted by `money`.
pub fn damage_sentences(
    damage: &Damage,
    preset: Preset,
    keys: KeyStrategy,
    plan: &Plan,
    money: impl Fn(i64) -> String,
) -> Vec<String> {
    let mut said = Vec::new();
    if damage.duplicate_charges > 0 {
        let (what, charged) = match keys {
            _ if preset.is_delivery() => ("One event", "credited"),
            KeyStrategy::Same => ("One key", "charged"),
            _ => ("One transfer", "charged"),
        };
        let times = damage.duplicate_charges + 1;
        said.push(format!(
            "{what} was {charged} {times} times ({} duplicates, {} in all)",
            damage.duplicate_charges,
            money(times * plan.amount_minor)
        ));
    }
    if damage.overdrawn_minor > 0 {
        said.push(format!(
            "{} more left wallet A than it held",
            money(damage.overdrawn_minor)
        ));
    }
    if damage.money_created_minor != 0 {
        let verb = if damage.money_created_minor > 0 {
            "created"
        } else {
            "destroyed"
        };
        said.push(format!(
            "{} of money was {verb}",
            money(damage.money_created_minor.abs())
        ));
    }
    if damage.payouts_paid_twice > 0 {
        said.push(format!(
            "The bank sent {} payout{} twice ({} sent beyond once each)",
            damage.payouts_paid_twice,
            if damage.payouts_paid_twice == 1 { "" } else { "s" },
            money(damage.sent_twice_minor)
        ));
    }
    if damage.sent_without_a_debit_minor > 0 {
        said.push(format!(
            "{} left through the bank for payouts whose debit was rolled back: money sent without a debit",
            money(damage.sent_without_a_debit_minor)
        ));
    }
    if damage.lost_updates > 0 {
        said.push(format!(
            "{} balance{} no longer match{} the ledger: updates were lost",
            damage.lost_updates,
            if damage.lost_updates == 1 { "" } else { "s" },
            if damage.lost_updates == 1 { "es" } else { "" },
        ));
    }
    said
}

/// Which switched layer a damage is the work of, and what that layer
/// exists to stop, for the headline.
pub fn cause(preset: Preset, switches: &Switches, keys: KeyStrategy) -> (String, &'static str) {
    let mut causes = Vec::new();
    match preset {
        Preset::SameKey | Preset::DoubleClick | Preset::RetryAfterWindow => {
            if !switches.cooldown && preset != Preset::RetryAfterWindow {
                causes.push("the cooldown off");
            }
            match keys {
                KeyStrategy::Same if switches.idempotency == IdempotencyMode::CheckThenInsert => {
                    causes.push("the naive key")
                }
                KeyStrategy::Same => {}
                KeyStrategy::NewPerRequest => causes.push("a new key for each copy"),
                KeyStrategy::None => causes.push("no key"),
            }
            (
                causes.join(" and "),
                "the idempotency key (and the cooldown before it)",
            )
        }
        Preset::Overdraw | Preset::Crossing => ("the naive row guard".to_owned(), "the row guard"),
        Preset::WebhookStorm | Preset::Redelivery => {
            if !switches.cooldown {
                causes.push("the edge lock off");
            }
            if switches.idempotency == IdempotencyMode::CheckThenInsert {
                causes.push("the naive inbox");
            }
            (causes.join(" and "), "the inbox (and the edge lock before it)")
        }
        Preset::LostAnswer => {
            match switches.payout_mode {
                PayoutMode::Outbox => {}
                PayoutMode::CallInTransaction => causes.push("the bank called inside the transaction"),
                PayoutMode::NewKeyPerAttempt => causes.push("a new key on each attempt"),
            }
            if !switches.bank_deduplicates {
                causes.push("a bank that does not deduplicate");
            }
            (
                causes.join(" and "),
                "the outbox, with one key per payout that the bank deduplicates by,",
            )
        }
    }
}

#[cfg(test)]
mod tests;
