//! A TCP proxy between the app and PostgreSQL that reads the frontend side
//! of the wire protocol and counts the query messages the app sends, and
//! that can cut every connection: proof that a request made no database
//! query, and a database that goes away mid-test. It can also lose one
//! answer: let a statement reach PostgreSQL and complete, then drop the
//! connection before the reply reaches the app, as a network failure at
//! the worst moment would.

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
    lose_reply: Arc<std::sync::Mutex<Option<Vec<u8>>>>,
}

impl CountingProxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let query_messages = Arc::new(AtomicU64::new(0));
        let refusing = Arc::new(AtomicBool::new(false));
        let cut = Arc::new(Notify::new());
        let lose_reply = Arc::new(std::sync::Mutex::new(None));
        let (counter, refuse, cut_all) = (query_messages.clone(), refusing.clone(), cut.clone());
        let armed = lose_reply.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if refuse.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                tokio::spawn(pipe(
                    client,
                    server,
                    counter.clone(),
                    cut_all.clone(),
                    armed.clone(),
                ));
            }
        });
        Self {
            port,
            query_messages,
            refusing,
            cut,
            lose_reply,
        }
    }

    /// Arms a one-shot fault: the next statement whose text contains
    /// `needle` runs to completion in PostgreSQL (its transaction commits,
    /// when it commits on its own), and then the connection is dropped
    /// before any of the reply is forwarded. The app cannot know whether it
    /// committed.
    pub fn lose_the_reply_to(&self, needle: &str) {
        *self.lose_reply.lock().expect("lock") = Some(needle.as_bytes().to_vec());
    }

    /// True once the armed fault has fired.
    pub fn reply_was_lost(&self) -> bool {
        self.lose_reply.lock().expect("lock").is_none()
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

async fn pipe(
    client: TcpStream,
    server: TcpStream,
    counter: Arc<AtomicU64>,
    cut: Arc<Notify>,
    lose_reply: Arc<std::sync::Mutex<Option<Vec<u8>>>>,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // Set once this connection has carried the armed statement.
    let doomed = Arc::new(AtomicBool::new(false));
    let upstream = async {
        let mut buffer = vec![0u8; 16 * 1024];
        let mut parser = FrontendParser::default();
        loop {
            let read = client_read.read(&mut buffer).await.unwrap_or(0);
            if read == 0 {
                break;
            }
            counter.fetch_add(parser.feed(&buffer[..read]), Ordering::SeqCst);
            {
                let mut armed = lose_reply.lock().expect("lock");
                let carries_it = armed
                    .as_deref()
                    .is_some_and(|needle| buffer[..read].windows(needle.len()).any(|w| w == needle));
                if carries_it {
                    *armed = None;
                    doomed.store(true, Ordering::SeqCst);
                }
            }
            if server_write.write_all(&buffer[..read]).await.is_err() {
                break;
            }
        }
    };
    let downstream = async {
        let mut buffer = vec![0u8; 16 * 1024];
        let mut replies = BackendParser::default();
        loop {
            let read = server_read.read(&mut buffer).await.unwrap_or(0);
            if read == 0 {
                break;
            }
            // The doomed statement's reply is complete once PostgreSQL says
            // the command completed and it is ready for the next query:
            // the implicit transaction has committed by then. Drop it all.
            if doomed.load(Ordering::SeqCst) && replies.feed(&buffer[..read]) {
                break;
            }
            if client_write.write_all(&buffer[..read]).await.is_err() {
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

/// Splits the backend byte stream into messages (type byte, length) and
/// reports when a CommandComplete has been followed by ReadyForQuery.
#[derive(Default)]
struct BackendParser {
    pending: Vec<u8>,
    command_completed: bool,
}

impl BackendParser {
    fn feed(&mut self, bytes: &[u8]) -> bool {
        self.pending.extend_from_slice(bytes);
        let mut ready_after_completion = false;
        while self.pending.len() >= 5 {
            let length = u32::from_be_bytes(self.pending[1..5].try_into().expect("four bytes")) as usize;
            if self.pending.len() < 1 + length {
                break;
            }
            match self.pending[0] {
                b'C' => self.command_completed = true,
                b'Z' if self.command_completed => ready_after_completion = true,
                _ => {}
            }
            self.pending.drain(..1 + length);
        }
        ready_after_completion
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
