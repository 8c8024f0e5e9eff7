//! Admission: how many transfers run their transaction at once on this
//! instance (`transfers_in_flight_max`).
//!
//! Past what PostgreSQL can take, more transfers in flight only queue for
//! a connection, each holding its request's memory and its client's
//! patience, until `db_acquire_wait_ms_max` answers them all 503 at once.
//! Here a transfer that finds no place within
//! `transfers_admission_wait_ms_max` is refused at once instead, with 503
//! `/problems/overloaded` and `Retry-After`, having changed nothing, so
//! that the transfers admitted keep their latency. It comes before the
//! cooldown: a refusal must cost the overloaded instance as little as
//! possible, so it takes no Redis round trip (nor a window to give back).

use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};

use crate::decision::{Layer, Outcome};
use crate::defense::Refusal;
use crate::problem::{Problem, ProblemType};
use crate::settings::Database;

pub struct Admission {
    places: Semaphore,
    in_flight_max: u32,
    wait: Duration,
}

impl Admission {
    pub fn new(database: &Database) -> Self {
        Self {
            places: Semaphore::new(database.transfers_in_flight_max as usize),
            in_flight_max: database.transfers_in_flight_max,
            wait: database.transfers_admission_wait,
        }
    }

    /// A place among the transfers in flight, held until the permit is
    /// dropped; or the refusal of an overloaded instance.
    pub async fn admit(&self) -> Result<SemaphorePermit<'_>, Refusal> {
        if let Ok(place) = self.places.try_acquire() {
            return Ok(place);
        }
        match tokio::time::timeout(self.wait, self.places.acquire()).await {
            Ok(Ok(place)) => Ok(place),
            // The semaphore is never closed; a timeout is the one refusal.
            Ok(Err(_)) | Err(_) => Err(self.overloaded()),
        }
    }

    fn overloaded(&self) -> Refusal {
        Refusal::new(
            Problem::new(
                ProblemType::Overloaded,
                format!(
                    "This instance is running as many transfers as it takes at once ({}), and none finished within \
                     {} ms. Nothing was changed; retry after Retry-After, with the same Idempotency-Key.",
                    self.in_flight_max,
                    self.wait.as_millis()
                ),
            )
            .with_retry_after_s(1),
            Layer::NoLayer,
            Outcome::Error,
        )
    }
}
