//! Bearer tokens: issued, verified (MAC and expiry), stored as hashes,
//! revoked.

use actix_web::HttpRequest;
use actix_web::http::header;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Duration, TimeZone, Utc};
use hmac::{Hmac, Mac};
use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use sqlx::PgExecutor;
use uuid::Uuid;

use crate::domain::UserId;
use crate::problem::Problem;

const TOKEN_PREFIX: &str = "lw1";
const PAYLOAD_BYTES: usize = 16 + 8 + 32;
/// A tag's bytes: SHA-256's 32. The buffer a tag is decoded into holds one
/// more, so that a longer tag decodes and then fails the check.
const TAG_BYTES_MAX: usize = 33;

/// Signs and verifies bearer tokens.
#[derive(Clone)]
pub struct TokenSigner {
    /// The MAC already keyed: keying it hashes the key's two pads, which
    /// is a third of the work of checking a token, so it is done once.
    /// Only the key's hashes are kept, never the key itself.
    keyed: Hmac<Sha256>,
}

/// A freshly issued token. The string is shown to the client once and never
/// stored or logged; only `hash` is kept.
pub struct IssuedToken {
    pub token: SecretString,
    pub hash: [u8; 32],
    pub expires_at: DateTime<Utc>,
}

/// A token whose MAC and expiry checked out. It still has to be found in the
/// database (not revoked) before it may change anything.
#[derive(Debug, Clone, Copy)]
pub struct VerifiedToken {
    pub user_id: UserId,
    pub hash: [u8; 32],
    /// When the token stops being valid (its revocation entry expires then).
    pub expires_at: DateTime<Utc>,
    /// Came from the browser's session cookie rather than an
    /// `Authorization` header: a state-changing API call must then also
    /// carry the CSRF token.
    pub via_session: bool,
}

/// The browser session cookie. It holds a bearer token like any other,
/// `HttpOnly` and `SameSite=Strict`.
pub const SESSION_COOKIE: &str = "lw_session";
/// The header a browser's script sends its CSRF token in.
pub const CSRF_HEADER: &str = "X-CSRF-Token";

impl TokenSigner {
    /// An empty key means "make one up": fine for one demo process, useless
    /// for several instances, which must share the key.
    pub fn new(key: &SecretString) -> Self {
        if key.expose_secret().is_empty() {
            tracing::warn!(
                "token_signing_key is not set; using a random key. Tokens will not survive a restart \
                 and other instances will not accept them. Set WALLET_TOKEN_SIGNING_KEY."
            );
            let mut bytes = [0u8; 32];
            rand::thread_rng().fill_bytes(&mut bytes);
            return Self::keyed_with(hex::encode(bytes).as_bytes());
        }
        Self::keyed_with(key.expose_secret().as_bytes())
    }

    fn keyed_with(key: &[u8]) -> Self {
        // HMAC accepts keys of any length, so this cannot fail.
        #[expect(clippy::expect_used, reason = "HMAC takes keys of any length")]
        let keyed = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
        Self { keyed }
    }

    pub(super) fn mac(&self) -> Hmac<Sha256> {
        self.keyed.clone()
    }

    pub fn issue(&self, user_id: UserId, ttl: Duration) -> IssuedToken {
        let expires_at = Utc::now() + ttl;
        let mut payload = [0u8; PAYLOAD_BYTES];
        payload[..16].copy_from_slice(user_id.0.as_bytes());
        payload[16..24].copy_from_slice(&expires_at.timestamp().to_be_bytes());
        rand::thread_rng().fill_bytes(&mut payload[24..]);
        let mut mac = self.mac();
        mac.update(&payload);
        let tag = mac.finalize().into_bytes();
        let token = format!(
            "{TOKEN_PREFIX}.{}.{}",
            URL_SAFE_NO_PAD.encode(payload),
            URL_SAFE_NO_PAD.encode(tag)
        );
        IssuedToken {
            hash: token_hash(&token),
            token: SecretString::from(token),
            expires_at,
        }
    }

    /// Checks the MAC (in constant time) and the expiry. No I/O.
    pub fn verify(&self, token: &str) -> Result<VerifiedToken, Problem> {
        let invalid = || Problem::invalid_token("The bearer token is invalid or has expired.");
        let mut parts = token.split('.');
        let (Some(TOKEN_PREFIX), Some(payload), Some(tag), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(invalid());
        };
        // Decoded on the stack: a part longer than its buffer is refused.
        let (encoded_payload, encoded_tag) = (payload, tag);
        let mut payload = [0u8; PAYLOAD_BYTES];
        let mut tag_bytes = [0u8; TAG_BYTES_MAX];
        let payload_len = URL_SAFE_NO_PAD
            .decode_slice(encoded_payload, &mut payload)
            .map_err(|_| invalid())?;
        let tag_len = URL_SAFE_NO_PAD
            .decode_slice(encoded_tag, &mut tag_bytes)
            .map_err(|_| invalid())?;
        if payload_len != PAYLOAD_BYTES {
            return Err(invalid());
        }
        let mut mac = self.mac();
        mac.update(&payload);
        mac.verify_slice(&tag_bytes[..tag_len]).map_err(|_| invalid())?;
        let user_id = Uuid::from_slice(&payload[..16]).map_err(|_| invalid())?;
        let mut expiry = [0u8; 8];
        expiry.copy_from_slice(&payload[16..24]);
        let expires_at = Utc
            .timestamp_opt(i64::from_be_bytes(expiry), 0)
            .single()
            .ok_or_else(invalid)?;
        if expires_at <= Utc::now() {
            return Err(invalid());
        }
        Ok(VerifiedToken {
            user_id: UserId(user_id),
            hash: token_hash(token),
            expires_at,
            via_session: false,
        })
    }

