//! The lab's comparison: the form posts to `/race-lab/comparisons`; the
//! server fires the preset at each alternative of one layer in turn
//! (`race_lab::compare`), keeps each run's results as a run of its own, and
//! redirects to `/race-lab/comparisons?compared=…&runs=…`, which reads them
//! back and shows them side by side.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use askama_web::WebTemplate;
use serde::{Deserialize, Serialize};

use crate::auth;
use crate::kept_pages::{self, Kind};
use crate::race_lab::Switches;
use crate::race_lab::compare::{self, Compared, ComparisonRequest};
use crate::race_lab::presets::{Preset, Stage};
use crate::state::AppState;

use super::results::RunView;
use super::*;

#[derive(Template, WebTemplate)]
#[template(path = "race_lab_comparison.html")]
struct ComparisonPage {
    chrome: Chrome,
    compared: &'static str,
    preset: String,
    requests: usize,
    /// What held still while the layer compared changed, in a sentence.
    held_still: &'static str,
    /// One column per alternative, in the order they were fired.
    alternatives: Vec<Column>,
    /// One row per measure, one cell per alternative.
    measures: Vec<Measure>,
    compare: CompareForm,
    compare_choices: CompareChoices,
    /// Always `None` here: a comparison that could not start goes back to
    /// the lab.
    compare_problem: Option<String>,
    requests_max: usize,
}

/// An alternative's column: its name, and its run's own results.
struct Column {
    name: &'static str,
    run_id: uuid::Uuid,
}

/// One measure across the alternatives.
struct Measure {
    label: &'static str,
    cells: Vec<Cell>,
}

struct Cell {
    text: String,
    /// `kept`, `broken` or `hidden` for a verdict; empty otherwise.
    class: String,
}

/// The compare form as the visitor last set it.
pub(super) struct CompareForm {
    pub(super) compared: &'static str,
    pub(super) preset: &'static str,
    pub(super) count: usize,
}

/// What the compare form offers.
pub(super) struct CompareChoices {
    pub(super) layers: Vec<Offered>,
    pub(super) presets: Vec<Offered>,
}

/// One option: its value, its words, and for a layer the preset that
/// reaches it and how many runs comparing it fires (for the page's script).
pub(super) struct Offered {
    pub(super) slug: &'static str,
    pub(super) label: &'static str,
    pub(super) preset: &'static str,
    pub(super) runs: usize,
}

impl CompareChoices {
    pub(super) fn offered() -> Self {
        Self {
            layers: Compared::ALL
                .into_iter()
                .map(|compared| Offered {
                    slug: compared.slug(),
                    label: compared.label(),
                    preset: compared.preset().slug(),
                    runs: compared.alternatives().len(),
                })
                .collect(),
            presets: compare::PRESETS
                .into_iter()
                .map(|preset| Offered {
                    slug: preset.slug(),
                    label: preset.label(),
                    preset: preset.slug(),
                    runs: 1,
                })
                .collect(),
        }
    }
}

impl CompareForm {
    pub(super) fn defaults(requests_max: usize) -> Self {
        Self {
            compared: Compared::RowGuard.slug(),
            preset: Compared::RowGuard.preset().slug(),
            count: 20.min(requests_max),
        }
    }

    /// The form of a comparison that could not start, carried back to the
    /// lab; `None` when the lab was not opened from the compare form.
    pub(super) fn carried_back(fields: &RunFields, requests_max: usize) -> Option<Self> {
        if fields.compared.is_empty() {
            return None;
        }
        let compared = Compared::from_slug(&fields.compared).unwrap_or(Compared::RowGuard);
        let preset = Preset::from_slug(&fields.preset)
            .filter(|preset| compare::PRESETS.contains(preset))
            .unwrap_or(compared.preset());
        let count = parse_count(&fields.count, requests_max).unwrap_or(20.min(requests_max));
        Some(Self::of(&ComparisonRequest {
            compared,
            preset,
            count,
        }))
    }

    fn of(request: &ComparisonRequest) -> Self {
        Self {
            compared: request.compared.slug(),
            preset: request.preset.slug(),
            count: request.count,
        }
    }
}

/// The compare form's fields, as posted or carried back to the lab.
#[derive(Deserialize, Serialize, Default)]
#[serde(default)]
pub struct CompareFields {
    compared: String,
    preset: String,
    count: String,
}

