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
use argon2::password_hash::PasswordHash;
use base64::Engine;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use chrono::{DateTime, Duration, TimeZone, Utc};
use hmac::{Hmac, Mac};
use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use sqlx::PgExecutor;
use uuid::Uuid;

use crate::domain::UserId;
use crate::problem::{Problem, ProblemType};

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
            expires_at,
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
                ProblemType::CsrfTokenInvalid,
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

/// Deletes expired token hashes, at most `batch_rows_max` per statement,
/// until none are left; returns how many it deleted.
pub async fn sweep_expired_tokens(pool: &sqlx::PgPool, batch_rows_max: i64) -> Result<u64, sqlx::Error> {
    crate::sweep::delete_in_batches(
        pool,
        "DELETE FROM api_tokens WHERE token_hash IN (
             SELECT token_hash FROM api_tokens WHERE expires_at <= now()
             LIMIT $1 FOR UPDATE SKIP LOCKED)",
        batch_rows_max,
    )
    .await
}

pub async fn revoke_token(executor: impl PgExecutor<'_>, token: &VerifiedToken) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM api_tokens WHERE token_hash = $1")
        .bind(&token.hash[..])
        .execute(executor)
        .await?;
    Ok(())
}

/// Password hashing on a fixed set of threads, with a bounded queue.
///
/// Argon2id with the crate's recommended parameters takes tens of
/// milliseconds of CPU and 19 MiB of memory per hash, by design. Hashing on
/// the runtime's blocking pool, with the memory allocated per hash, grew the
/// server by 19 MiB per sign-up (measured: past a gigabyte after a few dozen
/// sign-ups). A few dedicated threads, each reusing one buffer, bound both
/// the CPU and the memory that hashing may take; past
/// `password_hash_queue_max` waiting jobs, sign-ins are refused with 503
/// rather than queued without limit.
#[derive(Clone)]
pub struct PasswordWorkers {
    jobs: std::sync::mpsc::SyncSender<Job>,
}

type Job = Box<dyn FnOnce() + Send>;

/// Every password worker is busy and the queue is full.
#[derive(Debug, thiserror::Error)]
#[error("password hashing is saturated")]
pub struct PasswordWorkersBusy;

impl PasswordWorkers {
    /// Starts `threads` workers. They end when the last handle is dropped.
    pub fn start(threads: usize, queue_max: usize) -> Self {
        let (jobs, queue) = std::sync::mpsc::sync_channel::<Job>(queue_max);
        let queue = std::sync::Arc::new(std::sync::Mutex::new(queue));
        for index in 0..threads.max(1) {
            let queue = queue.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("password-{index}"))
                .spawn(move || {
                    loop {
                        // Holding the lock while waiting is fine: whoever holds
                        // it takes the next job, the others wait their turn.
                        let job = match queue.lock() {
                            Ok(receiver) => receiver.recv(),
                            Err(_) => return,
                        };
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    }
                });
            if let Err(error) = spawned {
                tracing::error!(error = %error, "could not start a password worker");
            }
        }
        Self { jobs }
    }

    async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, PasswordWorkersBusy> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.jobs
            .try_send(Box::new(move || {
                let _ = reply.send(work());
            }))
            .map_err(|_| PasswordWorkersBusy)?;
        answer.await.map_err(|_| PasswordWorkersBusy)
    }

    pub async fn hash(&self, password: SecretString) -> Result<anyhow::Result<String>, PasswordWorkersBusy> {
        self.run(move || phc_string(password.expose_secret().as_bytes()))
            .await
    }

    /// True when `password` matches `stored_hash`. With no stored hash (no
    /// such user) a dummy hash is verified anyway, so that a wrong name takes
    /// as long as a wrong password.
    pub async fn verify(
        &self,
        password: SecretString,
        stored_hash: Option<String>,
    ) -> Result<anyhow::Result<bool>, PasswordWorkersBusy> {
        self.run(move || {
            let known_user = stored_hash.is_some();
            let stored = stored_hash.unwrap_or_else(|| dummy_hash().to_owned());
            let matches = verify_phc(password.expose_secret().as_bytes(), &stored)?;
            Ok(known_user && matches)
        })
        .await
    }
}

