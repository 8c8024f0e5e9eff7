//! A replicated PostgreSQL of a test's own: one etcd and a Patroni node
//! per server (Debian's `etcd-server` and `patroni`), each on free ports in
//! a scratch directory, streaming replication from the primary to its
//! standbys, and Patroni promoting a standby when the primary's node dies.
//!
//! A node "dies" as a machine would: its Patroni agent and its PostgreSQL
//! get SIGKILL together, so that nothing restarts the server and the
//! leader key in etcd expires after `FAILOVER_TTL_S`. Everything started
//! here is stopped by its own pid or process group, never by name.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sqlx::Connection;

use crate::private_stores::{
    ScratchDir, hand_to_postgres, postgres_tool, running_as_root, wait_until_listening,
};

/// Patroni's leader key lives this long without its holder renewing it:
/// the longest a dead primary goes unnoticed. Patroni's floor is 10 s (its
/// default, 30 s, makes a failover three times slower).
pub const FAILOVER_TTL_S: u64 = 10;
/// A failover that has not promoted a standby this long after the primary
/// died has failed.
pub const FAILOVER_SECONDS_MAX: u64 = 60;
/// The commit-rate probe: this many connections, each committing one-row
/// transactions for `COMMIT_PROBE_SECONDS`, once per `synchronous_commit`.
pub const COMMIT_PROBE_CONNECTIONS: usize = 8;
pub const COMMIT_PROBE_SECONDS: u64 = 2;
/// How long the cluster may take to bootstrap and to stream to every
/// standby.
const CLUSTER_START_SECONDS_MAX: u64 = 90;

/// When the primary answers a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// As soon as the commit is in its own WAL; standbys catch up after.
    Asynchronous,
    /// Once a synchronous standby has the commit in its WAL too (Patroni's
    /// `synchronous_mode`, `synchronous_commit = on`); only that standby
    /// may be promoted.
    Synchronous,
}

impl Replication {
    pub fn describe(self) -> &'static str {
        match self {
            Replication::Asynchronous => "asynchronous",
            Replication::Synchronous => "synchronous",
        }
    }
}

/// One-row commits per second on the primary, with each
/// `synchronous_commit`: `on` waits for the synchronous standby when there
/// is one; `local` never does. Their ratio is what synchronous replication
/// costs a commit.
#[derive(Debug, Clone, Copy)]
pub struct CommitRates {
    pub synchronous: f64,
    pub local: f64,
}

/// One PostgreSQL server and the Patroni agent that manages it.
struct Node {
    name: String,
    rest_port: u16,
    pg_port: u16,
    data: PathBuf,
    patroni: Option<Child>,
}

/// A primary and its standbys under Patroni, with an etcd of their own.
pub struct ReplicatedPostgres {
    pub replication: Replication,
    nodes: Vec<Node>,
    etcd: Option<Child>,
    http: reqwest::Client,
    dir: ScratchDir,
}