#[derive(Deserialize)]
pub struct CompareFormPosted {
    csrf: String,
    #[serde(flatten)]
    fields: CompareFields,
}

/// The most runs a comparison's address may name: one per alternative of
/// the layer with the most.
const RUNS_PER_COMPARISON_MAX: usize = 4;

/// `POST /race-lab/comparisons`: fires one run per alternative, keeps each,
/// and redirects to them side by side; a comparison that cannot start
/// redirects back to the lab with the reason.
pub async fn fire_comparison(
    request: HttpRequest,
    form: web::Form<CompareFormPosted>,
    state: web::Data<AppState>,
) -> HttpResponse {
    let session = match session_for_form(&request, &state, &form.csrf).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let fields = &form.fields;
    let not_fired = |refusal: NotFired, wait_s: u64| back_to_the_lab(fields, refusal, wait_s, "#compare");
    let comparison = match parse_comparison(fields, &state) {
        Ok(comparison) => comparison,
        Err(refusal) => return not_fired(refusal, 0),
    };
    let Some(cookie) = request.cookie(auth::SESSION_COOKIE) else {
        return redirect("/signin");
    };
    let runs = match compare::compare(&state, &session.token, cookie.value(), comparison).await {
        Ok(runs) => runs,
        Err(error) => {
            let (refusal, wait_s) = NotFired::because(error);
            return not_fired(refusal, wait_s);
        }
    };
    let mut ids = Vec::new();
    for run in &runs {
        let view = RunView::of(&state, run);
        match kept_pages::keep(
            &state.db,
            session.token.user_id,
            Kind::RaceLabRun,
            &view,
            state.config.race_lab.results,
        )
        .await
        {
            Ok(id) => ids.push(id.to_string()),
            Err(error) => {
                tracing::error!(error = %error, "database error while keeping a comparison's results");
                return error_page(
                    &state,
                    Some(&session),
                    StatusCode::SERVICE_UNAVAILABLE,
                    "The comparison ran, but its results could not be kept",
                    "Every alternative was fired, but the database failed while its results were being kept, so \
                     there is nothing to show. Only lab money moved. Open the race lab and compare again in a moment.",
                );
            }
        }
    }
    redirect(&format!(
        "/race-lab/comparisons?compared={}&preset={}&runs={}",
        comparison.compared.slug(),
        comparison.preset.slug(),
        ids.join(",")
    ))
}

fn parse_comparison(fields: &CompareFields, state: &AppState) -> Result<ComparisonRequest, NotFired> {
    let lab = &state.config.race_lab;
    if !lab.switches_enabled {
        return Err(NotFired::SwitchesOff);
    }
    let compared = Compared::from_slug(&fields.compared).ok_or(NotFired::NoLayer)?;
    let preset = Preset::from_slug(&fields.preset)
        .filter(|preset| compare::PRESETS.contains(preset))
        .ok_or(NotFired::NoPreset)?;
    let count = parse_count(&fields.count, lab.requests_max)?;
    Ok(ComparisonRequest {
        compared,
        preset,
        count,
    })
}

/// What `/race-lab/comparisons` is opened with.
#[derive(Deserialize)]
pub struct ComparisonQuery {
    #[serde(default)]
    compared: String,
    #[serde(default)]
    preset: String,
    #[serde(default)]
    runs: String,
}

