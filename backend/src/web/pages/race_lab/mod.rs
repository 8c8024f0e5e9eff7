//! The race lab and the live feed pages.
//!
//! The lab's form posts to `/race-lab/runs`; the server fires the burst
//! (`race_lab::run`) and answers with the page and its results: a timeline,
//! the funnel, the money checked against the database, and the answers
//! grouped by how they ended.

use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use askama_web::WebTemplate;
use serde::Deserialize;

use crate::auth;
use crate::race_lab::presets::{KeyStrategy, Preset};
use crate::race_lab::run::{self, RunError, RunRequest};
use crate::race_lab::{LAB_CURRENCY, Switches};
use crate::settings::{IdempotencyMode, RowGuardMode};
use crate::state::AppState;
use crate::web::money;

use super::*;
use results::RunView;

mod results;

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
        Err(RunError::TooSoon { retry_after }) => lab_page(
            &state,
            &session,
            StatusCode::TOO_MANY_REQUESTS,
            lab_form,
            Some(format!(
                "You started runs too quickly: the lab spaces each visitor's runs so that it never slows other \
                 people's transfers. Nothing was sent; fire again in {} s.",
                retry_after.as_millis().div_ceil(1000).max(1)
            )),
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
