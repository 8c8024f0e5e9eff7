//! One race-lab run: reset the visitor's lab wallets, fire the preset's
//! bursts through the public endpoint, then read what happened from the
//! database.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

use super::bank::BankCounts;
use super::burst::{self, Answer, SwitchesWithPasses, Target};
use super::judgement::{Damage, Judgement};
use super::presets::{Funnel, KeyStrategy, Plan, Preset};
use super::{LabState, Switches};
use crate::auth::VerifiedToken;
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
    /// Whether the preset's promise held, judged from the database.
    pub kept: bool,
    /// What the run showed against what its switches predict.
    pub judgement: Judgement,
    pub damage: Damage,
    /// For a payout run, what the lab's bank was asked.
    pub bank: BankCounts,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("this instance is already firing as many race-lab runs as it may")]
    Busy,
    #[error("another race-lab run of yours is still going")]
    AlreadyRunning,
    /// The visitor's last run started less than `race_lab_run_spacing_ms`
    /// ago, or they have started `race_lab_runs_per_user_per_minute_max`
    /// runs in the last minute.
    #[error("too many race-lab runs of yours; the next may start in {} ms", .retry_after.as_millis())]
    TooSoon { retry_after: Duration },
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

/// A visitor's leave to fire: this instance's capacity for their requests,
/// their run lease across instances, and their quota. Held for as long as
/// the runs it admits last; `end` lets go of it.
pub struct Admission<'a> {
    _slot: tokio::sync::SemaphorePermit<'a>,
    _requests: tokio::sync::SemaphorePermit<'a>,
    lease: sqlx::Transaction<'static, sqlx::Postgres>,
}

impl Admission<'_> {
    pub async fn end(self) -> Result<(), RunError> {
        self.lease.rollback().await?;
        Ok(())
    }
}

/// Admits one start of `requests_at_once` requests at a time: a run, or a
/// comparison, which fires its runs one after another and counts as one
/// against the visitor's spacing and quota.
pub async fn admit(
    state: &AppState,
    user: UserId,
    requests_at_once: usize,
) -> Result<Admission<'_>, RunError> {
    let slot = state.lab_runs.try_acquire().map_err(|_| RunError::Busy)?;
    // Every lab request in flight on this instance holds one permit, so all
    // runs together stay within `race_lab_requests_in_flight_max`.
    let requests = u32::try_from(requests_at_once).map_err(|_| RunError::Busy)?;
    let requests = state
        .lab_requests
        .try_acquire_many(requests)
        .map_err(|_| RunError::Busy)?;
    // One run per visitor at a time, across instances: a transaction-scoped
    // advisory lock, released when the lease ends, however the run ends.
    let mut lease = state.db.begin().await?;
    let leased: bool =
        sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtextextended('race-lab:' || $1::text, 0))")
            .bind(user.0)
            .fetch_one(&mut *lease)
            .await?;
    if !leased {
        return Err(RunError::AlreadyRunning);
    }
    start_within_quota(state, user).await?;
    Ok(Admission {
        _slot: slot,
        _requests: requests,
        lease,
    })
}

pub async fn run(
    state: &AppState,
    caller: &VerifiedToken,
    bearer_token: &str,
    request: RunRequest,
) -> Result<Run, RunError> {
    let admission = admit(state, caller.user_id, request.count).await?;
    let run = run_admitted(state, caller, bearer_token, request).await?;
    admission.end().await?;
    Ok(run)
}

