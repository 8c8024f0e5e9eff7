//! What the demonstrations read: the browser demo and the race lab.

use std::time::Duration;

use crate::settings::Settings;

#[derive(Debug, Clone)]
pub struct Demo {
    pub allow_unsafe_modes: bool,
    /// The pause inside the naive variants' race windows.
    pub naive_window: Duration,
    /// A trace viewer's URL with `{trace_id}` in it; empty: no links.
    pub trace_ui_url: String,
    /// Empty: no demo recipient.
    pub recipient_name: String,
    /// How long the page a wallet form leads to is kept; one per person.
    pub wallet_pages: crate::kept_pages::Bounds,
}

impl From<&Settings> for Demo {
    fn from(s: &Settings) -> Self {
        Self {
            allow_unsafe_modes: s.allow_unsafe_demo_modes,
            naive_window: Duration::from_millis(s.naive_window_ms),
            trace_ui_url: s.trace_ui_url.clone(),
            recipient_name: s.demo_recipient_name.trim().to_owned(),
            // One per person: their next form replaces it.
            wallet_pages: crate::kept_pages::Bounds {
                retention: Duration::from_secs(s.wallet_page_retention_s),
                per_user_max: 1,
            },
        }
    }
}

#[derive(Debug, Clone)]
pub struct RaceLab {
    pub switches_enabled: bool,
    pub requests_max: usize,
    pub runs_in_flight_max: usize,
    pub balance_minor: i64,
    pub run_max: Duration,
    pub naive_window: Duration,
    pub run_spacing: Duration,
    pub runs_per_user_per_minute_max: u32,
    pub requests_in_flight_max: usize,
    pub db_connections_max: usize,
    pub pass_lifetime: Duration,
    pub passes_held_max: usize,
    /// How long a run's results are kept at their address, and how many
    /// one visitor keeps.
    pub results: crate::kept_pages::Bounds,
}

impl From<&Settings> for RaceLab {
    fn from(s: &Settings) -> Self {
        Self {
            switches_enabled: s.race_lab_switches_enabled,
            requests_max: s.race_lab_requests_max,
            runs_in_flight_max: s.race_lab_runs_in_flight_max,
            balance_minor: s.race_lab_balance_minor,
            run_max: Duration::from_millis(s.race_lab_run_ms_max),
            naive_window: Duration::from_millis(s.race_lab_naive_window_ms),
            run_spacing: Duration::from_millis(s.race_lab_run_spacing_ms),
            runs_per_user_per_minute_max: s.race_lab_runs_per_user_per_minute_max,
            requests_in_flight_max: s.race_lab_requests_in_flight_max,
            pass_lifetime: Duration::from_millis(s.race_lab_pass_lifetime_ms),
            passes_held_max: s.race_lab_passes_held_max,
            results: crate::kept_pages::Bounds {
                retention: Duration::from_secs(s.race_lab_result_retention_hours * 3_600),
                per_user_max: s.race_lab_results_per_user_max,
            },
            // At most all but one of the pool's connections (at least one),
            // so that real transfers always have one to take.
            db_connections_max: (s.race_lab_db_connections_max as usize)
                .min((s.db_pool_connections_max as usize).saturating_sub(1).max(1)),
        }
    }
}
