//! Why a run or a comparison was not fired, carried in the address the
//! form redirects to, and said in a sentence on the lab's page.

use crate::race_lab::run::RunError;
use crate::state::AppState;

/// Why a run was not fired. Carried in the address the form redirects to,
/// as a slug, so that the page can say it after post/redirect/get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NotFired {
    NoPreset,
    BadCount,
    NoKeys,
    WindowTooLong,
    Busy,
    AlreadyRunning,
    TooSoon,
    DatabaseLost,
    NoLayer,
    SwitchesOff,
}

impl NotFired {
    const ALL: [NotFired; 10] = [
        NotFired::NoPreset,
        NotFired::BadCount,
        NotFired::NoKeys,
        NotFired::WindowTooLong,
        NotFired::Busy,
        NotFired::AlreadyRunning,
        NotFired::TooSoon,
        NotFired::DatabaseLost,
        NotFired::NoLayer,
        NotFired::SwitchesOff,
    ];

    pub(super) fn slug(self) -> &'static str {
        match self {
            NotFired::NoPreset => "no-preset",
            NotFired::BadCount => "bad-count",
            NotFired::NoKeys => "no-keys",
            NotFired::WindowTooLong => "window-too-long",
            NotFired::Busy => "busy",
            NotFired::AlreadyRunning => "already-running",
            NotFired::TooSoon => "too-soon",
            NotFired::DatabaseLost => "database-lost",
            NotFired::NoLayer => "no-layer",
            NotFired::SwitchesOff => "switches-off",
        }
    }

    pub(super) fn from_slug(slug: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|refusal| refusal.slug() == slug)
    }

    pub(super) fn sentence(self, state: &AppState, wait_s: u64) -> String {
        let requests_max = state.config.race_lab.requests_max;
        match self {
            NotFired::NoPreset => "Choose one of the presets. Nothing was sent.".to_owned(),
            NotFired::BadCount => {
                format!("The number of requests must be a whole number from 2 to {requests_max}. Nothing was sent.")
            }
            NotFired::NoKeys => "Choose which idempotency keys the requests carry. Nothing was sent.".to_owned(),
            NotFired::WindowTooLong => format!(
                "The cooldown window here lasts {} s, longer than a race-lab run may wait, so this preset cannot run \
                 on this deployment. Nothing was sent.",
                state.config.cooldown.ttl.as_secs()
            ),
            NotFired::Busy => {
                "The race lab is busy with other visitors' runs. Nothing was sent; try again in a few seconds."
                    .to_owned()
            }
            NotFired::AlreadyRunning => "Another run of yours is still going, perhaps in another tab. Nothing was \
                                         sent; wait for it to finish."
                .to_owned(),
            NotFired::TooSoon => format!(
                "You started runs too quickly: the lab spaces each visitor's runs so that it never slows other \
                 people's transfers. Nothing was sent; fire again in {} s.",
                wait_s.max(1)
            ),
            NotFired::DatabaseLost => "The race lab lost the database during this run, so it cannot show what \
                                       happened. Only lab money can have moved: your real balance is untouched. Fire \
                                       again in a moment; the next run starts from refilled lab wallets."
                .to_owned(),
            NotFired::NoLayer => "Choose the layer whose alternatives to compare. Nothing was sent.".to_owned(),
            NotFired::SwitchesOff => "This deployment keeps every defense on in the race lab, so there are no \
                                      alternatives to compare. Nothing was sent."
                .to_owned(),
        }
    }

    /// Why a run or a comparison that was admitted could not go on, and
    /// how many whole seconds to wait, if that is why.
    pub(super) fn because(error: RunError) -> (NotFired, u64) {
        match error {
            RunError::Busy => (NotFired::Busy, 0),
            RunError::AlreadyRunning => (NotFired::AlreadyRunning, 0),
            RunError::TooSoon { retry_after } => {
                (NotFired::TooSoon, retry_after.as_millis().div_ceil(1000) as u64)
            }
            RunError::Database(error) => {
                tracing::error!(error = %error, "database error during a race-lab run");
                (NotFired::DatabaseLost, 0)
            }
        }
    }
}