impl ReplicatedPostgres {
    /// Starts etcd, then the first node (which bootstraps the cluster and
    /// becomes its primary), then `standbys` more; returns once every
    /// standby streams and, when synchronous, one of them is synchronous.
    pub async fn start(replication: Replication, standbys: usize) -> Self {
        for program in ["patroni", "etcd"] {
            assert!(
                on_path(program),
                "{program} was not found; install Debian's patroni and etcd-server packages (./scripts/test does)"
            );
        }
        let dir = ScratchDir::for_logs("patroni");
        let etcd_client = crate::closed_port();
        let etcd_peer = crate::closed_port();
        let nodes: Vec<Node> = (0..=standbys)
            .map(|number| {
                let name = format!("node{number}");
                let home = dir.path().join(&name);
                std::fs::create_dir_all(&home).expect("a node's directory");
                Node {
                    data: home.join("data"),
                    name,
                    rest_port: crate::closed_port(),
                    pg_port: crate::closed_port(),
                    patroni: None,
                }
            })
            .collect();
        for node in &nodes {
            write_patroni_config(dir.path(), node, etcd_client, replication);
        }
        hand_to_postgres(dir.path());
        let etcd = as_postgres("etcd")
            .args(["--name", "etcd", "--data-dir"])
            .arg(dir.path().join("etcd"))
            .args([
                "--listen-client-urls",
                &format!("http://127.0.0.1:{etcd_client}"),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{etcd_client}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{etcd_peer}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{etcd_peer}"),
                "--initial-cluster",
                &format!("etcd=http://127.0.0.1:{etcd_peer}"),
            ])
            .stdout(log_file(dir.path(), "etcd.log"))
            .stderr(log_file(dir.path(), "etcd.log"))
            .spawn()
            .expect("start etcd");
        let mut cluster = Self {
            replication,
            nodes,
            etcd: Some(etcd),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(2))
                .build()
                .expect("an HTTP client"),
            dir,
        };
        tokio::task::block_in_place(|| wait_until_listening(etcd_client, "the private etcd"));
        let deadline = Instant::now() + Duration::from_secs(CLUSTER_START_SECONDS_MAX);
        cluster.start_node(0);
        cluster
            .wait_until(deadline, "the first node to lead", |c| c.leader() == Some(0))
            .await;
        for number in 1..cluster.nodes.len() {
            cluster.start_node(number);
        }
        let members = cluster.nodes.len();
        cluster
            .wait_until(deadline, "every standby to stream", |c| {
                let streaming = c.members.iter().filter(|m| m.streams()).count();
                let synchronous = c.members.iter().any(|m| m.role == "sync_standby");
                streaming == members - 1 && (replication == Replication::Asynchronous || synchronous)
            })
            .await;
        cluster
    }

    fn start_node(&mut self, number: usize) {
        let node = &mut self.nodes[number];
        let log = format!("{}.log", node.name);
        let child = as_postgres("patroni")
            .arg(self.dir.path().join(format!("{}.yml", node.name)))
            .stdout(log_file(self.dir.path(), &log))
            .stderr(log_file(self.dir.path(), &log))
            .spawn()
            .expect("start a Patroni node");
        node.patroni = Some(child);
    }

    /// A URL that names every server, in the nodes' order, for a client
    /// that finds the one taking writes itself, as libpq does.
    pub fn url(&self, database: &str) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.pg_port))
            .collect();
        format!(
            "postgres://postgres@{}/{database}?sslmode=disable&target_session_attrs=read-write",
            hosts.join(",")
        )
    }

    /// A URL of the server that leads now.
    pub async fn primary_url(&self, database: &str) -> String {
        let leader = self.cluster().await.leader().expect("a leader");
        format!(
            "postgres://postgres@127.0.0.1:{}/{database}?sslmode=disable",
            self.nodes[leader].pg_port
        )
    }

    pub async fn create_database(&self, name: &str) {
        let mut admin = sqlx::PgConnection::connect(&self.primary_url("postgres").await)
            .await
            .expect("connect to the primary");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .expect("create a database on the primary");
    }

    /// The cluster as Patroni's REST API on any live node describes it.
    async fn cluster(&self) -> ClusterView {
        for node in self.nodes.iter().filter(|n| n.patroni.is_some()) {
            let url = format!("http://127.0.0.1:{}/cluster", node.rest_port);
            let Ok(answer) = self.http.get(&url).send().await else {
                continue;
            };
            if let Ok(body) = answer.json::<Value>().await {
                return ClusterView::read(&body, &self.nodes);
            }
        }
        ClusterView::default()
    }

    async fn wait_until(&self, deadline: Instant, what: &str, done: impl Fn(&ClusterView) -> bool) {
        loop {
            let view = self.cluster().await;
            if done(&view) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the replicated PostgreSQL did not get {what} in time; Patroni's logs are in {}",
                self.dir.path().display()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The node that leads now, by its place in the URL.
    pub async fn leader(&self) -> Option<usize> {
        self.cluster().await.leader()
    }

    /// Pauses the primary's WAL senders, as a slow link to its standbys
    /// would hold them back: an asynchronous primary goes on answering
    /// commits its standbys do not have; a synchronous one waits. (The
    /// senders, not the standbys' receivers: on one machine, what a sender
    /// has written already sits in the receiver's socket and would survive
    /// the primary.)
    pub fn pause_replication(&self, primary: usize) {
        let Some(postmaster) = postmaster_pid(&self.nodes[primary].data) else {
            return;
        };
        for sender in children_named(postmaster, "walsender") {
            send_signal("-STOP", &sender.to_string());
        }
    }

    /// Kills node `number` as a machine dies: its Patroni agent and its
    /// PostgreSQL (postmaster and every backend), all with SIGKILL. The
    /// kernel resets every connection to it.
    pub fn kill_node(&mut self, number: usize) {
        let node = &mut self.nodes[number];
        if let Some(mut patroni) = node.patroni.take() {
            // The agent runs in a process group of its own (see `as_postgres`).
            send_signal("-KILL", &format!("-{}", patroni.id()));
            let _ = patroni.wait();
        }
        if let Some(postmaster) = postmaster_pid(&node.data) {
            // The postmaster runs in a session of its own (Patroni starts it so),
            // so its backends are killed by their parent's pid.
            for backend in children_named(postmaster, "") {
                send_signal("-KILL", &backend.to_string());
            }
            send_signal("-KILL", &postmaster.to_string());
        }
    }

    /// Waits until a node other than `dead` leads and takes writes, and
    /// returns which, and how long after `since` that was.
    pub async fn wait_for_promotion(&self, dead: usize, since: Instant) -> (usize, Duration) {
        let deadline = since + Duration::from_secs(FAILOVER_SECONDS_MAX);
        loop {
            if let Some(leader) = self.leader().await.filter(|l| *l != dead)
                && self.takes_writes(leader).await
            {
                return (leader, since.elapsed());
            }
            assert!(
                Instant::now() < deadline,
                "no standby was promoted within {FAILOVER_SECONDS_MAX} s; Patroni's logs are in {}",
                self.dir.path().display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn takes_writes(&self, number: usize) -> bool {
        let url = format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
            self.nodes[number].pg_port
        );
        let Ok(mut connection) = sqlx::PgConnection::connect(&url).await else {
            return false;
        };
        let read_only: Result<String, _> = sqlx::query_scalar("SHOW transaction_read_only")
            .fetch_one(&mut connection)
            .await;
        read_only.is_ok_and(|r| r == "off")
    }

    /// Measures `CommitRates` on the primary, in a database of its own.
    pub async fn commit_rates(&self) -> CommitRates {
        self.create_database("commit_probe").await;
        let url = self.primary_url("commit_probe").await;
        let mut setup = sqlx::PgConnection::connect(&url)
            .await
            .expect("connect to the primary");
        sqlx::raw_sql("CREATE TABLE probe (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())")
            .execute(&mut setup)
            .await
            .expect("create the probe's table");
        CommitRates {
            synchronous: commits_per_s(&url, "on").await,
            local: commits_per_s(&url, "local").await,
        }
    }

    /// Where Patroni's and etcd's logs are.
    pub fn logs(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for ReplicatedPostgres {
    fn drop(&mut self) {
        for number in 0..self.nodes.len() {
            self.kill_node(number);
        }
        if let Some(mut etcd) = self.etcd.take() {
            send_signal("-KILL", &format!("-{}", etcd.id()));
            let _ = etcd.wait();
        }
    }
}

/// A member of the cluster as Patroni reports it.
#[derive(Debug, Clone)]
struct Member {
    node: Option<usize>,
    role: String,
    state: String,
}

impl Member {
    fn streams(&self) -> bool {
        self.role != "leader" && matches!(self.state.as_str(), "running" | "streaming")
    }
}

#[derive(Debug, Default)]
struct ClusterView {
    members: Vec<Member>,
}

impl ClusterView {
    fn read(body: &Value, nodes: &[Node]) -> Self {
        let members = body["members"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| Member {
                node: nodes
                    .iter()
                    .position(|n| Some(n.name.as_str()) == m["name"].as_str()),
                role: m["role"].as_str().unwrap_or_default().to_owned(),
                state: m["state"].as_str().unwrap_or_default().to_owned(),
            })
            .collect();
        Self { members }
    }

    fn leader(&self) -> Option<usize> {
        self.members
            .iter()
            .find(|m| m.role == "leader" && m.state == "running")
            .and_then(|m| m.node)
    }
}

async fn commits_per_s(url: &str, synchronous_commit: &'static str) -> f64 {
    let each = Duration::from_secs(COMMIT_PROBE_SECONDS);
    let workers = (0..COMMIT_PROBE_CONNECTIONS).map(|_| async move {
        let mut connection = sqlx::PgConnection::connect(url)
            .await
            .expect("connect to the primary");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "SET synchronous_commit = {synchronous_commit}"
        )))
        .execute(&mut connection)
        .await
        .expect("set synchronous_commit");
        let started = Instant::now();
        let mut commits = 0_u64;
        while started.elapsed() < each {
            sqlx::query("INSERT INTO probe DEFAULT VALUES")
                .execute(&mut connection)
                .await
                .expect("commit a probe row");
            commits += 1;
        }
        commits
    });
    let commits: u64 = futures::future::join_all(workers).await.into_iter().sum();
    commits as f64 / each.as_secs_f64()
}

fn write_patroni_config(dir: &Path, node: &Node, etcd_client: u16, replication: Replication) {
    let home = dir.join(&node.name);
    // Patroni runs every server tool from one directory; pg_controldata is
    // only in the versioned one.
    let bin_dir = postgres_tool("pg_controldata");
    let bin_dir = bin_dir.parent().expect("the PostgreSQL tools' directory");
    let synchronous = replication == Replication::Synchronous;
    let config = format!(
        "scope: lw-failover
name: {name}
restapi:
  listen: 127.0.0.1:{rest}
  connect_address: 127.0.0.1:{rest}
etcd3:
  hosts: 127.0.0.1:{etcd_client}
bootstrap:
  dcs:
    ttl: {FAILOVER_TTL_S}
    loop_wait: 1
    retry_timeout: 3
    maximum_lag_on_failover: 1073741824
    synchronous_mode: {synchronous}
    postgresql:
      use_pg_rewind: false
      parameters:
        max_connections: 200
        synchronous_commit: 'on'
  initdb:
    - encoding: UTF8
    - auth: trust
  pg_hba:
    - local all all trust
    - host replication all 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:{pg}
  connect_address: 127.0.0.1:{pg}
  data_dir: {data}
  bin_dir: {bin_dir}
  pgpass: {home}/pgpass
  authentication:
    replication:
      username: postgres
    superuser:
      username: postgres
  parameters:
    unix_socket_directories: {home}
",
        name = node.name,
        rest = node.rest_port,
        pg = node.pg_port,
        data = node.data.display(),
        bin_dir = bin_dir.display(),
        home = home.display(),
    );
    std::fs::write(dir.join(format!("{}.yml", node.name)), config).expect("write a Patroni config");
}

/// A command run as `postgres` when the tests run as root (PostgreSQL and
/// Patroni refuse root), in a process group of its own so that it and
/// everything it forks can be killed together.
fn as_postgres(program: &str) -> Command {
    let mut command = if running_as_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--", program]);
        command
    } else {
        Command::new(program)
    };
    command.stdin(Stdio::null()).process_group(0);
    command
}

fn log_file(dir: &Path, name: &str) -> File {
    File::options()
        .create(true)
        .append(true)
        .open(dir.join(name))
        .expect("a log file")
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

fn postmaster_pid(data: &Path) -> Option<u32> {
    std::fs::read_to_string(data.join("postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

/// The children of `parent` whose command line holds `name` (all of them
/// when `name` is empty).
fn children_named(parent: u32, name: &str) -> Vec<u32> {
    let output = Command::new("pgrep")
        .args([
            "-P",
            &parent.to_string(),
            "-f",
            if name.is_empty() { "." } else { name },
        ])
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.trim().parse().ok())
        .collect()
}

fn send_signal(signal: &str, target: &str) {
    // A process already gone (a backend that followed its postmaster) is
    // no error here.
    let _ = Command::new("kill")
        .args([signal, "--", target])
        .stderr(Stdio::null())
        .status();
}
