//! Admission: how many transfers run their transaction at once on this
//! instance (`transfers_in_flight_max`), and how many may wait for a place
//! (`transfers_admission_queue_max`).
//!
//! Past what PostgreSQL can take, more transfers in flight only queue for
//! a connection, each holding its request's memory and its client's
//! patience, until `db_acquire_wait_ms_max` answers them all 503 at once.
//! Here a transfer that finds the places taken joins a short queue; when
//! that queue is full, or no place frees within
//! `transfers_admission_wait_ms_max`, it is refused instead, with 503
//! `/problems/overloaded` and `Retry-After`, having changed nothing, so
//! that the transfers admitted keep their latency.
//!
//! The queue is bounded because a refusal must cost the overloaded
//! instance as little as possible. A queue as long as the places keeps
//! every freed place taken at once, which is all a queue is for here;
//! past that, a transfer that waited would only be refused later, after a
//! timer, a wake-up and the memory of a request held all that time.
//!
//! Admission comes after the cooldown, and counts only the transfers that
//! passed it. A burst of copies of one transfer is not overload: the
//! cooldown refuses every copy but the first with a 429 in one Redis round
//! trip, without touching PostgreSQL. Were the copies counted here first,
//! they would fill the places and the queue, and most would be told 503
//! "overloaded" instead of the 429 that says what they are (448 of 500
//! identical copies sent at once, when admission came first). What real
//! overload pays for this is that round trip, and one more to give the
//! window back: a refused transfer changed nothing, and its honest retry
//! must not meet the window.

use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};

use crate::decision::{Layer, Outcome};
use crate::defense::Refusal;
use crate::metrics::Occupancy;
use crate::problem::{Problem, ProblemType};
use crate::settings::Database;

pub struct Admission {
    /// One per transfer running.
    places: Semaphore,
    /// One per transfer admitted, running or waiting for a place
    /// (`transfers_in_flight_max` + `transfers_admission_queue_max`). A
    /// transfer holds it until it is decided, with its place: the queue
    /// frees a turn exactly when a place is handed on, so a request that
    /// arrives in between is not refused for a turn not yet given back.
    entries: Semaphore,
    in_flight_max: u32,
    queue_max: u32,
    wait: Duration,
}

/// A transfer's place, and its entry: given back together when it is
/// decided.
pub struct Admitted<'a> {
    _place: SemaphorePermit<'a>,
    _entry: SemaphorePermit<'a>,
}

impl Admission {
    pub fn new(database: &Database) -> Self {
        Self {
            places: Semaphore::new(database.transfers_in_flight_max as usize),
            entries: Semaphore::new(
                (database.transfers_in_flight_max + database.transfers_admission_queue_max) as usize,
            ),
            in_flight_max: database.transfers_in_flight_max,
            queue_max: database.transfers_admission_queue_max,
            wait: database.transfers_admission_wait,
        }
    }

    /// A place among the transfers in flight, held until `Admitted` is
    /// dropped; or the refusal of an overloaded instance.
    pub async fn admit(&self) -> Result<Admitted<'_>, Refusal> {
        let Ok(entry) = self.entries.try_acquire() else {
            return Err(self.overloaded(format!(
                "and as many as may wait for a place are waiting ({})",
                self.queue_max
            )));
        };
        let place = match self.places.try_acquire() {
            Ok(place) => Some(place),
            // The semaphore is never closed: `None` is a timeout.
            Err(_) => tokio::time::timeout(self.wait, self.places.acquire())
                .await
                .ok()
                .and_then(Result::ok),
        };
        let Some(place) = place else {
            return Err(self.overloaded(format!("and none finished within {} ms", self.wait.as_millis())));
        };
        Ok(Admitted {
            _place: place,
            _entry: entry,
        })
    }

    pub fn occupancy(&self) -> Occupancy {
        let taken = |max: u32, semaphore: &Semaphore| {
            max.saturating_sub(u32::try_from(semaphore.available_permits()).unwrap_or(u32::MAX))
        };
        let running = taken(self.in_flight_max, &self.places);
        let admitted = taken(self.in_flight_max + self.queue_max, &self.entries);
        Occupancy {
            running,
            waiting: admitted.saturating_sub(running),
            running_max: self.in_flight_max,
            waiting_max: self.queue_max,
        }
    }

    /// `why` ends the first sentence: what was full.
    fn overloaded(&self, why: String) -> Refusal {
        Refusal::new(
            Problem::new(
                ProblemType::Overloaded,
                format!(
                    "This instance is running as many transfers as it takes at once ({}), {why}. Nothing was \
                     changed; retry after Retry-After, with the same Idempotency-Key.",
                    self.in_flight_max,
                ),
            )
            .with_retry_after_s(1),
            Layer::NoLayer,
            Outcome::Error,
        )
    }
}
