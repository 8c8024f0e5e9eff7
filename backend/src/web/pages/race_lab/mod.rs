//! The race lab and the live feed pages.
//!
//! The lab's form posts to `/race-lab/runs`; the server fires the burst
//! (`race_lab::run`), keeps the results (`kept_pages`) and redirects to
//! `/race-lab/runs/{id}`, which shows them: a timeline, the funnel, the
//! money checked against the database, and the answers grouped by how they
//! ended.

use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use askama_web::WebTemplate;
use serde::{Deserialize, Serialize};

use crate::auth;
use crate::kept_pages::{self, Kind};
use crate::race_lab::presets::{KeyStrategy, Preset};
use crate::race_lab::run::{self, RunRequest};
use crate::race_lab::switches::{Choice, IDEMPOTENCY_CHOICES, ROW_GUARD_CHOICES};
use crate::race_lab::{LAB_CURRENCY, Switches};
use crate::settings::{IdempotencyMode, PayoutMode, RowGuardMode, choice_name, parse_choice};
use crate::state::AppState;
use crate::web::money;

use super::*;
use comparison::{CompareChoices, CompareForm};
use not_fired::NotFired;
use results::RunView;

mod answers;
mod comparison;
mod funnel;
mod live_feed;
mod money_card;
mod not_fired;
mod results;
mod timeline;

pub use comparison::{fire_comparison, show_comparison};
pub use live_feed::feed;

#[derive(Template, WebTemplate)]
#[template(path = "race_lab.html")]
struct RaceLabPage {
    chrome: Chrome,
    form: LabForm,
    presets: Vec<PresetChoice>,
    switches_enabled: bool,
    requests_max: usize,
    lab_balance: String,
    /// How long a run's results stay at their address, in words.
    retention: String,
    problem: Option<String>,
    /// A run's results, and its id when they are kept.
    result: Option<(Option<uuid::Uuid>, RunView)>,
    /// The ways to claim a key and to guard the balance the form offers.
    idempotency_choices: Vec<FormChoice>,
    row_guard_choices: Vec<FormChoice>,
    compare: CompareForm,
    compare_choices: CompareChoices,
    /// Why the last comparison did not start, shown by its form.
    compare_problem: Option<String>,
}

/// An option of one of the form's switches.
struct FormChoice {
    value: &'static str,
    words: &'static str,
}

/// The form as the visitor last set it.
struct LabForm {
    preset: &'static str,
    count: usize,
    cooldown: bool,
    keys: &'static str,
    /// `idempotency_mode`'s value.
    idempotency: &'static str,
    /// `row_guard_mode`'s value.
    row_guard: &'static str,
    /// The payout switches: `payout_mode`'s value, and the lab bank's
    /// deduplication.
    payout_mode: &'static str,
    bank_deduplicates: bool,
}

struct PresetChoice {
    slug: &'static str,
    label: &'static str,
    promise: &'static str,
    /// The switches the preset starts with, for the page's script.
    cooldown: bool,
    keys: &'static str,
}

/// `GET /race-lab`: the form, as the visitor last set it when they come
/// back from a run that could not start, with the reason; otherwise each
/// preset with its defaults.
pub async fn race_lab(
    request: HttpRequest,
    query: web::Query<LabQuery>,
    state: web::Data<AppState>,
) -> HttpResponse {
    let session = match require_session(&request, &state).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let requests_max = state.config.race_lab.requests_max;
    let form = match parse_run(&query.form, requests_max) {
        Ok(run_request) => LabForm::of(&run_request),
        Err(_) => LabForm::defaults(Preset::SameKey, 50.min(requests_max)),
    };
    let problem = NotFired::from_slug(&query.refused)
        .map(|refusal| refusal.sentence(&state, query.wait_s.parse().unwrap_or(1)));
    // A comparison that could not start carries back its own fields, and
    // its reason goes by its own form.
    match CompareForm::carried_back(&query.form, requests_max) {
        Some(compare) => lab_page_with(
            &state,
            Some(&session),
            LabForm::defaults(Preset::SameKey, 50.min(requests_max)),
            (None, None),
            (compare, problem),
        ),
        None => lab_page(&state, Some(&session), form, problem, None),
    }
}

