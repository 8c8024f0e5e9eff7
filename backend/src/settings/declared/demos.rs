//! The settings of the demonstrations: the unsafe modes, the race lab and
//! the browser demo.
//!
//! Declared as `declared.rs` says: this file's macro adds its sections to
//! those gathered before it. The types it names are in scope where the
//! declaration expands, in `declared.rs`.

/// Adds this file's sections to the declaration (`declare_settings!`'s
/// `@gather`).
macro_rules! demos_settings {
    ([$($files:ident)*] $($sections:tt)*) => {
        $crate::settings::declare::declare_settings! { @gather [$($files)*] $($sections)*
            section "Unsafe demonstration modes" {
                /// Must be on for the server to start with any layer disabled or in a
                /// naive mode. Never in production.
                allow_unsafe_demo_modes: bool = false;
                /// A pause inside the naive variants' race windows (between check and
                /// insert, between read and write), so that demonstrations of the races
                /// they allow are reliable rather than lucky.
                naive_window_ms: u64 = 0, within 0..=10_000 "ms";
            }

            section "Race lab" {
                /// Lets a race-lab run switch layers off for its own lab wallets; real
                /// wallets refuse the switches whatever this says. Off: every run goes
                /// through all three layers.
                race_lab_switches_enabled: bool = true;
                /// Requests one race-lab run fires at once.
                race_lab_requests_max: usize = 200, within 2..=1_000 "requests";
                /// Race-lab runs one instance fires at once; a further one is refused.
                race_lab_runs_in_flight_max: usize = 2, within 1..=64 "runs";
                /// What each of a visitor's two lab wallets holds when a run starts.
                race_lab_balance_minor: i64 = 10_000, within 100..=1_000_000_000 "minor units";
                /// A run's requests are given up after this long (the retry preset
                /// waits out the cooldown window inside it).
                race_lab_run_ms_max: u64 = 30_000, within 1_000..=600_000 "ms";
                /// The pause inside a lab run's naive race windows (check-then-insert,
                /// read-decide-write), so that the race a switched-off layer allows
                /// shows on every run rather than by luck.
                race_lab_naive_window_ms: u64 = 50, within 0..=1_000 "ms";
                /// A visitor's runs start at least this far apart, across instances.
                race_lab_run_spacing_ms: u64 = 1_000, within 0..=600_000 "ms";
                /// Runs one visitor may start in any minute, across instances.
                race_lab_runs_per_user_per_minute_max: u32 = 10, within 1..=1_000 "runs";
                /// Lab requests all runs on one instance may have in flight at once: a
                /// run that would pass it is refused, so the lab cannot starve real
                /// transfers of workers and connections.
                race_lab_requests_in_flight_max: usize = 400, within 2..=10_000 "requests";
                /// PostgreSQL connections the lab's transactions hold at once; further
                /// lab requests wait for one, so a burst never takes the pool from real
                /// transfers. At most all but one of `db_pool_connections_max` are used.
                race_lab_db_connections_max: u32 = 4, within 1..=1_000 "connections";
                /// How long a lab request's pass is valid after the burst mints it,
                /// just before sending the request.
                race_lab_pass_lifetime_ms: u64 = 5_000, within 100..=600_000 "ms";
                /// Used passes one instance remembers until they expire, so that none
                /// is accepted twice. Past it, lab requests are answered busy.
                race_lab_passes_held_max: usize = 20_000, within 100..=1_000_000 "passes";
                /// How long a run's results stay at their address
                /// (`/race-lab/runs/{id}`); the sweeper deletes them after it.
                race_lab_result_retention_hours: u64 = 168, within 1..=8_760 "hours";
                /// Results one visitor keeps at once: a newer run's results push out
                /// their oldest. At least four, since a comparison is four runs.
                race_lab_results_per_user_max: i64 = 50, within 4..=10_000 "results";
            }

            section "Browser demo" {
                /// An account made at start-up (after migrations) that anyone can send
                /// to and nobody can sign in as, so that a lone visitor has a
                /// recipient. Empty: none.
                demo_recipient_name: String = "demo".into();
                /// A trace viewer's URL with `{trace_id}` in it, e.g.
                /// `http://127.0.0.1:16686/trace/{trace_id}` for Jaeger; the race lab
                /// links each request to its trace. Empty: no links.
                trace_ui_url: String = String::new(), empty "no links";
                /// How long the page a wallet form leads to (a review, or what
                /// happened after Send) stays at its address, so that reloading it
                /// shows it again. One per person; their next form replaces it.
                wallet_page_retention_s: u64 = 3_600, within 10..=86_400 "s";
            }

        }
    };
}

pub(super) use demos_settings;
