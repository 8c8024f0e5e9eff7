//! The lab's comparison: one burst fired at each way of doing one layer,
//! one run after another, each from refilled lab wallets, so that the
//! alternatives can be read side by side with the damage each let through.

use super::Switches;
use super::presets::Preset;
use super::run::{self, Run, RunError, RunRequest};
use super::switches::{IDEMPOTENCY_CHOICES, ROW_GUARD_CHOICES, name_of};
use crate::auth::VerifiedToken;
use crate::state::AppState;

/// The layer whose alternatives a comparison runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compared {
    RowGuard,
    Idempotency,
    Cooldown,
}

/// The presets a comparison may fire: the transfers'. A delivery or a
/// payout has switches of its own, and the retry preset waits out a whole
/// cooldown window per run.
pub const PRESETS: [Preset; 4] = [
    Preset::Overdraw,
    Preset::Crossing,
    Preset::SameKey,
    Preset::DoubleClick,
];

impl Compared {
    pub const ALL: [Compared; 3] = [Compared::RowGuard, Compared::Idempotency, Compared::Cooldown];

    pub fn slug(self) -> &'static str {
        match self {
            Compared::RowGuard => "row_guard",
            Compared::Idempotency => "idempotency",
            Compared::Cooldown => "cooldown",
        }
    }

    pub fn from_slug(slug: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|compared| compared.slug() == slug)
    }

    pub fn label(self) -> &'static str {
        match self {
            Compared::RowGuard => "How the balance is guarded",
            Compared::Idempotency => "How the idempotency key is claimed",
            Compared::Cooldown => "The cooldown at the edge, or none",
        }
    }

    /// The preset that reaches the layer.
    pub fn preset(self) -> Preset {
        match self {
            Compared::RowGuard => Preset::Overdraw,
            Compared::Idempotency => Preset::SameKey,
            Compared::Cooldown => Preset::DoubleClick,
        }
    }

    /// Each alternative's switches. Comparing a layer behind the cooldown,
    /// every run has the cooldown off, or it would stop the copies before
    /// they reach the layer compared; the other layers are the service's.
    pub fn alternatives(self) -> Vec<Switches> {
        let behind_the_edge = Switches {
            cooldown: false,
            ..Switches::ALL_ON
        };
        match self {
            Compared::RowGuard => ROW_GUARD_CHOICES
                .iter()
                .map(|choice| Switches {
                    row_guard: choice.mode,
                    ..behind_the_edge
                })
                .collect(),
            Compared::Idempotency => IDEMPOTENCY_CHOICES
                .iter()
                .map(|choice| Switches {
                    idempotency: choice.mode,
                    ..behind_the_edge
                })
                .collect(),
            Compared::Cooldown => vec![Switches::ALL_ON, behind_the_edge],
        }
    }

    /// The alternative a run used, in a few words.
    pub fn name_of(self, used: &Switches) -> &'static str {
        match self {
            Compared::RowGuard => name_of(&ROW_GUARD_CHOICES, used.row_guard),
            Compared::Idempotency => name_of(&IDEMPOTENCY_CHOICES, used.idempotency),
            Compared::Cooldown if used.cooldown => "cooldown on (the service's)",
            Compared::Cooldown => "no cooldown",
        }
    }
}

/// What the visitor asked to compare.
#[derive(Debug, Clone, Copy)]
pub struct ComparisonRequest {
    pub compared: Compared,
    pub preset: Preset,
    pub count: usize,
}

/// Fires the preset once per alternative, in the order the alternatives
/// are listed, and returns each run. Admitted once, as one run: the
/// visitor's lease is held across all of them.
pub async fn compare(
    state: &AppState,
    caller: &VerifiedToken,
    bearer_token: &str,
    request: ComparisonRequest,
) -> Result<Vec<Run>, RunError> {
    let admission = run::admit(state, caller.user_id, request.count).await?;
    let mut runs = Vec::new();
    for switches in request.compared.alternatives() {
        let run_request = RunRequest {
            preset: request.preset,
            count: request.count,
            // A run of its own, so that each starts with its own cooldown
            // window.
            switches: Switches {
                run: Some(uuid::Uuid::new_v4()),
                ..switches
            },
            keys: request.preset.default_keys(),
        };
        runs.push(run::run_admitted(state, caller, bearer_token, run_request).await?);
    }
    admission.end().await?;
    Ok(runs)
}
