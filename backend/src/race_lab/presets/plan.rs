//! A preset's requests: what each moves, between which wallets, with which
//! key, and in how many waves.

use std::time::Duration;

use uuid::Uuid;

use super::{KeyStrategy, Plan, Preset, REDELIVERY_AFTER};
use crate::race_lab::LabWallets;
use crate::race_lab::burst::Shot;

impl Preset {
    /// The requests of a run of `count` against wallets of `balance_minor`.
    pub fn plan(
        self,
        wallets: LabWallets,
        count: usize,
        balance_minor: i64,
        keys: KeyStrategy,
        window: Duration,
    ) -> Plan {
        let shared_key = Uuid::new_v4();
        // Every delivery carries the event's id, and every payout order a
        // key of its own: the keys strategy is a retrying client's.
        let keys = if self.is_delivery() || self.is_payout() {
            self.default_keys()
        } else {
            keys
        };
        let amount_minor = self.amount_minor(count, balance_minor);
        let shot = |from: Uuid, to: Uuid| Shot {
            from,
            to,
            amount_minor,
            key: match keys {
                KeyStrategy::Same => Some(shared_key),
                KeyStrategy::NewPerRequest => Some(Uuid::new_v4()),
                KeyStrategy::None => None,
            },
        };
        let (waves, pause) = self.waves(wallets, count, window, shot);
        Plan {
            waves,
            pause,
            amount_minor,
        }
    }

    /// What each request of a run of `count` moves, in lab minor units.
    fn amount_minor(self, count: usize, balance_minor: i64) -> i64 {
        let count = i64::try_from(count).unwrap_or(i64::MAX);
        match self {
            // N × amount ≈ 2 × balance: about half must be refused.
            Preset::Overdraw => ((2 * balance_minor + count - 1) / count.max(1)).max(1),
            // Small enough that wallet B covers every delivery even if each
            // one credits: the damage is counted, never refused.
            // Small enough that wallet A covers every payout.
            Preset::WebhookStorm | Preset::Redelivery | Preset::LostAnswer => {
                (balance_minor / (2 * count).max(1)).max(1)
            }
            _ => (balance_minor / 20).max(1),
        }
    }

    /// The run's requests, made by `shot` from one wallet to another, in
    /// waves, and the pause between the first wave and the second.
    fn waves(
        self,
        wallets: LabWallets,
        count: usize,
        window: Duration,
        shot: impl Fn(Uuid, Uuid) -> Shot,
    ) -> (Vec<Vec<Shot>>, Duration) {
        let LabWallets { a, b } = wallets;
        match self {
            Preset::RetryAfterWindow => {
                let first = vec![shot(a, b)];
                let retries = (1..count).map(|_| shot(a, b)).collect();
                // Past the window, with a margin for clocks and queues.
                (vec![first, retries], window + Duration::from_millis(250))
            }
            Preset::Crossing => {
                let both_ways = (0..count)
                    .map(|i| if i % 2 == 0 { shot(a, b) } else { shot(b, a) })
                    .collect();
                (vec![both_ways], Duration::ZERO)
            }
            // The money arrives in A from B, B standing in for the
            // provider's clearing account.
            Preset::WebhookStorm => (vec![(0..count).map(|_| shot(b, a)).collect()], Duration::ZERO),
            Preset::Redelivery => (
                vec![vec![shot(b, a)], (1..count).map(|_| shot(b, a)).collect()],
                REDELIVERY_AFTER,
            ),
            _ => (vec![(0..count).map(|_| shot(a, b)).collect()], Duration::ZERO),
        }
    }
}
