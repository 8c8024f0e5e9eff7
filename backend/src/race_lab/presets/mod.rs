//! The shapes of burst that reach each layer, and what each should show.
//!
//! A preset fixes the wallets, the amount, the timing and its default
//! switches; the visitor may change the switches and the key strategy to
//! watch a layer alone, or the damage when it is off. After the run the
//! page checks the preset's promise against the database.

use std::time::Duration;

use super::burst::{Answer, Shot};
use super::{LabState, Switches};
use crate::decision::{Layer, Outcome};
use crate::settings::IdempotencyMode;

mod plan;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// A client retrying one transfer: N copies at once, one key.
    SameKey,
    /// Double clicks: N copies at once, no key.
    DoubleClick,
    /// One transfer, then, once the cooldown window has passed, N − 1
    /// retries with its key.
    RetryAfterWindow,
    /// N different transfers whose sum is about twice the balance.
    Overdraw,
    /// Transfers both ways between the two lab wallets at once.
    Crossing,
    /// Money that arrives: a payment provider delivering one deposit event
    /// N times at once, to wallet A from wallet B (the lab's stand-in for
    /// the provider's clearing account).
    WebhookStorm,
    /// One deposit event delivered, then, while that delivery is still
    /// being applied, delivered again N − 1 times: a provider whose
    /// time-out is shorter than the service's work.
    Redelivery,
    /// Money that leaves: N payouts from wallet A at once, each with its
    /// own key, to the lab's bank, which sends each one, then loses its
    /// first answer.
    LostAnswer,
}

/// How long after the first delivery the redeliveries of the `Redelivery`
/// preset start: shorter than a delivery takes, so that they overlap it.
pub const REDELIVERY_AFTER: Duration = Duration::from_millis(5);

/// Which idempotency keys the requests of a run carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyStrategy {
    Same,
    NewPerRequest,
    None,
}

/// The requests of a run: a first wave, then, after `pause`, a second.
pub struct Plan {
    pub waves: Vec<Vec<Shot>>,
    pub pause: Duration,
    /// What each request moves, in lab minor units.
    pub amount_minor: i64,
}

impl Preset {
    pub const ALL: [Preset; 8] = [
        Preset::SameKey,
        Preset::DoubleClick,
        Preset::RetryAfterWindow,
        Preset::Overdraw,
        Preset::Crossing,
        Preset::WebhookStorm,
        Preset::Redelivery,
        Preset::LostAnswer,
    ];

