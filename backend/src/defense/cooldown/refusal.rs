//! The cooldown's 429: what happened, and when the next transfer is
//! possible, said to people.

use std::time::Duration;

use super::CooldownLock;
use crate::problem::{self, Problem, ProblemType};
use crate::settings::CooldownScope;

impl CooldownLock {
    /// The 429, saying what happened and when the next transfer is possible.
    pub(super) fn window_still_open(
        &self,
        retry_after: Duration,
        elapsed: Duration,
        last_refused: bool,
    ) -> Problem {
        let seconds = problem::retry_after_s(retry_after);
        let ago = if elapsed.as_secs() == 0 {
            "less than a second ago".to_owned()
        } else {
            format!("{} s ago", elapsed.as_secs())
        };
        let spacing = human_duration(self.ttl);
        // A refused attempt keeps its window too: a burst of one refused
        // request must still meet the edge, not the database.
        let (last, kept) = if last_refused {
            ("tried", " It was refused, and its window still holds.")
        } else {
            ("sent", "")
        };
        let detail = match self.scope {
            CooldownScope::UserAction => format!(
                "You {last} a transfer {ago}.{kept} Transfers are spaced at least {spacing} apart so that \
                 duplicates cannot slip through. Try again in {seconds} s."
            ),
            CooldownScope::UserActionBody => format!(
                "You {last} this same transfer {ago}.{kept} Identical transfers are spaced at least {spacing} \
                 apart so that duplicates cannot slip through. Try again in {seconds} s."
            ),
        };
        Problem::new(ProblemType::CooldownActive, detail)
            .detail_is_for_people()
            .with_retry_after_s(seconds)
    }
}

/// `5000` → `5 s`, `1500` → `1.5 s`, `300` → `300 ms`.
fn human_duration(duration: Duration) -> String {
    match duration.as_millis() {
        ms if ms < 1_000 => format!("{ms} ms"),
        ms if ms % 1_000 == 0 => format!("{} s", ms / 1_000),
        ms => format!("{:.1} s", ms as f64 / 1_000.0),
    }
}
