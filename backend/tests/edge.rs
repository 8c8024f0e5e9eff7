//! What a client at the edge can and cannot tell the service about itself:
//! not its address through the shipped nginx, and not that it came over
//! HTTPS.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use wallet_testkit::nginx::Nginx;
use wallet_testkit::*;

/// The shipped nginx site, as deployments run it.
const NGINX_SITE: &str = include_str!("../../deploy/nginx/wallet.conf");

/// The cookie a browser's first page sets, with a client's claim that it
/// came over HTTPS.
async fn first_cookie(app: &TestApp) -> String {
    let response = app
        .client
        .get(app.url("/signin"))
        .header("X-Forwarded-Proto", "https")
        .header("Forwarded", "proto=https")
        .send()
        .await
        .expect("the sign-in page");
    assert_eq!(response.status(), 200);
    response
        .headers()
        .get("set-cookie")
        .and_then(|value| value.to_str().ok())
        .expect("the pre-session cookie")
        .to_owned()
}

#[tokio::test]
async fn a_clients_forwarded_proto_does_not_make_cookies_secure() {
    let app = spawn_app(|_| {}).await;
    let cookie = first_cookie(&app).await;
    assert!(!cookie.contains("Secure"), "{cookie}");
}

#[tokio::test]
async fn cookies_are_secure_when_the_deployment_says_so() {
    let app = spawn_app(|settings| settings.cookies_secure = true).await;
    let cookie = first_cookie(&app).await;
    assert!(cookie.contains("; Secure"), "{cookie}");
}

#[test]
fn every_nginx_location_sets_the_forwarding_headers() {
    let locations: Vec<&str> = NGINX_SITE.split("\n    location ").skip(1).collect();
    assert!(locations.len() >= 2, "{NGINX_SITE}");
    for location in locations {
        let path = location.split_whitespace().next().unwrap_or_default();
        for header in [
            "proxy_set_header Host $http_host;",
            "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;",
            "proxy_set_header X-Forwarded-Proto $scheme;",
        ] {
            assert!(location.contains(header), "location {path} lacks {header}");
        }
    }
}

/// A client that connects from 127.0.0.2 and writes its own
/// `X-Forwarded-For` still counts as 127.0.0.2 on the live-stream
/// location: its second stream is over the cap of one per address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_nginx_a_clients_own_forwarded_for_does_not_lift_the_live_stream_cap() {
    let app = spawn_app(|settings| {
        settings.trusted_proxies = vec!["127.0.0.1".into()];
        settings.decision_streams_per_address_max = 1;
    })
    .await;
    let alice = app.sign_up("alice").await;
    let nginx = Nginx::start(&[app.port()]).await;
    let client = reqwest::Client::builder()
        .local_address(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)))
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let open = |claimed: &'static str| {
        client
            .get(format!("{}/api/v1/decisions/stream", nginx.url()))
            .bearer_auth(&alice.token)
            .header("X-Forwarded-For", claimed)
            .send()
    };
    let first = open("203.0.113.1").await.expect("the first stream");
    assert_eq!(first.status(), 200);
    let second = open("203.0.113.2").await.expect("the second stream");
    let (status, body) = problem(second).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["type"], "/problems/too-many-streams", "{body}");
    drop(first);
}
