//! Counts the PostgreSQL round trips a server makes, on the wire: a TCP
//! proxy between the server and PostgreSQL that reads the messages the
//! server sends and forwards every byte untouched.
//!
//! A round trip is a message after which the client waits for the server's
//! `ReadyForQuery`: a `Sync` (which ends an extended-protocol exchange, and
//! is all a connection check sends) or a simple `Query`. PostgreSQL's own
//! statistics cannot show these: a check runs no statement, and
//! `pg_stat_database` counts transactions, not exchanges.
//!
//! The counts are served as JSON on a second address, to any request:
//! `curl http://STATS/`. Run the server with `sslmode=disable` through the
//! proxy, so that the messages can be read.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(clap::Args)]
pub struct WireArgs {
    /// Where the server connects instead of PostgreSQL.
    #[arg(long)]
    pub listen: SocketAddr,
    /// PostgreSQL's address, host:port.
    #[arg(long)]
    pub upstream: String,
    /// Where the counts are served as JSON.
    #[arg(long)]
    pub stats_listen: SocketAddr,
}

/// What the clients sent, summed over every connection.
#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    syncs: AtomicU64,
    simple_queries: AtomicU64,
    parses: AtomicU64,
    executes: AtomicU64,
}

/// The counts as served.
#[derive(Debug, Serialize, serde::Deserialize, Default, Clone, Copy, PartialEq, Eq)]
pub struct WireCounts {
    pub connections: u64,
    /// Syncs plus simple queries: each waits for the server.
    pub round_trips: u64,
    pub syncs: u64,
    pub simple_queries: u64,
    /// Statements prepared (`Parse`): a cached statement sends none.
    pub parses: u64,
    pub executes: u64,
}

impl Counters {
    fn snapshot(&self) -> WireCounts {
        let syncs = self.syncs.load(Ordering::Relaxed);
        let simple_queries = self.simple_queries.load(Ordering::Relaxed);
        WireCounts {
            connections: self.connections.load(Ordering::Relaxed),
            round_trips: syncs + simple_queries,
            syncs,
            simple_queries,
            parses: self.parses.load(Ordering::Relaxed),
            executes: self.executes.load(Ordering::Relaxed),
        }
    }