    /// The layers `switches` weaken for a run of this preset, in words for
    /// the page: for deliveries, the first switch is the edge lock and the
    /// second the inbox, and the credit cannot be weakened.
    pub fn switched_off(self, switches: &Switches) -> Vec<&'static str> {
        if self.is_payout() {
            return switches.payouts_off();
        }
        if !self.is_delivery() {
            return switches.off();
        }
        let mut off = Vec::new();
        if !switches.cooldown {
            off.push("the edge lock on the event is off");
        }
        if switches.idempotency == IdempotencyMode::CheckThenInsert {
            off.push("the inbox is checked, then written after the credit (naive)");
        }
        off
    }

    /// The first layer a run of this preset meets, for the page.
    pub fn first_layer(self) -> &'static str {
        if self.is_delivery() {
            "the edge lock"
        } else if self.is_payout() {
            "the idempotency key"
        } else {
            "the cooldown lock"
        }
    }

    /// A preset of deliveries of one deposit event, rather than transfers:
    /// its layers are the edge lock, the inbox and the credit.
    pub fn is_delivery(self) -> bool {
        matches!(self, Preset::WebhookStorm | Preset::Redelivery)
    }

    /// A preset of payouts to the lab's bank: its switches are how the
    /// payouts reach the bank and whether the bank deduplicates.
    pub fn is_payout(self) -> bool {
        self == Preset::LostAnswer
    }

    pub fn slug(self) -> &'static str {
        match self {
            Preset::SameKey => "same-key",
            Preset::DoubleClick => "double-click",
            Preset::RetryAfterWindow => "retry-after-window",
            Preset::Overdraw => "overdraw",
            Preset::Crossing => "crossing",
            Preset::WebhookStorm => "webhook-storm",
            Preset::Redelivery => "redelivery",
            Preset::LostAnswer => "lost-answer",
        }
    }

    pub fn from_slug(slug: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|preset| preset.slug() == slug)
    }

    pub fn label(self) -> &'static str {
        match self {
            Preset::SameKey => "A client retrying: the same transfer, the same key, all at once",
            Preset::DoubleClick => "Double clicks: the same transfer, no key, all at once",
            Preset::RetryAfterWindow => {
                "Retry after the window: one transfer, then retries with its key once the cooldown has passed"
            }
            Preset::Overdraw => "Overdraw: different transfers adding up to twice the balance, all at once",
            Preset::Crossing => "Crossing: transfers from A to B and from B to A, all at once",
            Preset::WebhookStorm => {
                "Webhook storm: a payment provider delivers one deposit event into A, all copies at once"
            }
            Preset::Redelivery => {
                "Redelivery: one deposit event, delivered again while its first delivery is still being applied"
            }
            Preset::LostAnswer => {
                "Lost answer: payouts from A to a bank that sends each one, then loses its first answer"
            }
        }
    }

    /// The switches a preset starts with: the cooldown lets one request per
    /// window through, so the presets aimed at the row guard switch it off.
    pub fn default_switches(self) -> Switches {
        match self {
            Preset::Overdraw | Preset::Crossing => Switches {
                cooldown: false,
                ..Switches::ALL_ON
            },
            _ => Switches::ALL_ON,
        }
    }

    pub fn default_keys(self) -> KeyStrategy {
        match self {
            // A delivery's key is its event id, the same on every copy.
            Preset::SameKey | Preset::RetryAfterWindow | Preset::WebhookStorm | Preset::Redelivery => {
                KeyStrategy::Same
            }
            Preset::DoubleClick => KeyStrategy::None,
            // Each payout is a different order, with a key of its own.
            Preset::Overdraw | Preset::Crossing | Preset::LostAnswer => KeyStrategy::NewPerRequest,
        }
    }

    /// What the run should show, as the page states it before the verdict.
    pub fn promise(self) -> &'static str {
        match self {
            Preset::SameKey | Preset::DoubleClick => {
                "Exactly one transfer moves money, however many copies arrive together."
            }
            Preset::RetryAfterWindow => {
                "One transfer moves money; the retry that arrives after the cooldown window is answered with the \
                 stored result (a replay) and moves nothing."
            }
            Preset::Overdraw => {
                "No more than the balance leaves wallet A: the row guard refuses the transfers the balance cannot \
                 cover."
            }
            Preset::Crossing => {
                "Every transfer moves or is refused cleanly, without a deadlock, and no money is created or lost."
            }
            Preset::WebhookStorm | Preset::Redelivery => {
                "The event is credited exactly once, however many deliveries arrive together; every delivery gets \
                 the same answer."
            }
            Preset::LostAnswer => {
                "Each payout leaves the bank exactly once and is debited once: after the lost answer, the retry \
                 asks again with the same key and the bank replays what it did."
            }
        }
    }

    /// Whether the run showed what the preset promises, judged from the
    /// database and the answers.
    pub fn kept(self, funnel: &Funnel, state: &LabState, plan: &Plan, balance_minor: i64) -> bool {
        let clean = state.invariants_hold();
        clean
            && match self {
                Preset::SameKey | Preset::DoubleClick | Preset::WebhookStorm | Preset::Redelivery => {
                    state.transfers == 1 && state.moved_minor == plan.amount_minor
                }
                Preset::RetryAfterWindow => state.transfers == 1 && funnel.replayed >= 1,
                // The row guard refuses what the balance cannot cover, unless
                // the cooldown already stopped the copies before it.
                Preset::Overdraw => {
                    state.moved_minor <= balance_minor && (funnel.guard >= 1 || funnel.cooldown > 0)
                }
                Preset::Crossing => funnel.failed == 0,
                // Every order held and settled, each sent exactly once.
                Preset::LostAnswer => {
                    let orders = i64::try_from(funnel.sent).unwrap_or(i64::MAX);
                    state.payouts_settled == orders
                        && state.bank_sendings == orders
                        && state.payouts_debited_minor == orders * plan.amount_minor
                        && state.bank_checks().iter().all(|check| check.holds)
                }
            }
    }
}