/// `GET /race-lab/runs/{id}`: a run's results, as long as they are kept.
/// Anyone with the address may look: it names lab money only.
pub async fn show_run(
    request: HttpRequest,
    id: web::Path<String>,
    state: web::Data<AppState>,
) -> HttpResponse {
    let session = match crate::web::session(&request, &state).await {
        Ok(session) => session,
        Err(error) => return unavailable(&state, None, &error),
    };
    let kept = match crate::domain::parse_uuid(&id) {
        Some(id) => match kept_pages::load::<RunView>(&state.db, Kind::RaceLabRun, id, None).await {
            Ok(view) => view.map(|view| (Some(id), view)),
            Err(error) => return unavailable(&state, session.as_ref(), &error),
        },
        None => None,
    };
    let Some(result) = kept else {
        return error_page(
            &state,
            session.as_ref(),
            StatusCode::NOT_FOUND,
            "This run is no longer kept",
            &format!(
                "A race-lab run's results are kept for {} after it is fired, and each visitor keeps their latest {}. \
                 These are gone, or the address is wrong. Open the race lab to fire a new run.",
                retention_in_words(&state),
                state.config.race_lab.results.per_user_max
            ),
        );
    };
    // "Fire again" repeats the run shown, every switch and count as it was.
    let requests_max = state.config.race_lab.requests_max;
    let form = match parse_run(&result.1.fired, requests_max) {
        Ok(fired) => LabForm::of(&fired),
        Err(_) => LabForm::defaults(Preset::SameKey, 50.min(requests_max)),
    };
    lab_page(&state, session.as_ref(), form, None, Some(result))
}

/// What `/race-lab` may be opened with: the form as it was, and why the
/// run was not fired.
#[derive(Deserialize)]
pub struct LabQuery {
    #[serde(flatten)]
    form: RunFields,
    #[serde(default)]
    refused: String,
    /// Whole seconds, as text: a flattened query reads every value as a
    /// string.
    #[serde(default)]
    wait_s: String,
}

/// The lab form's fields, as posted, or as carried back to the form when a
/// run could not start. Every field defaults to empty, so a damaged form
/// gets a sentence rather than a bare 400.
#[derive(Deserialize, Serialize, Default)]
#[serde(default)]
pub struct RunFields {
    /// Set by the compare form only: the layer it was to compare.
    #[serde(skip_serializing_if = "String::is_empty")]
    compared: String,
    preset: String,
    count: String,
    cooldown: String,
    keys: String,
    idempotency: String,
    row_guard: String,
    payout: String,
    bank: String,
}

#[derive(Deserialize)]
pub struct RunForm {
    csrf: String,
    #[serde(flatten)]
    fields: RunFields,
}

/// `POST /race-lab/runs`: fires the burst, keeps the results, and
/// redirects to them (post/redirect/get); a run that cannot start
/// redirects back to the form with the reason.
pub async fn fire(
    request: HttpRequest,
    form: web::Form<RunForm>,
    state: web::Data<AppState>,
) -> HttpResponse {
    let session = match session_for_form(&request, &state, &form.csrf).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let fields = &form.fields;
    let not_fired = |refusal: NotFired, wait_s: u64| back_to_the_lab(fields, refusal, wait_s, "");
    let run_request = match parse_run(fields, state.config.race_lab.requests_max)
        .and_then(|run_request| fits_in_a_run(&state, run_request))
    {
        Ok(run_request) => run_request,
        Err(refusal) => return not_fired(refusal, 0),
    };
    let Some(cookie) = request.cookie(auth::SESSION_COOKIE) else {
        return redirect("/signin");
    };
    let run = match run::run(&state, &session.token, cookie.value(), run_request).await {
        Ok(run) => run,
        Err(error) => {
            let (refusal, wait_s) = NotFired::because(error);
            return not_fired(refusal, wait_s);
        }
    };
    let view = RunView::of(&state, &run);
    let kept = kept_pages::keep(
        &state.db,
        session.token.user_id,
        Kind::RaceLabRun,
        &view,
        state.config.race_lab.results,
    )
    .await;
    match kept {
        Ok(id) => redirect(&format!("/race-lab/runs/{id}")),
        Err(error) => {
            // The run happened and its results are in hand: show them here
            // rather than lose them, and say that they have no address.
            tracing::error!(error = %error, "database error while keeping a race-lab run's results");
            let form = LabForm::of(&run.request);
            let problem = "These results could not be kept, so this page has no address of its own: reloading it \
                           would fire again. Only lab money moved.";
            lab_page(
                &state,
                Some(&session),
                form,
                Some(problem.to_owned()),
                Some((None, view)),
            )
        }
    }
}

/// Back to the lab's form, as it was posted (`fields`), with the reason
/// nothing was fired; `anchor` is where on the page the form is.
fn back_to_the_lab(fields: &impl Serialize, refusal: NotFired, wait_s: u64, anchor: &str) -> HttpResponse {
    let query = serde_urlencoded::to_string(fields).unwrap_or_default();
    redirect(&format!(
        "/race-lab?{query}&refused={}&wait_s={wait_s}{anchor}",
        refusal.slug()
    ))
}

