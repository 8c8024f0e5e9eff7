//! What a run did to money, as the page says it: the headline (red with ✗
//! when money was harmed, with each harm's amount and who bore it; green
//! with ✓ otherwise), what moved and what should have, the balances beside
//! their ledgers, and the checks that held.
//!
//! The rule for colour and marks is `Damage::any`, counted against the
//! database; whether the run behaved as its switches predict is a separate
//! line (`Judgement::sentence`) with no mark of its own.

use serde::{Deserialize, Serialize};

use crate::race_lab::judgement::Harm;
use crate::race_lab::presets::Preset;
use crate::race_lab::run::Run;
use crate::race_lab::{LAB_CURRENCY, LabState};
use crate::web::money;

/// One harm as kept with the run: its sentence, and its amount. Results
/// kept before amounts were kept have sentences only.
#[derive(Serialize, Deserialize)]
#[serde(from = "KeptHarm")]
pub(super) struct HarmLine {
    pub(super) text: String,
    pub(super) minor: Option<i64>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum KeptHarm {
    Counted { text: String, minor: Option<i64> },
    Said(String),
}

impl From<KeptHarm> for HarmLine {
    fn from(kept: KeptHarm) -> Self {
        match kept {
            KeptHarm::Counted { text, minor } => Self { text, minor },
            KeptHarm::Said(text) => Self { text, minor: None },
        }
    }
}

impl From<Harm> for HarmLine {
    fn from(harm: Harm) -> Self {
        Self {
            text: harm.sentence,
            minor: Some(harm.minor),
        }
    }
}

#[derive(Serialize, Deserialize)]
pub(super) struct Check {
    pub(super) label: String,
    pub(super) held: bool,
}

/// Lab money, in words.
pub(super) fn lab_money(minor: i64) -> String {
    money::format(minor, LAB_CURRENCY)
}

/// The headline and its class: what harmed money and by how much, or that
/// nothing did and what moved instead.
pub(super) fn headline(run: &Run, harms: &[Harm]) -> (String, &'static str) {
    if harms.is_empty() {
        return (format!("✓ No money was harmed: {}.", unharmed(run)), "unharmed");
    }
    let said: Vec<&str> = harms.iter().map(|harm| harm.sentence.as_str()).collect();
    (format!("✗ Money was harmed. {}.", said.join(". ")), "harmed")
}

/// What moved in a run that harmed no money, in a clause.
fn unharmed(run: &Run) -> String {
    let state = &run.state;
    let moved = lab_money(state.moved_minor);
    match run.request.preset {
        _ if state.transfers == 0 && !run.request.preset.is_payout() => "nothing moved".to_owned(),
        Preset::SameKey | Preset::DoubleClick | Preset::RetryAfterWindow => {
            format!("one transfer of {moved} moved, once, and every balance matches its ledger")
        }
        Preset::Overdraw => {
            format!("{moved} left wallet A, no more than it held, and every balance matches its ledger")
        }
        Preset::Crossing => format!("{}, and every cent is accounted for", both_ways(state)),
        Preset::WebhookStorm | Preset::Redelivery => format!("the event credited {moved} to wallet A, once"),
        Preset::LostAnswer => format!(
            "{} left wallet A and the bank sent {}; {}",
            lab_money(state.payouts_debited_minor),
            lab_money(state.bank_sent_minor),
            settled_in_words(state)
        ),
    }
}

/// How many payouts settled, and what is still held, in a clause.
fn settled_in_words(state: &LabState) -> String {
    let settled = match state.payouts_settled {
        1 => "1 payout settled, sent once".to_owned(),
        n => format!("{n} payouts settled, each sent once"),
    };
    match state.held_minor {
        0 => settled,
        held => format!("{settled}, and {} is still held for the rest", lab_money(held)),
    }
}

/// What moved each way between the lab wallets, directions named.
fn both_ways(state: &LabState) -> String {
    format!(
        "A→B {} and B→A {}",
        lab_money(state.moved_a_to_b_minor),
        lab_money(state.moved_b_to_a_minor)
    )
}

/// The money line's figure: what moved between the lab wallets (each way,
/// for the preset that moves both ways), or for a payout run what left
/// wallet A and what the bank sent.
pub(super) fn money_moved(preset: Preset, state: &LabState) -> String {
    match preset {
        Preset::LostAnswer => format!(
            "{} and {}",
            lab_money(state.payouts_debited_minor),
            lab_money(state.bank_sent_minor)
        ),
        Preset::Crossing => both_ways(state),
        _ => lab_money(state.moved_minor),
    }
}

/// A wallet's balance, and beside it what its ledger says when the two
/// disagree.
pub(super) fn balance_beside_ledger(balance_minor: i64, ledger_minor: i64) -> String {
    if balance_minor == ledger_minor {
        lab_money(balance_minor)
    } else {
        format!(
            "{} (but its opening balance plus its ledger is {})",
            lab_money(balance_minor),
            lab_money(ledger_minor)
        )
    }
}

/// The checks that held, each with ✓, and those that broke and that no
/// harm's sentence already says, each in words that say what broke.
pub(super) fn checks(preset: Preset, state: &LabState) -> Vec<Check> {
    let mut invariants = state.invariants().to_vec();
    if preset.is_payout() {
        invariants.extend(state.payout_accounts());
        invariants.extend(state.bank_checks());
    }
    invariants
        .into_iter()
        .filter_map(|invariant| match (invariant.holds, invariant.broken) {
            (true, _) => Some(Check {
                label: invariant.held.to_owned(),
                held: true,
            }),
            (false, Some(broken)) => Some(Check {
                label: broken.to_owned(),
                held: false,
            }),
            (false, None) => None,
        })
        .collect()
}

/// What the lab's bank sent, and where the payouts' money is now.
pub(super) fn bank_note(state: &LabState) -> String {
    let times = match state.bank_sendings {
        1 => "once".to_owned(),
        count => format!("{count} times"),
    };
    let held = if state.held_minor == 0 {
        "nothing is held any more".to_owned()
    } else {
        format!("{} is still held for the rest", lab_money(state.held_minor))
    };
    format!(
        "The lab bank's own ledger shows money sent {times}. {} payout{} settled, and {held}.",
        state.payouts_settled,
        if state.payouts_settled == 1 { "" } else { "s" },
    )
}

/// What should have moved, in words, and whether the database agrees.
pub(super) fn expected_money(run: &Run) -> (String, bool) {
    let amount = run.plan.amount_minor;
    let moved = run.state.moved_minor;
    match run.request.preset {
        Preset::SameKey | Preset::DoubleClick | Preset::RetryAfterWindow => {
            (format!("{} (one transfer)", lab_money(amount)), moved == amount)
        }
        Preset::Overdraw => {
            let coverable = run.balance_minor / amount * amount;
            (
                format!("at most {} (what the balance covers)", lab_money(coverable)),
                moved <= coverable,
            )
        }
        Preset::Crossing => (
            "any amount each way, with every cent accounted for".to_owned(),
            run.state.invariants_hold(),
        ),
        Preset::WebhookStorm | Preset::Redelivery => {
            (format!("{} (one credit)", lab_money(amount)), moved == amount)
        }
        Preset::LostAnswer => {
            let orders = i64::try_from(run.funnel.sent).unwrap_or(i64::MAX);
            let each_once = lab_money(orders * amount);
            (
                format!("{each_once} and {each_once} ({orders} payouts, each debited once and sent once)"),
                run.state.payouts_debited_minor == orders * amount
                    && run.state.bank_sent_minor == orders * amount,
            )
        }
    }
}
