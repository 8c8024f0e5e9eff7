//! PostgreSQL and Redis servers of a test's own, on free ports, that the
//! test may stop, crash and restart. The shared servers the rest of the
//! suite uses are never touched: each private server lives in a directory
//! of its own and is stopped by its own data directory or by its pid.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a private server may take to accept connections after a start.
pub const STORE_START_SECONDS_MAX: u64 = 30;

fn accepts_connections(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200)).is_ok()
}

pub(crate) fn wait_until_listening(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(STORE_START_SECONDS_MAX);
    while !accepts_connections(port) {
        assert!(
            Instant::now() < deadline,
            "{what} did not accept connections on 127.0.0.1:{port} within {STORE_START_SECONDS_MAX} s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGKILL to a child process this test started, and reaping it.
pub(crate) fn kill_9(child: &mut Option<Child>) {
    if let Some(mut child) = child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A scratch directory under the system's temporary directory, removed on
/// drop unless the test is failing (its logs are then worth keeping).
pub(crate) struct ScratchDir {
    path: PathBuf,
    keep_on_failure: bool,
}

impl ScratchDir {
    pub(crate) fn path(&self) -> &std::path::Path {
        &self.path
    }

    pub(crate) fn new(what: &str) -> Self {
        let path = std::env::temp_dir().join(format!("lw-{what}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&path).expect("create a scratch directory");
        Self {
            path,
            keep_on_failure: false,
        }
    }

    /// A directory for logs, kept when the test fails.
    pub(crate) fn for_logs(what: &str) -> Self {
        let mut dir = Self::new(what);
        dir.keep_on_failure = true;
        dir
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if self.keep_on_failure && std::thread::panicking() {
            return;
        }
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// PostgreSQL refuses to run as root. When the tests do, the private
/// cluster runs as the `postgres` account that Debian's package creates.
pub(crate) fn running_as_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

/// Makes `dir` the `postgres` account's when the tests run as root, so
/// that the servers started in it as `postgres` may write there.
pub(crate) fn hand_to_postgres(dir: &std::path::Path) {
    if !running_as_root() {
        return;
    }
    let chown = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(dir)
        .status()
        .expect("chown the scratch directory");
    assert!(chown.success(), "could not hand {} to postgres", dir.display());
}

/// `initdb` and `pg_ctl`: from PATH, or from Debian's versioned directory,
/// newest first.
pub(crate) fn postgres_tool(name: &str) -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file());
    if let Some(found) = on_path {
        return found;
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("bin").join(name))
        .filter(|candidate| candidate.is_file())
        .collect();
    versions.sort_by_key(|path| {
        path.components()
            .nth(4)
            .and_then(|c| c.as_os_str().to_str()?.parse::<u32>().ok())
    });
    versions.pop().unwrap_or_else(|| {
        panic!("{name} was not found on PATH or in /usr/lib/postgresql/*/bin; install Debian's postgresql package")
    })
}

/// Runs a PostgreSQL tool, as `postgres` when the tests run as root.
fn run_postgres_tool(name: &str, args: &[&str]) -> std::process::Output {
    let tool = postgres_tool(name);
    let mut command = if running_as_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(&tool);
        command
    } else {
        Command::new(&tool)
    };
    command
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|error| panic!("{name} could not be run: {error}"))
}

#[derive(Debug, Clone, Copy)]
pub enum PgStopMode {
    /// Disconnects every client, rolls back open transactions, checkpoints.
    Fast,
    /// Every process exits at once, as in a crash; start-up replays the WAL.
    Immediate,
}

impl PgStopMode {
    fn as_arg(self) -> &'static str {
        match self {
            PgStopMode::Fast => "fast",
            PgStopMode::Immediate => "immediate",
        }
    }
}

/// A PostgreSQL cluster of a test's own: `initdb` in a scratch directory,
/// the server on a free port, trust authentication for `postgres`.
pub struct PrivatePostgres {
    pub port: u16,
    data: PathBuf,
    tls: bool,
    _dir: ScratchDir,
}

impl PrivatePostgres {
    pub fn start() -> Self {
        let dir = ScratchDir::new("pg");
        let data = dir.path.join("data");
        hand_to_postgres(&dir.path);
        let data_arg = data.to_str().expect("a UTF-8 path");
        let init = run_postgres_tool(
            "initdb",
            &[
                "-D",
                data_arg,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        assert!(
            init.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&init.stderr)
        );
        let cluster = Self {
            port: crate::closed_port(),
            data,
            tls: false,
            _dir: dir,
        };
        cluster.start_server();
        cluster
    }

    /// A cluster that also accepts TLS, with a self-signed certificate made
    /// for it (`openssl`), for tests of `sslmode`.
    pub fn start_with_tls() -> Self {
        let mut cluster = Self::start();
        cluster.stop(PgStopMode::Fast);
        let (cert, key) = (cluster.data.join("server.crt"), cluster.data.join("server.key"));
        let made = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=127.0.0.1",
            ])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("openssl runs (Debian's openssl package)");
        assert!(made.success(), "openssl could not make a certificate");
        for (path, mode) in [(&cert, "644"), (&key, "600")] {
            let _ = Command::new("chmod").arg(mode).arg(path).status();
            if running_as_root() {
                let _ = Command::new("chown").arg("postgres:postgres").arg(path).status();
            }
        }
        cluster.tls = true;
        cluster.start_server();
        cluster
    }

    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    fn data_arg(&self) -> &str {
        self.data.to_str().expect("a UTF-8 path")
    }

    /// Starts the server on this cluster's port; the socket directory is
    /// the data directory, so nothing outside it is touched. fsync is off:
    /// an immediate stop kills processes, not the machine, so the WAL in the
    /// page cache survives it, and the tests run faster.
    fn start_server(&self) {
        let mut options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c fsync=off -c max_connections=200",
            self.port,
            self.data_arg()
        );
        if self.tls {
            options.push_str(" -c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key");
        }
        let log = self.data.join("server.log");
        let start = run_postgres_tool(
            "pg_ctl",
            &[
                "start",
                "-D",
                self.data_arg(),
                "-l",
                log.to_str().expect("a UTF-8 path"),
                "-o",
                &options,
                "-w",
            ],
        );
        assert!(
            start.status.success(),
            "pg_ctl start failed: {}\n{}",
            String::from_utf8_lossy(&start.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        wait_until_listening(self.port, "the private PostgreSQL");
    }

    pub fn stop(&self, mode: PgStopMode) {
        let stop = run_postgres_tool(
            "pg_ctl",
            &["stop", "-D", self.data_arg(), "-m", mode.as_arg(), "-w"],
        );
        assert!(
            stop.status.success(),
            "pg_ctl stop failed: {}",
            String::from_utf8_lossy(&stop.stderr)
        );
    }

    pub fn start_again(&self) {
        self.start_server();
    }

    /// Creates a database on this cluster.
    pub async fn create_database(&self, name: &str) {
        use sqlx::Connection;
        let mut admin = sqlx::PgConnection::connect(&self.url("postgres"))
            .await
            .expect("connect to the private PostgreSQL");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .expect("create a database on the private PostgreSQL");
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        // Only this cluster: pg_ctl finds its postmaster by the data
        // directory's postmaster.pid.
        if self.data.join("postmaster.pid").exists() {
            let _ = run_postgres_tool(
                "pg_ctl",
                &["stop", "-D", self.data_arg(), "-m", "immediate", "-w"],
            );
        }
    }
}

/// How every private Redis runs: nothing on disk unless a test asks, and
/// full memory refusing writes, as the deployment's does.
pub(crate) const PRIVATE_REDIS_ARGS: [&str; 6] = [
    "--save",
    "",
    "--appendonly",
    "no",
    "--maxmemory-policy",
    "noeviction",
];

/// A Redis server of a test's own on a free port, which keeps nothing on
/// disk and can be killed and started again on the same port.
pub struct PrivateRedis {
    pub port: u16,
    child: Option<Child>,
    dir: ScratchDir,
    extra_args: Vec<String>,
}

impl PrivateRedis {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// With extra `redis-server` arguments, e.g. `["--maxmemory", "4mb"]`.
    pub fn start_with(args: &[&str]) -> Self {
        let mut redis = Self {
            port: crate::closed_port(),
            child: None,
            dir: ScratchDir::new("redis"),
            extra_args: args.iter().map(|arg| (*arg).to_owned()).collect(),
        };
        redis.start_again();
        redis
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "the private Redis is already running");
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(PRIVATE_REDIS_ARGS)
            .arg("--dir")
            .arg(&self.dir.path)
            .args(&self.extra_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| {
                panic!("redis-server could not be started ({error}); install Debian's redis-server package")
            });
        self.child = Some(child);
        wait_until_listening(self.port, "the private Redis");
    }

    /// SIGKILL to this server's pid: it vanishes with whatever it held.
    pub fn kill(&mut self) {
        kill_9(&mut self.child);
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
    }
}
