//! One run's results as the page shows them: the verdict, the funnel, the
//! money checked against the database, a timeline of every answer
//! (`timeline`), and the answers grouped by how they ended (`answers`).

use serde::{Deserialize, Serialize};

use crate::race_lab::burst::Answer;
use crate::race_lab::judgement::{self, Judgement, damage_sentences};
use crate::race_lab::presets::{Preset, Stage};
use crate::race_lab::run::Run;
use crate::race_lab::{LAB_CURRENCY, LabState, Switches};
use crate::state::AppState;
use crate::web::money;

use super::answers::{Group, groups, milliseconds};
use super::timeline::Timeline;

/// One run, as the page shows it. Stored as JSON with the run
/// (`kept_pages`), so that its address shows the same page for as
/// long as it is kept.
#[derive(Serialize, Deserialize)]
pub(super) struct RunView {
    pub(super) preset: String,
    pub(super) promise: String,
    /// The judgement's mark and sentence, and its class on the page.
    pub(super) headline: String,
    pub(super) headline_class: String,
    /// The damage counted against the database, one sentence each.
    pub(super) damage: Vec<String>,
    pub(super) switches_off: Vec<String>,
    pub(super) keys: String,
    pub(super) sent: usize,
    /// What was fired: requests, or a provider's deliveries. Results kept
    /// before deliveries existed were requests.
    #[serde(default = "requests_word")]
    pub(super) requests: String,
    pub(super) overlap_max: usize,
    pub(super) wave: usize,
    pub(super) overlap_target: usize,
    pub(super) amount: String,
    pub(super) funnel: Vec<FunnelRow>,
    /// What the money line counts: money moved between A and B, or paid
    /// out. Results kept before payouts existed moved money.
    #[serde(default = "moved_word")]
    pub(super) moved_label: String,
    pub(super) moved: String,
    pub(super) expected_moved: String,
    pub(super) moved_as_expected: bool,
    pub(super) balance_a: String,
    pub(super) balance_b: String,
    pub(super) checks: Vec<Check>,
    /// For a payout run, what the lab's bank sent and where the money is,
    /// in a sentence; empty otherwise.
    #[serde(default)]
    pub(super) bank_note: String,
    pub(super) timeline: Timeline,
    pub(super) groups: Vec<Group>,
    /// When the run was fired, in UTC, for the page of a stored run.
    pub(super) fired_at: String,
    /// The switches the run used, as its requests carried them; empty in
    /// results kept before comparisons existed.
    #[serde(default)]
    pub(super) switches_used: String,
    /// Answers 409: a key in flight, or a version conflict.
    #[serde(default)]
    pub(super) conflicts: usize,
    /// The slowest answer's time, in words.
    #[serde(default)]
    pub(super) slowest: String,
}

#[derive(Serialize, Deserialize)]
pub(super) struct FunnelRow {
    pub(super) label: String,
    pub(super) class: String,
    pub(super) count: usize,
    /// Bar width, percent of the requests sent.
    pub(super) percent: usize,
}

#[derive(Serialize, Deserialize)]
pub(super) struct Check {
    pub(super) label: String,
    pub(super) held: bool,
}

impl RunView {
    pub(super) fn of(state: &AppState, run: &Run) -> Self {
        let switches = if state.config.race_lab.switches_enabled {
            run.request.switches
        } else {
            Switches::ALL_ON
        };
        let preset = run.request.preset;
        let lab_state = &run.state;
        let (expected_moved, moved_as_expected) = expected_money(run);
        let damage = damage_sentences(&run.damage, preset, run.request.keys, &run.plan, lab_money);
        // A delivery's first layer is the edge lock, which has no window,
        // and a payout run's orders skip the cooldown.
        let cooldown_window = (switches.cooldown && !preset.is_delivery() && !preset.is_payout())
            .then_some(state.config.cooldown.ttl);
        Self {
            preset: preset.label().to_owned(),
            promise: preset.promise().to_owned(),
            headline: headline(run, &switches, &damage),
            headline_class: run.judgement.class().to_owned(),
            damage,
            switches_off: preset
                .switched_off(&switches)
                .into_iter()
                .map(str::to_owned)
                .collect(),
            keys: keys_carried(run),
            sent: run.funnel.sent,
            requests: what_was_fired(preset),
            overlap_max: run.overlap_max,
            wave: run.wave_max,
            overlap_target: (run.wave_max * 9).div_ceil(10),
            amount: lab_money(run.plan.amount_minor),
            funnel: FunnelRow::all_of(run),
            moved_label: if preset.is_payout() {
                "Paid out of wallet A, and sent by the bank".to_owned()
            } else {
                moved_word()
            },
            moved: money_moved(preset, lab_state),
            expected_moved,
            moved_as_expected,
            balance_a: lab_money(lab_state.wallet_a_balance_minor),
            balance_b: lab_money(lab_state.wallet_b_balance_minor),
            checks: Check::all_of(preset, lab_state),
            bank_note: if preset.is_payout() {
                bank_note(lab_state)
            } else {
                String::new()
            },
            timeline: Timeline::of(&run.answers, preset, cooldown_window),
            groups: groups(state, preset, &run.answers),
            fired_at: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
            switches_used: switches.header_value(),
            conflicts: run.answers.iter().filter(|answer| answer.status == 409).count(),
            slowest: milliseconds(run.answers.iter().map(Answer::latency).max().unwrap_or_default()),
        }
    }
}

