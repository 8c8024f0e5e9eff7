//! The race lab and the live feed pages.
//!
//! The lab's form posts to `/race-lab/runs`; the server fires the burst
//! (`race_lab::run`) and answers with the page and its results: a timeline,
//! the funnel, the money checked against the database, and the answers
//! grouped by how they ended.

use std::collections::BTreeMap;
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use askama_web::WebTemplate;
use serde::Deserialize;

use crate::auth;
use crate::problem::ProblemType;
use crate::race_lab::burst::Answer;
use crate::race_lab::presets::{KeyStrategy, Preset, Stage};
use crate::race_lab::run::{self, Run, RunError, RunRequest};
use crate::race_lab::{LAB_CURRENCY, Switches};
use crate::settings::{IdempotencyMode, RowGuardMode};
use crate::state::AppState;
use crate::web::money;

use super::*;

/// Examples shown under each group of answers.
const EXAMPLES_PER_GROUP_MAX: usize = 5;

#[derive(Template, WebTemplate)]
#[template(path = "race_lab.html")]
struct RaceLabPage {
    chrome: Chrome,
    form: LabForm,
    presets: Vec<PresetChoice>,
    switches_enabled: bool,
    requests_max: usize,
    lab_balance: String,
    problem: Option<String>,
    result: Option<RunView>,
}

/// The form as the visitor last set it.
struct LabForm {
    preset: &'static str,
    count: usize,
    cooldown: bool,
    keys: &'static str,
    idempotency_naive: bool,
    row_guard_naive: bool,
}

struct PresetChoice {
    slug: &'static str,
    label: &'static str,
    promise: &'static str,
    /// The switches the preset starts with, for the page's script.
    cooldown: bool,
    keys: &'static str,
}

/// One run, as the page shows it.
struct RunView {
    preset: &'static str,
    promise: &'static str,
    kept: bool,
    switches_off: Vec<&'static str>,
    keys: &'static str,
    sent: usize,
    overlap_max: usize,
    wave: usize,
    overlap_target: usize,
    amount: String,
    funnel: Vec<FunnelRow>,
    moved: String,
    expected_moved: String,
    moved_as_expected: bool,
    balance_a: String,
    balance_b: String,
    checks: Vec<Check>,
    timeline: Timeline,
    groups: Vec<Group>,
}

struct FunnelRow {
    label: &'static str,
    class: &'static str,
    count: usize,
    /// Bar width, percent of the requests sent.
    percent: usize,
}

struct Check {
    label: &'static str,
    held: bool,
}

struct Timeline {
    width: u32,
    height: u32,
    last_ms: String,
    lanes: Vec<Lane>,
    marks: Vec<Mark>,
}

struct Lane {
    y: u32,
    label: &'static str,
}

struct Mark {
    x: u32,
    y: u32,
    class: &'static str,
    /// `circle`, `square` or `diamond`: moved, refused or replayed.
    shape: &'static str,
    title: String,
}

struct Group {
    label: &'static str,
    class: &'static str,
    how: String,
    count: usize,
    examples: Vec<Example>,
}

struct Example {
    number: usize,
    status: String,
    problem: String,
    /// A refusal's problem body as it was sent, for engineers; empty for a
    /// success.
    body: String,
    /// `/problems/{slug}` of a refusal.
    problem_link: Option<String>,
    key: String,
    latency: String,
    /// The instance that answered: the burst goes to the one serving the page.
    instance: String,
    trace_link: Option<String>,
    trace_id: String,
}

#[derive(Template, WebTemplate)]
#[template(path = "feed.html")]
struct FeedPage {
    chrome: Chrome,
}

/// `GET /race-lab`: the form, each preset with its defaults.
pub async fn race_lab(request: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let session = match require_session(&request, &state).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let form = LabForm::defaults(Preset::SameKey, 50.min(state.config.race_lab.requests_max));
    lab_page(&state, &session, StatusCode::OK, form, None, None)
}

#[derive(Deserialize)]
pub struct RunForm {
    csrf: String,
    preset: String,
    count: String,
    #[serde(default)]
    cooldown: Option<String>,
    keys: String,
    #[serde(default)]
    idempotency: Option<String>,
    #[serde(default)]
    row_guard: Option<String>,
}

