//! Counts the PostgreSQL round trips a server makes, on the wire: the test
//! kit's counting proxy, standing between a running server and PostgreSQL,
//! with its counts served as JSON.
//!
//! A round trip is a message after which the client waits for PostgreSQL to
//! be ready again: a `Sync` (which ends an extended-protocol exchange, and is
//! all sqlx's connection check sends) or a simple `Query`. PostgreSQL's own
//! statistics cannot show these: a check runs no statement, and
//! `pg_stat_database` counts transactions, not exchanges.
//!
//! `curl http://STATS/` answers the counts, whatever the request. Run the
//! server through the proxy with `sslmode=disable`, so that the messages can
//! be read.

use std::net::SocketAddr;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use wallet_testkit::proxy::CountingProxy;

#[derive(clap::Args)]
pub struct WireArgs {
    /// Where the server connects instead of PostgreSQL.
    #[arg(long)]
    pub listen: SocketAddr,
    /// PostgreSQL's address, host:port.
    #[arg(long)]
    pub upstream: SocketAddr,
    /// Where the counts are served as JSON.
    #[arg(long)]
    pub stats_listen: SocketAddr,
}

/// The counts as served.
#[derive(Debug, Serialize, Deserialize, Default, Clone, Copy, PartialEq, Eq)]
pub struct WireCounts {
    /// Syncs plus simple queries: each waits for PostgreSQL.
    pub round_trips: u64,
    /// Messages that carry or run a statement (simple query, parse, bind,
    /// execute, function call): a cached statement is a bind and an execute.
    pub query_messages: u64,
}

impl WireCounts {
    /// What was counted between `before` and these counts.
    pub fn since(&self, before: &WireCounts) -> WireCounts {
        WireCounts {
            round_trips: self.round_trips.saturating_sub(before.round_trips),
            query_messages: self.query_messages.saturating_sub(before.query_messages),
        }
    }
}

/// Runs the proxy until the process is stopped.
pub async fn serve(args: &WireArgs) -> anyhow::Result<()> {
    let stats = TcpListener::bind(args.stats_listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.stats_listen))?;
    let proxy = CountingProxy::start_on(args.listen, args.upstream).await;
    eprintln!(
        "pg-wire: {} -> {}, counts at http://{}/",
        args.listen, args.upstream, args.stats_listen
    );
    loop {
        let (mut stream, _) = stats.accept().await?;
        let counts = WireCounts {
            round_trips: proxy.round_trips(),
            query_messages: proxy.query_messages(),
        };
        let body = serde_json::to_string(&counts)?;
        // The request itself does not matter; read what came, so that the
        // client is not reset before it reads the answer.
        let mut request = [0u8; 1024];
        let _ = stream.read(&mut request).await;
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(answer.as_bytes()).await;
    }
}

/// Reads the counts served at `url`.
pub async fn counts(url: &str) -> anyhow::Result<WireCounts> {
    reqwest::get(url)
        .await
        .with_context(|| format!("cannot reach the wire counter at {url}"))?
        .json()
        .await
        .context("the wire counter's answer is not its JSON")
}