impl FunnelRow {
    /// Every request sent, then where they stopped, stage by stage.
    fn all_of(run: &Run) -> Vec<Self> {
        let funnel = &run.funnel;
        let row = |stage: Stage, count: usize| FunnelRow {
            label: stage.label(run.request.preset).to_owned(),
            class: stage.class().to_owned(),
            count,
            percent: (count * 100).checked_div(funnel.sent).unwrap_or(0),
        };
        vec![
            FunnelRow {
                label: "Sent".to_owned(),
                class: "sent".to_owned(),
                count: funnel.sent,
                percent: 100,
            },
            row(Stage::Cooldown, funnel.cooldown),
            row(Stage::Key, funnel.key),
            row(Stage::Guard, funnel.guard),
            row(Stage::Moved, funnel.moved),
            row(Stage::Other, funnel.failed),
        ]
    }
}

impl Check {
    /// The lab wallets' invariants, and for a payout run its accounts and
    /// the bank's ledger.
    fn all_of(preset: Preset, lab_state: &LabState) -> Vec<Self> {
        let mut checks: Vec<(&str, bool)> = lab_state.invariants().to_vec();
        if preset.is_payout() {
            checks.extend(lab_state.payout_accounts());
            checks.extend(lab_state.bank_checks());
        }
        checks
            .into_iter()
            .map(|(label, held)| Check {
                label: label.to_owned(),
                held,
            })
            .collect()
    }
}

/// Lab money, in words.
fn lab_money(minor: i64) -> String {
    money::format(minor, LAB_CURRENCY)
}

/// Which keys the run's requests carried, in words.
fn keys_carried(run: &Run) -> String {
    let preset = run.request.preset;
    if preset.is_delivery() {
        "one event id, the same on every delivery".to_owned()
    } else if preset.is_payout() {
        "a key of its own on each order".to_owned()
    } else {
        run.request.keys.described().to_owned()
    }
}

/// What a run of `preset` fires, in words.
fn what_was_fired(preset: Preset) -> String {
    if preset.is_delivery() {
        "deliveries".to_owned()
    } else if preset.is_payout() {
        "payout orders".to_owned()
    } else {
        requests_word()
    }
}

/// The money the run moved between the lab wallets, or for a payout run
/// what left wallet A and what the bank sent.
fn money_moved(preset: Preset, lab_state: &LabState) -> String {
    if preset.is_payout() {
        format!(
            "{} and {}",
            lab_money(lab_state.payouts_debited_minor),
            lab_money(lab_state.bank_sent_minor)
        )
    } else {
        lab_money(lab_state.moved_minor)
    }
}

/// The run's judgement in one sentence, its mark first.
fn headline(run: &Run, switches: &Switches, damage: &[String]) -> String {
    let mark = run.judgement.mark();
    let (cause, layer) = judgement::cause(run.request.preset, switches, run.request.keys);
    match run.judgement {
        Judgement::Protected => format!("{mark} It showed what it should."),
        Judgement::NotProtected => format!("{mark} It did not show what it should."),
        Judgement::DamageAsExpected => format!(
            "{mark} As expected with {cause}: {}. This is what {layer} exists to stop.",
            damage.join("; ")
        ),
        Judgement::HiddenByCooldown => {
            let first = run.request.preset.first_layer();
            format!(
                "{mark} {} {} {} of the {} copies, so the naive layer was never reached and could not fail. Switch \
                 {first} off and fire again to watch it fail.",
                capitalised(first),
                if run.request.preset.is_delivery() {
                    "answered"
                } else {
                    "stopped"
                },
                run.funnel.cooldown,
                run.funnel.sent
            )
        }
        Judgement::NoDamageThisTime => format!(
            "{mark} With {cause}, nothing was charged twice and no money was created this time: the race did not \
             hit. Fire again; nothing but {layer} makes that certain."
        ),
    }
}

fn requests_word() -> String {
    "requests".to_owned()
}

fn moved_word() -> String {
    "Money moved".to_owned()
}

/// What the lab's bank sent, and where the payouts' money is now.
fn bank_note(state: &LabState) -> String {
    let times = |count: i64| {
        if count == 1 {
            "once".to_owned()
        } else {
            format!("{count} times")
        }
    };
    let held = if state.held_minor == 0 {
        "nothing is held any more".to_owned()
    } else {
        format!("{} is still held for the rest", lab_money(state.held_minor))
    };
    format!(
        "The lab bank's own ledger shows money sent {}. {} payout{} settled, and {held}.",
        times(state.bank_sendings),
        state.payouts_settled,
        if state.payouts_settled == 1 { "" } else { "s" },
    )
}

fn capitalised(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map(|first| first.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// What should have moved, in words, and whether the database agrees.
fn expected_money(run: &Run) -> (String, bool) {
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
            "any amount, with every cent accounted for".to_owned(),
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
