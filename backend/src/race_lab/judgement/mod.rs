//! What a run should have shown, given its preset and its switches, and
//! whether it did: judged against the database, never against a fixed
//! promise. With every layer that could stop the preset's race at full
//! strength, the expected result is the protection; with all of them off or
//! naive, it is the damage, counted. A weakened layer that the cooldown kept
//! out of reach is said to be hidden, not to have held.
//!
//! This judgement is the page's secondary line. Whether money was harmed
//! (`damage`) is the headline, and decides its colour.

mod damage;

pub use damage::{Damage, Harm};

use super::presets::{Funnel, KeyStrategy, Preset};
use super::switches::Switches;
use crate::settings::{IdempotencyMode, PayoutMode, RowGuardMode};

/// How a run ended, against what its switches predict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judgement {
    /// The layers that could stop this race were at full strength, and
    /// they held.
    Protected,
    /// They were at full strength and did not hold: a real failure.
    NotProtected,
    /// Every layer that could stop this race was off or naive, and the
    /// damage it exists to prevent happened.
    DamageAsExpected,
    /// A layer was made naive, but the cooldown stopped every copy before
    /// the naive layer was reached.
    HiddenByCooldown,
    /// Every layer that could stop this race was off or naive, yet the race
    /// did not hit this time.
    NoDamageThisTime,
}

/// Whether a layer that could stop this preset's race is at full strength.
fn defended(preset: Preset, switches: &Switches, keys: KeyStrategy) -> bool {
    // A claim under a lock, advisory or in Redis, holds the key too.
    let key_holds = keys == KeyStrategy::Same && switches.idempotency != IdempotencyMode::CheckThenInsert;
    match preset {
        Preset::SameKey | Preset::DoubleClick => switches.cooldown || key_holds,
        // The retries come after the window: only the key can catch them.
        Preset::RetryAfterWindow => key_holds,
        // Locking first, or an optimistic version, guards the balance too.
        Preset::Overdraw | Preset::Crossing => switches.row_guard != RowGuardMode::ReadDecideWrite,
        // For deliveries the first switch is the edge lock and the second
        // the inbox; the event id is the key, on every copy.
        Preset::WebhookStorm | Preset::Redelivery => {
            switches.cooldown || switches.idempotency != IdempotencyMode::CheckThenInsert
        }
        // The outbox, one key per payout and a bank that deduplicates by
        // it: each is needed, since the bank's lost answer is certain.
        Preset::LostAnswer => switches.payout_mode == PayoutMode::Outbox && switches.bank_deduplicates,
    }
}

impl Judgement {
    pub fn of(
        preset: Preset,
        switches: &Switches,
        keys: KeyStrategy,
        funnel: &Funnel,
        kept: bool,
        damage: &Damage,
    ) -> Self {
        // A delivery's third layer, the credit, has no naive variant; a
        // payout run's switches are its own, and the cooldown is not one.
        let weakened = !preset.is_payout()
            && (switches.idempotency == IdempotencyMode::CheckThenInsert
                || (switches.row_guard == RowGuardMode::ReadDecideWrite && !preset.is_delivery()));
        let cooldown_stopped_the_rest =
            switches.cooldown && funnel.cooldown > 0 && funnel.cooldown + 1 >= funnel.sent;
        if weakened && cooldown_stopped_the_rest && !damage.any() {
            Judgement::HiddenByCooldown
        } else if defended(preset, switches, keys) {
            if kept {
                Judgement::Protected
            } else {
                Judgement::NotProtected
            }
        } else if damage.any() {
            Judgement::DamageAsExpected
        } else {
            Judgement::NoDamageThisTime
        }
    }

    /// What the run showed against what its switches predict, in a
    /// sentence without a mark: marks and colour say whether money was
    /// harmed, and only that.
    pub fn sentence(self, preset: Preset, switches: &Switches, keys: KeyStrategy, funnel: &Funnel) -> String {
        let (cause, layer) = cause(preset, switches, keys);
        match self {
            Judgement::Protected => "This is what the layers at full strength should show.".to_owned(),
            Judgement::NotProtected => {
                "The layers that should stop this race were at full strength, yet the run did \
                                        not show what they promise: see the checks below."
                    .to_owned()
            }
            Judgement::DamageAsExpected => {
                format!("This is the damage let through with {cause}: {layer} exists to stop it.")
            }
            Judgement::HiddenByCooldown => {
                let first = preset.first_layer();
                format!(
                    "{} {} {} of the {} copies, so the weakened layer was never reached and could not fail. Switch \
                     {first} off and fire again to watch it fail.",
                    capitalised(first),
                    if preset.is_delivery() {
                        "answered"
                    } else {
                        "stopped"
                    },
                    funnel.cooldown,
                    funnel.sent
                )
            }
            Judgement::NoDamageThisTime => format!(
                "With {cause}, the race did not hit this time. Fire again: nothing but {layer} makes that certain."
            ),
        }
    }
}

fn capitalised(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map(|first| first.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// Which switched layer a damage is the work of, and what that layer
/// exists to stop, for the headline.
pub fn cause(preset: Preset, switches: &Switches, keys: KeyStrategy) -> (String, &'static str) {
    let mut causes = Vec::new();
    match preset {
        Preset::SameKey | Preset::DoubleClick | Preset::RetryAfterWindow => {
            if !switches.cooldown && preset != Preset::RetryAfterWindow {
                causes.push("the cooldown off");
            }
            match keys {
                KeyStrategy::Same if switches.idempotency == IdempotencyMode::CheckThenInsert => {
                    causes.push("the naive key")
                }
                KeyStrategy::Same => {}
                KeyStrategy::NewPerRequest => causes.push("a new key for each copy"),
                KeyStrategy::None => causes.push("no key"),
            }
            (
                causes.join(" and "),
                "the idempotency key (and the cooldown before it)",
            )
        }
        Preset::Overdraw | Preset::Crossing => ("the naive row guard".to_owned(), "the row guard"),
        Preset::WebhookStorm | Preset::Redelivery => {
            if !switches.cooldown {
                causes.push("the edge lock off");
            }
            if switches.idempotency == IdempotencyMode::CheckThenInsert {
                causes.push("the naive inbox");
            }
            (causes.join(" and "), "the inbox (and the edge lock before it)")
        }
        Preset::LostAnswer => {
            match switches.payout_mode {
                PayoutMode::Outbox => {}
                PayoutMode::CallInTransaction => causes.push("the bank called inside the transaction"),
                PayoutMode::NewKeyPerAttempt => causes.push("a new key on each attempt"),
            }
            if !switches.bank_deduplicates {
                causes.push("a bank that does not deduplicate");
            }
            (
                causes.join(" and "),
                "the outbox, with one key per payout that the bank deduplicates by",
            )
        }
    }
}

#[cfg(test)]
mod tests;
