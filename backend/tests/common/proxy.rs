//! A TCP proxy between the app and PostgreSQL that counts the bytes the app
//! sends and can cut every connection: proof that a request made no
//! database query, and a database that goes away mid-test.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

pub struct CountingProxy {
    pub port: u16,
    bytes_to_upstream: Arc<AtomicU64>,
    refusing: Arc<AtomicBool>,
    cut: Arc<Notify>,
}

impl CountingProxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let bytes_to_upstream = Arc::new(AtomicU64::new(0));
        let refusing = Arc::new(AtomicBool::new(false));
        let cut = Arc::new(Notify::new());
        let (counter, refuse, cut_all) = (bytes_to_upstream.clone(), refusing.clone(), cut.clone());
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
            bytes_to_upstream,
            refusing,
            cut,
        }
    }

    /// Bytes the app has sent to PostgreSQL so far.
    pub fn bytes_to_upstream(&self) -> u64 {
        self.bytes_to_upstream.load(Ordering::SeqCst)
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
        loop {
            let read = client_read.read(&mut buffer).await.unwrap_or(0);
            if read == 0 {
                break;
            }
            counter.fetch_add(read as u64, Ordering::SeqCst);
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
