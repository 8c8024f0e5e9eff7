//! Per-run switches: which variant of each layer a race-lab request goes
//! through.
//!
//! A request carries them in the `Race-Lab-Switches` header, e.g.
//! `cooldown=off, idempotency=check_then_insert, row_guard=read_decide_write`,
//! and may name the run (`run=<uuid>`), so that each run starts with its own
//! cooldown window instead of the one the previous run left behind.
//! They apply to lab wallets only: a request that carries them is refused
//! before any layer when a wallet is not a lab wallet
//! (`transfer::transaction`), and the naive row-guard statements themselves
//! only ever match lab rows. With every layer on, a lab request runs the
//! production transaction, the one call of `transfer()`; only a naive
//! variant runs step by step. The
//! deployment-wide demonstration modes in `settings` are a different thing,
//! kept for the command-line ladder.
//!
//! A payout run's two switches (how the lab's payouts reach the lab's bank,
//! and whether that bank deduplicates) never travel in the header: the lab
//! sends its payouts itself (`payouts`).

use uuid::Uuid;

use crate::settings::{IdempotencyMode, PayoutMode, RowGuardMode, choice_name, parse_choice};

pub const HEADER: &str = "race-lab-switches";

/// One way to do a layer that the lab offers: its words on the lab's form,
/// and its short name where runs are compared side by side.
#[derive(Debug, Clone, Copy)]
pub struct Choice<T> {
    pub mode: T,
    pub on_the_form: &'static str,
    pub name: &'static str,
}

/// The ways to claim a key, the service's first.
pub const IDEMPOTENCY_CHOICES: [Choice<IdempotencyMode>; 4] = [
    Choice {
        mode: IdempotencyMode::Atomic,
        on_the_form: "Atomic: claimed by an insert in the transfer's transaction",
        name: "insert-first claim (the service's)",
    },
    Choice {
        mode: IdempotencyMode::AdvisoryLock,
        on_the_form: "Alternative: an advisory lock on its hash, a point read, then the claim",
        name: "advisory lock on the key's hash",
    },
    Choice {
        mode: IdempotencyMode::RedisKeyLock,
        on_the_form: "Alternative: a Redis lock on the key, a point read, then the claim",
        name: "Redis lock on the key",
    },
    Choice {
        mode: IdempotencyMode::CheckThenInsert,
        on_the_form: "Naive: look it up, transfer, then record it",
        name: "check-then-insert (naive)",
    },
];

/// The ways to guard the balance, the service's first.
pub const ROW_GUARD_CHOICES: [Choice<RowGuardMode>; 4] = [
    Choice {
        mode: RowGuardMode::Guarded,
        on_the_form: "Guarded: check and debit in one statement",
        name: "conditional UPDATE (the service's)",
    },
    Choice {
        mode: RowGuardMode::ForUpdate,
        on_the_form: "Alternative: lock with SELECT … FOR UPDATE, decide, write",
        name: "SELECT … FOR UPDATE",
    },
    Choice {
        mode: RowGuardMode::OptimisticVersion,
        on_the_form: "Alternative: optimistic version, a conflict is answered 409",
        name: "optimistic version",
    },
    Choice {
        mode: RowGuardMode::ReadDecideWrite,
        on_the_form: "Naive: read the balance, decide, write it back",
        name: "read-decide-write (naive)",
    },
];

/// The short name of a mode the lab offers.
pub fn name_of<T: PartialEq + Copy>(choices: &[Choice<T>], mode: T) -> &'static str {
    choices
        .iter()
        .find(|choice| choice.mode == mode)
        .map_or("", |choice| choice.name)
}

/// The variants one lab run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Switches {
    /// Layer 1 on or off. Off, the lab request takes no window.
    pub cooldown: bool,
    /// Layer 2: atomic, or the naive check-then-insert.
    pub idempotency: IdempotencyMode,
    /// Layer 3: guarded, or the naive read-decide-write.
    pub row_guard: RowGuardMode,
    /// The run the request belongs to, if named.
    pub run: Option<Uuid>,
    /// Payouts: the outbox with one key per payout, the call inside the
    /// transaction, or a new key per attempt.
    pub payout_mode: PayoutMode,
    /// Payouts: whether the lab's bank deduplicates by key.
    pub bank_deduplicates: bool,
}