impl KeyStrategy {
    pub fn slug(self) -> &'static str {
        match self {
            KeyStrategy::Same => "same",
            KeyStrategy::NewPerRequest => "new",
            KeyStrategy::None => "none",
        }
    }

    /// What the requests carried, for the page.
    pub fn described(self) -> &'static str {
        match self {
            KeyStrategy::Same => "one key shared by every request",
            KeyStrategy::NewPerRequest => "a new key for each request",
            KeyStrategy::None => "no key",
        }
    }

    pub fn from_slug(slug: &str) -> Option<Self> {
        [KeyStrategy::Same, KeyStrategy::NewPerRequest, KeyStrategy::None]
            .into_iter()
            .find(|strategy| strategy.slug() == slug)
    }
}

/// Where the requests of a run stopped.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Funnel {
    pub sent: usize,
    /// Refused by the cooldown window.
    pub cooldown: usize,
    /// Stopped by the idempotency key: replays, keys in flight or reused.
    pub key: usize,
    /// ...of which replays.
    pub replayed: usize,
    /// Refused by the row guard (insufficient funds and the like).
    pub guard: usize,
    /// Moved money.
    pub moved: usize,
    /// No answer, or an error answer.
    pub failed: usize,
}

/// The stage of the funnel where a request stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    Cooldown,
    Key,
    Guard,
    Moved,
    Other,
}

impl Stage {
    /// In the order a request meets them.
    pub const ALL: [Stage; 5] = [
        Stage::Cooldown,
        Stage::Key,
        Stage::Guard,
        Stage::Moved,
        Stage::Other,
    ];

    pub fn of(answer: &Answer) -> Stage {
        match answer.decision {
            Some(decision)
                if decision.outcome == Outcome::Accepted || decision.outcome == Outcome::Degraded =>
            {
                Stage::Moved
            }
            Some(decision) => match decision.layer {
                Layer::Cooldown if decision.outcome == Outcome::Rejected => Stage::Cooldown,
                Layer::EdgeLock if answer.status < 500 => Stage::Cooldown,
                Layer::Inbox
                    if matches!(
                        decision.outcome,
                        Outcome::Replayed | Outcome::InFlight | Outcome::PayloadChanged
                    ) =>
                {
                    Stage::Key
                }
                Layer::Idempotency
                    if matches!(
                        decision.outcome,
                        Outcome::Replayed | Outcome::InFlight | Outcome::KeyReused
                    ) =>
                {
                    Stage::Key
                }
                Layer::RowGuard if answer.status < 500 => Stage::Guard,
                _ => Stage::Other,
            },
            None => Stage::Other,
        }
    }

    /// What the stage is called for a run of `preset`: a transfer's layers,
    /// or a delivery's.
    pub fn label(self, preset: Preset) -> &'static str {
        if preset.is_payout() {
            return match self {
                Stage::Cooldown => "Stopped by the cooldown lock",
                Stage::Key => "Stopped by the idempotency key",
                Stage::Guard => "Refused by the hold",
                Stage::Moved => "Held and accepted",
                Stage::Other => "Failed, or outcome unknown",
            };
        }
        match (self, preset.is_delivery()) {
            (Stage::Cooldown, false) => "Stopped by the cooldown lock",
            (Stage::Key, false) => "Stopped by the idempotency key",
            (Stage::Guard, false) => "Stopped by the row guard",
            (Stage::Moved, false) => "Moved money",
            (Stage::Cooldown, true) => "Answered by the edge lock",
            (Stage::Key, true) => "Answered by the inbox",
            (Stage::Guard, true) => "Refused by the credit",
            (Stage::Moved, true) => "Credited",
            (Stage::Other, _) => "Failed or refused for another reason",
        }
    }

    /// The style class, for colour.
    pub fn class(self) -> &'static str {
        match self {
            Stage::Cooldown => "cooldown",
            Stage::Key => "key",
            Stage::Guard => "guard",
            Stage::Moved => "moved",
            Stage::Other => "other",
        }
    }
}

impl Funnel {
    pub fn of(answers: &[Answer]) -> Self {
        let mut funnel = Funnel {
            sent: answers.len(),
            ..Funnel::default()
        };
        for answer in answers {
            match Stage::of(answer) {
                Stage::Cooldown => funnel.cooldown += 1,
                Stage::Key => {
                    funnel.key += 1;
                    if answer.replayed {
                        funnel.replayed += 1;
                    }
                }
                Stage::Guard => funnel.guard += 1,
                Stage::Moved => funnel.moved += 1,
                Stage::Other => funnel.failed += 1,
            }
        }
        funnel
    }
}
