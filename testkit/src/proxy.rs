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
    refusing: Arc<AtomicBool>,
    wire: Wire,
}

/// What every proxied connection shares with the proxy: its counters,
/// its faults and its log.
#[derive(Clone, Default)]
struct Wire {
    query_messages: Arc<AtomicU64>,
    round_trips: Arc<AtomicU64>,
    cut: Arc<Notify>,
    lose_reply: Arc<std::sync::Mutex<Option<ReplyFault>>>,
    replies_lost: Arc<AtomicU64>,
    /// The text of every statement run through the proxy since a test
    /// asked (`record_statements`), in order; `None` until then, so that
    /// long storms through the proxy keep nothing.
    statements_run: Arc<std::sync::Mutex<Option<Vec<String>>>>,
}

/// Which statement's reply to lose, and whether to go on losing them.
struct ReplyFault {
    /// Any of these in a statement's text.
    needles: Vec<Vec<u8>>,
    every_time: bool,
}

impl CountingProxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), upstream).await
    }

    /// As `start`, listening on `listen` (the benchmark's fixed port).
    pub async fn start_on(listen: SocketAddr, upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind(listen).await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let refusing = Arc::new(AtomicBool::new(false));
        let wire = Wire::default();
        let (refuse, shared) = (refusing.clone(), wire.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if refuse.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                tokio::spawn(pipe(client, server, shared.clone()));
            }
        });
        Self { port, refusing, wire }
    }

    /// The text of every statement the app has run since
    /// `record_statements` (a simple query, or the Bind of a prepared one),
    /// in the order the proxy saw them.
    pub fn statements_run(&self) -> Vec<String> {
        self.wire
            .statements_run
            .lock()
            .expect("lock")
            .clone()
            .unwrap_or_default()
    }

    /// Records the statements run from now on, forgetting any recorded
    /// before.
    pub fn record_statements(&self) {
        *self.wire.statements_run.lock().expect("lock") = Some(Vec::new());
    }

    /// Arms a one-shot fault: the next statement whose text contains
    /// `needle` runs to completion in PostgreSQL (its transaction commits,
    /// when it commits on its own), and then the connection is dropped
    /// before any of the reply is forwarded. The app cannot know whether it
    /// committed.
    pub fn lose_the_reply_to(&self, needle: &str) {
        self.arm(&[needle], false);
    }

    /// Like `lose_the_reply_to`, for every statement that contains any of
    /// `needles`, until `stop_losing_replies`.
    pub fn keep_losing_replies_to(&self, needles: &[&str]) {
        self.arm(needles, true);
    }

    pub fn stop_losing_replies(&self) {
        *self.wire.lose_reply.lock().expect("lock") = None;
    }

    fn arm(&self, needles: &[&str], every_time: bool) {
        *self.wire.lose_reply.lock().expect("lock") = Some(ReplyFault {
            needles: needles.iter().map(|needle| needle.as_bytes().to_vec()).collect(),
            every_time,
        });
    }

    /// True once an armed fault has fired.
    pub fn reply_was_lost(&self) -> bool {
        self.replies_lost() > 0
    }

    /// How many replies were dropped after their statement completed.
    pub fn replies_lost(&self) -> u64 {
        self.wire.replies_lost.load(Ordering::SeqCst)
    }

    /// Query-carrying messages (simple query, parse, bind, execute,
    /// function call) the app has sent to PostgreSQL so far. Connection
    /// start-up, sync and terminate messages do not count.
    pub fn query_messages(&self) -> u64 {
        self.wire.query_messages.load(Ordering::SeqCst)
    }

    /// Round trips the app has made to PostgreSQL so far: messages after
    /// which it waits for PostgreSQL to be ready again (a simple query, or
    /// the Sync that ends an extended-protocol exchange; sqlx's liveness
    /// ping is a Sync alone).
    pub fn round_trips(&self) -> u64 {
        self.wire.round_trips.load(Ordering::SeqCst)
    }

    /// Drops every open connection and refuses new ones: PostgreSQL is gone.
    pub fn go_down(&self) {
        self.refusing.store(true, Ordering::SeqCst);
        self.wire.cut.notify_waiters();
    }

    /// Accepts connections again after `go_down`.
    pub fn come_back_up(&self) {
        self.refusing.store(false, Ordering::SeqCst);
    }

    /// Drops every open connection, mid-statement or idle, and goes on
    /// accepting new ones: a network blip, or a firewall forgetting flows.
    pub fn cut_connections(&self) {
        self.wire.cut.notify_waiters();
    }
}

