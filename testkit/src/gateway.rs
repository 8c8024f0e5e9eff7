//! The bank gateway simulator (`wallet-sim gateway`) as a real process on
//! a free port, over a database of its own, for the tests of its callers:
//! the payout dispatcher's, and its own.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sqlx::PgPool;

use crate::{closed_port, create_database, database_url_of, drop_database};

/// How long a started gateway may take to answer `/healthz`.
pub const GATEWAY_START_SECONDS_MAX: u64 = 30;

/// The `wallet-sim` the workspace's tests build next to this test's
/// directory (`target/debug/`).
pub fn wallet_sim_binary() -> PathBuf {
    let binary = std::env::current_exe()
        .expect("the test's path")
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/debug")
        .join("wallet-sim");
    assert!(
        binary.exists(),
        "no wallet-sim at {}: run the workspace's tests (./scripts/test), which build it",
        binary.display()
    );
    binary
}

/// A gateway process on a free port, over a database of its own; killed
/// when dropped, and its database with it.
pub struct Gateway {
    binary: PathBuf,
    child: Option<Child>,
    pub url: String,
    pub port: u16,
    database: String,
    database_url: String,
    /// The gateway's own database: its ledger of money sent.
    pub db: PgPool,
    pub http: reqwest::Client,
}

impl Gateway {
    /// Starts `binary gateway` with `knobs` (its command-line flags).
    pub async fn start(binary: &Path, knobs: &[&str]) -> Self {
        let (database, options) = create_database().await;
        let database_url = database_url_of(&options);
        let port = closed_port();
        let mut gateway = Self {
            binary: binary.to_owned(),
            child: None,
            url: format!("http://127.0.0.1:{port}"),
            port,
            database,
            db: PgPool::connect(&database_url)
                .await
                .expect("the gateway's database"),
            database_url,
            http: reqwest::Client::new(),
        };
        gateway.start_again(knobs).await;
        gateway
    }

    /// Starts the process (again) on the same port and database.
    pub async fn start_again(&mut self, knobs: &[&str]) {
        let child = Command::new(&self.binary)
            .args(["gateway", "--listen", &format!("127.0.0.1:{}", self.port)])
            .args(["--database-url", &self.database_url])
            .args(knobs)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start wallet-sim gateway");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(GATEWAY_START_SECONDS_MAX);
        while !self
            .http
            .get(format!("{}/healthz", self.url))
            .send()
            .await
            .is_ok_and(|response| response.status() == 200)
        {
            assert!(Instant::now() < deadline, "the gateway did not start in 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn payout(&self, key: Option<&str>, body: &Value) -> reqwest::RequestBuilder {
        let request = self.http.post(format!("{}/v1/payouts", self.url)).json(body);
        match key {
            Some(key) => request.header("Idempotency-Key", key),
            None => request,
        }
    }

    /// `GET /v1/payouts/{key}`: the stored answer, as reconciliation asks.
    pub async fn look_up(&self, key: &str) -> (u16, Value) {
        let response = self
            .http
            .get(format!("{}/v1/payouts/{key}", self.url))
            .send()
            .await
            .expect("lookup");
        let status = response.status().as_u16();
        (status, response.json().await.expect("a JSON body"))
    }

    pub async fn send(&self, key: &str, body: &Value) -> (u16, Value, bool) {
        let response = self.payout(Some(key), body).send().await.expect("an answer");
        let status = response.status().as_u16();
        let replayed = response.headers().contains_key("idempotent-replayed");
        (status, response.json().await.expect("a JSON body"), replayed)
    }

    /// Sendings in the gateway's ledger for `key`.
    pub async fn sent(&self, key: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM gateway_sent WHERE idempotency_key = $1")
            .bind(key)
            .fetch_one(&self.db)
            .await
            .expect("count")
    }

    pub async fn sent_in_all(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM gateway_sent")
            .fetch_one(&self.db)
            .await
            .expect("count")
    }

    pub fn has_exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| child.try_wait().is_ok_and(|status| status.is_some()))
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.kill();
        let database = self.database.clone();
        // Dropped from a runtime thread: the database goes on its own thread.
        let _ = std::thread::spawn(move || {
            if let Ok(runtime) = tokio::runtime::Runtime::new() {
                runtime.block_on(drop_database(&database));
            }
        })
        .join();
    }
}
