//! A `database_url` may name several PostgreSQL servers, as libpq's do:
//! `postgres://role@db1:5432,db2:5432/wallet?target_session_attrs=read-write`.
//!
//! A replicated deployment names its primary and its standbys. The pool
//! connects to one server at a time. With `target_session_attrs=read-write`
//! (or `primary`), a server that only accepts reads (a standby, or a
//! primary its failover manager has demoted) is refused at connect, and a
//! watch moves the pool to the server that accepts writes once the one it
//! uses stops doing so: after a failover, the instances find the promoted
//! standby by themselves.
//!
//! Connections opened before a move are closed at their next checkout,
//! since they lead to a server that no longer takes writes.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection, PgPool};

/// The servers a `database_url` names, in its order, and what a
/// connection must accept.
#[derive(Debug, Clone)]
pub struct DatabaseHosts {
    servers: Vec<PgConnectOptions>,
    /// Where each server is, for the logs: `host:port`, never the role
    /// or its password.
    addresses: Vec<String>,
    writes_required: bool,
}

impl DatabaseHosts {
    /// Parses `url`. The error names what is wrong, never the URL (it may
    /// hold a password).
    pub fn parse(url: &str) -> Result<Self, String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or("it does not start with postgres://")?;
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path_and_query) = rest.split_at(authority_end);
        let (user_info, host_list) = match authority.rsplit_once('@') {
            Some((user_info, hosts)) => (Some(user_info), hosts),
            None => (None, authority),
        };
        let (path, query) = match path_and_query.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (path_and_query, None),
        };
        let mut writes_required = false;
        let mut kept_query = Vec::new();
        for pair in query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|p| !p.is_empty())
        {
            match pair.split_once('=') {
                Some(("target_session_attrs", "any")) => {}
                Some(("target_session_attrs", "read-write" | "primary")) => writes_required = true,
                Some(("target_session_attrs", _)) => {
                    return Err("its target_session_attrs is neither any, read-write nor primary".into());
                }
                _ => kept_query.push(pair),
            }
        }
        let query = if kept_query.is_empty() {
            String::new()
        } else {
            format!("?{}", kept_query.join("&"))
        };
        let user_info = user_info.map(|u| format!("{u}@")).unwrap_or_default();
        let mut servers = Vec::new();
        let mut addresses = Vec::new();
        for host in host_list.split(',') {
            if host.is_empty() {
                return Err("it names an empty host".into());
            }
            let one = format!("{scheme}://{user_info}{host}{path}{query}");
            let options = PgConnectOptions::from_str(&one).map_err(|_| "it is not a valid PostgreSQL URL")?;
            addresses.push(format!("{}:{}", options.get_host(), options.get_port()));
            servers.push(options);
        }
        Ok(Self {
            servers,
            addresses,
            writes_required,
        })
    }

    /// The first server named: where the pool starts.
    pub fn first(&self) -> PgConnectOptions {
        self.servers[0].clone()
    }

    pub fn writes_required(&self) -> bool {
        self.writes_required
    }

    /// Only a URL that names several servers has anywhere to move to.
    pub fn has_alternatives(&self) -> bool {
        self.servers.len() > 1
    }

    /// Applies `change` to every server's options.
    pub fn map(mut self, change: impl Fn(PgConnectOptions) -> PgConnectOptions) -> Self {
        self.servers = self.servers.into_iter().map(change).collect();
        self
    }
}

/// Does this connection's server take writes? What libpq asks for
/// `read-write`: a standby, or a server set read-only, answers `on`.
pub async fn accepts_writes(connection: &mut PgConnection) -> Result<bool, sqlx::Error> {
    let read_only: String = sqlx::query_scalar("SHOW transaction_read_only")
        .fetch_one(connection)
        .await?;
    Ok(read_only == "off")
}

/// When the pool last moved to another server, for the checkout check.
#[derive(Debug, Default)]
pub struct PoolMoves {
    /// Nanoseconds after `epoch` of the last move; 0: never moved.
    last_move_nanos: AtomicU64,
    epoch: std::sync::OnceLock<Instant>,
}

impl PoolMoves {
    fn epoch(&self) -> Instant {
        *self.epoch.get_or_init(Instant::now)
    }