async fn pipe(client: TcpStream, server: TcpStream, wire: Wire) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // Set once this connection has carried the armed statement.
    let doomed = Arc::new(AtomicBool::new(false));
    let upstream = async {
        let mut buffer = vec![0u8; 16 * 1024];
        let mut parser = FrontendParser::default();
        let mut statements = Statements::default();
        loop {
            let read = client_read.read(&mut buffer).await.unwrap_or(0);
            if read == 0 {
                break;
            }
            let messages = parser.feed(&buffer[..read]);
            wire.query_messages.fetch_add(
                messages.iter().filter(|m| b"QPBEF".contains(&m.kind)).count() as u64,
                Ordering::SeqCst,
            );
            wire.round_trips.fetch_add(
                messages.iter().filter(|m| b"QS".contains(&m.kind)).count() as u64,
                Ordering::SeqCst,
            );
            {
                let mut armed = wire.lose_reply.lock().expect("lock");
                let mut carries_it = false;
                for message in &messages {
                    let executes = statements.note(message);
                    if let (Some(text), Some(log)) =
                        (&executes, wire.statements_run.lock().expect("lock").as_mut())
                    {
                        log.push(String::from_utf8_lossy(text).trim_end_matches('\0').to_owned());
                    }
                    carries_it |= armed.as_ref().zip(executes).is_some_and(|(fault, text)| {
                        fault
                            .needles
                            .iter()
                            .any(|needle| text.windows(needle.len()).any(|w| w == needle.as_slice()))
                    });
                }
                if carries_it {
                    if armed.as_ref().is_some_and(|fault| !fault.every_time) {
                        *armed = None;
                    }
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
                wire.replies_lost.fetch_add(1, Ordering::SeqCst);
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
        _ = wire.cut.notified() => {}
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

struct FrontendMessage {
    /// The type byte; 0 for the start-up packet.
    kind: u8,
    body: Vec<u8>,
}

impl FrontendParser {
    /// Consumes bytes and returns the messages they completed.
    fn feed(&mut self, bytes: &[u8]) -> Vec<FrontendMessage> {
        self.pending.extend_from_slice(bytes);
        let mut messages = Vec::new();
        loop {
            let header = if self.started { 5 } else { 4 };
            if self.pending.len() < header {
                return messages;
            }
            let length_at = header - 4;
            let length =
                u32::from_be_bytes(self.pending[length_at..header].try_into().expect("four bytes")) as usize;
            let total = length_at + length;
            if self.pending.len() < total {
                return messages;
            }
            let body = self.pending[header..total].to_vec();
            // An SSLRequest or GSSENCRequest comes before the start-up
            // packet and, like it, has no type byte.
            let negotiation = !self.started
                && body.len() == 4
                && matches!(
                    u32::from_be_bytes(body[..4].try_into().expect("four bytes")),
                    80_877_103 | 80_877_104
                );
            messages.push(FrontendMessage {
                kind: if self.started { self.pending[0] } else { 0 },
                body,
            });
            self.started = !negotiation;
            self.pending.drain(..total);
        }
    }
}

/// The text of every statement a connection has prepared, by name, so
/// that a Bind of a cached statement (which carries only its name) can be
/// recognised as well as a simple query carrying its text.
#[derive(Default)]
struct Statements {
    by_name: std::collections::HashMap<Vec<u8>, Vec<u8>>,
}

impl Statements {
    /// Remembers prepared statements; returns the text a message runs, for
    /// a simple query or a Bind.
    fn note(&mut self, message: &FrontendMessage) -> Option<Vec<u8>> {
        let mut fields = message.body.split(|&byte| byte == 0);
        match message.kind {
            b'Q' => Some(message.body.clone()),
            b'P' => {
                let name = fields.next()?.to_vec();
                let text = fields.next()?.to_vec();
                self.by_name.insert(name, text);
                None
            }
            b'B' => {
                let _portal = fields.next()?;
                let statement = fields.next()?;
                self.by_name.get(statement).cloned()
            }
            _ => None,
        }
    }
}