impl Switches {
    /// Every layer on, as in production.
    pub const ALL_ON: Switches = Switches {
        cooldown: true,
        idempotency: IdempotencyMode::Atomic,
        row_guard: RowGuardMode::Guarded,
        run: None,
        payout_mode: PayoutMode::Outbox,
        bank_deduplicates: true,
    };

    /// Parses the header's value; `None` for anything but the grammar
    /// above (each name at most once, every name optional, defaults on).
    pub fn parse(value: &str) -> Option<Switches> {
        let mut switches = Switches::ALL_ON;
        let mut seen = [false; 4];
        for member in value.split(',').map(str::trim).filter(|m| !m.is_empty()) {
            let (name, setting) = member.split_once('=')?;
            let slot = match (name.trim(), setting.trim()) {
                ("cooldown", "on") => {
                    switches.cooldown = true;
                    0
                }
                ("cooldown", "off") => {
                    switches.cooldown = false;
                    0
                }
                // Keys ignored altogether is a deployment's mode, not a switch.
                ("idempotency", mode) => {
                    switches.idempotency = parse_choice(mode).filter(|mode| *mode != IdempotencyMode::Off)?;
                    1
                }
                ("row_guard", mode) => {
                    switches.row_guard = parse_choice(mode)?;
                    2
                }
                ("run", run) => {
                    switches.run = Some(Uuid::try_parse(run).ok()?);
                    3
                }
                _ => return None,
            };
            if std::mem::replace(&mut seen[slot], true) {
                return None;
            }
        }
        Some(switches)
    }

    pub fn header_value(&self) -> String {
        let run = self.run.map(|run| format!(", run={run}")).unwrap_or_default();
        format!(
            "cooldown={}, idempotency={}, row_guard={}{run}",
            if self.cooldown { "on" } else { "off" },
            choice_name(&self.idempotency),
            choice_name(&self.row_guard),
        )
    }

    /// The layers switched off, in words for the page.
    pub fn off(&self) -> Vec<&'static str> {
        let mut off = Vec::new();
        if !self.cooldown {
            off.push("the cooldown lock is off");
        }
        match self.idempotency {
            IdempotencyMode::Atomic | IdempotencyMode::Off => {}
            IdempotencyMode::AdvisoryLock => off.push(
                "the idempotency key was claimed under a transaction's advisory lock on its hash, after a point read",
            ),
            IdempotencyMode::RedisKeyLock => {
                off.push("the idempotency key was claimed under a Redis lock on it, after a point read")
            }
            IdempotencyMode::CheckThenInsert => off.push("the idempotency key is checked, then inserted (naive)"),
        }
        match self.row_guard {
            RowGuardMode::Guarded => {}
            RowGuardMode::ForUpdate => {
                off.push("the row guard was replaced by SELECT … FOR UPDATE, a decision in the server, then the write")
            }
            RowGuardMode::OptimisticVersion => off.push(
                "the row guard was replaced by an optimistic version check: a write that finds the balance changed \
                 is a conflict, answered 409",
            ),
            RowGuardMode::ReadDecideWrite => off.push("the balance is read, decided on and written back (naive)"),
        }
        off
    }

    /// A payout run's switches that weaken it, in words for the page.
    pub fn payouts_off(&self) -> Vec<&'static str> {
        let mut off = Vec::new();
        match self.payout_mode {
            PayoutMode::Outbox => {}
            PayoutMode::CallInTransaction => off.push("the bank was called inside the payout's transaction"),
            PayoutMode::NewKeyPerAttempt => off.push("each attempt carried a new key"),
        }
        if !self.bank_deduplicates {
            off.push("the bank did not deduplicate by key");
        }
        off
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_round_trips_and_refuses_anything_else() {
        let naive = Switches {
            cooldown: false,
            idempotency: IdempotencyMode::CheckThenInsert,
            row_guard: RowGuardMode::ReadDecideWrite,
            run: Some(Uuid::new_v4()),
            ..Switches::ALL_ON
        };
        assert_eq!(Switches::parse(&naive.header_value()), Some(naive));
        assert_eq!(Switches::parse(""), Some(Switches::ALL_ON));
        assert_eq!(Switches::parse("cooldown=off").map(|s| s.cooldown), Some(false));
        for bad in [
            "cooldown",
            "cooldown=maybe",
            "idempotency=off",
            "cooldown=off, cooldown=on",
            "guard=guarded",
            "row_guard=naive",
            "run=42",
        ] {
            assert_eq!(Switches::parse(bad), None, "{bad}");
        }
    }
}
