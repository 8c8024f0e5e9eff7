//! What the live decision feed reads: its queue, budget and streams.

use std::time::Duration;

use crate::settings::Settings;

#[derive(Debug, Clone)]
pub struct Feed {
    pub enabled: bool,
    pub queue_entries_max: usize,
    pub write_interval: Duration,
    pub entries_per_user_max: u64,
    pub lab_entries_per_user_max: u64,
    pub retention: Duration,
    pub entries_max: u64,
    pub drop_notice: Duration,
    pub page_entries_max: usize,
    pub streams_max: usize,
    pub stream_keepalive: Duration,
    pub stream_token_check: Duration,
    pub stream_lifetime: Duration,
    pub stream_idle: Duration,
    pub streams_per_user_max: usize,
    pub streams_per_address_max: usize,
}

impl From<&Settings> for Feed {
    fn from(s: &Settings) -> Self {
        Self {
            enabled: s.decision_feed_enabled,
            queue_entries_max: s.decision_feed_queue_entries_max,
            write_interval: Duration::from_millis(s.decision_feed_write_interval_ms),
            entries_per_user_max: s.decision_feed_entries_per_user_max,
            lab_entries_per_user_max: s.decision_feed_lab_entries_per_user_max,
            // An hour count out of bounds is reported and the `Config`
            // thrown away; saturating keeps it from overflowing meanwhile.
            retention: Duration::from_secs(s.decision_feed_retention_hours.saturating_mul(3_600)),
            entries_max: s.decision_feed_entries_max,
            drop_notice: Duration::from_secs(s.decision_feed_drop_notice_s),
            page_entries_max: s.decisions_page_entries_max,
            streams_max: s.decision_streams_max,
            stream_keepalive: Duration::from_millis(s.decision_stream_keepalive_ms),
            stream_token_check: Duration::from_secs(s.decision_stream_token_check_s),
            stream_lifetime: Duration::from_secs(s.decision_stream_lifetime_s),
            stream_idle: Duration::from_secs(s.decision_stream_idle_s),
            streams_per_user_max: s.decision_streams_per_user_max,
            streams_per_address_max: s.decision_streams_per_address_max,
        }
    }
}
