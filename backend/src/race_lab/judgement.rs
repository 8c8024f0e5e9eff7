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
mod tests {
    use super::*;
    use crate::race_lab::presets::Funnel;

    fn funnel(sent: usize, cooldown: usize, moved: usize) -> Funnel {
        Funnel {
            sent,
            cooldown,
            moved,
            ..Funnel::default()
        }
    }

    fn switches(cooldown: bool, key_naive: bool, guard_naive: bool) -> Switches {
        Switches {
            cooldown,
            idempotency: if key_naive {
                IdempotencyMode::CheckThenInsert
            } else {
                IdempotencyMode::Atomic
            },
            row_guard: if guard_naive {
                RowGuardMode::ReadDecideWrite
            } else {
                RowGuardMode::Guarded
            },
            run: None,
            ..Switches::ALL_ON
        }
    }

    const DOUBLE_CHARGE: Damage = Damage {
        duplicate_charges: 19,
        money_created_minor: 0,
        overdrawn_minor: 0,
        lost_updates: 0,
        payouts_paid_twice: 0,
        sent_twice_minor: 0,
        sent_without_a_debit_minor: 0,
    };

    #[test]
    fn with_every_layer_on_the_protection_is_expected() {
        let all_on = switches(true, false, false);
        let judged = Judgement::of(
            Preset::Overdraw,
            &all_on,
            KeyStrategy::NewPerRequest,
            &funnel(100, 99, 1),
            true,
            &Damage::default(),
        );
        assert_eq!(judged, Judgement::Protected);
        let judged = Judgement::of(
            Preset::SameKey,
            &all_on,
            KeyStrategy::Same,
            &funnel(20, 0, 2),
            false,
            &DOUBLE_CHARGE,
        );
        assert_eq!(judged, Judgement::NotProtected);
    }

    #[test]
    fn with_the_defending_layers_weakened_the_damage_is_expected() {
        let naive_key = switches(false, true, false);
        let judged = Judgement::of(
            Preset::SameKey,
            &naive_key,
            KeyStrategy::Same,
            &funnel(20, 0, 20),
            false,
            &DOUBLE_CHARGE,
        );
        assert_eq!((judged, judged.mark()), (Judgement::DamageAsExpected, "✓"));
        let no_key = switches(false, false, false);
        let judged = Judgement::of(
            Preset::DoubleClick,
            &no_key,
            KeyStrategy::None,
            &funnel(20, 0, 1),
            false,
            &Damage::default(),
        );
        assert_eq!((judged, judged.mark()), (Judgement::NoDamageThisTime, "ℹ"));
    }

    #[test]
    fn a_naive_layer_the_cooldown_kept_out_of_reach_is_hidden_not_held() {
        let naive_key = switches(true, true, false);
        let judged = Judgement::of(
            Preset::SameKey,
            &naive_key,
            KeyStrategy::Same,
            &funnel(20, 19, 1),
            true,
            &Damage::default(),
        );
        assert_eq!((judged, judged.mark()), (Judgement::HiddenByCooldown, "ℹ"));
        let naive_guard = switches(true, false, true);
        let judged = Judgement::of(
            Preset::Overdraw,
            &naive_guard,
            KeyStrategy::NewPerRequest,
            &funnel(100, 99, 1),
            true,
            &Damage::default(),
        );
        assert_eq!(judged, Judgement::HiddenByCooldown);
    }

    #[test]
    fn a_payout_run_is_defended_only_by_the_outbox_one_key_and_a_deduplicating_bank() {
        let paid_twice = Damage {
            payouts_paid_twice: 20,
            sent_twice_minor: 5_000,
            ..Damage::default()
        };
        let judged = |switches: Switches, kept: bool, damage: &Damage| {
            Judgement::of(
                Preset::LostAnswer,
                &switches,
                KeyStrategy::NewPerRequest,
                &funnel(20, 0, 20),
                kept,
                damage,
            )
        };
        assert_eq!(
            judged(Switches::ALL_ON, true, &Damage::default()),
            Judgement::Protected
        );
        assert_eq!(
            judged(Switches::ALL_ON, false, &paid_twice),
            Judgement::NotProtected
        );
        for weakened in [
            Switches {
                bank_deduplicates: false,
                ..Switches::ALL_ON
            },
            Switches {
                payout_mode: PayoutMode::NewKeyPerAttempt,
                ..Switches::ALL_ON
            },
        ] {
            assert_eq!(judged(weakened, false, &paid_twice), Judgement::DamageAsExpected);
        }
        let inside = Switches {
            payout_mode: PayoutMode::CallInTransaction,
            ..Switches::ALL_ON
        };
        let (cause, _) = cause(Preset::LostAnswer, &inside, KeyStrategy::NewPerRequest);
        assert_eq!(cause, "the bank called inside the transaction");
        let said = damage_sentences(
            &Damage {
                sent_without_a_debit_minor: 5_000,
                ..Damage::default()
            },
            Preset::LostAnswer,
            KeyStrategy::NewPerRequest,
            &Plan {
                waves: Vec::new(),
                pause: std::time::Duration::ZERO,
                amount_minor: 250,
            },
            |minor| format!("LAB {minor}"),
        );
        assert_eq!(
            said,
            vec![
                "LAB 5000 left through the bank for payouts whose debit was rolled back: money sent without a debit"
            ]
        );
    }

    #[test]
    fn the_damage_is_counted_in_sentences() {
        let plan = Plan {
            waves: Vec::new(),
            pause: std::time::Duration::ZERO,
            amount_minor: 500,
        };
        let said = damage_sentences(
            &DOUBLE_CHARGE,
            Preset::SameKey,
            KeyStrategy::Same,
            &plan,
            |minor| format!("LAB {minor}"),
        );
        assert_eq!(
            said,
            vec!["One key was charged 20 times (19 duplicates, LAB 10000 in all)"]
        );
        let created = Damage {
            money_created_minor: 18_600,
            lost_updates: 1,
            ..Damage::default()
        };
        let said = damage_sentences(
            &created,
            Preset::Overdraw,
            KeyStrategy::NewPerRequest,
            &plan,
            |minor| format!("LAB {minor}"),
        );
        assert_eq!(
            said,
            vec![
                "LAB 18600 of money was created".to_owned(),
                "1 balance no longer matches the ledger: updates were lost".to_owned()
            ]
        );
    }
}
