//! One run from start to end: the clients signed up, the storm started,
//! the fault injected in its middle with `/readyz` sampled while it lasts,
//! recovery awaited, the storm stopped, and the checks made.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::RECOVERY_SECONDS_MAX;
use super::checks::Checked;
use super::deployment::{Deployment, Postgres};
use super::failover::{FailoverMeasures, answers_during};
use super::fault::{Fault, Readiness};
use super::report::ChaosReport;
use super::scale::Scale;
use super::storm::{KeyRecord, Outcome, Storm};
use crate::TestUser;

impl Deployment {
    /// Runs the storm, injects `fault` in its middle, and checks and
    /// measures everything afterwards.
    pub(super) async fn run(mut self, fault: Fault, scale: Scale) -> ChaosReport {
        let stop = Arc::new(AtomicBool::new(false));
        let commit_rates = match &self.postgres {
            Postgres::Replicated(cluster) => Some(cluster.commit_rates().await),
            Postgres::Single { .. } => None,
        };
        let clients = self.sign_up_clients(scale).await;
        let probes = self.sign_up_probes().await;
        let shared = Arc::new(Storm {
            instances: self.instances.iter().map(|i| i.url("")).collect(),
            stop: stop.clone(),
        });

        let keyed_tasks: Vec<_> = (0..clients.keyed.len())
            .map(|number| {
                let storm = shared.clone();
                let me = clients.keyed[number].clone();
                let to = clients.keyed[(number + 1) % clients.keyed.len()].wallet_id;
                tokio::spawn(async move { storm.keyed_client(number, me, to).await })
            })
            .collect();
        let keyless_tasks: Vec<_> = clients
            .keyless
            .iter()
            .enumerate()
            .map(|(number, me)| {
                let storm = shared.clone();
                let (me, to) = (me.clone(), clients.keyed[number % clients.keyed.len()].wallet_id);
                tokio::spawn(async move { storm.keyless_user(me, to).await })
            })
            .collect();

        tokio::time::sleep(scale.before_fault).await;
        self.begin_fault(fault).await;
        let fault_began = Instant::now();
        let mut readiness_seen = Vec::new();
        let mut readiness_sampled = false;
        while fault_began.elapsed() < scale.fault_length {
            if !readiness_sampled && fault_began.elapsed() >= scale.fault_length / 2 {
                for instance in 0..self.instances.len() {
                    readiness_seen.push((instance, self.readiness(instance).await));
                }
                readiness_sampled = true;
            }
            self.sustain_fault(fault);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let fault_ended = Instant::now();
        self.end_fault(fault).await;
        let recovery = self.recover(fault_ended, &probes, &shared).await;
        let recovery_took = recovery.took;
        tokio::time::sleep(scale.after_fault).await;
        stop.store(true, Ordering::SeqCst);

        let mut keys = recovery.keys;
        for task in keyed_tasks {
            keys.extend(task.await.expect("a keyed client"));
        }
        let mut bursts = Vec::new();
        for task in keyless_tasks {
            bursts.extend(task.await.expect("a keyless user"));
        }
        // A failover on asynchronous replication loses 201s: each such key
        // is free again, and sent again with its key it pays, once.
        let mut failover = None;
        if let Some(seen) = self.failover {
            let lost = self.keys_lost(&keys).await;
            let users: Vec<TestUser> = clients.keyed.iter().chain(&probes).cloned().collect();
            let paid_again_once = self.pay_again(&mut keys, &lost, &users, &shared).await;
            failover = Some(FailoverMeasures {
                promoted_after: seen.took.expect("the failover ended"),
                answers_during: answers_during(&keys, &bursts, seen.killed_at..fault_ended + recovery_took),
                paid_again_once,
                commits_per_s: commit_rates.expect("measured on the replicated deployment"),
            });
        }
        let replies_lost = self.replies_lost();
        let mut report = ChaosReport::check(
            fault,
            &self.db,
            Checked {
                keys,
                bursts,
                keyed_wallets: clients.keyed.iter().chain(&probes).map(|u| u.wallet_id).collect(),
                readiness_seen,
                recovery: recovery.took,
                recovered: recovery.recovered,
                replies_lost,
            },
            self.logs.path().to_path_buf(),
        )
        .await;
        if let Some(measures) = &failover
            && measures.paid_again_once != report.lost_201s
        {
            report.violations.push(format!(
                "of {} keys whose 201 the failover lost, {} were paid exactly once when sent again",
                report.lost_201s, measures.paid_again_once
            ));
        }
        report.failover = failover;
        report
    }

    async fn sign_up_clients(&self, scale: Scale) -> Clients {
        let mut keyed = Vec::new();
        for number in 0..scale.keyed_clients {
            keyed.push(self.sign_up(&format!("keyed{number}")).await);
        }
        let mut keyless = Vec::new();
        for number in 0..scale.keyless_users {
            keyless.push(self.sign_up(&format!("keyless{number}")).await);
        }
        Clients { keyed, keyless }
    }

    /// One user per instance, whose transfers prove that instance works.
    async fn sign_up_probes(&self) -> Vec<TestUser> {
        let mut probes = Vec::new();
        for number in 0..self.instances.len() {
            probes.push(self.sign_up(&format!("probe{number}")).await);
        }
        probes
    }

    /// Waits until every instance is ready and has made a transfer, each
    /// through itself, with one key per instance retried until settled.
    async fn recover(&self, fault_ended: Instant, probes: &[TestUser], storm: &Storm) -> Recovery {
        let deadline = fault_ended + Duration::from_secs(RECOVERY_SECONDS_MAX);
        let mut keys = Vec::new();
        let mut recovered = true;
        for (instance, probe) in probes.iter().enumerate() {
            while self.readiness(instance).await != Readiness::Ready && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let to = probes[(instance + 1) % probes.len()].wallet_id;
            let mut record = KeyRecord::new(probe.user_id, to, 1);
            loop {
                let attempt = storm.send_once(instance, probe, &record).await;
                let settled = attempt.outcome.settles();
                record.attempts.push(attempt);
                if settled || Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            recovered &= record
                .attempts
                .last()
                .is_some_and(|a| matches!(a.outcome, Outcome::Transferred { .. }));
            keys.push(record);
        }
        Recovery {
            keys,
            took: fault_ended.elapsed(),
            recovered,
        }
    }
}

/// The probes' keys, and how long after the fault every instance was
/// ready and had made a transfer.
struct Recovery {
    keys: Vec<KeyRecord>,
    took: Duration,
    recovered: bool,
}

struct Clients {
    keyed: Vec<TestUser>,
    keyless: Vec<TestUser>,
}