thread_local! {
    /// Argon2's working memory, one buffer per password thread, reused for
    /// every hash: allocating it per hash left each hash's 19 MiB in the
    /// process's memory (measured: +19 MiB of RSS per sign-up).
    static ARGON2_BLOCKS: std::cell::RefCell<Vec<argon2::Block>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A PHC string (`$argon2id$v=19$m=…,t=…,p=…$salt$hash`) for `password`,
/// with a fresh salt and the crate's recommended parameters.
fn phc_string(password: &[u8]) -> anyhow::Result<String> {
    let mut salt = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut salt);
    let params = argon2::Params::default();
    let output = argon2id_raw(password, &salt, &params)?;
    Ok(format!(
        "$argon2id$v=19$m={},t={},p={}${}${}",
        params.m_cost(),
        params.t_cost(),
        params.p_cost(),
        STANDARD_NO_PAD.encode(salt),
        STANDARD_NO_PAD.encode(output)
    ))
}

/// Argon2id of `password` and `salt` with `params`, 32 bytes.
fn argon2id_raw(password: &[u8], salt: &[u8], params: &argon2::Params) -> anyhow::Result<[u8; 32]> {
    let argon2 = Argon2::new(
        argon2::Algorithm::Argon2id,
        argon2::Version::V0x13,
        params.clone(),
    );
    let mut output = [0u8; 32];
    ARGON2_BLOCKS.with(|blocks| {
        let mut blocks = blocks.borrow_mut();
        let needed = params.block_count();
        if blocks.len() < needed {
            blocks.resize(needed, argon2::Block::default());
        }
        argon2
            .hash_password_into_with_memory(password, salt, &mut output, &mut blocks[..needed])
            .map_err(|error| anyhow::anyhow!("failed to hash a password: {error}"))
    })?;
    Ok(output)
}

/// Checks `password` against a PHC string (`$argon2id$v=19$m=…,t=…,p=…$salt$hash`).
fn verify_phc(password: &[u8], stored: &str) -> anyhow::Result<bool> {
    let parsed = PasswordHash::new(stored)
        .map_err(|error| anyhow::anyhow!("stored password hash is malformed: {error}"))?;
    let params = argon2::Params::try_from(&parsed)
        .map_err(|error| anyhow::anyhow!("stored password hash parameters: {error}"))?;
    let salt = parsed
        .salt
        .ok_or_else(|| anyhow::anyhow!("stored password hash has no salt"))?;
    let mut salt_bytes = [0u8; 64];
    let salt = salt
        .decode_b64(&mut salt_bytes)
        .map_err(|error| anyhow::anyhow!("stored salt: {error}"))?;
    let expected = parsed
        .hash
        .ok_or_else(|| anyhow::anyhow!("stored password hash has no hash"))?;
    if expected.len() != 32 {
        anyhow::bail!("stored password hash has an unexpected length");
    }
    let computed = argon2id_raw(password, salt, &params)?;
    // Output's equality is constant-time.
    Ok(argon2::password_hash::Output::new(&computed).is_ok_and(|computed| computed == expected))
}

/// A hash of a random password nobody knows.
fn dummy_hash() -> &'static str {
    static DUMMY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DUMMY.get_or_init(|| {
        let mut password = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut password);
        phc_string(&password).unwrap_or_default()
    })
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
        let workers = PasswordWorkers::start(1, 4);
        let hash = workers
            .hash(SecretString::from("correct horse"))
            .await
            .expect("a worker")
            .expect("hash");
        let verify =
            |password: &str, stored: Option<String>| workers.verify(SecretString::from(password), stored);
        assert!(
            verify("correct horse", Some(hash.clone()))
                .await
                .expect("a worker")
                .expect("verify")
        );
        assert!(
            !verify("wrong", Some(hash))
                .await
                .expect("a worker")
                .expect("verify")
        );
        assert!(
            !verify("correct horse", None)
                .await
                .expect("a worker")
                .expect("verify")
        );
    }
}
