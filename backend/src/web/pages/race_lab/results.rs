//! One run's results as the page shows them: the verdict, the funnel, the
//! money checked against the database, a timeline of every answer, and the
//! answers grouped by how they ended.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::problem::ProblemType;
use crate::race_lab::burst::Answer;
use crate::race_lab::judgement::{self, Judgement, damage_sentences};
use crate::race_lab::presets::{Preset, Stage};
use crate::race_lab::run::Run;
use crate::race_lab::{LAB_CURRENCY, Switches};
use crate::state::AppState;
use crate::web::money;

/// Examples shown under each group of answers.
const EXAMPLES_PER_GROUP_MAX: usize = 5;

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

/// Every answer on one time axis, one lane per stage. Marks are drawn in
/// SVG (the page's policy allows no inline styles), words in HTML, so that
/// the text keeps its size on a phone while the drawing scales.
#[derive(Serialize, Deserialize)]
pub(super) struct Timeline {
    /// The drawing's width in SVG units; the axis runs from 0 to it.
    pub(super) width: u32,
    pub(super) lanes: Vec<Lane>,
    /// Axis labels at 0, ¼, ½, ¾ and the whole of the axis.
    pub(super) ticks: Vec<String>,
    /// The x of each tick line.
    pub(super) tick_xs: Vec<u32>,
    /// The cooldown window from the first request, when the cooldown was
    /// on: its right edge in SVG units (the axis width when the window
    /// outlasts the run), and a sentence saying what the shading is.
    pub(super) window_x: Option<u32>,
    pub(super) window_note: String,
}

#[derive(Serialize, Deserialize)]
pub(super) struct Lane {
    pub(super) label: String,
    pub(super) class: String,
    pub(super) count: usize,
    /// The lane's height in SVG units: its tallest column of marks.
    pub(super) height: u32,
    pub(super) marks: Vec<Mark>,
}

#[derive(Serialize, Deserialize)]
pub(super) struct Mark {
    pub(super) x: u32,
    pub(super) y: u32,
    /// `circle`, `square` or `diamond`: moved, refused or replayed.
    pub(super) shape: String,
    pub(super) title: String,
}

#[derive(Serialize, Deserialize)]
pub(super) struct Group {
    pub(super) label: String,
    pub(super) class: String,
    pub(super) how: String,
    pub(super) count: usize,
    pub(super) examples: Vec<Example>,
}

#[derive(Serialize, Deserialize)]
pub(super) struct Example {
    pub(super) number: usize,
    pub(super) status: String,
    pub(super) problem: String,
    /// A refusal's problem body as it was sent, for engineers; empty for a
    /// success.
    pub(super) body: String,
    /// `/problems/{slug}` of a refusal.
    pub(super) problem_link: Option<String>,
    pub(super) key: String,
    pub(super) latency: String,
    /// The instance that answered: the burst goes to the one serving the page.
    pub(super) instance: String,
    pub(super) trace_link: Option<String>,
    pub(super) trace_id: String,
}

