//! What this server dropped instead of writing, and why: the feed page
//! tells its readers, since their entries may be among them.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::time_delta;

/// Why this server dropped entries instead of writing them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Decisions came faster than the writer could send them.
    QueueFull,
    /// Redis failed or did not answer in time.
    RedisFailed,
}

/// Entries this server dropped for one reason, recently.
#[derive(Debug, Clone, PartialEq)]
pub struct Drops {
    pub reason: DropReason,
    pub entries: u64,
    pub first: DateTime<Utc>,
    pub last: DateTime<Utc>,
}

/// This server's recent drops, one record per reason, for the feed page.
#[derive(Default)]
pub(super) struct DropLog {
    by_reason: std::sync::Mutex<Vec<Drops>>,
}

impl DropLog {
    /// Adds `entries` to the reason's record, or starts a new one when the
    /// last is older than `notice`.
    pub(super) fn record(&self, reason: DropReason, entries: u64, notice: Duration) {
        let now = Utc::now();
        let mut by_reason = self
            .by_reason
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match by_reason.iter_mut().find(|drops| drops.reason == reason) {
            Some(drops) if now - drops.last <= time_delta(notice) => {
                drops.entries += entries;
                drops.last = now;
            }
            Some(drops) => {
                *drops = Drops {
                    reason,
                    entries,
                    first: now,
                    last: now,
                };
            }
            None => by_reason.push(Drops {
                reason,
                entries,
                first: now,
                last: now,
            }),
        }
    }

    pub(super) fn recent(&self, notice: Duration) -> Vec<Drops> {
        let now = Utc::now();
        let by_reason = self
            .by_reason
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        by_reason
            .iter()
            .filter(|drops| now - drops.last <= time_delta(notice))
            .cloned()
            .collect()
    }
}
