//! A race-lab request's pass: proof that this instance's own burst fired
//! the request, for this visitor and this run. Switches are honoured only
//! with a valid pass, so no API client can switch a layer off, or take a
//! fresh cooldown window with a new run id, for itself.
//!
//! `Race-Lab-Pass: <run>.<shot>.<expires_unix_ms>.<mac>`, where the MAC is
//! HMAC-SHA256 of the visitor, the run, the shot's number, the expiry and
//! the switches header exactly as sent. The key is made at start-up and
//! never leaves the process, so a pass works only on the instance that
//! minted it, which is the one the burst is sent to; and each shot of a run
//! is accepted once, so a captured pass cannot be sent again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use uuid::Uuid;

use crate::domain::UserId;

pub const HEADER: &str = "race-lab-pass";

/// Why a pass was refused. Each but `Full` is answered the same way (403
/// `race-lab-pass-invalid`); the reason goes to the log only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PassRefused {
    #[error("no pass came with the switches")]
    Missing,
    #[error("the pass does not read as a pass")]
    Malformed,
    #[error("the pass was not minted here for this visitor, run and switches")]
    Forged,
    #[error("the pass has expired")]
    Expired,
    #[error("the pass was used already")]
    Used,
    /// Not the client's fault: the instance holds as many used passes as
    /// it may. Answered busy, not as a forgery.
    #[error("this instance holds as many used passes as it may")]
    Full,
}

/// The passes this instance mints, and the shots already accepted.
pub struct LabPasses {
    key: [u8; 32],
    /// (run, shot) → expiry in unix ms, for passes accepted once.
    used: Mutex<HashMap<(Uuid, u32), u64>>,
    /// Used passes held until they expire (`race_lab_passes_held_max`).
    used_max: usize,
}

fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

impl LabPasses {
    pub fn new(used_max: usize) -> Self {
        let mut key = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut key);
        Self {
            key,
            used: Mutex::default(),
            used_max,
        }
    }

    fn mac(&self, user: UserId, run: Uuid, shot: u32, expires_ms: u64, switches: &str) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("any key length");
        mac.update(format!("race-lab-pass\n{user}\n{run}\n{shot}\n{expires_ms}\n{switches}").as_bytes());
        mac
    }

    /// The pass of one shot of a run, valid for `lifetime`.
    pub fn mint(&self, user: UserId, run: Uuid, shot: u32, switches: &str, lifetime: Duration) -> String {
        let expires_ms = unix_ms(SystemTime::now() + lifetime);
        let mac = self
            .mac(user, run, shot, expires_ms, switches)
            .finalize()
            .into_bytes();
        format!("{run}.{shot}.{expires_ms}.{}", hex::encode(mac))
    }

    /// Accepts a pass once, for `user`, with the switches header it came
    /// with; answers the run it belongs to. The MAC is compared in constant
    /// time, before anything is remembered.
    pub fn accept(&self, user: UserId, pass: Option<&str>, switches: &str) -> Result<Uuid, PassRefused> {
        let pass = pass.ok_or(PassRefused::Missing)?;
        let mut parts = pass.split('.');
        let (Some(run), Some(shot), Some(expires_ms), Some(mac), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(PassRefused::Malformed);
        };
        let (Ok(run), Ok(shot), Ok(expires_ms), Ok(mac)) = (
            Uuid::try_parse(run),
            shot.parse::<u32>(),
            expires_ms.parse::<u64>(),
            hex::decode(mac),
        ) else {
            return Err(PassRefused::Malformed);
        };
        self.mac(user, run, shot, expires_ms, switches)
            .verify_slice(&mac)
            .map_err(|_| PassRefused::Forged)?;
        let now_ms = unix_ms(SystemTime::now());
        if expires_ms <= now_ms {
            return Err(PassRefused::Expired);
        }
        let mut used = self.used.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        used.retain(|_, expiry| *expiry > now_ms);
        if used.contains_key(&(run, shot)) {
            return Err(PassRefused::Used);
        }
        if used.len() >= self.used_max {
            return Err(PassRefused::Full);
        }
        used.insert((run, shot), expires_ms);
        Ok(run)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SWITCHES: &str =
        "cooldown=off, idempotency=atomic, row_guard=guarded, run=0192a6c4-0000-7000-8000-000000000001";

    fn run() -> Uuid {
        Uuid::try_parse("0192a6c4-0000-7000-8000-000000000001").expect("uuid")
    }

    #[test]
    fn a_minted_pass_is_accepted_once() {
        let passes = LabPasses::new(10);
        let user = UserId(Uuid::new_v4());
        let pass = passes.mint(user, run(), 0, SWITCHES, Duration::from_secs(30));
        assert_eq!(passes.accept(user, Some(&pass), SWITCHES), Ok(run()));
        assert_eq!(passes.accept(user, Some(&pass), SWITCHES), Err(PassRefused::Used));
        let next = passes.mint(user, run(), 1, SWITCHES, Duration::from_secs(30));
        assert_eq!(passes.accept(user, Some(&next), SWITCHES), Ok(run()));
    }

    #[test]
    fn a_pass_binds_the_visitor_the_switches_and_the_instance() {
        let passes = LabPasses::new(10);
        let user = UserId(Uuid::new_v4());
        let pass = passes.mint(user, run(), 0, SWITCHES, Duration::from_secs(30));
        let someone_else = UserId(Uuid::new_v4());
        assert_eq!(
            passes.accept(someone_else, Some(&pass), SWITCHES),
            Err(PassRefused::Forged)
        );
        let weaker = SWITCHES.replace("row_guard=guarded", "row_guard=read_decide_write");
        assert_eq!(
            passes.accept(user, Some(&pass), &weaker),
            Err(PassRefused::Forged)
        );
        let another_instance = LabPasses::new(10);
        assert_eq!(
            another_instance.accept(user, Some(&pass), SWITCHES),
            Err(PassRefused::Forged)
        );
    }

    #[test]
    fn a_missing_malformed_or_expired_pass_is_refused() {
        let passes = LabPasses::new(10);
        let user = UserId(Uuid::new_v4());
        assert_eq!(passes.accept(user, None, SWITCHES), Err(PassRefused::Missing));
        for bad in ["", "x", "a.b.c.d", "a.b.c.d.e", &format!("{}.0.1.zz", run())] {
            assert_eq!(
                passes.accept(user, Some(bad), SWITCHES),
                Err(PassRefused::Malformed),
                "{bad}"
            );
        }
        let expired = passes.mint(user, run(), 0, SWITCHES, Duration::ZERO);
        assert_eq!(
            passes.accept(user, Some(&expired), SWITCHES),
            Err(PassRefused::Expired)
        );
    }

    #[test]
    fn the_passes_held_are_bounded() {
        let passes = LabPasses::new(2);
        let user = UserId(Uuid::new_v4());
        for shot in 0..2 {
            let pass = passes.mint(user, run(), shot, SWITCHES, Duration::from_secs(30));
            assert!(passes.accept(user, Some(&pass), SWITCHES).is_ok());
        }
        let third = passes.mint(user, run(), 2, SWITCHES, Duration::from_secs(30));
        assert_eq!(
            passes.accept(user, Some(&third), SWITCHES),
            Err(PassRefused::Full)
        );
    }
}
