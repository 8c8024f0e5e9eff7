//! A TCP proxy between the app and PostgreSQL that reads the frontend side
//! of the wire protocol and counts the query messages the app sends, and
//! that can cut every connection: proof that a request made no database
//! query, and a database that goes away mid-test.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

pub struct CountingProxy {
    pub port: u16,
    query_messages: Arc<AtomicU64>,
    refusing: Arc<AtomicBool>,
    cut: Arc<Notify>,
}

impl CountingProxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let query_messages = Arc::new(AtomicU64::new(0));
        let refusing = Arc::new(AtomicBool::new(false));
        let cut = Arc::new(Notify::new());
        let (counter, refuse, cut_all) = (query_messages.clone(), refusing.clone(), cut.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if refuse.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                tokio::spawn(pipe(client, server, counter.clone(), cut_all.clone()));
            }
        });
        Self {
            port,
            query_messages,
            refusing,
            cut,
        }
    }

    /// Query-carrying messages (simple query, parse, bind, execute,
    /// function call) the app has sent to PostgreSQL so far. Connection
    /// start-up, sync and terminate messages do not count.
    pub fn query_messages(&self) -> u64 {
        self.query_messages.load(Ordering::SeqCst)
    }

    /// Drops every open connection and refuses new ones: PostgreSQL is gone.
    pub fn go_down(&self) {
        self.refusing.store(true, Ordering::SeqCst);
        self.cut.notify_waiters();
    }
}

async fn pipe(client: TcpStream, server: TcpStream, counter: Arc<AtomicU64>, cut: Arc<Notify>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = async {
        let mut buffer = vec![0u8; 16 * 1024];
        let mut parser = FrontendParser::default();
        loop {
            let read = client_read.read(&mut buffer).await.unwrap_or(0);
            if read == 0 {
                break;
            }
            counter.fetch_add(parser.feed(&buffer[..read]), Ordering::SeqCst);
            if server_write.write_all(&buffer[..read]).await.is_err() {
                break;
            }
        }
    };
    let downstream = async {
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            let read = server_read.read(&mut buffer).await.unwrap_or(0);
            if read == 0 || client_write.write_all(&buffer[..read]).await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
        _ = cut.notified() => {}
    }
}

/// Splits the frontend byte stream into messages. The first message (the
/// start-up packet) has no type byte; every later one is a type byte and a
/// big-endian length that counts itself.
#[derive(Default)]
struct FrontendParser {
    pending: Vec<u8>,
    started: bool,
}

impl FrontendParser {
    /// Consumes bytes and returns how many query messages they completed.
    fn feed(&mut self, bytes: &[u8]) -> u64 {
        self.pending.extend_from_slice(bytes);
        let mut queries = 0;
        loop {
            let header = if self.started { 5 } else { 4 };
            if self.pending.len() < header {
                return queries;
            }
            let length_at = header - 4;
            let length =
                u32::from_be_bytes(self.pending[length_at..header].try_into().expect("four bytes")) as usize;
            let total = length_at + length;
            if self.pending.len() < total {
                return queries;
            }
            if self.started && b"QPBEF".contains(&self.pending[0]) {
                queries += 1;
            }
            self.started = true;
            self.pending.drain(..total);
        }
    }
}