impl RunView {
    pub(super) fn of(state: &AppState, run: &Run) -> Self {
        let lab = |minor: i64| money::format(minor, LAB_CURRENCY);
        let switches = if state.config.race_lab.switches_enabled {
            run.request.switches
        } else {
            Switches::ALL_ON
        };
        let funnel = &run.funnel;
        let percent = |count: usize| (count * 100).checked_div(funnel.sent).unwrap_or(0);
        let row = |stage: Stage, count: usize| FunnelRow {
            label: stage.label(run.request.preset).to_owned(),
            class: stage.class().to_owned(),
            count,
            percent: percent(count),
        };
        let (expected_moved, moved_as_expected) = expected_money(run);
        let damage = damage_sentences(&run.damage, run.request.preset, run.request.keys, &run.plan, lab);
        let lab_state = &run.state;
        let preset = run.request.preset;
        // A delivery's first layer is the edge lock, which has no window,
        // and a payout run's orders skip the cooldown.
        let cooldown_window = (switches.cooldown && !preset.is_delivery() && !preset.is_payout())
            .then_some(state.config.cooldown.ttl);
        let mut checks: Vec<(&str, bool)> = lab_state.invariants().to_vec();
        if preset.is_payout() {
            checks.extend(lab_state.payout_accounts());
            checks.extend(lab_state.bank_checks());
        }
        Self {
            preset: run.request.preset.label().to_owned(),
            promise: run.request.preset.promise().to_owned(),
            headline: headline(run, &switches, &damage, funnel),
            headline_class: run.judgement.class().to_owned(),
            damage,
            switches_off: run
                .request
                .preset
                .switched_off(&switches)
                .into_iter()
                .map(str::to_owned)
                .collect(),
            keys: if preset.is_delivery() {
                "one event id, the same on every delivery".to_owned()
            } else if preset.is_payout() {
                "a key of its own on each order".to_owned()
            } else {
                run.request.keys.described().to_owned()
            },
            sent: funnel.sent,
            requests: if preset.is_delivery() {
                "deliveries".to_owned()
            } else if preset.is_payout() {
                "payout orders".to_owned()
            } else {
                requests_word()
            },
            overlap_max: run.overlap_max,
            wave: run.wave_max,
            overlap_target: (run.wave_max * 9).div_ceil(10),
            amount: lab(run.plan.amount_minor),
            funnel: vec![
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
            ],
            moved_label: if preset.is_payout() {
                "Paid out of wallet A, and sent by the bank".to_owned()
            } else {
                moved_word()
            },
            moved: if preset.is_payout() {
                format!(
                    "{} and {}",
                    lab(lab_state.payouts_debited_minor),
                    lab(lab_state.bank_sent_minor)
                )
            } else {
                lab(lab_state.moved_minor)
            },
            expected_moved,
            moved_as_expected,
            balance_a: lab(lab_state.wallet_a_balance_minor),
            balance_b: lab(lab_state.wallet_b_balance_minor),
            checks: checks
                .into_iter()
                .map(|(label, held)| Check {
                    label: label.to_owned(),
                    held,
                })
                .collect(),
            bank_note: if preset.is_payout() {
                bank_note(lab_state, lab)
            } else {
                String::new()
            },
            timeline: Timeline::of(&run.answers, run.request.preset, cooldown_window),
            groups: groups(state, run.request.preset, &run.answers),
            fired_at: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
            switches_used: switches.header_value(),
            conflicts: run.answers.iter().filter(|answer| answer.status == 409).count(),
            slowest: milliseconds(run.answers.iter().map(Answer::latency).max().unwrap_or_default()),
        }
    }
}

