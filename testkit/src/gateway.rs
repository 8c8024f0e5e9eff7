//! The bank gateway simulator (`wallet-sim gateway`) as a real process on
//! a free port, over a database of its own, for the tests of its callers:
//! the payout dispatcher's, and its own.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

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

/// The longest request head a stand-in reads.
const STAND_IN_REQUEST_BYTES_MAX: usize = 64 * 1024;

/// Something standing where the gateway should be: a real HTTP server on a
/// free port that answers every request, whatever its path, with one
/// canned answer (a proxy's 404 page, a redirect, a 503 asking for a day's
/// wait), then closes the connection. It stops with the test's runtime.
pub struct StandIn {
    pub url: String,
}

impl StandIn {
    /// Answers every request with `status_line` (e.g. `302 Found`), the
    /// `headers` given and `body`.
    pub async fn start(status_line: &str, headers: &[(&str, &str)], body: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let url = format!("http://{}", listener.local_addr().expect("its address"));
        let mut answer = format!("HTTP/1.1 {status_line}\r\n");
        for (name, value) in headers {
            answer.push_str(&format!("{name}: {value}\r\n"));
        }
        answer.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ));
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(answer_one(stream, answer.clone()));
            }
        });
        Self { url }
    }

    /// A proxy or load balancer with no route to the gateway: an HTML 404
    /// on every path.
    pub async fn proxy_404() -> Self {
        Self::start(
            "404 Not Found",
            &[("Content-Type", "text/html")],
            "<html><head><title>404 Not Found</title></head><body><center><h1>404 Not Found</h1></center>\
             <hr><center>nginx</center></body></html>",
        )
        .await
    }

    /// A redirect of every path to `to`.
    pub async fn redirect_to(to: &str) -> Self {
        Self::start("302 Found", &[("Location", to)], "").await
    }
}

/// Reads one request (its head, then as many body bytes as it says), then
/// writes the answer: the client has sent all it meant to before it reads.
async fn answer_one(mut stream: TcpStream, answer: String) {
    let mut request = Vec::new();
    let mut buffer = [0u8; 4096];
    let head_end = loop {
        if let Some(end) = request.windows(4).position(|window| window == b"\r\n\r\n") {
            break end + 4;
        }
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) if request.len() + read <= STAND_IN_REQUEST_BYTES_MAX => {
                request.extend_from_slice(&buffer[..read])
            }
            Ok(_) => return,
        }
    };
    let head = String::from_utf8_lossy(&request[..head_end]).to_ascii_lowercase();
    let body_bytes = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|length| length.trim().parse::<usize>().ok())
        .unwrap_or(0)
        .min(STAND_IN_REQUEST_BYTES_MAX);
    let mut body_read = request.len() - head_end;
    while body_read < body_bytes {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => body_read += read,
        }
    }
    let _ = stream.write_all(answer.as_bytes()).await;
    let _ = stream.shutdown().await;
}
