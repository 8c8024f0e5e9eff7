//! What a primary failover measures beyond the other faults: how long
//! Patroni took to promote the standby, what the clients were answered
//! meanwhile, what the commit rate costs with each replication, and, for
//! each 201 that the failover lost, what a retry with the same key then
//! does (it pays again, once).

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::SETTLE_SECONDS_MAX;
use super::deployment::Deployment;
use super::report::{ChaosReport, publish_row};
use super::storm::{KeyRecord, Outcome, Storm};
use super::{CHAOS_COOLDOWN_TTL_MS, Fault};
use crate::TestUser;
use crate::replicated_postgres::CommitRates;

/// What one failover measured.
#[derive(Debug, Clone)]
pub struct FailoverMeasures {
    /// From the primary's `kill -9` to the standby taking writes.
    pub promoted_after: Duration,
    /// Every answer seen from the kill until every instance transferred
    /// again, by status.
    pub answers_during: BTreeMap<String, usize>,
    /// Of the lost 201s, how many were answered 201 again (a new transfer,
    /// not a replay) when sent again with their key, and then held exactly
    /// that one transfer.
    pub paid_again_once: usize,
    /// One-row commits per second on the primary before the failover.
    pub commits_per_s: CommitRates,
}

/// The failover table's header, matching `failover_row`.
pub const FAILOVER_REPORT_HEADER: &str = "| replication | standby promoted after | every instance transferring again after the promotion | answers from the kill until every instance transferred again | keys | 201s lost (keys free again) | lost keys sent again: paid once | keyed double effects | false \"nothing was changed\" | commits/s, `synchronous_commit` on / local |\n|---|---|---|---|---|---|---|---|---|---|";

impl ChaosReport {
    pub(super) fn failover_row(&self, measures: &FailoverMeasures) -> String {
        let Fault::PrimaryFailover(replication) = self.fault else {
            unreachable!("a failover's measures come from a failover");
        };
        format!(
            "| {} | {:.1} s | {:.2} s | {} | {} | {} | {} of {} | {} | {} | {:.0} / {:.0} |",
            replication.describe(),
            measures.promoted_after.as_secs_f64(),
            self.recovery.as_secs_f64(),
            counted_labels(&measures.answers_during),
            self.keys,
            self.lost_201s,
            measures.paid_again_once,
            self.lost_201s,
            self.keyed_double_effects,
            self.false_nothing_changed,
            measures.commits_per_s.synchronous,
            measures.commits_per_s.local,
        )
    }

    pub(super) fn publish_failover(&self, measures: &FailoverMeasures) {
        let place = Fault::FAILOVERS
            .iter()
            .position(|f| *f == self.fault)
            .unwrap_or(0);
        publish_row(
            "failover-",
            FAILOVER_REPORT_HEADER,
            place,
            &self.failover_row(measures),
        );
    }
}

fn counted_labels(answers: &BTreeMap<String, usize>) -> String {
    answers
        .iter()
        .map(|(label, count)| format!("{count} × {label}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every answer that ended within `window`, by label.
pub(super) fn answers_during(
    keys: &[KeyRecord],
    storm_bursts: &[super::storm::Burst],
    window: Range<Instant>,
) -> BTreeMap<String, usize> {
    let mut by_label = BTreeMap::new();
    let attempts = keys
        .iter()
        .flat_map(|k| &k.attempts)
        .chain(storm_bursts.iter().flat_map(|b| &b.outcomes));
    for attempt in attempts.filter(|a| window.contains(&a.ended)) {
        *by_label.entry(attempt.outcome.label()).or_insert(0) += 1;
    }
    by_label
}

impl Deployment {
    /// The transfer the database holds for `record`'s key, if any.
    async fn claimed_transfer(&self, record: &KeyRecord) -> Option<Uuid> {
        let claim: Option<Option<Uuid>> = sqlx::query_scalar(
            "SELECT transfer_id FROM idempotency_keys WHERE user_id = $1 AND key = $2::uuid",
        )
        .bind(record.user_id)
        .bind(&record.key)
        .fetch_optional(&self.db)
        .await
        .expect("read a key's claim");
        claim.flatten()
    }

    /// The places in `keys` of those answered with a fresh 201 whose claim
    /// (and transfer) the database no longer holds: free again.
    pub(super) async fn keys_lost(&self, keys: &[KeyRecord]) -> Vec<usize> {
        let mut lost = Vec::new();
        for (place, record) in keys.iter().enumerate().filter(|(_, r)| r.answered_fresh_201()) {
            if self.claimed_transfer(record).await.is_none() {
                lost.push(place);
            }
        }
        lost
    }

    /// Sends each lost key's transfer again, with its key, until it
    /// settles, adding the attempts to its record (so that the checks see
    /// them), and counts the keys then paid exactly once: a fresh 201 whose
    /// transfer is the one the database holds for the key.
    pub(super) async fn pay_again(
        &self,
        keys: &mut [KeyRecord],
        lost: &[usize],
        users: &[TestUser],
        storm: &Storm,
    ) -> usize {
        let mut paid_once = 0;
        for &place in lost {
            let record = &mut keys[place];
            let user = users
                .iter()
                .find(|u| u.user_id == record.user_id)
                .expect("a lost key's user");
            let deadline = Instant::now() + Duration::from_secs(SETTLE_SECONDS_MAX);
            loop {
                let attempt = storm.send_once(0, user, record).await;
                let settled = attempt.outcome.settles();
                record.attempts.push(attempt);
                if settled || Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(CHAOS_COOLDOWN_TTL_MS)).await;
            }
            let Some(Outcome::Transferred { id, replayed: false }) =
                record.attempts.last().map(|a| a.outcome.clone())
            else {
                continue;
            };
            paid_once += usize::from(self.claimed_transfer(&*record).await == Some(id));
        }
        paid_once
    }
}
