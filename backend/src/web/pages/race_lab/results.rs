//! One run's results as the page shows them: the verdict, the funnel, the
//! money checked against the database, a timeline of every answer
//! (`timeline`), and the answers grouped by how they ended (`answers`).

use serde::{Deserialize, Serialize};

use crate::race_lab::Switches;
use crate::race_lab::burst::Answer;
use crate::race_lab::presets::{KeyStrategy, Preset};
use crate::race_lab::run::{Run, RunRequest};
use crate::state::AppState;

use super::RunFields;
use super::answers::{Group, groups, milliseconds};
use super::funnel::{FunnelRow, stage_label};
use super::money_card::{self, Check, HarmLine, lab_money};
use super::timeline::Timeline;

/// One run, as the page shows it. Stored as JSON with the run
/// (`kept_pages`), so that its address shows the same page for as
/// long as it is kept.
#[derive(Serialize, Deserialize)]
pub(super) struct RunView {
    pub(super) preset: String,
    pub(super) promise: String,
    /// Whether money was harmed, and how much: its mark and sentence, and
    /// its class on the page (`harmed` or `unharmed`).
    pub(super) headline: String,
    pub(super) headline_class: String,
    /// Whether the run behaved as its switches predict, in a sentence
    /// without a mark; empty in results kept before it was said apart.
    #[serde(default)]
    pub(super) verdict: String,
    /// The damage counted against the database, one harm each.
    pub(super) damage: Vec<HarmLine>,
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
    /// Answers 409 from the balance's guard: an optimistic write that found
    /// the balance changed, counted as conflicts, not as refusals.
    #[serde(default)]
    pub(super) guard_conflicts: usize,
    /// The run as fired, every switch and count, so that "Fire again"
    /// repeats it; empty in results kept before it was kept.
    #[serde(default)]
    pub(super) fired: RunFields,
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
        let (expected_moved, moved_as_expected) = money_card::expected_money(run);
        let harms = run
            .damage
            .harms(preset, run.request.keys == KeyStrategy::Same, lab_money);
        let (headline, headline_class) = money_card::headline(run, &harms);
        // A delivery's first layer is the edge lock, which has no window,
        // and a payout run's orders skip the cooldown.
        let cooldown_window = (switches.cooldown && !preset.is_delivery() && !preset.is_payout())
            .then_some(state.config.cooldown.ttl);
        Self {
            preset: preset_line(run),
            promise: preset.promise().to_owned(),
            headline,
            headline_class: headline_class.to_owned(),
            verdict: run
                .judgement
                .sentence(preset, &switches, run.request.keys, &run.funnel),
            damage: harms.into_iter().map(HarmLine::from).collect(),
            switches_off: preset
                .switched_off(&switches)
                .into_iter()
                .map(str::to_owned)
                .collect(),
            keys: keys_carried(run),
            sent: run.funnel.sent,
            requests: what_was_fired(preset),
            overlap_max: run.overlap_max,
            wave: overlap_whole(run),
            overlap_target: (overlap_whole(run) * 9).div_ceil(10),
            amount: lab_money(run.plan.amount_minor),
            funnel: FunnelRow::all_of(run),
            moved_label: moved_label(preset),
            moved: money_card::money_moved(preset, lab_state),
            expected_moved,
            moved_as_expected,
            balance_a: money_card::balance_beside_ledger(
                lab_state.wallet_a_balance_minor,
                lab_state.wallet_a_ledger_minor,
            ),
            balance_b: money_card::balance_beside_ledger(
                lab_state.wallet_b_balance_minor,
                lab_state.wallet_b_ledger_minor,
            ),
            checks: money_card::checks(preset, lab_state),
            bank_note: if preset.is_payout() {
                money_card::bank_note(lab_state)
            } else {
                String::new()
            },
            timeline: Timeline::of(&run.answers, &|stage| stage_label(run, stage), cooldown_window),
            groups: groups(state, &|stage| stage_label(run, stage), &run.answers),
            fired_at: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
            switches_used: switches.header_value(),
            conflicts: run.answers.iter().filter(|answer| answer.status == 409).count(),
            slowest: milliseconds(run.answers.iter().map(Answer::latency).max().unwrap_or_default()),
            guard_conflicts: super::funnel::guard_conflicts(&run.answers),
            fired: RunFields::of(&run.request),
        }
    }

    /// Whether the run harmed money: the one rule for the page's colour.
    pub(super) fn harmed(&self) -> bool {
        self.headline_class == "harmed" || self.headline_class == "broken"
    }
}

/// What the overlap is measured against: the largest wave, or the whole
/// run when a later wave overlapped an earlier one still in flight (the
/// redelivery preset), so that the figure never exceeds its whole.
fn overlap_whole(run: &Run) -> usize {
    if run.overlap_max > run.wave_max {
        run.funnel.sent
    } else {
        run.wave_max
    }
}

/// The preset's name as the run fired it: a run with other keys than the
/// preset's own says which, instead of the preset's words about keys.
fn preset_line(run: &Run) -> String {
    let preset = run.request.preset;
    let keys = run.request.keys;
    let name = preset.label().split(':').next().unwrap_or_default();
    match preset {
        _ if keys == preset.default_keys() => preset.label().to_owned(),
        Preset::SameKey | Preset::DoubleClick => {
            format!(
                "{name}: the same transfer, all at once, with {}",
                keys.described()
            )
        }
        Preset::RetryAfterWindow => format!(
            "{name}: one transfer, then retries once the cooldown has passed, with {}",
            keys.described()
        ),
        _ => preset.label().to_owned(),
    }
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

fn requests_word() -> String {
    "requests".to_owned()
}

/// What the money line counts, for a run of `preset`.
fn moved_label(preset: Preset) -> String {
    match preset.is_payout() {
        true => "Paid out of wallet A, and sent by the bank".to_owned(),
        false => moved_word(),
    }
}

fn moved_word() -> String {
    "Money moved".to_owned()
}

impl RunFields {
    /// The fields that fire `request` again, every switch and count as it
    /// was.
    fn of(request: &RunRequest) -> Self {
        let form = super::LabForm::of(request);
        Self {
            compared: String::new(),
            preset: form.preset.to_owned(),
            count: form.count.to_string(),
            cooldown: if form.cooldown { "on" } else { "off" }.to_owned(),
            keys: form.keys.to_owned(),
            idempotency: form.idempotency.to_owned(),
            row_guard: form.row_guard.to_owned(),
            payout: form.payout_mode.to_owned(),
            bank: if form.bank_deduplicates {
                "deduplicates"
            } else {
                "no_deduplication"
            }
            .to_owned(),
        }
    }
}
