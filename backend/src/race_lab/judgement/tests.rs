//! What a run is judged to have shown, for each shape of switches, and
//! its damage in sentences.

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
    overcharged_minor: 9_500,
    money_created_minor: 0,
    overdrawn_minor: [0, 0],
    balance_and_ledger: [(500, 500), (19_500, 19_500)],
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
    assert_eq!(judged, Judgement::DamageAsExpected);
    assert!(DOUBLE_CHARGE.any());
    let no_key = switches(false, false, false);
    let judged = Judgement::of(
        Preset::DoubleClick,
        &no_key,
        KeyStrategy::None,
        &funnel(20, 0, 1),
        false,
        &Damage::default(),
    );
    assert_eq!(judged, Judgement::NoDamageThisTime);
    assert!(!Damage::default().any());
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
    assert_eq!(judged, Judgement::HiddenByCooldown);
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
    let said = Damage {
        sent_without_a_debit_minor: 5_000,
        ..Damage::default()
    }
    .harms(Preset::LostAnswer, false, |minor| format!("LAB {minor}"));
    assert_eq!(
        said,
        vec![Harm {
            sentence:
                "LAB 5000 left through the bank for payouts that do not exist: their debit was rolled back, \
                       so wallet A was never charged for it"
                    .to_owned(),
            minor: 5_000,
        }]
    );
}

/// Each harm is its own amount, with who bore it: the overcharge, not the
/// total; a balance beside its ledger; an overdraft by the ledger.
#[test]
fn the_damage_is_counted_in_sentences() {
    let money = |minor: i64| format!("LAB {minor}");
    let said = DOUBLE_CHARGE.harms(Preset::SameKey, true, money);
    assert_eq!(
        said,
        vec![Harm {
            sentence: "One key was charged 20 times: wallet A paid LAB 9500 too much (19 duplicates)"
                .to_owned(),
            minor: 9_500,
        }]
    );
    let naive_guard = Damage {
        money_created_minor: 14_900,
        overdrawn_minor: [10_000, 0],
        balance_and_ledger: [(4_900, -10_000), (30_000, 30_000)],
        ..Damage::default()
    };
    let said: Vec<(String, i64)> = naive_guard
        .harms(Preset::Overdraw, false, money)
        .into_iter()
        .map(|harm| (harm.sentence, harm.minor))
        .collect();
    assert_eq!(
        said,
        vec![
            ("Wallet A sent LAB 10000 more than it held: an overdraft".to_owned(), 10_000),
            ("LAB 14900 was created from nothing in wallets A and B".to_owned(), 14_900),
            (
                "Wallet A shows LAB 4900, but its opening balance plus its ledger is LAB -10000: lost updates \
                 misstate it by LAB 14900"
                    .to_owned(),
                14_900
            ),
        ]
    );
    assert_eq!(naive_guard.lost_updates(), 1);
}
