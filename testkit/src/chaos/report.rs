//! What a run reports: the measures behind a row of the table in
//! `docs/reliability.md`, and every violation found.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use super::fault::{Fault, Readiness};

/// What one fault did, measured, and what broke, if anything.
pub struct ChaosReport {
    pub fault: Fault,
    pub answers: BTreeMap<String, usize>,
    pub keys: usize,
    pub keyed_double_effects: usize,
    pub keyless_bursts: usize,
    pub keyless_double_charges: usize,
    pub server_errors: usize,
    pub false_nothing_changed: usize,
    pub slowest: Duration,
    pub recovery: Duration,
    pub replies_lost: u64,
    /// Keys answered 201 whose transfer the database no longer holds.
    pub lost_201s: usize,
    /// What a failover measured; none for the other faults.
    pub failover: Option<super::FailoverMeasures>,
    pub readiness: String,
    pub violations: Vec<String>,
    /// Where the instances' logs are, for the reader of a failure.
    pub(super) logs: PathBuf,
}

impl ChaosReport {
    /// Panics with every violation found, and where the instances' logs are.
    pub fn assert_held(&self) {
        assert!(
            self.violations.is_empty(),
            "under {}:\n- {}\n{}\ninstance logs: {}",
            self.fault.describe(),
            self.violations.join("\n- "),
            match &self.failover {
                Some(measures) => self.failover_row(measures),
                None => self.markdown_row(),
            },
            self.logs.display()
        );
    }

    /// One row of the table in `docs/reliability.md`.
    pub fn markdown_row(&self) -> String {
        let answers = self
            .answers
            .iter()
            .map(|(label, count)| format!("{count} × {label}"))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "| {} | {} | {} | {} | {} | {} of {} | {} | {:.2} s | {:.2} s |",
            self.fault.describe(),
            answers,
            self.keys,
            self.keyed_double_effects,
            self.false_nothing_changed,
            self.keyless_double_charges,
            self.keyless_bursts,
            self.readiness,
            self.slowest.as_secs_f64(),
            self.recovery.as_secs_f64(),
        )
    }

    /// Prints the row, and when `CHAOS_REPORT_DIR` is set writes it there
    /// as `row-<N>.md` (N: the fault's place in `Fault::ALL`) beside
    /// `header.md`, for `scripts/chaos` to gather into a table.
    pub fn publish(&self) {
        if let Some(measures) = &self.failover {
            self.publish_failover(measures);
            return;
        }
        let place = Fault::ALL
            .iter()
            .position(|f| *f == self.fault)
            .unwrap_or(Fault::ALL.len());
        publish_row("", REPORT_HEADER, place, &self.markdown_row());
    }
}

/// Counts by name, as a cell: "3 failed, 23 settled".
pub(super) fn counted(rows: &[(String, i64)]) -> String {
    rows.iter()
        .map(|(name, count)| format!("{count} {name}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Prints a report's row, and when `CHAOS_REPORT_DIR` is set writes it
/// there as `<table>row-<place>.md` beside `<table>header.md`, for
/// `scripts/chaos` to gather into a table.
pub(super) fn publish_row(table: &str, header: &str, place: usize, row: &str) {
    println!("{row}");
    if let Some(dir) = std::env::var_os("CHAOS_REPORT_DIR") {
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir).expect("create CHAOS_REPORT_DIR");
        std::fs::write(dir.join(format!("{table}header.md")), format!("{header}\n"))
            .expect("write the header");
        std::fs::write(dir.join(format!("{table}row-{place}.md")), format!("{row}\n"))
            .expect("write the report row");
    }
}

/// Panics, under `fault`, with every check of a `wallet-sim` kind that
/// found something, the report's row, and where the instances' logs are.
pub(super) fn assert_checks_held(
    checks: &wallet_sim::checks::Checks,
    fault: &str,
    row: &str,
    logs: &std::path::Path,
) {
    let failed: Vec<String> = checks
        .0
        .iter()
        .filter(|check| check.found != 0)
        .map(|check| format!("{}: {}", check.what, check.found))
        .collect();
    assert!(
        failed.is_empty(),
        "under {fault}:\n- {}\n{row}\ninstance logs: {}",
        failed.join("\n- "),
        logs.display()
    );
}

/// What `/readyz` answered during the fault, as the report's column shows
/// it: in the order the instances were asked, a state the next instance
/// repeated said once.
pub(super) fn readiness_summary(readiness_seen: &[(usize, Readiness)]) -> String {
    let mut readiness = String::new();
    let mut seen: Vec<_> = readiness_seen.iter().map(|(_, seen)| *seen).collect();
    seen.dedup();
    for (index, state) in seen.iter().enumerate() {
        let _ = write!(
            readiness,
            "{}{}",
            if index > 0 { ", " } else { "" },
            match state {
                Readiness::Ready => "200 ready",
                Readiness::Degraded => "200 degraded",
                Readiness::NotReady => "503",
                Readiness::NoAnswer => "no answer (killed)",
            }
        );
    }
    readiness
}

/// The table's header, matching `markdown_row`.
pub const REPORT_HEADER: &str = "| fault | answers | keys | keyed double effects | false \"nothing was changed\" | keyless double charges | /readyz during the fault | slowest request | recovery |\n|---|---|---|---|---|---|---|---|---|";
