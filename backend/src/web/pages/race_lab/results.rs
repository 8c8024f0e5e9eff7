//! One run's results as the page shows them: the verdict, the funnel, the
//! money checked against the database, a timeline of every answer, and the
//! answers grouped by how they ended.

use std::collections::BTreeMap;
use std::time::Duration;

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

/// One run, as the page shows it.
pub(super) struct RunView {
    pub(super) preset: &'static str,
    pub(super) promise: &'static str,
    /// The judgement's mark and sentence, and its class on the page.
    pub(super) headline: String,
    pub(super) headline_class: &'static str,
    /// The damage counted against the database, one sentence each.
    pub(super) damage: Vec<String>,
    pub(super) switches_off: Vec<&'static str>,
    pub(super) keys: &'static str,
    pub(super) sent: usize,
    pub(super) overlap_max: usize,
    pub(super) wave: usize,
    pub(super) overlap_target: usize,
    pub(super) amount: String,
    pub(super) funnel: Vec<FunnelRow>,
    pub(super) moved: String,
    pub(super) expected_moved: String,
    pub(super) moved_as_expected: bool,
    pub(super) balance_a: String,
    pub(super) balance_b: String,
    pub(super) checks: Vec<Check>,
    pub(super) timeline: Timeline,
    pub(super) groups: Vec<Group>,
}

pub(super) struct FunnelRow {
    pub(super) label: &'static str,
    pub(super) class: &'static str,
    pub(super) count: usize,
    /// Bar width, percent of the requests sent.
    pub(super) percent: usize,
}

pub(super) struct Check {
    pub(super) label: &'static str,
    pub(super) held: bool,
}

pub(super) struct Timeline {
    pub(super) width: u32,
    pub(super) height: u32,
    pub(super) last_ms: String,
    pub(super) lanes: Vec<Lane>,
    pub(super) marks: Vec<Mark>,
}

pub(super) struct Lane {
    pub(super) y: u32,
    pub(super) label: &'static str,
}

pub(super) struct Mark {
    pub(super) x: u32,
    pub(super) y: u32,
    pub(super) class: &'static str,
    /// `circle`, `square` or `diamond`: moved, refused or replayed.
    pub(super) shape: &'static str,
    pub(super) title: String,
}

pub(super) struct Group {
    pub(super) label: &'static str,
    pub(super) class: &'static str,
    pub(super) how: String,
    pub(super) count: usize,
    pub(super) examples: Vec<Example>,
}

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
            label: stage.label(),
            class: stage.class(),
            count,
            percent: percent(count),
        };
        let (expected_moved, moved_as_expected) = expected_money(run);
        let damage = damage_sentences(&run.damage, run.request.keys, &run.plan, lab);
        let lab_state = &run.state;
        Self {
            preset: run.request.preset.label(),
            promise: run.request.preset.promise(),
            headline: headline(run, &switches, &damage, funnel),
            headline_class: run.judgement.class(),
            damage,
            switches_off: switches.off(),
            keys: run.request.keys.described(),
            sent: funnel.sent,
            overlap_max: run.overlap_max,
            wave: run.wave_max,
            overlap_target: (run.wave_max * 9).div_ceil(10),
            amount: lab(run.plan.amount_minor),
            funnel: vec![
                FunnelRow {
                    label: "Sent",
                    class: "sent",
                    count: funnel.sent,
                    percent: 100,
                },
                row(Stage::Cooldown, funnel.cooldown),
                row(Stage::Key, funnel.key),
                row(Stage::Guard, funnel.guard),
                row(Stage::Moved, funnel.moved),
                row(Stage::Other, funnel.failed),
            ],
            moved: lab(lab_state.moved_minor),
            expected_moved,
            moved_as_expected,
            balance_a: lab(lab_state.wallet_a_balance_minor),
            balance_b: lab(lab_state.wallet_b_balance_minor),
            checks: lab_state
                .invariants()
                .into_iter()
                .map(|(label, held)| Check { label, held })
                .collect(),
            timeline: Timeline::of(&run.answers),
            groups: groups(state, &run.answers),
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
        Judgement::HiddenByCooldown => format!(
            "{mark} The cooldown lock stopped {} of the {} copies, so the naive layer was never reached and could not \
             fail. Untick the cooldown and fire again to watch it fail.",
            funnel.cooldown, funnel.sent
        ),
        Judgement::NoDamageThisTime => format!(
            "{mark} With {cause}, nothing was charged twice and no money was created this time: the race did not \
             hit. Fire again; nothing but {layer} makes that certain."
        ),
    }
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
    }
}

impl Timeline {
    const WIDTH: u32 = 640;
    const LEFT: u32 = 130;
    const LANE_HEIGHT: u32 = 36;

    /// One lane per stage, x the milliseconds since the burst at which the
    /// answer came, one mark per request.
    fn of(answers: &[Answer]) -> Self {
        let stages = Stage::ALL;
        let last = answers
            .iter()
            .map(|answer| answer.answered)
            .max()
            .unwrap_or(Duration::ZERO)
            .max(Duration::from_millis(1));
        let span = Self::WIDTH - Self::LEFT - 16;
        let lane_y = |stage: Stage| {
            let index = stages
                .iter()
                .position(|s| *s == stage)
                .unwrap_or(stages.len() - 1);
            20 + Self::LANE_HEIGHT * u32::try_from(index).unwrap_or(0)
        };
        let marks = answers
            .iter()
            .enumerate()
            .map(|(index, answer)| {
                let stage = Stage::of(answer);
                let fraction = answer.answered.as_secs_f64() / last.as_secs_f64();
                // Spread marks that land together over the lane's height.
                let jitter = u32::try_from(index % 5).unwrap_or(0) * 5;
                Mark {
                    x: Self::LEFT + (fraction * f64::from(span)).round() as u32,
                    y: lane_y(stage) - 10 + jitter,
                    class: stage.class(),
                    shape: if answer.replayed {
                        "diamond"
                    } else if stage == Stage::Moved {
                        "circle"
                    } else {
                        "square"
                    },
                    title: format!(
                        "Request {}: {} after {}",
                        index + 1,
                        how_it_ended(answer),
                        milliseconds(answer.answered)
                    ),
                }
            })
            .collect();
        Self {
            width: Self::WIDTH,
            height: 20 + Self::LANE_HEIGHT * 5,
            last_ms: milliseconds(last),
            lanes: stages
                .into_iter()
                .map(|stage| Lane {
                    y: lane_y(stage),
                    label: stage.lane(),
                })
                .collect(),
            marks,
        }
    }
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
        None => format!("answered {}", answer.status),
    }
}

/// The answers grouped by stage and how they ended, each group with a few
/// examples.
fn groups(state: &AppState, answers: &[Answer]) -> Vec<Group> {
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
            label: stage.label(),
            class: stage.class(),
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
