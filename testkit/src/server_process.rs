//! `wallet-server` as a real process: what a deployment runs, and what
//! `kill -9` can take away mid-request.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a started instance may take to answer `/readyz` with 200.
pub const INSTANCE_START_SECONDS_MAX: u64 = 30;

pub struct ServerProcess {
    pub port: u16,
    binary: PathBuf,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
}

impl ServerProcess {
    /// Starts `binary serve` on a free port with `env` (WALLET_* settings,
    /// DATABASE_URL, REDIS_URL) and waits until it is ready. Its logs go to
    /// `log`.
    pub async fn start(binary: PathBuf, env: Vec<(String, String)>, log: PathBuf) -> Self {
        let mut process = Self {
            port: crate::closed_port(),
            binary,
            env,
            log,
            child: None,
        };
        process.start_again().await;
        process
    }

    /// Runs `binary migrate` with `env` and waits for it to finish.
    pub fn migrate(binary: &PathBuf, env: &[(String, String)]) {
        let output = Command::new(binary)
            .arg("migrate")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .output()
            .expect("run wallet-server migrate");
        assert!(
            output.status.success(),
            "wallet-server migrate failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Starts the process again on the same port, after `kill_9`.
    pub async fn start_again(&mut self) {
        assert!(self.child.is_none(), "the instance is already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open the instance's log");
        let child = Command::new(&self.binary)
            .arg("serve")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("WALLET_HTTP_PORT", self.port.to_string())
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .expect("start wallet-server");
        self.child = Some(child);
        self.wait_until_ready().await;
    }

    /// Polls `/readyz` until it answers 200.
    pub async fn wait_until_ready(&mut self) {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(INSTANCE_START_SECONDS_MAX);
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "wallet-server exited with {status} before it was ready; its log:\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            let ready = client
                .get(self.url("/readyz"))
                .timeout(Duration::from_secs(1))
                .send()
                .await
                .is_ok_and(|response| response.status() == 200);
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "wallet-server on port {} was not ready within {INSTANCE_START_SECONDS_MAX} s; its log:\n{}",
                self.port,
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGSTOP: the process stops wherever it is, holding what it holds,
    /// until `resume`; to its peers it is a consumer that stalled.
    pub fn stall(&self) {
        self.signal("-STOP");
    }

    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("the instance is running").id();
        let status = Command::new("kill")
            .arg(signal)
            .arg(pid.to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid} failed");
    }

    /// SIGTERM: the process stops as a deployment stops it, draining the
    /// requests in flight within its grace.
    pub fn terminate(&self) {
        self.signal("-TERM");
    }

    /// Waits up to `within` for the process to exit: its exit status, or
    /// `None` while it still runs.
    pub async fn wait_for_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            let child = self.child.as_mut().expect("the instance was started");
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The instance's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL: the process ends at once, mid-request, without releasing
    /// anything it holds.
    pub fn kill_9(&mut self) {
        crate::private_stores::kill_9(&mut self.child);
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // A stalled process must go on to die.
        if self.child.is_some() {
            self.signal("-CONT");
        }
        self.kill_9();
    }
}