/// The retry preset waits out a cooldown window inside the run: with a
/// window longer than a run may last, it cannot be fired here.
fn fits_in_a_run(state: &AppState, run_request: RunRequest) -> Result<RunRequest, NotFired> {
    let needed = state.config.cooldown.ttl + Duration::from_secs(5);
    if run_request.preset == Preset::RetryAfterWindow && needed > state.config.race_lab.run_max {
        return Err(NotFired::WindowTooLong);
    }
    Ok(run_request)
}

fn parse_run(form: &RunFields, requests_max: usize) -> Result<RunRequest, NotFired> {
    let preset = Preset::from_slug(&form.preset).ok_or(NotFired::NoPreset)?;
    let count = parse_count(&form.count, requests_max)?;
    // Deliveries carry their event's id, and payout orders a key each,
    // whatever the keys field says.
    let keys = match KeyStrategy::from_slug(&form.keys) {
        _ if preset.is_delivery() || preset.is_payout() => preset.default_keys(),
        Some(keys) => keys,
        None => return Err(NotFired::NoKeys),
    };
    let switches = Switches {
        cooldown: form.cooldown == "on",
        idempotency: parse_choice(&form.idempotency)
            .filter(|mode| *mode != IdempotencyMode::Off)
            .unwrap_or(IdempotencyMode::Atomic),
        row_guard: parse_choice(&form.row_guard).unwrap_or(RowGuardMode::Guarded),
        run: Some(uuid::Uuid::new_v4()),
        payout_mode: parse_choice(&form.payout).unwrap_or(PayoutMode::Outbox),
        bank_deduplicates: form.bank != "no_deduplication",
    };
    Ok(RunRequest {
        preset,
        count,
        switches,
        keys,
    })
}

/// The number of requests fired at once, as typed.
fn parse_count(count: &str, requests_max: usize) -> Result<usize, NotFired> {
    count
        .trim()
        .parse::<usize>()
        .ok()
        .filter(|count| (2..=requests_max).contains(count))
        .ok_or(NotFired::BadCount)
}

/// How long results are kept, in words.
fn retention_in_words(state: &AppState) -> String {
    let hours = state.config.race_lab.results.retention.as_secs() / 3_600;
    match hours {
        h if h % 24 == 0 && h >= 48 => format!("{} days", h / 24),
        24 => "a day".to_owned(),
        1 => "an hour".to_owned(),
        h => format!("{h} hours"),
    }
}

fn lab_page(
    state: &AppState,
    session: Option<&crate::web::Session>,
    form: LabForm,
    problem: Option<String>,
    result: Option<(Option<uuid::Uuid>, RunView)>,
) -> HttpResponse {
    let compare = CompareForm::defaults(state.config.race_lab.requests_max);
    lab_page_with(state, session, form, (problem, result), (compare, None))
}

/// The lab with the fire form's problem and result, and the compare form
/// with its own problem.
fn lab_page_with(
    state: &AppState,
    session: Option<&crate::web::Session>,
    form: LabForm,
    (problem, result): (Option<String>, Option<(Option<uuid::Uuid>, RunView)>),
    (compare, compare_problem): (CompareForm, Option<String>),
) -> HttpResponse {
    let lab = &state.config.race_lab;
    with_page(
        StatusCode::OK,
        RaceLabPage {
            chrome: Chrome::new(state, "Race lab", session),
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
            retention: retention_in_words(state),
            problem,
            result,
            idempotency_choices: IDEMPOTENCY_CHOICES.iter().map(FormChoice::of).collect(),
            row_guard_choices: ROW_GUARD_CHOICES.iter().map(FormChoice::of).collect(),
            compare,
            compare_choices: CompareChoices::offered(),
            compare_problem,
        },
    )
}

impl FormChoice {
    fn of<T>(choice: &Choice<T>) -> Self
    where
        T: crate::settings::SettingValue + PartialEq + for<'de> Deserialize<'de>,
    {
        Self {
            value: choice_name(&choice.mode),
            words: choice.on_the_form,
        }
    }
}

impl LabForm {
    fn defaults(preset: Preset, count: usize) -> Self {
        let switches = preset.default_switches();
        Self {
            preset: preset.slug(),
            count,
            cooldown: switches.cooldown,
            keys: preset.default_keys().slug(),
            idempotency: choice_name(&switches.idempotency),
            row_guard: choice_name(&switches.row_guard),
            payout_mode: choice_name(&switches.payout_mode),
            bank_deduplicates: switches.bank_deduplicates,
        }
    }

    fn of(request: &RunRequest) -> Self {
        Self {
            preset: request.preset.slug(),
            count: request.count,
            cooldown: request.switches.cooldown,
            keys: request.keys.slug(),
            idempotency: choice_name(&request.switches.idempotency),
            row_guard: choice_name(&request.switches.row_guard),
            payout_mode: choice_name(&request.switches.payout_mode),
            bank_deduplicates: request.switches.bank_deduplicates,
        }
    }
}
