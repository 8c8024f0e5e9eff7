//! The invariants every scenario must keep, checked at the end on the
//! database (read-only) and on the responses.

use std::collections::HashMap;

use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::client::{AttemptRecord, Sample};

#[derive(Debug, Default, Serialize)]
pub struct Findings {
    /// Money created (positive) or destroyed (negative) in the run's
    /// wallets (the run's transfers stay among its own users).
    pub money_created_minor: i64,
    pub negative_balances: i64,
    /// Wallets whose balance is not opening grant plus ledger entries.
    pub unexplained_balances: i64,
    /// Transfers not recorded as two ledger entries summing to zero.
    pub unbalanced_transfers: i64,
    /// (user, key) pairs that produced more than one transfer.
    pub keys_paid_more_than_once: i64,
    /// Extra transfers those keys produced.
    pub duplicate_transfers: i64,
    /// Replays whose body differs from the first response for the key.
    pub replays_not_identical: u64,
    /// New (non-replayed) 2xx answers.
    pub accepted_responses: u64,
    /// Transfers the run's users made, per the database.
    pub new_transfers: i64,
    pub server_errors: u64,
    /// Human-readable violations; empty when every invariant held.
    pub violations: Vec<String>,
}

pub async fn check(db: &PgPool, run_users: &[Uuid], samples: &[Sample]) -> anyhow::Result<Findings> {
    let mut findings = Findings::default();
    // The server's own definition of the money invariants, scoped to the
    // run's users (the database may hold others').
    let (created, negative, unexplained, unbalanced): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT money_created_minor, negative_balances, unexplained_balances, unbalanced_transfers
               FROM money_invariants($1)",
    )
    .bind(run_users)
    .fetch_one(db)
    .await?;
    findings.money_created_minor = created;
    findings.negative_balances = negative;
    findings.unexplained_balances = unexplained;
    findings.unbalanced_transfers = unbalanced;
    let (keys, extra): (i64, i64) = sqlx::query_as(
        "SELECT count(*), coalesce(sum(n - 1), 0)::bigint FROM (
             SELECT count(*) AS n FROM transfers
             WHERE initiated_by = ANY($1) AND idempotency_key IS NOT NULL
             GROUP BY initiated_by, idempotency_key HAVING count(*) > 1) AS d",
    )
    .bind(run_users)
    .fetch_one(db)
    .await?;
    findings.keys_paid_more_than_once = keys;
    findings.duplicate_transfers = extra;
    findings.new_transfers =
        sqlx::query_scalar("SELECT count(*) FROM transfers WHERE initiated_by = ANY($1)")
            .bind(run_users)
            .fetch_one(db)
            .await?;

    let mut originals: HashMap<&str, &[u8]> = HashMap::new();
    for sample in samples
        .iter()
        .filter(|s| !s.replayed && s.status != 0 && s.status < 500)
    {
        let (Some(key), Some(body), Some(decision)) = (&sample.key, &sample.body, sample.decision) else {
            continue;
        };
        // The first answer a layer below the cooldown decided is the one
        // that was stored.
        if decision.layer == layered_wallet::decision::Layer::RowGuard {
            originals.entry(key.as_str()).or_insert(body.as_slice());
        }
    }
    for sample in samples.iter().filter(|s| s.replayed) {
        if let (Some(key), Some(body)) = (&sample.key, &sample.body) {
            if originals
                .get(key.as_str())
                .is_some_and(|original| *original != body.as_slice())
            {
                findings.replays_not_identical += 1;
            }
        }
    }
    findings.accepted_responses = samples
        .iter()
        .filter(|s| s.decision.is_some() && (200..300).contains(&s.status) && !s.replayed)
        .count() as u64;
    // An overloaded instance's 503 is an answer, not an error: it refused
    // at once, changed nothing and said when to come back.
    findings.server_errors = samples
        .iter()
        .filter(|s| s.status >= 500 && !s.attempts.last().is_some_and(AttemptRecord::overloaded))
        .count() as u64;

    let mut violations = Vec::new();
    if findings.money_created_minor != 0 {
        violations.push(format!(
            "money created or destroyed: {} minor units",
            findings.money_created_minor
        ));
    }
    if findings.negative_balances > 0 {
        violations.push(format!("{} negative balances", findings.negative_balances));
    }
    if findings.unexplained_balances > 0 {
        violations.push(format!(
            "{} balances do not match their ledger",
            findings.unexplained_balances
        ));
    }
    if findings.unbalanced_transfers > 0 {
        violations.push(format!(
            "{} transfers are not two ledger entries summing to zero",
            findings.unbalanced_transfers
        ));
    }
    if findings.keys_paid_more_than_once > 0 {
        violations.push(format!(
            "{} idempotency keys paid more than once ({} extra transfers)",
            findings.keys_paid_more_than_once, findings.duplicate_transfers
        ));
    }
    if findings.replays_not_identical > 0 {
        violations.push(format!(
            "{} replays differ from the original response",
            findings.replays_not_identical
        ));
    }
    if findings.accepted_responses as i64 != findings.new_transfers {
        violations.push(format!(
            "{} accepted responses but {} new transfers",
            findings.accepted_responses, findings.new_transfers
        ));
    }
    if findings.server_errors > 0 {
        violations.push(format!("{} server errors (5xx)", findings.server_errors));
    }
    findings.violations = violations;
    Ok(findings)
}
