//! The race lab's bank: where a lab run's payouts go, never the
//! deployment's gateway. It stands in for a bank whose answer is lost on
//! the way back, the hazard the payout saga exists for.
//!
//! - It **sends** by writing its own ledger (`race_lab_bank_send()`, in
//!   `migrations/20261202000008_race_lab.sql`) on a connection of its own,
//!   so what it sent stays sent when the service's transaction rolls back,
//!   as money wired by a real bank does.
//! - It **loses the answer** to the first request for each payout: the
//!   money has left, and the caller hears only that the outcome is unknown,
//!   as when a call times out after the bank acted.
//! - It **deduplicates** by `Idempotency-Key` like a real payment API (a
//!   key it has seen gets its first answer again), unless the run switched
//!   that off.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use sqlx::PgPool;
use uuid::Uuid;

use crate::domain::UserId;
use crate::payout::gateway::{GatewayAnswer, GatewayPayout, PayoutBank};

pub struct LabBank {
    db: PgPool,
    visitor: UserId,
    deduplicates: bool,
    /// The payouts whose first answer was already lost.
    answer_lost_for: Mutex<HashSet<Uuid>>,
    /// Requests the bank was sent, and those its deduplication by key
    /// answered without sending money again.
    asked: AtomicUsize,
    answered_from_its_key: AtomicUsize,
}

/// What the lab's bank was asked in a run, for the page's funnel.
#[derive(Debug, Clone, Copy, Default)]
pub struct BankCounts {
    pub asked: usize,
    pub answered_from_its_key: usize,
}

impl LabBank {
    pub fn new(db: PgPool, visitor: UserId, deduplicates: bool) -> Self {
        Self {
            db,
            visitor,
            deduplicates,
            answer_lost_for: Mutex::new(HashSet::new()),
            asked: AtomicUsize::new(0),
            answered_from_its_key: AtomicUsize::new(0),
        }
    }

    pub fn counts(&self) -> BankCounts {
        BankCounts {
            asked: self.asked.load(Ordering::Relaxed),
            answered_from_its_key: self.answered_from_its_key.load(Ordering::Relaxed),
        }
    }

    /// One request, answered as the deployment's gateway client sorts a
    /// real gateway's answers.
    pub async fn send(&self, key: &str, payout: &GatewayPayout<'_>) -> GatewayAnswer {
        self.asked.fetch_add(1, Ordering::Relaxed);
        let sent: Result<(i64, bool, bool), sqlx::Error> = sqlx::query_as(
            "SELECT sending, replayed, other_payout FROM race_lab_bank_send($1, $2, $3, $4, $5)",
        )
        .bind(self.visitor.0)
        .bind(key)
        .bind(payout.reference)
        .bind(payout.amount_minor)
        .bind(self.deduplicates)
        .fetch_one(&self.db)
        .await;
        match sent {
            // The statement may have committed before the error: unknown.
            Err(_) => GatewayAnswer::Unknown {
                why: "the lab bank's ledger could not be reached".to_owned(),
                retry_after: None,
            },
            Ok((_, _, true)) => GatewayAnswer::Rejected {
                why: "409 (the lab bank saw this key for another payout)".to_owned(),
            },
            Ok((sending, replayed, false)) => {
                if replayed {
                    self.answered_from_its_key.fetch_add(1, Ordering::Relaxed);
                }
                let first = self
                    .answer_lost_for
                    .lock()
                    .map(|mut lost| lost.insert(payout.reference))
                    .unwrap_or(false);
                if first {
                    GatewayAnswer::Unknown {
                        why: "the lab bank sent it, then its answer was lost".to_owned(),
                        retry_after: None,
                    }
                } else {
                    GatewayAnswer::Sent {
                        reference: format!("lab-{sending}"),
                    }
                }
            }
        }
    }
}

impl PayoutBank for LabBank {
    async fn send_payout(
        &self,
        key: &str,
        payout: &GatewayPayout<'_>,
        _traceparent: Option<&str>,
    ) -> GatewayAnswer {
        self.send(key, payout).await
    }

    /// A lab bank's calls are the race lab's, kept out of the deployment's
    /// payout metrics.
    fn is_the_gateway(&self) -> bool {
        false
    }
}