    fn count(&self, message_type: u8) {
        let counter = match message_type {
            b'S' => &self.syncs,
            b'Q' => &self.simple_queries,
            b'P' => &self.parses,
            b'E' => &self.executes,
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs the proxy until the process is stopped.
pub async fn serve(args: &WireArgs) -> anyhow::Result<()> {
    let proxy = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let stats = TcpListener::bind(args.stats_listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.stats_listen))?;
    let counters = Arc::new(Counters::default());
    eprintln!(
        "pg-wire: {} -> {}, counts at http://{}/",
        args.listen, args.upstream, args.stats_listen
    );
    tokio::spawn(serve_counts(stats, counters.clone()));
    loop {
        let (client, _) = proxy.accept().await?;
        let upstream = args.upstream.clone();
        let counters = counters.clone();
        tokio::spawn(async move {
            if let Err(error) = relay(client, &upstream, &counters).await {
                eprintln!("pg-wire: a connection ended: {error:#}");
            }
        });
    }
}

async fn serve_counts(listener: TcpListener, counters: Arc<Counters>) {
    while let Ok((mut stream, _)) = listener.accept().await {
        let body = serde_json::to_string(&counters.snapshot()).unwrap_or_default();
        let mut request = [0u8; 1024];
        // The request itself does not matter; read what came so that the
        // client is not reset before it reads the answer.
        let _ = stream.read(&mut request).await;
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(answer.as_bytes()).await;
    }
}

/// Reads the samples served at `url`.
pub async fn counts(url: &str) -> anyhow::Result<WireCounts> {
    reqwest::get(url)
        .await
        .with_context(|| format!("cannot reach the wire counter at {url}"))?
        .json()
        .await
        .context("the wire counter's answer is not its JSON")
}

async fn relay(client: TcpStream, upstream: &str, counters: &Counters) -> anyhow::Result<()> {
    let server = TcpStream::connect(upstream)
        .await
        .with_context(|| format!("cannot reach PostgreSQL at {upstream}"))?;
    counters.connections.fetch_add(1, Ordering::Relaxed);
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let to_server = async {
        let mut reader = MessageReader::default();
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let read = client_read.read(&mut buffer).await?;
            if read == 0 {
                break;
            }
            reader.feed(&buffer[..read], |message_type| counters.count(message_type));
            server_write.write_all(&buffer[..read]).await?;
        }
        server_write.shutdown().await
    };
    let to_client = async {
        tokio::io::copy(&mut server_read, &mut client_write).await?;
        client_write.shutdown().await
    };
    tokio::try_join!(to_server, to_client)?;
    Ok(())
}

/// Splits the client's byte stream into messages. The first message (and
/// an `SSLRequest` before it) has no type byte; every later one is a type
/// byte, then a length that counts itself.
#[derive(Default)]
struct MessageReader {
    started: bool,
    /// The current message's header bytes read so far (at most 5).
    header: Vec<u8>,
    /// Body bytes of the current message still to skip.
    remaining: usize,
}

/// The code an `SSLRequest` or `GSSENCRequest` carries instead of a
/// protocol version; the real start-up message follows it.
const ENCRYPTION_REQUEST_CODES: [u32; 2] = [80_877_103, 80_877_104];

impl MessageReader {
    fn feed(&mut self, mut bytes: &[u8], mut on_message: impl FnMut(u8)) {
        while !bytes.is_empty() {
            if self.remaining > 0 {
                let skipped = self.remaining.min(bytes.len());
                self.remaining -= skipped;
                bytes = &bytes[skipped..];
                continue;
            }
            let header_len = if self.started { 5 } else { 8 };
            let wanted = header_len - self.header.len();
            let taken = wanted.min(bytes.len());
            self.header.extend_from_slice(&bytes[..taken]);
            bytes = &bytes[taken..];
            if self.header.len() < header_len {
                continue;
            }
            if self.started {
                let length =
                    u32::from_be_bytes([self.header[1], self.header[2], self.header[3], self.header[4]]);
                on_message(self.header[0]);
                self.remaining = (length as usize).saturating_sub(4);
            } else {
                let length =
                    u32::from_be_bytes([self.header[0], self.header[1], self.header[2], self.header[3]]);
                let code =
                    u32::from_be_bytes([self.header[4], self.header[5], self.header[6], self.header[7]]);
                self.started = !ENCRYPTION_REQUEST_CODES.contains(&code);
                self.remaining = (length as usize).saturating_sub(8);
            }
            self.header.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::MessageReader;

    fn message(message_type: u8, body: &[u8]) -> Vec<u8> {
        let mut bytes = vec![message_type];
        bytes.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        bytes.extend_from_slice(body);
        bytes
    }

    #[test]
    fn messages_are_found_however_the_stream_is_cut() {
        let mut stream = Vec::new();
        // SSLRequest, then a start-up message of 16 bytes.
        stream.extend_from_slice(&8u32.to_be_bytes());
        stream.extend_from_slice(&80_877_103u32.to_be_bytes());
        stream.extend_from_slice(&16u32.to_be_bytes());
        stream.extend_from_slice(&196_608u32.to_be_bytes());
        stream.extend_from_slice(b"user\0pg\0");
        for (message_type, body) in [
            (b'P', &b"stmt\0SELECT 1\0\0\0"[..]),
            (b'B', b"xx"),
            (b'E', b"\0\0\0\0\0"),
            (b'S', b""),
        ] {
            stream.extend(message(message_type, body));
        }
        stream.extend(message(b'S', b""));
        stream.extend(message(b'Q', b"SELECT 1\0"));
        for cut in [1, 2, 3, 7, stream.len()] {
            let mut reader = MessageReader::default();
            let mut seen = Vec::new();
            for chunk in stream.chunks(cut) {
                reader.feed(chunk, |message_type| seen.push(message_type));
            }
            assert_eq!(seen, b"PBESSQ", "cut every {cut} bytes");
        }
    }
}