/// The run's judgement in one sentence, its mark first.
fn headline(
    run: &Run,
    switches: &Switches,
    damage: &[String],
    funnel: &crate::race_lab::presets::Funnel,
) -> String {
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
                funnel.cooldown,
                funnel.sent
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
fn bank_note(state: &crate::race_lab::LabState, lab: impl Fn(i64) -> String) -> String {
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
        format!("{} is still held for the rest", lab(state.held_minor))
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
    let lab = |minor: i64| money::format(minor, LAB_CURRENCY);
    let amount = run.plan.amount_minor;
    let moved = run.state.moved_minor;
    match run.request.preset {
        Preset::SameKey | Preset::DoubleClick | Preset::RetryAfterWindow => {
            (format!("{} (one transfer)", lab(amount)), moved == amount)
        }
        Preset::Overdraw => {
            let coverable = run.balance_minor / amount * amount;
            (
                format!("at most {} (what the balance covers)", lab(coverable)),
                moved <= coverable,
            )
        }
        Preset::Crossing => (
            "any amount, with every cent accounted for".to_owned(),
            run.state.invariants_hold(),
        ),
        Preset::WebhookStorm | Preset::Redelivery => {
            (format!("{} (one credit)", lab(amount)), moved == amount)
        }
        Preset::LostAnswer => {
            let orders = i64::try_from(run.funnel.sent).unwrap_or(i64::MAX);
            let each_once = lab(orders * amount);
            (
                format!("{each_once} and {each_once} ({orders} payouts, each debited once and sent once)"),
                run.state.payouts_debited_minor == orders * amount
                    && run.state.bank_sent_minor == orders * amount,
            )
        }
    }
}

impl Timeline {
    /// The axis in SVG units: `COLUMNS` columns of `STEP` each.
    const COLUMNS: u32 = 40;
    const STEP: u32 = 10;
    /// Marks one column holds before the next go to the nearest column
    /// with room: a dense moment spreads sideways a little rather than
    /// growing a lane taller than a screen. 40 columns of 10 hold 400
    /// marks, twice the largest run.
    const STACK_MAX: u32 = 10;

    /// One lane per stage that any answer reached; x is the moment the
    /// answer came, since the burst; one mark per request, stacked, so
    /// that every mark can be counted at any N.
    fn of(answers: &[Answer], preset: Preset, cooldown_window: Option<Duration>) -> Self {
        let last = answers
            .iter()
            .map(|answer| answer.answered)
            .max()
            .unwrap_or(Duration::ZERO);
        let axis_ms = nice_axis_ms(last.as_secs_f64() * 1000.0);
        let width = Self::COLUMNS * Self::STEP;
        let column_of = |at: Duration| {
            let fraction = (at.as_secs_f64() * 1000.0 / axis_ms).clamp(0.0, 1.0);
            ((fraction * f64::from(Self::COLUMNS)) as u32).min(Self::COLUMNS - 1)
        };
        let lanes = Stage::ALL
            .into_iter()
            .filter_map(|stage| {
                let mut heights = vec![0u32; Self::COLUMNS as usize];
                let marks: Vec<Mark> = answers
                    .iter()
                    .enumerate()
                    .filter(|(_, answer)| Stage::of(answer) == stage)
                    .map(|(index, answer)| {
                        let column =
                            nearest_column_with_room(&heights, column_of(answer.answered), Self::STACK_MAX);
                        let level = heights[column];
                        heights[column] += 1;
                        Mark {
                            x: column as u32 * Self::STEP + Self::STEP / 2,
                            y: level * Self::STEP + Self::STEP / 2,
                            shape: if answer.replayed {
                                "diamond"
                            } else if stage == Stage::Moved {
                                "circle"
                            } else {
                                "square"
                            }
                            .to_owned(),
                            title: format!(
                                "Request {}: {} after {}",
                                index + 1,
                                how_it_ended(answer),
                                milliseconds(answer.answered)
                            ),
                        }
                    })
                    .collect();
                let stack = heights.iter().copied().max().unwrap_or(0);
                // Marks are placed from the top; flip them so that columns
                // grow upwards from the lane's baseline.
                let height = stack * Self::STEP;
                let marks = marks
                    .into_iter()
                    .map(|mark| Mark {
                        y: height - mark.y,
                        ..mark
                    })
                    .collect::<Vec<_>>();
                (!marks.is_empty()).then(|| Lane {
                    label: stage.label(preset).to_owned(),
                    class: stage.class().to_owned(),
                    count: marks.len(),
                    height,
                    marks,
                })
            })
            .collect();
        let quarter = axis_ms / 4.0;
        let (window_x, window_note) = match cooldown_window {
            None => (None, String::new()),
            Some(window) => {
                let window_ms = window.as_secs_f64() * 1000.0;
                let edge = (window_ms / axis_ms).min(1.0) * f64::from(width);
                let note = if window_ms >= axis_ms {
                    format!(
                        "Shaded: the cooldown window, {} from the first request. The whole run fell inside it.",
                        axis_label(window_ms)
                    )
                } else {
                    format!(
                        "Shaded: the cooldown window, {} from the first request; it had ended when the requests \
                         to its right arrived.",
                        axis_label(window_ms)
                    )
                };
                (Some(edge.round() as u32), note)
            }
        };
        Self {
            width,
            lanes,
            ticks: (0..=4).map(|i| axis_label(quarter * f64::from(i))).collect(),
            tick_xs: (0..=4).map(|i| width * i / 4).collect(),
            window_x,
            window_note,
        }
    }
}

/// The column nearest `wanted` with fewer than `stack_max` marks, looking
/// left and right alternately; `wanted` itself when every column is full.
fn nearest_column_with_room(heights: &[u32], wanted: u32, stack_max: u32) -> usize {
    let wanted = wanted as usize;
    (0..heights.len())
        .flat_map(|distance| [wanted.checked_add(distance), wanted.checked_sub(distance)])
        .flatten()
        .find(|column| heights.get(*column).is_some_and(|height| *height < stack_max))
        .unwrap_or(wanted)
}

/// An axis end at or above `last_ms` whose quarters are round numbers of
/// milliseconds: 1, 2, 4, 6 or 8 times a power of ten.
fn nice_axis_ms(last_ms: f64) -> f64 {
    let last_ms = last_ms.max(1.0);
    let mut power = 1.0;
    while power * 10.0 < last_ms {
        power *= 10.0;
    }
    [1.0, 2.0, 4.0, 6.0, 8.0, 10.0]
        .into_iter()
        .map(|factor| factor * power)
        .find(|end| *end >= last_ms)
        .unwrap_or(10.0 * power)
}

/// A tick's label: milliseconds, with a thousands separator.
fn axis_label(ms: f64) -> String {
    let whole = ms.round() as u64;
    if ms < 10.0 && (ms - ms.round()).abs() > f64::EPSILON {
        return format!("{ms:.1} ms");
    }
    format!("{} ms", money::group_thousands(whole))
}

fn milliseconds(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1000.0)
}

/// How one answer ended, as a sentence fragment for people.
fn how_it_ended(answer: &Answer) -> String {
    if answer.status == 0 {
        return "no answer".to_owned();
    }
    if answer.replayed {
        return format!("replayed the stored answer ({})", answer.status);
    }
    match ProblemType::of_body(&answer.body) {
        Some(kind) => format!("{} ({})", kind.title().to_lowercase(), answer.status),
        None if answer.status == 201 => "moved money (201)".to_owned(),
        None if answer.status == 200 => "credited (200)".to_owned(),
        None if answer.status == 202 => "held and accepted (202)".to_owned(),
        None => format!("answered {}", answer.status),
    }
}

