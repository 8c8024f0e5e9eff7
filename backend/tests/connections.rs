//! What a connection may hold: a request head must arrive whole within
//! `http_request_head_wait_ms_max`, its body within
//! `http_request_body_wait_ms_max` after it, and an idle keep-alive
//! connection is closed after `http_keep_alive_s`.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use wallet_testkit::*;

/// Longest any of these waits for the server to close a connection: far
/// above the bounds the tests set (300 ms, 1 s), and under the defaults
/// (5 s), so that a setting not applied fails the test.
const CLOSE_WAIT_S_MAX: u64 = 3;

/// A whole request head, ended by its blank line; and one without it.
const HEALTHZ_REQUEST: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";
const HALF_A_HEAD: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n";
/// A sign-up's head and a sign-in form's, each announcing a body of 64
/// bytes.
const SIGN_UP_HEAD: &[u8] =
    b"POST /api/v1/users HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 64\r\n\r\n";
const SIGN_IN_FORM_HEAD: &[u8] = b"POST /signin HTTP/1.1\r\nHost: localhost\r\n\
    Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 64\r\n\r\n";

#[tokio::test]
async fn a_request_head_that_trickles_in_is_answered_408_and_the_connection_closed() {
    let app = spawn_app(|settings| settings.http_request_head_wait_ms_max = 300).await;
    let mut stream = connect(&app).await;
    // Half a head, and then nothing: the connection would be held forever.
    send(&mut stream, HALF_A_HEAD).await;
    let answer = read_until_closed(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
}

#[tokio::test]
async fn a_request_body_that_trickles_in_is_answered_408_and_the_connection_closed() {
    let app = spawn_app(|settings| settings.http_request_body_wait_ms_max = 500).await;
    // An API call and a browser's form: each says why, in its own terms.
    for (head, says) in [
        (SIGN_UP_HEAD, "/problems/body-too-slow"),
        (SIGN_IN_FORM_HEAD, "took too long to arrive"),
    ] {
        let mut stream = connect(&app).await;
        send(&mut stream, head).await;
        // A few bytes of the body, one at a time, and then nothing more: at
        // a byte a second, the body would hold the connection for minutes.
        for byte in b"name" {
            send(&mut stream, &[*byte]).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let answer = read_until_closed(&mut stream).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains(says), "{answer}");
    }
    assert_eq!(
        app.count("SELECT count(*) FROM users").await,
        0,
        "nothing was changed"
    );
}

#[tokio::test]
async fn with_keep_alive_off_each_connection_closes_after_its_response() {
    let app = spawn_app(|settings| settings.http_keep_alive_s = 0).await;
    let mut stream = connect(&app).await;
    send(&mut stream, HEALTHZ_REQUEST).await;
    let answer = read_until_closed(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "the response says the connection closes: {answer}"
    );
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_by_the_server() {
    let app = spawn_app(|settings| settings.http_keep_alive_s = 1).await;
    let mut stream = connect(&app).await;
    // Two requests on one connection: it is kept alive between them...
    for _ in 0..2 {
        send(&mut stream, HEALTHZ_REQUEST).await;
        let mut buffer = [0u8; 4096];
        let read = stream.read(&mut buffer).await.expect("read");
        assert!(buffer[..read].starts_with(b"HTTP/1.1 200"));
    }
    // ...and closed by the server once idle.
    let rest = read_until_closed(&mut stream).await;
    assert!(rest.is_empty(), "nothing more was sent: {rest}");
}

async fn send(stream: &mut TcpStream, bytes: &[u8]) {
    stream.write_all(bytes).await.expect("write");
}

async fn connect(app: &TestApp) -> TcpStream {
    TcpStream::connect(("127.0.0.1", app.port()))
        .await
        .expect("connect")
}

/// Everything the server sends until it closes the connection; fails if
/// it keeps it open past `CLOSE_WAIT_S_MAX`.
async fn read_until_closed(stream: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    tokio::time::timeout(
        Duration::from_secs(CLOSE_WAIT_S_MAX),
        stream.read_to_end(&mut answer),
    )
    .await
    .expect("the server closed the connection")
    .expect("read");
    String::from_utf8_lossy(&answer).into_owned()
}
