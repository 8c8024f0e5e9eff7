//! A Redis Cluster of a test's own: masters with one replica each, every
//! node a `redis-server` on free ports in a scratch directory, so that a
//! test may kill a master and watch its replica take over. The shared
//! cluster on 7101-7103 is never touched.
//!
//! Replication is asynchronous, as in every Redis deployment. To make the
//! replica of a master fall behind on purpose, replicas sign in to their
//! master as a user of their own (`REPLICATION_USER`); turning that user off
//! and dropping the link keeps the replica out while the master goes on
//! taking writes, as a partition between the two would.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::private_stores::{PRIVATE_REDIS_ARGS, ScratchDir, kill_9, wait_until_listening};

/// How long a node goes unanswered before the others count it as failed
/// and its replica stands for election.
pub const CLUSTER_NODE_TIMEOUT_MS: u64 = 1_000;
/// A replica not promoted this long after its master died has failed.
pub const PROMOTION_SECONDS_MAX: u64 = 30;
const REPLICATION_USER: &str = "replication";
const REPLICATION_PASSWORD: &str = "replication-only-for-tests";

struct Node {
    port: u16,
    child: Option<Child>,
}

pub struct PrivateRedisCluster {
    nodes: Vec<Node>,
    dir: ScratchDir,
}

impl PrivateRedisCluster {
    /// `masters` masters and as many replicas, the slots shared among the
    /// masters; returns once the cluster is `ok` and every replica is in
    /// sync with its master. Blocking.
    pub fn start(masters: usize) -> Self {
        let dir = ScratchDir::for_logs("redis-cluster");
        let mut cluster = Self {
            nodes: Vec::new(),
            dir,
        };
        for number in 0..2 * masters {
            let node_dir = cluster.dir.path().join(format!("node{number}"));
            std::fs::create_dir_all(&node_dir).expect("a node's directory");
            let (port, bus_port) = (crate::closed_port(), crate::closed_port());
            let child = Command::new("redis-server")
                .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                .args([
                    "--cluster-enabled",
                    "yes",
                    "--cluster-port",
                    &bus_port.to_string(),
                ])
                .args(["--cluster-config-file", "nodes.conf"])
                .args(["--cluster-node-timeout", &CLUSTER_NODE_TIMEOUT_MS.to_string()])
                // A replica cut off from its master still stands for
                // election: what a failover after a partition does.
                .args(["--cluster-replica-validity-factor", "0"])
                .args(PRIVATE_REDIS_ARGS)
                .args([
                    "--masteruser",
                    REPLICATION_USER,
                    "--masterauth",
                    REPLICATION_PASSWORD,
                ])
                .args([
                    "--user",
                    REPLICATION_USER,
                    "on",
                    &format!(">{REPLICATION_PASSWORD}"),
                    "+@all",
                    "~*",
                ])
                .arg("--dir")
                .arg(&node_dir)
                .arg("--logfile")
                .arg(node_dir.join("redis.log"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .expect("start a Redis Cluster node (install Debian's redis-server)");
            cluster.nodes.push(Node {
                port,
                child: Some(child),
            });
        }
        for node in &cluster.nodes {
            wait_until_listening(node.port, "a private Redis Cluster node");
        }
        let addresses: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let create = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("redis-cli (install Debian's redis-tools)");
        assert!(
            create.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&create.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(PROMOTION_SECONDS_MAX);
        while !cluster.is_ready() {
            assert!(
                Instant::now() < deadline,
                "the private Redis Cluster did not become ready; logs in {}",
                cluster.dir.path().display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster
    }

    /// Every node says `cluster_state:ok` and every replica's link to its
    /// master is up.
    fn is_ready(&self) -> bool {
        self.nodes.iter().enumerate().all(|(number, node)| {
            node.child.is_none()
                || (self
                    .ask(number, &["CLUSTER", "INFO"])
                    .contains("cluster_state:ok")
                    && (self.role(number) == "master"
                        || self
                            .ask(number, &["INFO", "replication"])
                            .contains("master_link_status:up")))
        })
    }

    /// The URLs of every node, for `redis_cluster_urls`.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect()
    }

    /// A node's answer to a command, as `redis-cli` prints it.
    fn ask(&self, number: usize, command: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .args(["-p", &self.nodes[number].port.to_string()])
            .args(command)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn role(&self, number: usize) -> String {
        self.ask(number, &["ROLE"])
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned()
    }

    /// The slot `key` hashes to.
    pub fn slot_of(&self, key: &str) -> u16 {
        let live = self
            .nodes
            .iter()
            .position(|n| n.child.is_some())
            .expect("a live node");
        self.ask(live, &["CLUSTER", "KEYSLOT", key])
            .trim()
            .parse()
            .expect("a slot")
    }

    /// The node that serves `slot` now, by its place among the nodes.
    pub fn master_of(&self, slot: u16) -> usize {
        let live = self
            .nodes
            .iter()
            .position(|n| n.child.is_some())
            .expect("a live node");
        for line in self.ask(live, &["CLUSTER", "NODES"]).lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 9 || !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            let serves = fields[8..].iter().any(|range| match range.split_once('-') {
                Some((low, high)) => {
                    (low.parse().unwrap_or(u16::MAX)..=high.parse().unwrap_or(0)).contains(&slot)
                }
                None => range.parse::<u16>().ok() == Some(slot),
            });
            if serves {
                let port: u16 = fields[1]
                    .split(['@', ':'])
                    .nth(1)
                    .and_then(|p| p.parse().ok())
                    .expect("a node's port");
                return self
                    .nodes
                    .iter()
                    .position(|n| n.port == port)
                    .expect("a node of this cluster");
            }
        }
        panic!("no master serves slot {slot}");
    }

    /// The replica of master `number`.
    pub fn replica_of(&self, number: usize) -> usize {
        let port = self.nodes[number].port.to_string();
        (0..self.nodes.len())
            .find(|&candidate| {
                candidate != number
                    && self.nodes[candidate].child.is_some()
                    && self.ask(candidate, &["ROLE"]).lines().nth(2) == Some(port.as_str())
            })
            .expect("the master has a replica")
    }

    /// Keeps master `number`'s replica out: the replica's user is turned
    /// off and its link dropped, so that nothing the master takes from now
    /// on is copied.
    pub fn pause_replication(&self, number: usize) {
        self.ask(number, &["ACL", "SETUSER", REPLICATION_USER, "off"]);
        self.ask(number, &["CLIENT", "KILL", "TYPE", "replica"]);
    }

    /// Waits until master `number`'s replica has everything it took.
    pub fn wait_for_replication(&self, number: usize) {
        let copied = self.ask(number, &["WAIT", "1", "5000"]);
        assert_eq!(copied.trim(), "1", "the replica did not catch up with its master");
    }

    /// The length of `stream` as replica `number` holds it.
    pub fn replica_stream_length(&self, number: usize, stream: &str) -> usize {
        let output = Command::new("redis-cli")
            .args(["-p", &self.nodes[number].port.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                let mut input = child.stdin.take().expect("redis-cli's input");
                writeln!(input, "READONLY")?;
                writeln!(input, "XLEN {stream}")?;
                drop(input);
                child.wait_with_output()
            })
            .expect("redis-cli");
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .last()
            .and_then(|line| line.trim().parse().ok())
            .expect("a stream's length")
    }

    /// SIGKILL to node `number`.
    pub fn kill(&mut self, number: usize) {
        kill_9(&mut self.nodes[number].child);
    }

    /// Waits until node `replica` is a master and the cluster is `ok`
    /// again; returns how long after `since` that was.
    pub fn wait_for_promotion(&self, replica: usize, since: Instant) -> Duration {
        let deadline = since + Duration::from_secs(PROMOTION_SECONDS_MAX);
        loop {
            if self.role(replica) == "master"
                && self
                    .ask(replica, &["CLUSTER", "INFO"])
                    .contains("cluster_state:ok")
            {
                return since.elapsed();
            }
            assert!(
                Instant::now() < deadline,
                "the replica was not promoted within {PROMOTION_SECONDS_MAX} s; logs in {}",
                self.dir.path().display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for PrivateRedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            kill_9(&mut node.child);
        }
    }
}