/// The answers grouped by stage and how they ended, each group with a few
/// examples.
fn groups(state: &AppState, preset: Preset, answers: &[Answer]) -> Vec<Group> {
    let mut grouped: BTreeMap<(Stage, String), Vec<(usize, &Answer)>> = BTreeMap::new();
    for (index, answer) in answers.iter().enumerate() {
        grouped
            .entry((Stage::of(answer), how_it_ended(answer)))
            .or_default()
            .push((index, answer));
    }
    let trace_ui = &state.config.demo.trace_ui_url;
    grouped
        .into_iter()
        .map(|((stage, how), members)| Group {
            label: stage.label(preset).to_owned(),
            class: stage.class().to_owned(),
            how,
            count: members.len(),
            examples: members
                .iter()
                .take(EXAMPLES_PER_GROUP_MAX)
                .map(|(index, answer)| {
                    let trace_id = answer.trace_id.clone().unwrap_or_default();
                    Example {
                        number: index + 1,
                        status: if answer.status == 0 {
                            "no answer".to_owned()
                        } else {
                            answer.status.to_string()
                        },
                        problem: problem_sentence(answer),
                        body: if answer.status >= 400 {
                            answer.body.clone()
                        } else {
                            String::new()
                        },
                        problem_link: ProblemType::of_body(&answer.body)
                            .map(|kind| format!("/problems/{}", kind.slug())),
                        key: answer
                            .shot
                            .key
                            .map(crate::domain::short_id)
                            .unwrap_or_else(|| "none".to_owned()),
                        latency: milliseconds(answer.latency()),
                        instance: state.instance_id.to_string(),
                        trace_link: (!trace_ui.is_empty() && !trace_id.is_empty())
                            .then(|| trace_ui.replace("{trace_id}", &trace_id)),
                        trace_id,
                    }
                })
                .collect(),
        })
        .collect()
}

/// A refusal's own sentence, from its problem body; empty for a success.
fn problem_sentence(answer: &Answer) -> String {
    serde_json::from_str::<serde_json::Value>(&answer.body)
        .ok()
        .and_then(|body| body.get("detail").and_then(|d| d.as_str()).map(str::to_owned))
        .filter(|_| answer.status >= 400)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_axis_ends_at_a_round_number_at_or_past_the_last_answer() {
        assert_eq!(nice_axis_ms(0.3), 1.0);
        assert_eq!(nice_axis_ms(37.0), 40.0);
        assert_eq!(nice_axis_ms(100.0), 100.0);
        assert_eq!(nice_axis_ms(5_300.0), 6_000.0);
        assert_eq!(axis_label(0.5), "0.5 ms");
        assert_eq!(axis_label(1_500.0), "1,500 ms");
    }

    /// 200 answers at the same moment, and 200 spread over the run: every
    /// mark has a place of its own, and no lane grows past its stack limit.
    #[test]
    fn two_hundred_marks_stay_countable() {
        use crate::decision::{Decision, Layer, Outcome};
        use crate::race_lab::burst::{Answer, Shot};
        let answer = |at_ms: u64| Answer {
            shot: Shot {
                from: uuid::Uuid::nil(),
                to: uuid::Uuid::nil(),
                amount_minor: 1,
                key: None,
            },
            sent: Duration::ZERO,
            answered: Duration::from_millis(at_ms),
            status: 429,
            decision: Some(Decision::new(Layer::Cooldown, Outcome::Rejected)),
            replayed: false,
            body: String::new(),
            trace_id: None,
        };
        for answers in [
            (0..200).map(|_| answer(3)).collect::<Vec<_>>(),
            (0..200).map(answer).collect::<Vec<_>>(),
        ] {
            let timeline = Timeline::of(&answers, Preset::SameKey, None);
            let lane = &timeline.lanes[0];
            assert_eq!(lane.count, 200);
            let mut places: Vec<(u32, u32)> = lane.marks.iter().map(|mark| (mark.x, mark.y)).collect();
            places.sort_unstable();
            places.dedup();
            assert_eq!(places.len(), 200, "two marks share a place");
            assert!(lane.height <= Timeline::STACK_MAX * Timeline::STEP);
            assert!(places.iter().all(|(x, _)| *x < timeline.width));
        }
    }

    #[test]
    fn a_full_column_spills_to_the_nearest_column_with_room() {
        let heights = [0, 0, 10, 10, 0];
        assert_eq!(nearest_column_with_room(&heights, 2, 10), 1);
        assert_eq!(nearest_column_with_room(&heights, 3, 10), 4);
        assert_eq!(nearest_column_with_room(&heights, 0, 10), 0);
        // Every column full: the mark stays where it belongs.
        assert_eq!(nearest_column_with_room(&[10, 10], 1, 10), 1);
    }
}