    /// Reads `Authorization: Bearer …`, or else the session cookie, and
    /// verifies it. No I/O.
    pub fn verify_request(&self, request: &HttpRequest) -> Result<VerifiedToken, Problem> {
        let Some(header) = crate::headers::single(request, header::AUTHORIZATION.as_str())? else {
            let cookie = request
                .cookie(SESSION_COOKIE)
                .ok_or_else(|| Problem::unauthorized("Send Authorization: Bearer <token>."))?;
            let verified = self.verify(cookie.value())?;
            return Ok(VerifiedToken {
                via_session: true,
                ..verified
            });
        };
        let value = header
            .to_str()
            .map_err(|_| Problem::invalid_token("The Authorization header is not valid."))?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .ok_or_else(|| Problem::unauthorized("Send Authorization: Bearer <token>."))?;
        self.verify(token.trim())
    }
}

pub fn token_hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Stores an issued token's hash.
pub async fn store_token(
    executor: impl PgExecutor<'_>,
    user_id: UserId,
    issued: &IssuedToken,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO api_tokens (token_hash, user_id, expires_at) VALUES ($1, $2, $3)")
        .bind(&issued.hash[..])
        .bind(user_id.0)
        .bind(issued.expires_at)
        .execute(executor)
        .await?;
    Ok(())
}

/// True when the token has not been revoked and has not expired.
pub async fn token_is_live(
    executor: impl PgExecutor<'_>,
    token: &VerifiedToken,
) -> Result<bool, sqlx::Error> {
    // The one definition, shared with transfer() in the database.
    sqlx::query_scalar::<_, bool>("SELECT token_is_live($1, $2)")
        .bind(&token.hash[..])
        .bind(token.user_id.0)
        .fetch_one(executor)
        .await
}

pub async fn revoke_token(executor: impl PgExecutor<'_>, token: &VerifiedToken) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM api_tokens WHERE token_hash = $1")
        .bind(&token.hash[..])
        .execute(executor)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer() -> TokenSigner {
        TokenSigner::new(&SecretString::from("k".repeat(32)))
    }

    #[test]
    fn an_issued_token_verifies_and_names_its_user() {
        let user = UserId(Uuid::new_v4());
        let issued = signer().issue(user, Duration::hours(1));
        let verified = signer()
            .verify(issued.token.expose_secret())
            .expect("valid token");
        assert_eq!(verified.user_id, user);
        assert_eq!(verified.hash, issued.hash);
    }

    #[test]
    fn a_tampered_expired_or_foreign_token_is_refused() {
        let user = UserId(Uuid::new_v4());
        let token = signer()
            .issue(user, Duration::hours(1))
            .token
            .expose_secret()
            .to_owned();
        let mut tampered = token.clone().into_bytes();
        let last = tampered.len() - 1;
        tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
        assert!(
            signer()
                .verify(&String::from_utf8(tampered).expect("ascii"))
                .is_err()
        );
        let expired = signer().issue(user, Duration::seconds(-1));
        assert!(signer().verify(expired.token.expose_secret()).is_err());
        let other = TokenSigner::new(&SecretString::from("x".repeat(32)));
        assert!(other.verify(&token).is_err());
        assert!(signer().verify("lw1.abc").is_err());
        // A part one byte longer or shorter than it should be, or a tag
        // cut short, is refused, not read past or padded.
        let (rest, tag) = token.rsplit_once('.').expect("three parts");
        let (prefix, payload) = rest.split_once('.').expect("three parts");
        let signed_payload = URL_SAFE_NO_PAD.decode(payload).expect("base64");
        for changed in [
            [&signed_payload[..], &[0]].concat(),
            signed_payload[..PAYLOAD_BYTES - 1].to_vec(),
        ] {
            let changed = format!("{prefix}.{}.{tag}", URL_SAFE_NO_PAD.encode(changed));
            assert!(signer().verify(&changed).is_err());
        }
        let signed_tag = URL_SAFE_NO_PAD.decode(tag).expect("base64");
        for changed in [[&signed_tag[..], &[0]].concat(), signed_tag[..31].to_vec()] {
            let changed = format!("{rest}.{}", URL_SAFE_NO_PAD.encode(changed));
            assert!(signer().verify(&changed).is_err());
        }
    }
}
