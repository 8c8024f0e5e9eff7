//! Instances of `wallet-server` this program starts itself, so that it can
//! kill one (`SIGKILL`), stall one (`SIGSTOP` … `SIGCONT`) and start it
//! again: the faults a broker's consumers and a provider's receivers meet
//! in production.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How long a started instance may take to answer `/readyz`.
pub const READY_WAIT_S: u64 = 30;
/// Times an instance is started on fresh ports when it exits before it is
/// ready: a port found free can be taken by another process before the
/// instance binds it, when many tests start servers at once.
pub const SPAWN_ATTEMPTS_MAX: u32 = 3;

/// Why an instance did not become ready.
enum NotReady {
    /// It exited (most often: a port was taken).
    Exited(ExitStatus),
    TimedOut,
}

/// Where a run's instances come from and keep their state: the command
/// line's half of a `Spec`.
#[derive(Debug, Clone, clap::Args)]
pub struct Stores {
    /// The wallet-server binary (default: next to this one).
    #[arg(long)]
    pub server_bin: Option<PathBuf>,
    /// The database the instances use (they migrate it); read afterwards
    /// for the checks.
    #[arg(long, env = "SIM_DATABASE_URL")]
    pub database_url: String,
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
}

impl Stores {
    /// A spec for a run named `name`, with a Redis prefix of its own.
    pub fn spec(&self, name: &str) -> anyhow::Result<Spec> {
        Ok(Spec::new(
            server_binary(self.server_bin.as_deref())?,
            &self.database_url,
            &self.redis_url,
            name,
        ))
    }
}

/// What every instance of a run shares: the binary, the stores and the
/// settings, as environment variables.
#[derive(Debug, Clone)]
pub struct Spec {
    pub server: PathBuf,
    pub database_url: String,
    pub redis_url: String,
    /// The run's own Redis key prefix, so that runs never meet.
    pub redis_prefix: String,
    /// Settings beyond the common ones, e.g. `("WALLET_COMMANDS_ENABLED", "true")`.
    pub settings: Vec<(String, String)>,
}

impl Spec {
    /// A run's spec with a fresh Redis prefix; `name` says whose run it is.
    pub fn new(server: PathBuf, database_url: &str, redis_url: &str, name: &str) -> Self {
        Self {
            server,
            database_url: database_url.to_owned(),
            redis_url: redis_url.to_owned(),
            redis_prefix: format!("{name}:{}:", uuid::Uuid::new_v4().simple()),
            settings: Vec::new(),
        }
    }

    pub fn with(mut self, name: &str, value: impl ToString) -> Self {
        self.settings.push((name.to_owned(), value.to_string()));
        self
    }
}

/// The `wallet-server` next to the running program, or the one given.
pub fn server_binary(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    let server = match given {
        Some(path) => path.to_owned(),
        None => std::env::current_exe()?.with_file_name("wallet-server"),
    };
    if !server.exists() {
        bail!(
            "no wallet-server at {}; build it (cargo build --release -p layered-wallet) or pass --server-bin",
            server.display()
        );
    }
    Ok(server)
}

struct Instance {
    child: Child,
    port: u16,
    /// The admin listener's: `/metrics`.
    admin_port: u16,
}

/// The running instances; every one still running is killed when dropped.
pub struct Instances {
    spec: Spec,
    /// Shared by every instance, so a token one signs another accepts.
    signing_key: String,
    members: Vec<Instance>,
    http: reqwest::Client,
}

impl Instances {
    /// Starts `count` instances and waits until each is ready.
    pub async fn start(spec: Spec, count: usize) -> anyhow::Result<Self> {
        let mut instances = Self {
            spec,
            signing_key: uuid::Uuid::new_v4().simple().to_string().repeat(2),
            members: Vec::new(),
            http: reqwest::Client::new(),
        };
        for index in 0..count.max(1) {
            instances.start_one(index).await?;
        }
        Ok(instances)
    }

    /// Starts instance `index` on free ports, and again on others if it
    /// exits before it is ready.
    async fn start_one(&mut self, index: usize) -> anyhow::Result<()> {
        let mut attempt = 1;
        loop {
            let instance = self.spawn(index, free_port()?, free_port()?)?;
            if index < self.members.len() {
                self.members[index] = instance;
            } else {
                self.members.push(instance);
            }
            match self.wait_ready(index).await {
                Ok(()) => return Ok(()),
                Err(NotReady::Exited(_)) if attempt < SPAWN_ATTEMPTS_MAX => attempt += 1,
                Err(not_ready) => return Err(self.not_ready(index, not_ready)),
            }
        }
    }

