//! When the writer refreshes a stream's expiry: at most once per stream
//! per interval, not with every entry.

use std::time::Duration;

use super::Source;
use crate::domain::UserId;

/// How often, at most, the writer refreshes one stream's expiry.
pub(super) const EXPIRY_REFRESH_INTERVAL: Duration = Duration::from_secs(60);

/// Streams whose expiry the writer remembers refreshing in one interval;
/// beyond this, streams are refreshed with every batch again, so the memo
/// stays bounded whatever the number of users.
const EXPIRY_MEMO_STREAMS_MAX: usize = 100_000;

/// Which streams had their expiry refreshed recently. Two generations, each
/// one interval long: a stream refreshed in either is skipped, so each is
/// refreshed at most once per interval and at least once every two while
/// it is written (which `stream_lifetime` allows for).
pub(super) struct ExpiryMemo {
    current: std::collections::HashSet<(UserId, Source)>,
    previous: std::collections::HashSet<(UserId, Source)>,
    pub(super) generation_started: std::time::Instant,
}

impl ExpiryMemo {
    pub(super) fn new() -> Self {
        Self {
            current: std::collections::HashSet::new(),
            previous: std::collections::HashSet::new(),
            generation_started: std::time::Instant::now(),
        }
    }

    /// True when `user`'s stream needs its expiry refreshed now; remembers
    /// that it was.
    pub(super) fn needs_refresh(&mut self, stream: (UserId, Source), now: std::time::Instant) -> bool {
        if now.duration_since(self.generation_started) >= EXPIRY_REFRESH_INTERVAL {
            self.previous = std::mem::take(&mut self.current);
            self.generation_started = now;
        }
        if self.current.contains(&stream) || self.previous.contains(&stream) {
            return false;
        }
        if self.current.len() < EXPIRY_MEMO_STREAMS_MAX {
            self.current.insert(stream);
        }
        true
    }
}

/// How long a stream lives after a write: its retention plus two refresh
/// intervals, so that, refreshed at least once every two, it never expires
/// sooner than the retention after its last entry.
pub(super) fn stream_lifetime(retention: Duration) -> Duration {
    retention + 2 * EXPIRY_REFRESH_INTERVAL
}
