//! Who may deposit: the payment provider, proved by a signature over the
//! exact bytes it sent.
//!
//! The header reads `Provider-Signature: t=<unix seconds>,v1=<hex>`, where
//! the hex is HMAC-SHA256 under a shared secret of `t` + `.` + the body.
//! Signing the time with the body means a captured delivery cannot be
//! replayed after `provider_signature_tolerance_s`; the inbox makes a
//! replay within it harmless anyway. Several `v1` values may be sent, and
//! several secrets configured (`provider_webhook_secrets`), so that a
//! secret can be rotated without refusing a single delivery.
//!
//! Every comparison is in constant time (`Mac::verify_slice`). Nothing
//! here is logged but the reason for a refusal; never a secret, a MAC or
//! the body.

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha2::Sha256;

/// Lower-case, as `HeaderName::from_static` requires.
pub const HEADER: &str = "provider-signature";

/// `v1` values read from one header at most: enough for a rotation, and a
/// bound on the work a forged header can ask for.
const SIGNATURES_PER_HEADER_MAX: usize = 4;

/// Why a delivery's signature was refused. Each is a 401 that stores
/// nothing; the reason is said to the caller (none reveals a secret).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureRefused {
    #[error("no Provider-Signature header was sent")]
    Missing,
    #[error("the Provider-Signature header must read t=<unix seconds>,v1=<64 hex digits>")]
    Malformed,
    #[error("the signature's time is further from now than the tolerance allows")]
    Stale,
    #[error("no signature matches the body under any configured secret")]
    Mismatch,
    #[error("this deployment has no provider secret, so it accepts no deposits")]
    NoSecret,
}

impl SignatureRefused {
    /// A short name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            SignatureRefused::Missing => "missing",
            SignatureRefused::Malformed => "malformed",
            SignatureRefused::Stale => "stale",
            SignatureRefused::Mismatch => "mismatch",
            SignatureRefused::NoSecret => "no_secret",
        }
    }
}

/// The provider's secrets and how far a signature's time may drift.
#[derive(Clone)]
pub struct ProviderSignatures {
    secrets: Vec<SecretString>,
    tolerance_s: i64,
}

/// A parsed header: its time and the MACs it carries.
struct Signed {
    at_s: i64,
    macs: Vec<[u8; 32]>,
}

impl ProviderSignatures {
    pub fn new(secrets: Vec<SecretString>, tolerance: std::time::Duration) -> Self {
        Self {
            secrets,
            tolerance_s: i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX),
        }
    }

    /// Checks `header` (the raw `Provider-Signature` value, if any) against
    /// `body` at time `now`.
    pub fn verify(
        &self,
        header: Option<&[u8]>,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<(), SignatureRefused> {
        if self.secrets.is_empty() {
            return Err(SignatureRefused::NoSecret);
        }
        let header = header.ok_or(SignatureRefused::Missing)?;
        let signed = parse(header).ok_or(SignatureRefused::Malformed)?;
        if (now.timestamp() - signed.at_s).abs() > self.tolerance_s {
            return Err(SignatureRefused::Stale);
        }
        let matches = self.secrets.iter().any(|secret| {
            signed
                .macs
                .iter()
                .any(|mac| mac_of(secret, signed.at_s, body).verify_slice(mac).is_ok())
        });
        matches.then_some(()).ok_or(SignatureRefused::Mismatch)
    }
}

/// The header a provider sends for `body` at `at` under `secret`: what the
/// simulator and the tests sign with, by the same rule.
pub fn header_for(secret: &SecretString, at: DateTime<Utc>, body: &[u8]) -> String {
    let mac = mac_of(secret, at.timestamp(), body).finalize().into_bytes();
    format!("t={},v1={}", at.timestamp(), hex::encode(mac))
}

fn mac_of(secret: &SecretString, at_s: i64, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.expose_secret().as_bytes()).expect("any key length");
    mac.update(at_s.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// `t=<seconds>,v1=<hex>[,v1=<hex>…]`, in any order; other schemes are
/// skipped, as a provider may add them.
fn parse(header: &[u8]) -> Option<Signed> {
    let header = std::str::from_utf8(header).ok()?;
    let mut at_s = None;
    let mut macs = Vec::new();
    for part in header.split(',') {
        let (name, value) = part.trim().split_once('=')?;
        match name {
            "t" if at_s.is_none() => at_s = Some(value.parse::<i64>().ok().filter(|t| *t >= 0)?),
            "t" => return None,
            "v1" if macs.len() < SIGNATURES_PER_HEADER_MAX => {
                let mut mac = [0u8; 32];
                hex::decode_to_slice(value, &mut mac).ok()?;
                macs.push(mac);
            }
            "v1" => return None,
            _ => {}
        }
    }
    (!macs.is_empty()).then_some(Signed { at_s: at_s?, macs })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(text: &str) -> SecretString {
        SecretString::from(text.to_owned())
    }

    fn signatures() -> ProviderSignatures {
        ProviderSignatures::new(
            vec![
                secret("old-secret-old-secret-old-secret-0"),
                secret("new-secret-new-secret-new-secret-1"),
            ],
            std::time::Duration::from_secs(300),
        )
    }

    #[test]
    fn a_signature_under_any_configured_secret_is_accepted() {
        let now = Utc::now();
        let body = br#"{"event_id":"evt_1"}"#;
        for key in [
            "old-secret-old-secret-old-secret-0",
            "new-secret-new-secret-new-secret-1",
        ] {
            let header = header_for(&secret(key), now, body);
            assert_eq!(signatures().verify(Some(header.as_bytes()), body, now), Ok(()));
        }
    }

    #[test]
    fn every_broken_signature_is_refused_with_its_reason() {
        let now = Utc::now();
        let body = br#"{"event_id":"evt_1"}"#;
        let good = header_for(&secret("new-secret-new-secret-new-secret-1"), now, body);
        let other_key = header_for(&secret("another-secret-another-secret-xx"), now, body);
        let old = header_for(
            &secret("new-secret-new-secret-new-secret-1"),
            now - chrono::TimeDelta::seconds(301),
            body,
        );
        let cases: [(Option<&str>, &[u8], SignatureRefused); 8] = [
            (None, body, SignatureRefused::Missing),
            (Some(""), body, SignatureRefused::Malformed),
            (Some("t=abc,v1=00"), body, SignatureRefused::Malformed),
            (Some(&good[..good.len() - 1]), body, SignatureRefused::Malformed),
            (Some("t=1,v1="), body, SignatureRefused::Malformed),
            (Some(&other_key), body, SignatureRefused::Mismatch),
            (
                Some(&good),
                br#"{"event_id":"evt_2"}"#,
                SignatureRefused::Mismatch,
            ),
            (Some(&old), body, SignatureRefused::Stale),
        ];
        for (header, body, refused) in cases {
            assert_eq!(
                signatures().verify(header.map(str::as_bytes), body, now),
                Err(refused),
                "{header:?}"
            );
        }
        let none = ProviderSignatures::new(Vec::new(), std::time::Duration::from_secs(300));
        assert_eq!(
            none.verify(Some(good.as_bytes()), body, now),
            Err(SignatureRefused::NoSecret)
        );
    }
}
