//! Where a run's requests stopped, layer by layer, with what each layer
//! stopped: the funnel, and the names of its stages that the timeline and
//! the answers share. A conflict (409) from the balance's guard is counted
//! as a conflict, never as a refusal for want of money; a payout run names
//! each of its layers, down to the outbox and the bank's own key.

use serde::{Deserialize, Serialize};

use crate::race_lab::burst::Answer;
use crate::race_lab::presets::Stage;
use crate::race_lab::run::Run;
use crate::settings::PayoutMode;

#[derive(Serialize, Deserialize)]
pub(super) struct FunnelRow {
    pub(super) label: String,
    pub(super) class: String,
    pub(super) count: usize,
    /// Bar width, percent of the requests sent.
    pub(super) percent: usize,
}

/// The answers the balance's guard gave 409: an optimistic write that
/// found the balance changed under it.
pub(super) fn guard_conflicts(answers: &[Answer]) -> usize {
    answers
        .iter()
        .filter(|answer| answer.status == 409 && Stage::of(answer) == Stage::Guard)
        .count()
}

/// What `stage` is called in `run`: for a payout run, each layer by name
/// and, with the bank called inside the transaction, the rolled-back
/// orders as what they are.
pub(super) fn stage_label(run: &Run, stage: Stage) -> String {
    let preset = run.request.preset;
    if !preset.is_payout() {
        return stage.label(preset).to_owned();
    }
    let inside = run.request.switches.payout_mode == PayoutMode::CallInTransaction;
    match stage {
        Stage::Guard => "Refused by the hold (the row guard): the balance could not cover it",
        Stage::Moved if inside => "Held (the row guard), and the bank called inside the transaction",
        Stage::Moved => "Held (the row guard) and queued in the outbox",
        Stage::Other if inside => {
            "Rolled back after the bank was called: it sent the money, then its answer was lost"
        }
        _ => stage.label(preset),
    }
    .to_owned()
}

impl FunnelRow {
    fn new(label: impl Into<String>, class: &str, count: usize, of: usize) -> Self {
        Self {
            label: label.into(),
            class: class.to_owned(),
            count,
            percent: (count * 100).checked_div(of).unwrap_or(0).min(100),
        }
    }

    /// Every request sent, then where they stopped, layer by layer.
    pub(super) fn all_of(run: &Run) -> Vec<Self> {
        let funnel = &run.funnel;
        let sent = funnel.sent;
        let row = |stage: Stage, count: usize| Self::new(stage_label(run, stage), stage.class(), count, sent);
        let conflicts = guard_conflicts(&run.answers);
        let mut rows = vec![Self::new("Sent", "sent", sent, sent)];
        if run.request.preset.is_payout() {
            rows.push(Self::new(
                "Cooldown lock: not asked, since each order is a payout of its own",
                Stage::Cooldown.class(),
                funnel.cooldown,
                sent,
            ));
        } else {
            rows.push(row(Stage::Cooldown, funnel.cooldown));
        }
        rows.push(row(Stage::Key, funnel.key));
        rows.push(row(Stage::Guard, funnel.guard - conflicts));
        if conflicts > 0 {
            rows.push(Self::new(
                "Conflicts (409): the balance changed under the write, so nothing moved",
                Stage::Guard.class(),
                conflicts,
                sent,
            ));
        }
        rows.push(row(Stage::Moved, funnel.moved));
        rows.push(row(Stage::Other, funnel.failed));
        if run.request.preset.is_payout() {
            rows.extend(bank_rows(run));
        }
        rows
    }
}

/// A payout run's last layers: what the outbox sent to the bank, what the
/// bank's deduplication by key answered without sending again, and what
/// settled.
fn bank_rows(run: &Run) -> Vec<FunnelRow> {
    let bank = run.bank;
    let sent = run.funnel.sent;
    let settled = usize::try_from(run.state.payouts_settled).unwrap_or(0);
    let mut rows = Vec::new();
    if run.request.switches.payout_mode != PayoutMode::CallInTransaction {
        rows.push(FunnelRow::new(
            "Sent by the outbox to the bank, retries included",
            "moved",
            bank.asked,
            bank.asked.max(sent),
        ));
    }
    let key = if run.request.switches.bank_deduplicates {
        "Answered by the bank's key (the payout's id) without sending again"
    } else {
        "Answered by the bank's key: none, since this bank does not deduplicate"
    };
    rows.push(FunnelRow::new(
        key,
        "key",
        bank.answered_from_its_key,
        bank.asked.max(sent),
    ));
    rows.push(FunnelRow::new("Settled", "moved", settled, sent));
    rows
}
