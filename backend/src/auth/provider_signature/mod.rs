//! Who may deposit: the payment provider, proved by a signature over the
//! exact bytes it sent, in either of two schemes.
//!
//! - **Ours**: `Provider-Signature: t=<unix seconds>,v1=<hex>`, where the
//!   hex is HMAC-SHA256 under a shared secret of `t` + `.` + the body.
//!   Several `v1` values may be sent.
//! - **Standard Webhooks** (the open specification behind Svix and
//!   others): `webhook-id`, `webhook-timestamp` (unix seconds) and
//!   `webhook-signature`, a space-separated list of `v1,<base64>` where the
//!   base64 is HMAC-SHA256 of `id` + `.` + `timestamp` + `.` + the body,
//!   under the bytes a `whsec_<base64>` secret encodes. The `webhook-id`
//!   must be the body's `event_id`: the id is signed, and the inbox keys on
//!   the event id, so the two must name one event.
//!
//! The secrets are one list (`provider_webhook_secrets`): one in `whsec_`
//! form signs Standard Webhooks, any other our scheme. Several at once let
//! a secret be rotated without refusing a single delivery. Signing the time
//! with the body means a captured delivery cannot be replayed outside
//! `provider_signature_tolerance_s`, either way, in both schemes; the inbox
//! makes a replay within it harmless anyway.
//!
//! The reference implementation's Rust crate fixes the tolerance at five
//! minutes and reads the clock itself, so Standard Webhooks is checked here
//! with the same HMAC as our scheme; the tests sign with the specification's
//! Python library (`backend/tests/standard_webhooks.rs`).
//!
//! Every comparison is in constant time (`Mac::verify_slice`). Nothing
//! here is logged but the reason for a refusal; never a secret, a MAC or
//! the body.

use actix_web::HttpRequest;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretSlice, SecretString};
use sha2::Sha256;

use crate::problem::Problem;
use crate::settings::{ProviderSecret, provider_secret};

/// Lower-case, as `HeaderName::from_static` requires.
pub const HEADER: &str = "provider-signature";
/// The Standard Webhooks headers.
pub const WEBHOOK_ID: &str = "webhook-id";
pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";
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
    #[error(
        "the Standard Webhooks headers must all be sent: webhook-id (the body's event_id), webhook-timestamp \
         (unix seconds) and webhook-signature (v1,<base64 HMAC-SHA256>, space-separated)"
    )]
    StandardMalformed,
    #[error("both a Provider-Signature and Standard Webhooks headers were sent; sign with one scheme")]
    BothSchemes,
    #[error("the signature's time is further from now than the tolerance allows")]
    Stale,
    #[error("no signature matches the body under any configured secret")]
    Mismatch,
    #[error("webhook-id is not the body's event_id")]
    IdNotEventId,
    #[error("this deployment has no provider secret, so it accepts no deposits")]
    NoSecret,
}

impl SignatureRefused {
    /// A short name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            SignatureRefused::Missing => "missing",
            SignatureRefused::Malformed => "malformed",
            SignatureRefused::StandardMalformed => "standard_malformed",
            SignatureRefused::BothSchemes => "both_schemes",
            SignatureRefused::Stale => "stale",
            SignatureRefused::Mismatch => "mismatch",
            SignatureRefused::IdNotEventId => "id_not_event_id",
            SignatureRefused::NoSecret => "no_secret",
        }
    }
}

/// The signature headers of one delivery, each sent once at most.
#[derive(Debug, Clone, Copy, Default)]
pub struct SignatureHeaders<'a> {
    pub provider_signature: Option<&'a [u8]>,
    pub webhook_id: Option<&'a [u8]>,
    pub webhook_timestamp: Option<&'a [u8]>,
    pub webhook_signature: Option<&'a [u8]>,
}

impl<'a> SignatureHeaders<'a> {
    /// The request's signature headers; one sent twice is refused
    /// (`headers::single`), as every header that proves something is.
    pub fn of(request: &'a HttpRequest) -> Result<Self, Problem> {
        let one =
            |name| crate::headers::single(request, name).map(|value| value.map(|value| value.as_bytes()));
        Ok(Self {
            provider_signature: one(HEADER)?,
            webhook_id: one(WEBHOOK_ID)?,
            webhook_timestamp: one(WEBHOOK_TIMESTAMP)?,
            webhook_signature: one(WEBHOOK_SIGNATURE)?,
        })
    }

    fn any_standard(&self) -> bool {
        self.webhook_id.is_some() || self.webhook_timestamp.is_some() || self.webhook_signature.is_some()
    }
}

/// The provider's secrets, by scheme, and how far a signature's time may
/// drift.
#[derive(Clone)]
pub struct ProviderSignatures {
    secrets: Vec<SecretString>,
    standard_keys: Vec<SecretSlice<u8>>,
    tolerance_s: i64,
}

/// A parsed header: its time and the MACs it carries.
struct Signed {
    at_s: i64,
    macs: Vec<[u8; 32]>,
}