    fn spawn(&self, index: usize, port: u16, admin_port: u16) -> anyhow::Result<Instance> {
        let spec = &self.spec;
        let mut command = Command::new(&spec.server);
        command
            .env("DATABASE_URL", &spec.database_url)
            .env("REDIS_URL", &spec.redis_url)
            .env("PORT", port.to_string())
            .env("RUST_LOG", "error")
            .env("WALLET_INSTANCE_ID", format!("sim-{index}"))
            .env("WALLET_ADMIN_HTTP_ADDR", format!("127.0.0.1:{admin_port}"))
            .env("WALLET_ACCOUNT_LIMITS_ENABLED", "false")
            .env("WALLET_TOKEN_SIGNING_KEY", &self.signing_key)
            .env("WALLET_REDIS_KEY_PREFIX", &spec.redis_prefix);
        for (name, value) in &spec.settings {
            command.env(name, value);
        }
        let child = command
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("failed to start {}", spec.server.display()))?;
        Ok(Instance {
            child,
            port,
            admin_port,
        })
    }

    /// Ready when this instance answers: its public `/readyz` and its
    /// admin listener's detailed one both say so, and its process is still
    /// running afterwards. Both ports and the process, because a port this
    /// instance failed to bind may be answered by another process.
    async fn wait_ready(&mut self, index: usize) -> Result<(), NotReady> {
        let public = format!("{}/readyz", self.url(index));
        let admin = format!("http://127.0.0.1:{}/readyz", self.members[index].admin_port);
        let deadline = Instant::now() + Duration::from_secs(READY_WAIT_S);
        loop {
            if let Ok(Some(status)) = self.members[index].child.try_wait() {
                return Err(NotReady::Exited(status));
            }
            let public_ready = self
                .http
                .get(&public)
                .send()
                .await
                .is_ok_and(|r| r.status() == 200);
            let admin_ready = match self.http.get(&admin).send().await {
                Ok(response) if response.status() == 200 => response
                    .json::<serde_json::Value>()
                    .await
                    .is_ok_and(|readiness| readiness.get("postgres").is_some()),
                _ => false,
            };
            if public_ready && admin_ready && matches!(self.members[index].child.try_wait(), Ok(None)) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(NotReady::TimedOut);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn not_ready(&self, index: usize, not_ready: NotReady) -> anyhow::Error {
        match not_ready {
            NotReady::Exited(status) => anyhow::anyhow!(
                "{} exited before it was ready ({status}), {SPAWN_ATTEMPTS_MAX} times at most",
                self.url(index)
            ),
            NotReady::TimedOut => {
                anyhow::anyhow!("{} did not become ready in {READY_WAIT_S} s", self.url(index))
            }
        }
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub fn url(&self, index: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[index].port)
    }

    pub fn urls(&self) -> Vec<String> {
        (0..self.members.len()).map(|index| self.url(index)).collect()
    }

    /// The sum over the running instances of every series of a counter,
    /// e.g. `wallet_commands_claimed_total`, since each last started.
    pub async fn counter(&self, series: &str) -> f64 {
        let mut sum = 0.0;
        for index in 0..self.members.len() {
            sum += self.counter_of(index, series).await;
        }
        sum
    }

    /// One instance's counter, since it last started; 0 if it cannot say.
    pub async fn counter_of(&self, index: usize, series: &str) -> f64 {
        let url = format!("http://127.0.0.1:{}/metrics", self.members[index].admin_port);
        let Ok(response) = self.http.get(&url).send().await else {
            return 0.0;
        };
        let text = response.text().await.unwrap_or_default();
        text.lines()
            .filter(|line| line.starts_with(series))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    /// `SIGKILL`: the instance dies wherever it is, mid-transaction or
    /// between a commit and its acknowledgement.
    pub fn kill(&mut self, index: usize) -> anyhow::Result<()> {
        let child = &mut self.members[index].child;
        child.kill()?;
        child.wait()?;
        Ok(())
    }

    /// Starts a killed instance again on its port.
    pub async fn restart(&mut self, index: usize) -> anyhow::Result<()> {
        let Instance { port, admin_port, .. } = self.members[index];
        self.members[index] = self.spawn(index, port, admin_port)?;
        self.wait_ready(index)
            .await
            .map_err(|not_ready| self.not_ready(index, not_ready))
    }

    /// `SIGSTOP`: the instance stops wherever it is, holding what it holds,
    /// until `resume`; to its peers it looks exactly like a slow consumer.
    pub fn stall(&self, index: usize) -> anyhow::Result<()> {
        self.signal(index, "-STOP")
    }

    pub fn resume(&self, index: usize) -> anyhow::Result<()> {
        self.signal(index, "-CONT")
    }

    fn signal(&self, index: usize, signal: &str) -> anyhow::Result<()> {
        let pid = self.members[index].child.id();
        let status = Command::new("kill").arg(signal).arg(pid.to_string()).status()?;
        anyhow::ensure!(status.success(), "kill {signal} {pid} failed");
        Ok(())
    }
}

impl Drop for Instances {
    fn drop(&mut self) {
        for index in 0..self.members.len() {
            // A stalled instance must go on to die.
            let _ = self.resume(index);
            let _ = self.kill(index);
        }
    }
}

pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
