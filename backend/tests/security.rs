//! What hostile or careless traffic can make the service hold, and what it
//! can reach: every resource an outsider touches has a bound.

use serde_json::{Value, json};
use wallet_testkit::*;

/// Series of the request-latency histogram in a `/metrics` text.
fn latency_series(metrics: &str) -> usize {
    metrics
        .lines()
        .filter(|line| line.starts_with("wallet_http_request_duration_seconds_count"))
        .count()
}

#[tokio::test]
async fn invented_methods_and_paths_mint_no_metric_series() {
    let app = spawn_app(|_| {}).await;
    let send = |method: String, path: String| {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method token");
        app.client.request(method, app.url(&path)).send()
    };
    // One of each kind first, so that the `other` and `unmatched` series
    // exist.
    send("BREW".into(), "/no-such-page".into()).await.expect("send");
    let before = latency_series(&app.metrics().await);

    for chunk in (0..1_000).collect::<Vec<_>>().chunks(100) {
        let requests = chunk.iter().map(|i| {
            let method = if i % 2 == 0 {
                format!("INVENTED{i}")
            } else {
                "X".repeat(3_000)
            };
            send(method, format!("/invented/{i}/{}", "p".repeat(i % 50)))
        });
        for response in futures::future::join_all(requests).await {
            assert_eq!(response.expect("send").status(), 404);
        }
    }

    let metrics = app.metrics().await;
    assert_eq!(
        latency_series(&metrics),
        before,
        "new series were minted:\n{metrics}"
    );
    assert!(metrics.contains(r#"method="other""#), "{metrics}");
    assert!(metrics.contains(r#"route="unmatched""#), "{metrics}");
    assert!(!metrics.contains("INVENTED"), "a client's method became a label");
    assert!(!metrics.contains("/invented/"), "a client's path became a label");
}

#[tokio::test]
async fn metrics_and_readiness_details_are_only_on_the_admin_listener() {
    let app = spawn_app(|_| {}).await;
    let public_metrics = app.client.get(app.url("/metrics")).send().await.expect("send");
    assert_eq!(public_metrics.status(), 404);
    let public_ready: Value = app.get_json("/readyz", None).await;
    assert_eq!(public_ready, json!({ "status": "ready" }));

    assert!(
        app.metrics()
            .await
            .contains("wallet_http_request_duration_seconds")
    );
    let (status, detailed) = app.admin_readiness().await;
    assert_eq!(status, 200);
    assert_eq!(detailed["postgres"], "ok");
    assert_eq!(detailed["mode"]["safe"], true);
    assert!(
        app.admin_address.starts_with("http://127.0.0.1:"),
        "the admin listener is on loopback in tests as by default"
    );
}
