//! A TCP proxy in front of a server that loses answers on purpose, the
//! fault a retrying client exists for: on the first `cuts` connections it
//! passes the request on whole, waits until the server has begun to
//! answer (so the request was decided), and then closes the client's side
//! without passing the answer on, or, started with `delaying`, holds the
//! answer back for a while before passing it on. Either way the client
//! gets no answer in time after its request was processed: an unknown
//! outcome.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The proxy; it stops when dropped with the test's runtime.
pub struct AnswerCutter {
    pub address: String,
    cuts_left: Arc<AtomicUsize>,
    answers_cut: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
}

impl AnswerCutter {
    /// A proxy to `upstream` (`http://host:port`) that cuts the answers of
    /// its first `cuts` connections.
    pub async fn start(upstream: &str, cuts: usize) -> Self {
        Self::starting(upstream, cuts, None).await
    }

    /// A proxy to `upstream` that holds back the answers of its first
    /// `count` connections for `delay`, then passes them on.
    pub async fn delaying(upstream: &str, count: usize, delay: std::time::Duration) -> Self {
        Self::starting(upstream, count, Some(delay)).await
    }

    async fn starting(upstream: &str, cuts: usize, delay: Option<std::time::Duration>) -> Self {
        let upstream = upstream.trim_start_matches("http://").to_owned();
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the answer cutter");
        let address = format!("http://{}", listener.local_addr().expect("address"));
        let cutter = Self {
            address,
            cuts_left: Arc::new(AtomicUsize::new(cuts)),
            answers_cut: Arc::new(AtomicUsize::new(0)),
            requests: Arc::new(AtomicUsize::new(0)),
        };
        let (cuts_left, answers_cut, requests) = (
            cutter.cuts_left.clone(),
            cutter.answers_cut.clone(),
            cutter.requests.clone(),
        );
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let cut = cuts_left
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| left.checked_sub(1))
                    .is_ok();
                let (answers_cut, requests) = (answers_cut.clone(), requests.clone());
                tokio::spawn(relay(client, server, cut.then_some(delay), answers_cut, requests));
            }
        });
        cutter
    }

    /// Answers the server gave that were cut, or held back.
    pub fn answers_cut(&self) -> usize {
        self.answers_cut.load(Ordering::SeqCst)
    }

    /// Requests that passed through, counted by their request lines.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// `fault`: `None` passes the answer on; `Some(None)` cuts it;
/// `Some(Some(delay))` holds it back for `delay` first.
async fn relay(
    client: TcpStream,
    server: TcpStream,
    fault: Option<Option<std::time::Duration>>,
    answers_cut: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
) {
    let (mut client_reads, mut client_writes) = client.into_split();
    let (mut server_reads, mut server_writes) = server.into_split();
    let upstream = tokio::spawn(async move {
        let mut buffer = vec![0u8; 16 * 1024];
        // The end of the last read, so that a request line split across
        // two reads is still counted once.
        let mut tail: Vec<u8> = Vec::new();
        loop {
            let read = match client_reads.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            };
            let mut seen = std::mem::take(&mut tail);
            seen.extend_from_slice(&buffer[..read]);
            let marker = b" HTTP/1.1\r\n";
            let lines = seen
                .windows(marker.len())
                .filter(|window| window == marker)
                .count();
            requests.fetch_add(lines, Ordering::SeqCst);
            tail = seen[seen.len().saturating_sub(marker.len() - 1)..].to_vec();
            if server_writes.write_all(&buffer[..read]).await.is_err() {
                break;
            }
        }
    });
    let mut buffer = vec![0u8; 16 * 1024];
    let mut held = false;
    loop {
        let read = match server_reads.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        match fault {
            // The server decided and began to answer: lose the answer.
            Some(None) => {
                answers_cut.fetch_add(1, Ordering::SeqCst);
                break;
            }
            Some(Some(delay)) if !held => {
                held = true;
                answers_cut.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
            }
            _ => {}
        }
        if client_writes.write_all(&buffer[..read]).await.is_err() {
            break;
        }
    }
    upstream.abort();
}
