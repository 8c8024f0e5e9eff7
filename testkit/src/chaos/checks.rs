//! The checks made after a run, on the answers the clients got and on the
//! database: one function per invariant, named for what it proves, called
//! in the order the report lists what broke.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use super::fault::{Fault, Readiness};
use super::report::{ChaosReport, readiness_summary};
use super::storm::{Burst, KeyRecord, Outcome};
use super::{RECOVERY_SECONDS_MAX, REQUEST_SECONDS_MAX, SETTLE_SECONDS_MAX};

/// What a run gathered for the checks.
pub(super) struct Checked {
    pub(super) keys: Vec<KeyRecord>,
    pub(super) bursts: Vec<Burst>,
    pub(super) keyed_wallets: Vec<Uuid>,
    pub(super) readiness_seen: Vec<(usize, Readiness)>,
    pub(super) recovery: Duration,
    pub(super) recovered: bool,
    pub(super) replies_lost: u64,
}

impl ChaosReport {
    pub(super) async fn check(fault: Fault, db: &PgPool, run: Checked, logs: PathBuf) -> Self {
        let mut checks = Checks {
            fault,
            db,
            run: &run,
            answers: Answers::tally(&run),
            claims: Claims::read(db).await,
            violations: Vec::new(),
        };
        checks.no_server_error_but_503();
        checks.no_request_over_its_bound();
        // Keyed transfers: at most one per key, exactly the one every 201
        // names, and none that no request could have made.
        let lost_201s = checks.every_201_names_its_keys_transfer();
        let false_nothing_changed = checks.no_transfer_behind_nothing_changed();
        checks.every_key_settled();
        let keyed_double_effects = checks.no_key_took_effect_twice().await;
        checks.no_claim_dangles().await;
        checks.money_invariants_hold().await;
        let keyless_double_charges = checks.keyless_double_clicks_charged_once().await;
        checks.readiness_as_the_fault_expects();
        checks.recovered_in_time();
        checks.fault_happened();
        let Checks {
            answers, violations, ..
        } = checks;

        Self {
            fault,
            answers: answers.by_label,
            keys: run.keys.len(),
            keyed_double_effects,
            keyless_bursts: run.bursts.len(),
            keyless_double_charges,
            server_errors: answers.server_errors,
            false_nothing_changed,
            slowest: answers.slowest,
            recovery: run.recovery,
            replies_lost: run.replies_lost,
            lost_201s,
            failover: None,
            readiness: readiness_summary(&run.readiness_seen),
            violations,
            logs,
        }
    }
}

/// Every answer the clients got: counted by label, the slowest, and the
/// 5xx other than 503.
struct Answers {
    by_label: BTreeMap<String, usize>,
    slowest: Duration,
    server_errors: usize,
}

impl Answers {
    fn tally(run: &Checked) -> Self {
        let mut by_label = BTreeMap::new();
        let all_attempts = run
            .keys
            .iter()
            .flat_map(|k| &k.attempts)
            .chain(run.bursts.iter().flat_map(|b| &b.outcomes));
        let mut slowest = Duration::ZERO;
        let mut server_errors = 0;
        for attempt in all_attempts {
            *by_label.entry(attempt.outcome.label()).or_insert(0) += 1;
            slowest = slowest.max(attempt.took);
            server_errors += usize::from(matches!(attempt.outcome, Outcome::ServerError { .. }));
        }
        Self {
            by_label,
            slowest,
            server_errors,
        }
    }
}

/// The transfer each key claimed in the database, by user and key: what
/// the keyed checks hold the clients' answers against.
struct Claims(BTreeMap<(Uuid, String), Option<Uuid>>);

impl Claims {
    async fn read(db: &PgPool) -> Self {
        let claims = sqlx::query_as::<_, (Uuid, Uuid, Option<Uuid>)>(
            "SELECT user_id, key, transfer_id FROM idempotency_keys",
        )
        .fetch_all(db)
        .await
        .expect("read the idempotency keys")
        .into_iter()
        .map(|(user, key, transfer)| ((user, key.to_string()), transfer))
        .collect();
        Self(claims)
    }

    /// The transfer the database holds for `record`'s key, if any.
    fn transfer_of(&self, record: &KeyRecord) -> Option<Uuid> {
        self.0
            .get(&(record.user_id, record.key.clone()))
            .copied()
            .flatten()
    }

    /// How many keys made a transfer.
    fn transfers(&self) -> usize {
        self.0.values().filter(|transfer| transfer.is_some()).count()
    }
}

/// The checks on one run; each adds what broke, if anything, to
/// `violations`.
struct Checks<'a> {
    fault: Fault,
    /// Straight to PostgreSQL, not through the proxy.
    db: &'a PgPool,
    run: &'a Checked,
    answers: Answers,
    claims: Claims,
    violations: Vec<String>,
}