/// One run, once admitted: refill the lab wallets, fire, read and judge.
pub async fn run_admitted(
    state: &AppState,
    caller: &VerifiedToken,
    bearer_token: &str,
    request: RunRequest,
) -> Result<Run, RunError> {
    let user = caller.user_id;
    let lab = &state.config.race_lab;
    let wallets = super::reset(&state.db, user, lab.balance_minor).await?;
    let plan = request.preset.plan(
        wallets,
        request.count,
        lab.balance_minor,
        request.keys,
        state.config.cooldown.ttl,
    );
    // What the run uses: a deployment with the switches off runs every
    // layer whatever was asked.
    let used = if lab.switches_enabled {
        request.switches
    } else {
        Switches::ALL_ON
    };
    let mut bank = BankCounts::default();
    let (answers, overlap_max, wave_max) = if request.preset.is_payout() {
        let orders: Vec<_> = plan.waves.iter().flatten().cloned().collect();
        let (paid, asked) = super::payouts::pay_out(state, caller, used, &orders, lab.run_max).await;
        bank = asked;
        (paid.answers, paid.overlap_max, orders.len())
    } else if request.preset.is_delivery() {
        let delivered = super::deliveries::deliver(state, user, wallets, used, &plan.waves, plan.pause).await;
        let wave_max = plan.waves.iter().map(Vec::len).max().unwrap_or(0);
        (delivered.answers, delivered.overlap_max, wave_max)
    } else {
        fire_transfers(state, user, bearer_token, &request, &plan).await
    };
    let funnel = Funnel::of(&answers);
    let lab_state = LabState::read(&state.db, user).await?;
    let kept = request.preset.kept(&funnel, &lab_state, &plan, lab.balance_minor);
    let damage = Damage::of(request.preset, &lab_state, plan.amount_minor);
    let judgement = Judgement::of(request.preset, &used, request.keys, &funnel, kept, &damage);
    // The run's keys served their purpose inside it; left, a visitor firing
    // run after run would pile up keys until their retention ends.
    let keys: Vec<uuid::Uuid> = plan.waves.iter().flatten().filter_map(|shot| shot.key).collect();
    sqlx::query("DELETE FROM idempotency_keys WHERE user_id = $1 AND key = ANY ($2)")
        .bind(user.0)
        .bind(&keys)
        .execute(&state.db)
        .await?;
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
        judgement,
        damage,
        bank,
    })
}

/// Fires the plan's waves of transfers through the public endpoint, one
/// wave after another; returns every answer, and the overlap and size of
/// the largest wave.
async fn fire_transfers(
    state: &AppState,
    user: UserId,
    bearer_token: &str,
    request: &RunRequest,
    plan: &Plan,
) -> (Vec<Answer>, usize, usize) {
    let lab = &state.config.race_lab;
    let switches = match request.switches.run {
        Some(run) if lab.switches_enabled => Some(SwitchesWithPasses {
            header: request.switches.header_value(),
            passes: &state.lab_passes,
            user,
            run,
            // Minted just before its request is sent.
            pass_lifetime: lab.pass_lifetime,
            next_shot: AtomicU32::new(0),
        }),
        _ => None,
    };
    let target = Target {
        address: state.public_address,
        bearer_token,
        switches,
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
    (answers, overlap_max, wave_max)
}

/// Records the start of a run, or refuses it when the visitor's last run
/// started less than `race_lab_run_spacing_ms` ago, or when they started
/// `race_lab_runs_per_user_per_minute_max` runs in the last minute. Called
/// while holding the visitor's run lease, so instances cannot race here;
/// the record commits on its own, since the lease's transaction is rolled
/// back.
async fn start_within_quota(state: &AppState, user: UserId) -> Result<(), RunError> {
    let lab = &state.config.race_lab;
    let (runs_last_minute, since_last_ms, until_quota_ms): (i64, Option<f64>, Option<f64>) = sqlx::query_as(
        "WITH gone AS (
             DELETE FROM race_lab_runs WHERE user_id = $1 AND started_at < clock_timestamp() - interval '1 minute'
         ),
         recent AS (
             SELECT started_at FROM race_lab_runs
              WHERE user_id = $1 AND started_at >= clock_timestamp() - interval '1 minute'
         )
         SELECT count(*),
                (extract(epoch FROM clock_timestamp() - max(started_at)) * 1000)::float8,
                (extract(epoch FROM min(started_at) + interval '1 minute' - clock_timestamp()) * 1000)::float8
           FROM recent",
    )
    .bind(user.0)
    .fetch_one(&state.db)
    .await?;
    let spacing_ms = lab.run_spacing.as_secs_f64() * 1000.0;
    let wait_ms = match (since_last_ms, until_quota_ms) {
        _ if runs_last_minute >= i64::from(lab.runs_per_user_per_minute_max) => until_quota_ms,
        (Some(since), _) if since < spacing_ms => Some(spacing_ms - since),
        _ => None,
    };
    if let Some(wait_ms) = wait_ms {
        return Err(RunError::TooSoon {
            retry_after: Duration::from_secs_f64(wait_ms.max(1.0) / 1000.0),
        });
    }
    sqlx::query("INSERT INTO race_lab_runs (user_id) VALUES ($1)")
        .bind(user.0)
        .execute(&state.db)
        .await?;
    Ok(())
}
