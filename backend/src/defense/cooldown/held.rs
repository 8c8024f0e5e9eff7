//! The windows this instance's own requests took, remembered until they
//! run out, so that a further attempt at one of them is refused here,
//! without a Redis round trip (see the module doc of `cooldown`, **Windows
//! this instance holds**).
//!
//! Why the memory is exact: only a window's holder changes it (gives it
//! back, marks it refused), the holder is a request on this instance, and
//! each change goes through here as well as to Redis. A window is
//! remembered until its TTL counted from before the `SET` was sent, which
//! is never later than Redis lets it expire. A revocation through this
//! instance forgets the user's windows, so that Redis, which knows it,
//! answers 401; `docs/layers.md` says what the memory cannot know.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::domain::UserId;

/// One window this instance holds.
struct Held {
    user: UserId,
    /// The holder's token: only the holder changes the window.
    token: String,
    /// Sent before this instant, so Redis keeps it at least until then.
    until: Instant,
    last_refused: bool,
}

/// The windows held here, at most `windows_max` of them.
pub(super) struct HeldWindows {
    windows: Mutex<Memory>,
    windows_max: usize,
}

struct Memory {
    windows: HashMap<String, Held>,
    /// When full of open windows: the earliest any of them runs out, before
    /// which a new window is not remembered without looking again, so that
    /// a full memory costs an acquisition no scan.
    full_until: Option<Instant>,
}

/// A remembered window that is still open.
pub(super) struct StillOpen {
    pub retry_after: Duration,
    pub last_refused: bool,
}

impl HeldWindows {
    /// Remembers at most `windows_max` windows; 0 remembers none, and every
    /// attempt asks Redis.
    pub(super) fn new(windows_max: usize) -> Self {
        Self {
            windows: Mutex::new(Memory {
                windows: HashMap::new(),
                full_until: None,
            }),
            windows_max,
        }
    }

    /// The window at `key`, if this instance holds it and it is open.
    pub(super) fn still_open(&self, key: &str, now: Instant) -> Option<StillOpen> {
        let windows = &mut self.lock().windows;
        let held = windows.get(key)?;
        if held.until <= now {
            windows.remove(key);
            return None;
        }
        Some(StillOpen {
            retry_after: held.until - now,
            last_refused: held.last_refused,
        })
    }

    /// A request here took the window at `key` with `token`, its `SET`
    /// sent at `sent`. When full, the windows that ran out are dropped; if
    /// it is still full, this one is not remembered (Redis still holds it,
    /// and is asked).
    pub(super) fn took(&self, user: UserId, key: &str, token: &str, sent: Instant, ttl: Duration) {
        if self.windows_max == 0 {
            return;
        }
        let mut memory = self.lock();
        let Memory { windows, full_until } = &mut *memory;
        if windows.len() >= self.windows_max && !windows.contains_key(key) {
            if full_until.is_some_and(|until| sent < until) {
                return;
            }
            windows.retain(|_, held| held.until > sent);
            if windows.len() >= self.windows_max {
                *full_until = windows.values().map(|held| held.until).min();
                return;
            }
            *full_until = None;
        }
        windows.insert(
            key.to_owned(),
            Held {
                user,
                token: token.to_owned(),
                until: sent + ttl,
                last_refused: false,
            },
        );
    }

    /// The holder was refused: the next 429 says the last attempt was.
    pub(super) fn refused(&self, key: &str, token: &str) {
        if let Some(held) = self
            .lock()
            .windows
            .get_mut(key)
            .filter(|held| held.token == token)
        {
            held.last_refused = true;
        }
    }

    /// The holder gave the window back.
    pub(super) fn given_back(&self, key: &str, token: &str) {
        let windows = &mut self.lock().windows;
        if windows.get(key).is_some_and(|held| held.token == token) {
            windows.remove(key);
        }
    }

    /// Forgets every window of `user`: one of the user's tokens was revoked
    /// here, and Redis, which knows the revocation, decides again.
    pub(super) fn forget_user(&self, user: UserId) {
        self.lock().windows.retain(|_, held| held.user != user);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Memory> {
        // A panic while holding the lock leaves no half-made entry: every
        // change is one map operation.
        self.windows.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;

    const TTL: Duration = Duration::from_secs(5);

    fn user() -> UserId {
        UserId(Uuid::new_v4())
    }

    #[test]
    fn a_window_is_open_until_its_ttl_from_sending_and_then_forgotten() {
        let windows = HeldWindows::new(10);
        let sent = Instant::now();
        windows.took(user(), "w", "t", sent, TTL);
        let open = windows
            .still_open("w", sent + Duration::from_secs(2))
            .expect("open");
        assert_eq!(open.retry_after, Duration::from_secs(3));
        assert!(!open.last_refused);
        assert!(windows.still_open("w", sent + TTL).is_none());
        assert!(
            windows.lock().windows.is_empty(),
            "a window that ran out is dropped"
        );
    }

    #[test]
    fn only_the_holders_token_marks_or_gives_back() {
        let windows = HeldWindows::new(10);
        let sent = Instant::now();
        windows.took(user(), "w", "holder", sent, TTL);
        windows.refused("w", "other");
        windows.given_back("w", "other");
        assert!(!windows.still_open("w", sent).expect("kept").last_refused);
        windows.refused("w", "holder");
        assert!(windows.still_open("w", sent).expect("kept").last_refused);
        windows.given_back("w", "holder");
        assert!(windows.still_open("w", sent).is_none());
    }

    #[test]
    fn a_full_memory_drops_what_ran_out_and_otherwise_remembers_nothing_more() {
        let windows = HeldWindows::new(2);
        let sent = Instant::now();
        windows.took(user(), "a", "t", sent, Duration::from_millis(1));
        windows.took(user(), "b", "t", sent, TTL);
        let later = sent + Duration::from_millis(2);
        windows.took(user(), "c", "t", later, TTL);
        assert!(
            windows.still_open("c", later).is_some(),
            "room made from a window that ran out"
        );
        windows.took(user(), "d", "t", later, TTL);
        assert!(windows.still_open("d", later).is_none(), "full: not remembered");
        assert!(windows.still_open("b", later).is_some());
        // Full until the first window runs out; then there is room again.
        let after_b = sent + TTL;
        windows.took(user(), "e", "t", after_b, TTL);
        assert!(
            windows.still_open("e", after_b).is_some(),
            "room made once b ran out"
        );

        let none = HeldWindows::new(0);
        none.took(user(), "a", "t", sent, TTL);
        assert!(none.still_open("a", sent).is_none());
    }

    #[test]
    fn a_revocation_forgets_only_its_users_windows() {
        let windows = HeldWindows::new(10);
        let (alice, bob) = (user(), user());
        let sent = Instant::now();
        windows.took(alice, "a", "t", sent, TTL);
        windows.took(bob, "b", "t", sent, TTL);
        windows.forget_user(alice);
        assert!(windows.still_open("a", sent).is_none());
        assert!(windows.still_open("b", sent).is_some());
    }
}
