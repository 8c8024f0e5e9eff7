//! The retry half of the idempotency contract: which answers may be
//! retried, how long to wait, and the key that every retry carries.

use std::time::Duration;

use rand::Rng;
use uuid::Uuid;

/// The key of one logical payment. Make it once, before the first attempt
/// (store it with the order if a crash must not lose it), and send it with
/// every retry: a new key per retry is how double charges happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(Uuid);

impl IdempotencyKey {
    /// A fresh key for a new payment.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        Self(Uuid::new_v4())
    }

    /// A key stored earlier, for a payment being resumed.
    pub fn from_uuid(key: Uuid) -> Self {
        Self(key)
    }

    pub fn as_uuid(self) -> Uuid {
        self.0
    }
}

/// How a retried call waits: exponential backoff with full jitter. Attempt
/// `n` (from 0) waits a random time in `[0, min(cap, base · 2ⁿ)]` (exactly
/// the ceiling without jitter), and never less than what the server's
/// `Retry-After` asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The backoff's first ceiling.
    pub base: Duration,
    /// The backoff's largest ceiling.
    pub cap: Duration,
    /// Requests sent at most, the first included.
    pub attempts_max: u32,
    /// How long one request may take before it counts as an unknown
    /// outcome and is retried with the same key.
    pub request_timeout: Duration,
    /// How long one call may take in all, attempts and waits together; no
    /// attempt starts after it.
    pub call_time_max: Duration,
    /// Whether each wait is drawn at random under its ceiling (full
    /// jitter). Leave it on: without it, clients that failed at the same
    /// moment wait exactly as long, and come back at the same moment, again
    /// and again (`loadtest/retry-storm.sh` shows it).
    pub jitter: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(10),
            attempts_max: 6,
            request_timeout: Duration::from_secs(10),
            call_time_max: Duration::from_secs(60),
            jitter: true,
        }
    }
}

impl RetryPolicy {
    /// How long to wait before attempt `attempt + 1`, after attempt
    /// `attempt` (from 0) was answered with `retry_after`, if any.
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let ceiling = self
            .base
            .checked_mul(2u32.saturating_pow(attempt.min(31)))
            .unwrap_or(self.cap)
            .min(self.cap);
        let wait = match self.jitter {
            true => ceiling.mul_f64(rand::thread_rng().r#gen::<f64>()),
            false => ceiling,
        };
        wait.max(retry_after.unwrap_or(Duration::ZERO))
    }
}

/// Whether an answer with this status may succeed if sent again with the
/// same key: the key is still in flight, or a demonstration's optimistic
/// write found the balance changed (409), the caller was early (429),
/// or the server could not tell or could not do it now (503, including
/// `outcome-unknown`). Everything else is final: a success, or a refusal
/// that the same request would get again.
pub fn may_succeed_later(status: u16) -> bool {
    matches!(status, 409 | 429 | 503)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_is_jittered_under_a_growing_capped_ceiling_and_never_shorter_than_retry_after() {
        let policy = RetryPolicy {
            base: Duration::from_millis(100),
            cap: Duration::from_millis(800),
            ..RetryPolicy::default()
        };
        for _ in 0..200 {
            assert!(policy.delay(0, None) <= Duration::from_millis(100));
            assert!(policy.delay(2, None) <= Duration::from_millis(400));
            assert!(policy.delay(10, None) <= Duration::from_millis(800));
            assert!(policy.delay(40, None) <= Duration::from_millis(800));
            assert!(policy.delay(0, Some(Duration::from_secs(5))) >= Duration::from_secs(5));
        }
        // Full jitter: the waits spread over the range, not at its top.
        let waits: Vec<Duration> = (0..200).map(|_| policy.delay(3, None)).collect();
        assert!(waits.iter().any(|wait| *wait < Duration::from_millis(400)));
        assert!(waits.iter().any(|wait| *wait > Duration::from_millis(400)));
    }

    #[test]
    fn without_jitter_every_wait_is_its_ceiling() {
        let policy = RetryPolicy {
            base: Duration::from_millis(100),
            cap: Duration::from_millis(800),
            jitter: false,
            ..RetryPolicy::default()
        };
        assert_eq!(policy.delay(0, None), Duration::from_millis(100));
        assert_eq!(policy.delay(2, None), Duration::from_millis(400));
        assert_eq!(policy.delay(9, None), Duration::from_millis(800));
        assert_eq!(
            policy.delay(9, Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn only_what_may_succeed_later_is_retried() {
        for status in [409, 429, 503] {
            assert!(may_succeed_later(status), "{status}");
        }
        for status in [200, 201, 400, 401, 403, 404, 405, 413, 415, 422, 500] {
            assert!(!may_succeed_later(status), "{status}");
        }
    }
}
