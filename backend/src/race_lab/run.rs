//! One race-lab run: reset the visitor's lab wallets, fire the preset's
//! bursts through the public endpoint, then read what happened from the
//! database.

use std::time::Duration;

use super::burst::{self, Answer, Target};
use super::presets::{Funnel, KeyStrategy, Plan, Preset};
use super::{LabState, Switches};
use crate::domain::UserId;
use crate::state::AppState;

/// What the visitor asked for.
#[derive(Debug, Clone, Copy)]
pub struct RunRequest {
    pub preset: Preset,
    pub count: usize,
    pub switches: Switches,
    pub keys: KeyStrategy,
}

/// What a run did, checked against the database.
pub struct Run {
    pub request: RunRequest,
    pub balance_minor: i64,
    pub plan: Plan,
    /// Every answer, in the order the requests were sent.
    pub answers: Vec<Answer>,
    /// The most requests in flight at once, in the largest wave.
    pub overlap_max: usize,
    /// The size of the largest wave: what the overlap is measured against.
    pub wave_max: usize,
    pub funnel: Funnel,
    pub state: LabState,
    pub kept: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("this instance is already firing as many race-lab runs as it may")]
    Busy,
    #[error("another race-lab run of yours is still going")]
    AlreadyRunning,
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

pub async fn run(
    state: &AppState,
    user: UserId,
    bearer_token: &str,
    request: RunRequest,
) -> Result<Run, RunError> {
    let lab = &state.config.race_lab;
    let _slot = state.lab_runs.try_acquire().map_err(|_| RunError::Busy)?;
    // One run per visitor at a time, across instances: a transaction-scoped
    // advisory lock, released when `_lease` is dropped, however the run ends.
    let mut lease = state.db.begin().await?;
    let leased: bool =
        sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtextextended('race-lab:' || $1::text, 0))")
            .bind(user.0)
            .fetch_one(&mut *lease)
            .await?;
    if !leased {
        return Err(RunError::AlreadyRunning);
    }
    let wallets = super::reset(&state.db, user, lab.balance_minor).await?;
    let plan = request.preset.plan(
        wallets,
        request.count,
        lab.balance_minor,
        request.keys,
        state.config.cooldown.ttl,
    );
    let switches_header = (state.config.race_lab.switches_enabled).then(|| request.switches.header_value());
    let target = Target {
        address: state.public_address,
        bearer_token,
        switches_header,
        give_up_after: lab.run_max,
    };
    let mut answers = Vec::with_capacity(request.count);
    let (mut overlap_max, mut wave_max) = (0, 0);
    for (index, wave) in plan.waves.iter().enumerate() {
        if index > 0 {
            tokio::time::sleep(plan.pause).await;
        }
        let offset = answers
            .last()
            .map_or(Duration::ZERO, |answer: &Answer| answer.answered + plan.pause);
        let fired = burst::fire(&target, wave.clone()).await;
        if wave.len() >= wave_max {
            wave_max = wave.len();
            overlap_max = fired.overlap_max;
        }
        answers.extend(fired.answers.into_iter().map(|mut answer| {
            answer.sent += offset;
            answer.answered += offset;
            answer
        }));
    }
    let funnel = Funnel::of(&answers);
    let lab_state = LabState::read(&state.db, user).await?;
    let kept = request.preset.kept(&funnel, &lab_state, &plan, lab.balance_minor);
    // The run's keys served their purpose inside it; left, a visitor firing
    // run after run would pile up keys until their retention ends.
    let keys: Vec<uuid::Uuid> = plan.waves.iter().flatten().filter_map(|shot| shot.key).collect();
    sqlx::query("DELETE FROM idempotency_keys WHERE user_id = $1 AND key = ANY ($2)")
        .bind(user.0)
        .bind(&keys)
        .execute(&state.db)
        .await?;
    lease.rollback().await?;
    Ok(Run {
        request,
        balance_minor: lab.balance_minor,
        plan,
        answers,
        overlap_max,
        wave_max,
        funnel,
        state: lab_state,
        kept,
    })
}