    fn moved_now(&self) {
        let nanos = u64::try_from(self.epoch().elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        self.last_move_nanos.store(nanos, Ordering::SeqCst);
    }

    /// Was a connection of this age opened before the last move, to a
    /// server the pool has left?
    pub fn predates_last_move(&self, age: Duration) -> bool {
        let nanos = self.last_move_nanos.load(Ordering::SeqCst);
        if nanos == 0 {
            return false;
        }
        let since_move = self.epoch().elapsed().saturating_sub(Duration::from_nanos(nanos));
        age > since_move
    }
}

/// How the watch looks for the server that takes writes.
#[derive(Debug, Clone, Copy)]
pub struct WatchTimings {
    pub check_interval: Duration,
    pub connect_wait_max: Duration,
}

/// Watches the server the pool uses, and when it stops answering (or,
/// with `read-write`, stops taking writes) moves the pool to the first
/// server in the URL's order that does. Ends when the pool is closed.
pub fn watch(pool: PgPool, hosts: DatabaseHosts, moves: Arc<PoolMoves>, timings: WatchTimings) {
    tokio::spawn(async move {
        let mut current = 0;
        let mut connection: Option<PgConnection> = None;
        let mut ticks = tokio::time::interval(timings.check_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !pool.is_closed() {
            ticks.tick().await;
            if connection.is_none() {
                connection = open(&hosts.servers[current], timings.connect_wait_max).await;
            }
            let still_writable = match connection.as_mut() {
                Some(open) => checked(open, hosts.writes_required, timings.connect_wait_max).await,
                None => false,
            };
            if still_writable {
                continue;
            }
            connection = None;
            let Some((found, open)) = first_writable(&hosts, timings.connect_wait_max).await else {
                continue;
            };
            connection = Some(open);
            if found != current {
                tracing::warn!(
                    from = %hosts.addresses[current],
                    to = %hosts.addresses[found],
                    "the database server that takes writes changed; the pool moves to it"
                );
                pool.set_connect_options(hosts.servers[found].clone());
                moves.moved_now();
                current = found;
            }
        }
    });
}

async fn open(server: &PgConnectOptions, wait: Duration) -> Option<PgConnection> {
    tokio::time::timeout(wait, server.connect()).await.ok()?.ok()
}

/// Does the server answer, and take writes when the URL requires them?
async fn checked(connection: &mut PgConnection, writes_required: bool, wait: Duration) -> bool {
    let answer = async {
        if writes_required {
            accepts_writes(connection).await
        } else {
            connection.ping().await.map(|()| true)
        }
    };
    matches!(tokio::time::timeout(wait, answer).await, Ok(Ok(true)))
}

/// The first server, in the URL's order, that answers (and takes writes,
/// with `read-write`), with the connection that found it.
async fn first_writable(hosts: &DatabaseHosts, wait: Duration) -> Option<(usize, PgConnection)> {
    for (index, server) in hosts.servers.iter().enumerate() {
        if let Some(mut connection) = open(server, wait).await {
            if checked(&mut connection, hosts.writes_required, wait).await {
                return Some((index, connection));
            }
            let _ = connection.close().await;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_server_is_one_server() {
        let hosts =
            DatabaseHosts::parse("postgres://app:secret@db:5433/wallet?sslmode=disable").expect("parsed");
        assert!(!hosts.has_alternatives());
        assert!(!hosts.writes_required());
        assert_eq!(hosts.addresses, ["db:5433"]);
    }

    #[test]
    fn several_servers_keep_the_role_database_and_parameters() {
        let hosts = DatabaseHosts::parse(
            "postgres://app:p%40ss@10.0.0.1:5432,10.0.0.2:6432/wallet?sslmode=disable&target_session_attrs=read-write",
        )
        .expect("parsed");
        assert!(hosts.has_alternatives());
        assert!(hosts.writes_required());
        assert_eq!(hosts.addresses, ["10.0.0.1:5432", "10.0.0.2:6432"]);
        for server in &hosts.servers {
            assert_eq!(server.get_username(), "app");
            assert_eq!(server.get_database(), Some("wallet"));
        }
    }

    #[test]
    fn primary_means_read_write_and_any_means_nothing() {
        assert!(
            DatabaseHosts::parse("postgres://a,b/w?target_session_attrs=primary")
                .expect("parsed")
                .writes_required()
        );
        assert!(
            !DatabaseHosts::parse("postgres://a,b/w?target_session_attrs=any")
                .expect("parsed")
                .writes_required()
        );
    }

    #[test]
    fn bad_urls_are_refused_without_echoing_them() {
        for url in [
            "db:5432/wallet",
            "postgres://a,,b/w",
            "postgres://user:hunter2@a/w?target_session_attrs=standby",
        ] {
            let error = DatabaseHosts::parse(url).expect_err("refused");
            assert!(
                !error.contains("hunter2") && !error.contains("db:5432"),
                "{error}"
            );
        }
    }

    #[test]
    fn connections_older_than_the_last_move_are_left_behind() {
        let moves = PoolMoves::default();
        assert!(!moves.predates_last_move(Duration::from_secs(3600)));
        moves.moved_now();
        std::thread::sleep(Duration::from_millis(5));
        assert!(moves.predates_last_move(Duration::from_secs(1)));
        assert!(!moves.predates_last_move(Duration::ZERO));
    }
}
