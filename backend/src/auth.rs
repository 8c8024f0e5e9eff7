//! Who is calling: passwords, bearer tokens and their verification.
//!
//! A bearer token is `lw1.<payload>.<mac>` in URL-safe base64, where the
//! payload is the user id, an expiry time and 256 random bits, and the mac is
//! HMAC-SHA-256 over the payload with `token_signing_key`. The MAC lets the
//! edge of the transfer route learn the caller without a database query, so
//! a request the cooldown refuses costs no PostgreSQL work at all.
//!
//! The database keeps only the SHA-256 of each token, which is how a token is
//! revoked: every route checks that the hash is still present (the transfer
//! route does so inside its transaction), so a revoked or expired token
//! moves no money.

use actix_web::HttpRequest;
use actix_web::http::header;
use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString, rand_core::OsRng};
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

/// Signs and verifies bearer tokens.
#[derive(Clone)]
pub struct TokenSigner {
    key: SecretString,
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
            return Self {
                key: SecretString::from(hex::encode(bytes)),
            };
        }
        Self { key: key.clone() }
    }

    fn mac(&self) -> Hmac<Sha256> {
        // HMAC accepts keys of any length, so this cannot fail.
        #[expect(clippy::expect_used, reason = "HMAC takes keys of any length")]
        Hmac::<Sha256>::new_from_slice(self.key.expose_secret().as_bytes()).expect("any key length")
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
        let payload = URL_SAFE_NO_PAD.decode(payload).map_err(|_| invalid())?;
        let tag = URL_SAFE_NO_PAD.decode(tag).map_err(|_| invalid())?;
        if payload.len() != PAYLOAD_BYTES {
            return Err(invalid());
        }
        let mut mac = self.mac();
        mac.update(&payload);
        mac.verify_slice(&tag).map_err(|_| invalid())?;
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
            via_session: false,
        })
    }

    /// Reads `Authorization: Bearer …`, or else the session cookie, and
    /// verifies it. No I/O.
    pub fn verify_request(&self, request: &HttpRequest) -> Result<VerifiedToken, Problem> {
        let Some(header) = request.headers().get(header::AUTHORIZATION) else {
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

impl TokenSigner {
    /// The CSRF token of a session: a MAC of the session's token hash, so
    /// it needs no storage and is worthless without the session cookie.
    pub fn csrf_token(&self, session: &VerifiedToken) -> String {
        let mut mac = self.mac();
        mac.update(b"csrf:");
        mac.update(&session.hash);
        hex::encode(mac.finalize().into_bytes())
    }

    /// Checks a presented CSRF token in constant time.
    pub fn verify_csrf(&self, session: &VerifiedToken, presented: &str) -> bool {
        let Ok(presented) = hex::decode(presented.trim()) else {
            return false;
        };
        let mut mac = self.mac();
        mac.update(b"csrf:");
        mac.update(&session.hash);
        mac.verify_slice(&presented).is_ok()
    }

    /// For API calls that change state: a session-cookie caller must also
    /// present the CSRF token in `X-CSRF-Token`.
    pub fn require_csrf_header(&self, request: &HttpRequest, caller: &VerifiedToken) -> Result<(), Problem> {
        if !caller.via_session {
            return Ok(());
        }
        let presented = request
            .headers()
            .get(CSRF_HEADER)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("");
        if self.verify_csrf(caller, presented) {
            Ok(())
        } else {
            Err(Problem::new(
                actix_web::http::StatusCode::FORBIDDEN,
                "csrf-token-invalid",
                "CSRF token missing or invalid",
                "A request authenticated by the session cookie must carry the page's X-CSRF-Token.",
            ))
        }
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
    sqlx::query_scalar::<_, bool>(
        "SELECT EXISTS (SELECT 1 FROM api_tokens
                        WHERE token_hash = $1 AND user_id = $2 AND expires_at > now())",
    )
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

/// Argon2id with the crate's recommended parameters; runs on the blocking
/// pool because it takes tens of milliseconds of CPU by design.
pub async fn hash_password(password: SecretString) -> anyhow::Result<String> {
    tokio::task::spawn_blocking(move || {
        let salt = SaltString::generate(&mut OsRng);
        Argon2::default()
            .hash_password(password.expose_secret().as_bytes(), &salt)
            .map(|hash| hash.to_string())
            .map_err(|error| anyhow::anyhow!("failed to hash a password: {error}"))
    })
    .await?
}

/// A hash of a random password nobody knows, verified when the user does not
/// exist so that a wrong name takes as long as a wrong password.
fn dummy_hash() -> &'static str {
    static DUMMY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DUMMY.get_or_init(|| {
        let mut password = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut password);
        let salt = SaltString::generate(&mut OsRng);
        Argon2::default()
            .hash_password(&password, &salt)
            .map(|hash| hash.to_string())
            .unwrap_or_default()
    })
}

pub async fn verify_password(password: SecretString, stored_hash: Option<String>) -> anyhow::Result<bool> {
    tokio::task::spawn_blocking(move || {
        let known_user = stored_hash.is_some();
        let stored = stored_hash.unwrap_or_else(|| dummy_hash().to_owned());
        let parsed = PasswordHash::new(&stored)
            .map_err(|error| anyhow::anyhow!("stored password hash is malformed: {error}"))?;
        let matches = Argon2::default()
            .verify_password(password.expose_secret().as_bytes(), &parsed)
            .is_ok();
        Ok(known_user && matches)
    })
    .await?
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
    }

    #[tokio::test]
    async fn passwords_verify_only_against_their_own_hash() {
        let hash = hash_password(SecretString::from("correct horse"))
            .await
            .expect("hash");
        assert!(
            verify_password(SecretString::from("correct horse"), Some(hash.clone()))
                .await
                .expect("verify")
        );
        assert!(
            !verify_password(SecretString::from("wrong"), Some(hash))
                .await
                .expect("verify")
        );
        assert!(
            !verify_password(SecretString::from("correct horse"), None)
                .await
                .expect("verify")
        );
    }
}
