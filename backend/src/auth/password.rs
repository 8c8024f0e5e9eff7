//! Passwords: argon2id, on threads of their own so that hashing never
//! blocks the server's workers.

use argon2::Argon2;
use argon2::password_hash::PasswordHash;
use base64::Engine;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};

/// Password hashing on a fixed set of threads, with a bounded queue.
///
/// Argon2id takes tens of milliseconds of CPU and megabytes of memory per
/// hash, by design (`ARGON2_MEMORY_KIB`). Hashing on the runtime's blocking
/// pool, with the memory allocated per hash, grew the server by a hash's
/// memory per sign-up (measured with 19 MiB: past a gigabyte after a few
/// dozen sign-ups). A few dedicated threads, each reusing one buffer, bound
/// both the CPU and the memory that hashing may take; past
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

/// Argon2id's cost for a new hash: 9 MiB of memory, 4 passes, 1 lane.
/// OWASP's password storage guidance lists this as one of five
/// configurations of equal strength (19 MiB with 2 passes is another, and
/// the `argon2` crate's default). Of those, this one takes less than half
/// the memory for about the same CPU, and the server keeps one buffer per
/// password thread for as long as it runs. A stored hash names its own
/// parameters, so hashes made with other ones still verify.
const ARGON2_MEMORY_KIB: u32 = 9 * 1024;
const ARGON2_PASSES: u32 = 4;
const ARGON2_LANES: u32 = 1;

thread_local! {
    /// Argon2's working memory, one buffer per password thread, reused for
    /// every hash: allocating it per hash left each hash's memory in the
    /// process (measured with 19 MiB: +19 MiB of RSS per sign-up).
    static ARGON2_BLOCKS: std::cell::RefCell<Vec<argon2::Block>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A PHC string (`$argon2id$v=19$m=…,t=…,p=…$salt$hash`) for `password`,
/// with a fresh salt and this server's cost (`ARGON2_MEMORY_KIB`).
pub fn phc_string(password: &[u8]) -> anyhow::Result<String> {
    let mut salt = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut salt);
    let params = argon2::Params::new(ARGON2_MEMORY_KIB, ARGON2_PASSES, ARGON2_LANES, Some(32))
        .map_err(|error| anyhow::anyhow!("argon2 parameters: {error}"))?;
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

    /// A hash made before the cost changed names its own parameters (here
    /// the crate's default, 19 MiB and 2 passes, encoded by the crate
    /// itself) and still verifies.
    #[tokio::test]
    async fn a_hash_made_with_other_parameters_still_verifies() {
        use argon2::password_hash::{PasswordHasher, SaltString};
        let salt = SaltString::from_b64("c2FsdHNhbHRzYWx0c2FsdA").expect("a salt");
        let stored = Argon2::default()
            .hash_password(b"correct horse", &salt)
            .expect("hash")
            .to_string();
        assert!(stored.contains("m=19456,t=2,p=1"), "{stored}");
        let workers = PasswordWorkers::start(1, 4);
        let verify = |password: &str| workers.verify(SecretString::from(password), Some(stored.clone()));
        assert!(verify("correct horse").await.expect("a worker").expect("verify"));
        assert!(!verify("wrong").await.expect("a worker").expect("verify"));
        let fresh = workers
            .hash(SecretString::from("correct horse"))
            .await
            .expect("a worker")
            .expect("hash");
        assert!(fresh.contains("m=9216,t=4,p=1"), "{fresh}");
    }
}