impl Checks<'_> {
    /// No answer was a 5xx other than 503, whatever the fault.
    fn no_server_error_but_503(&mut self) {
        let server_errors = self.answers.server_errors;
        if server_errors > 0 {
            self.violations
                .push(format!("{server_errors} answers were 5xx other than 503"));
        }
    }

    /// No request took longer than `REQUEST_SECONDS_MAX`.
    fn no_request_over_its_bound(&mut self) {
        let slowest = self.answers.slowest;
        if slowest > Duration::from_secs(REQUEST_SECONDS_MAX) {
            self.violations.push(format!(
                "a request took {slowest:?}, over REQUEST_SECONDS_MAX ({REQUEST_SECONDS_MAX} s)"
            ));
        }
    }

    /// Every 201 a key was answered with names the transfer the database
    /// holds for that key. Where the fault loses commits that were
    /// answered (a failover on asynchronous replication), a key whose 201
    /// names a transfer that is gone is counted as lost instead; returns
    /// how many keys were.
    fn every_201_names_its_keys_transfer(&mut self) -> usize {
        let mut lost = 0;
        for record in &self.run.keys {
            let in_database = self.claims.transfer_of(record);
            let mut lost_here = false;
            for attempt in &record.attempts {
                if let Outcome::Transferred { id, .. } = attempt.outcome
                    && in_database != Some(id)
                {
                    // A transfer that still existed without its key would be
                    // found by `no_key_took_effect_twice`.
                    if self.fault.loses_answered_commits() {
                        lost_here = true;
                        continue;
                    }
                    self.violations.push(format!(
                        "key {} was answered with transfer {id}, but the database holds {in_database:?}",
                        record.key
                    ));
                }
            }
            lost += usize::from(lost_here);
        }
        lost
    }

    /// No key made a transfer when every answer it got said nothing was
    /// changed: a client that believed them would send the money again.
    /// Returns how many did.
    fn no_transfer_behind_nothing_changed(&mut self) -> usize {
        let false_nothing_changed = self
            .run
            .keys
            .iter()
            .filter(|record| {
                self.claims.transfer_of(record).is_some()
                    && !record.attempts.iter().any(|a| a.outcome.may_have_transferred())
            })
            .count();
        if false_nothing_changed > 0 {
            self.violations.push(format!(
                "{false_nothing_changed} keys have a transfer although every answer said nothing was changed"
            ));
        }
        false_nothing_changed
    }

    /// Every key ended with an answer that settles it, within
    /// `SETTLE_SECONDS_MAX` after the storm.
    fn every_key_settled(&mut self) {
        let unsettled = self
            .run
            .keys
            .iter()
            .filter(|record| !record.attempts.last().is_some_and(|a| a.outcome.settles()))
            .count();
        if unsettled > 0 {
            self.violations.push(format!(
                "{unsettled} keys were still unsettled {SETTLE_SECONDS_MAX} s after the storm"
            ));
        }
    }

    /// Every transfer from a keyed wallet is the one transfer of a key: no
    /// key took effect twice. Returns how many transfers are over.
    async fn no_key_took_effect_twice(&mut self) -> usize {
        let keyed_transfers: i64 =
            sqlx::query_scalar("SELECT count(*) FROM transfers WHERE from_wallet_id = ANY($1)")
                .bind(&self.run.keyed_wallets)
                .fetch_one(self.db)
                .await
                .expect("count keyed transfers");
        let keyed_double_effects = usize::try_from(keyed_transfers)
            .unwrap_or(0)
            .saturating_sub(self.claims.transfers());
        if keyed_double_effects > 0 {
            self.violations.push(format!(
                "{keyed_double_effects} keyed transfers have no key of their own: a key took effect twice"
            ));
        }
        keyed_double_effects
    }

    /// Every idempotency claim got its response stored: none was left
    /// half made by the fault.
    async fn no_claim_dangles(&mut self) {
        let dangling: i64 =
            sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE response_status IS NULL")
                .fetch_one(self.db)
                .await
                .expect("count dangling claims");
        if dangling > 0 {
            self.violations
                .push(format!("{dangling} idempotency claims dangle without a response"));
        }
    }

    /// The money invariants hold on the deployment's database (see
    /// `crate::money_invariant_violations`).
    async fn money_invariants_hold(&mut self) {
        self.violations
            .extend(crate::money_invariant_violations(self.db).await);
    }

    /// No keyless double click was charged more than once, unless the
    /// fault let everything through the cooldown, their one defense.
    /// Returns how many were.
    async fn keyless_double_clicks_charged_once(&mut self) -> usize {
        let mut keyless_double_charges = 0;
        for burst in &self.run.bursts {
            let charged: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM transfers WHERE from_wallet_id = $1 AND amount_minor = $2",
            )
            .bind(burst.wallet_id)
            .bind(burst.amount_minor)
            .fetch_one(self.db)
            .await
            .expect("count a burst's transfers");
            keyless_double_charges += usize::from(charged > 1);
        }
        if keyless_double_charges > 0 && !self.fault.allows_keyless_double_charges() {
            self.violations.push(format!(
                "{keyless_double_charges} keyless double clicks were charged more than once"
            ));
        }
        keyless_double_charges
    }

    /// Every instance's `/readyz` answered during the fault what the fault
    /// should make it answer.
    fn readiness_as_the_fault_expects(&mut self) {
        for (instance, seen) in &self.run.readiness_seen {
            let expected = self.fault.expected_readiness(*instance);
            if *seen != expected {
                self.violations.push(format!(
                    "instance {instance}'s /readyz was {seen:?} during the fault; it should be {expected:?}"
                ));
            }
        }
    }

    /// Every instance was ready and transferring again within
    /// `RECOVERY_SECONDS_MAX` after the fault ended.
    fn recovered_in_time(&mut self) {
        if !self.run.recovered || self.run.recovery > Duration::from_secs(RECOVERY_SECONDS_MAX) {
            self.violations.push(format!(
                "the instances were not all ready and transferring within RECOVERY_SECONDS_MAX \
                 ({RECOVERY_SECONDS_MAX} s) after the fault ended"
            ));
        }
    }

    /// The fault did happen: the proxy loses a reply only when a transfer
    /// commits through it while the fault lasts, so its count is the proof.
    fn fault_happened(&mut self) {
        if self.fault == Fault::CommitRepliesLost && self.run.replies_lost == 0 {
            self.violations
                .push("the proxy never lost a reply: the fault did not happen".into());
        }
    }
}