impl ProviderSignatures {
    pub fn new(secrets: Vec<SecretString>, tolerance: std::time::Duration) -> Self {
        let mut signatures = Self {
            secrets: Vec::new(),
            standard_keys: Vec::new(),
            tolerance_s: i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX),
        };
        // The settings refuse an unusable secret before this is built.
        for secret in secrets {
            match provider_secret(&secret) {
                ProviderSecret::Ours => signatures.secrets.push(secret),
                ProviderSecret::StandardWebhooks(key) => signatures.standard_keys.push(key),
                ProviderSecret::Unusable => {}
            }
        }
        signatures
    }

    /// Checks a delivery's signature `headers` against `body` at time
    /// `now`, in the scheme the headers are of.
    pub fn verify(
        &self,
        headers: &SignatureHeaders<'_>,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<(), SignatureRefused> {
        if self.secrets.is_empty() && self.standard_keys.is_empty() {
            return Err(SignatureRefused::NoSecret);
        }
        if headers.any_standard() {
            if headers.provider_signature.is_some() {
                return Err(SignatureRefused::BothSchemes);
            }
            return self.verify_standard(headers, body, now);
        }
        let header = headers.provider_signature.ok_or(SignatureRefused::Missing)?;
        let signed = parse(header).ok_or(SignatureRefused::Malformed)?;
        self.within_tolerance(signed.at_s, now)?;
        let matches = self.secrets.iter().any(|secret| {
            signed
                .macs
                .iter()
                .any(|mac| mac_of(secret, signed.at_s, body).verify_slice(mac).is_ok())
        });
        matches.then_some(()).ok_or(SignatureRefused::Mismatch)
    }

    fn within_tolerance(&self, at_s: i64, now: DateTime<Utc>) -> Result<(), SignatureRefused> {
        if (now.timestamp() - at_s).abs() > self.tolerance_s {
            return Err(SignatureRefused::Stale);
        }
        Ok(())
    }

    /// Standard Webhooks: the three headers, the time, a matching `v1`
    /// under a `whsec_` key, and the id the body's event id.
    fn verify_standard(
        &self,
        headers: &SignatureHeaders<'_>,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<(), SignatureRefused> {
        let signed = parse_standard(headers).ok_or(SignatureRefused::StandardMalformed)?;
        self.within_tolerance(signed.at_s, now)?;
        let matches = self.standard_keys.iter().any(|key| {
            signed.macs.iter().any(|mac| {
                standard_mac_of(key, signed.id, signed.at_s, body)
                    .verify_slice(mac)
                    .is_ok()
            })
        });
        if !matches {
            return Err(SignatureRefused::Mismatch);
        }
        #[derive(serde::Deserialize)]
        struct EventId {
            event_id: Option<String>,
        }
        let event_id = serde_json::from_slice::<EventId>(body)
            .ok()
            .and_then(|body| body.event_id);
        (event_id.as_deref() == Some(signed.id))
            .then_some(())
            .ok_or(SignatureRefused::IdNotEventId)
    }
}

/// The header a provider sends for `body` at `at` under `secret`: what the
/// simulator and the tests sign with, by the same rule.
pub fn header_for(secret: &SecretString, at: DateTime<Utc>, body: &[u8]) -> String {
    let mac = mac_of(secret, at.timestamp(), body).finalize().into_bytes();
    format!("t={},v1={}", at.timestamp(), hex::encode(mac))
}

/// The headers a provider sends for event `event_id`'s `body` at `at`
/// under `secret`, in the secret's scheme: Standard Webhooks for a `whsec_`
/// secret, `Provider-Signature` for any other.
pub fn headers_for(
    secret: &SecretString,
    event_id: &str,
    at: DateTime<Utc>,
    body: &[u8],
) -> Vec<(&'static str, String)> {
    let ProviderSecret::StandardWebhooks(key) = provider_secret(secret) else {
        return vec![(HEADER, header_for(secret, at, body))];
    };
    let mac = standard_mac_of(&key, event_id, at.timestamp(), body)
        .finalize()
        .into_bytes();
    vec![
        (WEBHOOK_ID, event_id.to_owned()),
        (WEBHOOK_TIMESTAMP, at.timestamp().to_string()),
        (WEBHOOK_SIGNATURE, format!("v1,{}", BASE64.encode(mac))),
    ]
}

fn mac_of(secret: &SecretString, at_s: i64, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.expose_secret().as_bytes()).expect("any key length");
    mac.update(at_s.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

fn standard_mac_of(key: &SecretSlice<u8>, id: &str, at_s: i64, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key.expose_secret()).expect("any key length");
    mac.update(id.as_bytes());
    mac.update(b".");
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

/// A parsed Standard Webhooks delivery: its id, time and `v1` MACs.
struct StandardSigned<'a> {
    id: &'a str,
    at_s: i64,
    macs: Vec<[u8; 32]>,
}

/// The three headers: an id the inbox takes, a time in unix seconds, and
/// `v1,<base64>` signatures separated by spaces; other versions are
/// skipped, as the specification says.
fn parse_standard<'a>(headers: &SignatureHeaders<'a>) -> Option<StandardSigned<'a>> {
    let text = |value: Option<&'a [u8]>| value.and_then(|value| std::str::from_utf8(value).ok());
    let id = text(headers.webhook_id).filter(|id| crate::defense::inbox::is_event_id(id))?;
    let at_s = text(headers.webhook_timestamp)?
        .parse::<i64>()
        .ok()
        .filter(|t| *t >= 0)?;
    let mut macs = Vec::new();
    for part in text(headers.webhook_signature)?
        .split(' ')
        .filter(|part| !part.is_empty())
    {
        let (version, value) = part.split_once(',')?;
        if version != "v1" {
            continue;
        }
        if macs.len() == SIGNATURES_PER_HEADER_MAX {
            return None;
        }
        let decoded = BASE64.decode(value).ok()?;
        macs.push(<[u8; 32]>::try_from(decoded.as_slice()).ok()?);
    }
    (!macs.is_empty()).then_some(StandardSigned { id, at_s, macs })
}

#[cfg(test)]
mod tests;
