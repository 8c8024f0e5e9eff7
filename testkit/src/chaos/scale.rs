use std::time::Duration;

/// How big a run is. `CHAOS_FULL=1` gives the run `docs/reliability.md`
/// reports; without it, the subset CI runs on every change.
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    pub instances: usize,
    pub keyed_clients: usize,
    pub keyless_users: usize,
    pub before_fault: Duration,
    pub fault_length: Duration,
    pub after_fault: Duration,
}

impl Scale {
    pub fn from_env() -> Self {
        if std::env::var_os("CHAOS_FULL").is_some() {
            Self {
                instances: 3,
                keyed_clients: 40,
                keyless_users: 10,
                before_fault: Duration::from_secs(3),
                fault_length: Duration::from_secs(3),
                after_fault: Duration::from_secs(3),
            }
        } else {
            Self {
                instances: 3,
                keyed_clients: 12,
                keyless_users: 4,
                before_fault: Duration::from_millis(1_500),
                fault_length: Duration::from_secs(2),
                after_fault: Duration::from_millis(1_500),
            }
        }
    }
}