/// `GET /race-lab/comparisons`: the runs of a comparison side by side, as
/// long as they are kept. Anyone with the address may look: it names lab
/// money only. Without runs, the lab.
pub async fn show_comparison(
    request: HttpRequest,
    query: web::Query<ComparisonQuery>,
    state: web::Data<AppState>,
) -> HttpResponse {
    if query.runs.is_empty() {
        return redirect("/race-lab#compare");
    }
    let session = match crate::web::session(&request, &state).await {
        Ok(session) => session,
        Err(error) => return unavailable(&state, None, &error),
    };
    let ids: Option<Vec<uuid::Uuid>> = query.runs.split(',').map(crate::domain::parse_uuid).collect();
    let (Some(compared), Some(ids)) = (
        Compared::from_slug(&query.compared),
        ids.filter(|ids| ids.len() <= RUNS_PER_COMPARISON_MAX),
    ) else {
        return no_longer_kept(&state, session.as_ref());
    };
    let mut views = Vec::new();
    for id in ids {
        match kept_pages::load::<RunView>(&state.db, Kind::RaceLabRun, id, None).await {
            Ok(Some(view)) => views.push((id, view)),
            Ok(None) => return no_longer_kept(&state, session.as_ref()),
            Err(error) => return unavailable(&state, session.as_ref(), &error),
        }
    }
    let Some((_, first)) = views.first() else {
        return no_longer_kept(&state, session.as_ref());
    };
    let requests_max = state.config.race_lab.requests_max;
    let form = match Preset::from_slug(&query.preset) {
        Some(preset) => CompareForm::of(&ComparisonRequest {
            compared,
            preset,
            count: first.sent.min(requests_max),
        }),
        None => CompareForm::defaults(requests_max),
    };
    with_page(
        StatusCode::OK,
        ComparisonPage {
            chrome: Chrome::new(&state, "Race lab: compared side by side", session.as_ref()),
            compared: compared.label(),
            preset: first.preset.clone(),
            requests: first.sent,
            held_still: match compared {
                Compared::Cooldown => "Every other layer was the service's own.",
                _ => {
                    "The cooldown was off for every run, so that each burst reached the layer compared; the other \
                     layers were the service's own."
                }
            },
            alternatives: views
                .iter()
                .map(|(run_id, view)| Column {
                    name: compared.name_of(&Switches::parse(&view.switches_used).unwrap_or(Switches::ALL_ON)),
                    run_id: *run_id,
                })
                .collect(),
            measures: measures(&views),
            compare: form,
            compare_choices: CompareChoices::offered(),
            compare_problem: None,
            requests_max,
        },
    )
}

/// The measures of each run, side by side: whether money was harmed, the
/// run against its switches, the money, where the requests stopped, and
/// the damage counted against the database. Colour and marks follow the
/// one rule: red with ✗ where money was harmed, green with ✓ where not.
fn measures(views: &[(uuid::Uuid, RunView)]) -> Vec<Measure> {
    let plain = |text: String| Cell {
        text,
        class: String::new(),
    };
    let across = |label: &'static str, cell: &dyn Fn(&RunView) -> Cell| Measure {
        label,
        cells: views.iter().map(|(_, view)| cell(view)).collect(),
    };
    let count = |view: &RunView, stage: Stage| {
        view.funnel
            .iter()
            .find(|row| row.class == stage.class())
            .map_or(0, |row| row.count)
    };
    let stage = |stage: Stage| move |view: &RunView| plain(count(view, stage).to_string());
    let harm_class = |view: &RunView| if view.harmed() { "harmed" } else { "unharmed" }.to_owned();
    vec![
        across("Money", &|view| Cell {
            text: view.headline.clone(),
            class: harm_class(view),
        }),
        across("Against its switches", &|view| plain(view.verdict.clone())),
        across("Money moved", &|view| plain(view.moved.clone())),
        across("Requests that moved money", &stage(Stage::Moved)),
        across("Stopped by the cooldown", &stage(Stage::Cooldown)),
        across("Stopped by the key", &stage(Stage::Key)),
        across("Refused: the balance could not cover it", &|view| {
            plain(count(view, Stage::Guard).to_string())
        }),
        across("Conflicts (409): the balance changed under the write", &|view| {
            plain(view.guard_conflicts.to_string())
        }),
        across("All answers 409 (a conflict, or a key in flight)", &|view| {
            plain(view.conflicts.to_string())
        }),
        across("No answer, or an error", &stage(Stage::Other)),
        across("Slowest answer", &|view| plain(view.slowest.clone())),
        across("Damage, counted against the database", &|view| Cell {
            text: match view.damage.is_empty() {
                true => "✓ None".to_owned(),
                false => {
                    let said: Vec<&str> = view.damage.iter().map(|harm| harm.text.as_str()).collect();
                    format!("✗ {}", said.join("; "))
                }
            },
            class: harm_class(view),
        }),
    ]
}

fn no_longer_kept(state: &AppState, session: Option<&crate::web::Session>) -> HttpResponse {
    error_page(
        state,
        session,
        StatusCode::NOT_FOUND,
        "This comparison is no longer kept",
        &format!(
            "A comparison is its runs, and a race-lab run's results are kept for {} after it is fired, each visitor \
             keeping their latest {}. Some of these are gone, or the address is wrong. Open the race lab to compare \
             again.",
            retention_in_words(state),
            state.config.race_lab.results.per_user_max
        ),
    )
}