/// `POST /race-lab/runs`: fires the burst, then shows what happened.
pub async fn fire(
    request: HttpRequest,
    form: web::Form<RunForm>,
    state: web::Data<AppState>,
) -> HttpResponse {
    let session = match session_for_form(&request, &state, &form.csrf).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let requests_max = state.config.race_lab.requests_max;
    let parsed = parse_run(&form, requests_max).and_then(|run_request| fits_in_a_run(&state, run_request));
    let lab_form = match &parsed {
        Ok(run_request) => LabForm::of(run_request),
        Err(_) => LabForm::defaults(Preset::SameKey, 50.min(requests_max)),
    };
    let run_request = match parsed {
        Ok(run_request) => run_request,
        Err(sentence) => {
            return lab_page(
                &state,
                &session,
                StatusCode::UNPROCESSABLE_ENTITY,
                lab_form,
                Some(sentence),
                None,
            );
        }
    };
    let Some(cookie) = request.cookie(auth::SESSION_COOKIE) else {
        return redirect("/signin");
    };
    match run::run(&state, session.token.user_id, cookie.value(), run_request).await {
        Ok(run) => {
            let view = RunView::of(&state, &run);
            lab_page(&state, &session, StatusCode::OK, lab_form, None, Some(view))
        }
        Err(RunError::Busy) => lab_page(
            &state,
            &session,
            StatusCode::SERVICE_UNAVAILABLE,
            lab_form,
            Some("The race lab is busy with other visitors' runs. Nothing was sent; try again in a few seconds.".into()),
            None,
        ),
        Err(RunError::AlreadyRunning) => lab_page(
            &state,
            &session,
            StatusCode::CONFLICT,
            lab_form,
            Some("Another run of yours is still going, perhaps in another tab. Nothing was sent; wait for it to finish.".into()),
            None,
        ),
        Err(RunError::Database(error)) => {
            tracing::error!(error = %error, "database error during a race-lab run");
            lab_page(
                &state,
                &session,
                StatusCode::SERVICE_UNAVAILABLE,
                lab_form,
                Some(
                    "The race lab lost the database during this run, so it cannot show what happened. Only lab money \
                     can have moved: your real balance is untouched. Fire again in a moment; the next run starts \
                     from refilled lab wallets."
                        .into(),
                ),
                None,
            )
        }
    }
}

/// The retry preset waits out a cooldown window inside the run: with a
/// window longer than a run may last, it cannot be fired here.
fn fits_in_a_run(state: &AppState, run_request: RunRequest) -> Result<RunRequest, String> {
    let window = state.config.cooldown.ttl;
    let needed = window + Duration::from_secs(5);
    if run_request.preset == Preset::RetryAfterWindow && needed > state.config.race_lab.run_max {
        return Err(format!(
            "The cooldown window here lasts {} s, longer than a race-lab run may wait, so this preset cannot run on \
             this deployment. Nothing was sent.",
            window.as_secs()
        ));
    }
    Ok(run_request)
}

fn parse_run(form: &RunForm, requests_max: usize) -> Result<RunRequest, String> {
    let preset = Preset::from_slug(&form.preset).ok_or("Choose one of the presets.")?;
    let count = form
        .count
        .trim()
        .parse::<usize>()
        .ok()
        .filter(|count| (2..=requests_max).contains(count))
        .ok_or_else(|| format!("The number of requests must be a whole number from 2 to {requests_max}."))?;
    let keys =
        KeyStrategy::from_slug(&form.keys).ok_or("Choose which idempotency keys the requests carry.")?;
    let switches = Switches {
        cooldown: form.cooldown.as_deref() == Some("on"),
        idempotency: if form.idempotency.as_deref() == Some("check_then_insert") {
            IdempotencyMode::CheckThenInsert
        } else {
            IdempotencyMode::Atomic
        },
        row_guard: if form.row_guard.as_deref() == Some("read_decide_write") {
            RowGuardMode::ReadDecideWrite
        } else {
            RowGuardMode::Guarded
        },
        run: Some(uuid::Uuid::new_v4()),
    };
    Ok(RunRequest {
        preset,
        count,
        switches,
        keys,
    })
}

fn lab_page(
    state: &AppState,
    session: &crate::web::Session,
    status: StatusCode,
    form: LabForm,
    problem: Option<String>,
    result: Option<RunView>,
) -> HttpResponse {
    let lab = &state.config.race_lab;
    with_page(
        status,
        RaceLabPage {
            chrome: Chrome::new(state, "Race lab", Some(session)),
            form,
            presets: Preset::ALL
                .into_iter()
                .map(|preset| PresetChoice {
                    slug: preset.slug(),
                    label: preset.label(),
                    promise: preset.promise(),
                    cooldown: preset.default_switches().cooldown,
                    keys: preset.default_keys().slug(),
                })
                .collect(),
            switches_enabled: lab.switches_enabled,
            requests_max: lab.requests_max,
            lab_balance: money::format(lab.balance_minor, LAB_CURRENCY),
            problem,
            result,
        },
    )
}

impl LabForm {
    fn defaults(preset: Preset, count: usize) -> Self {
        let switches = preset.default_switches();
        Self {
            preset: preset.slug(),
            count,
            cooldown: switches.cooldown,
            keys: preset.default_keys().slug(),
            idempotency_naive: false,
            row_guard_naive: false,
        }
    }

    fn of(request: &RunRequest) -> Self {
        Self {
            preset: request.preset.slug(),
            count: request.count,
            cooldown: request.switches.cooldown,
            keys: request.keys.slug(),
            idempotency_naive: request.switches.idempotency != IdempotencyMode::Atomic,
            row_guard_naive: request.switches.row_guard != RowGuardMode::Guarded,
        }
    }
}

impl RunView {
    fn of(state: &AppState, run: &Run) -> Self {
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
        let lab_state = &run.state;
        Self {
            preset: run.request.preset.label(),
            promise: run.request.preset.promise(),
            kept: run.kept,
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
                            .map(|key| key.simple().to_string()[..8].to_owned())
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

pub async fn feed(request: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    match require_session(&request, &state).await {
        Ok(session) => with_page(
            StatusCode::OK,
            FeedPage {
                chrome: Chrome::new(&state, "Live feed", Some(&session)),
            },
        ),
        Err(response) => response,
    }
}
