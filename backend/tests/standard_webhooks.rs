//! Deposits signed with Standard Webhooks by the specification's own
//! Python library (`standardwebhooks` from PyPI), delivered to a real
//! server: each event is credited once however often it comes, a rotation
//! with several signatures is accepted, and every malformed, wrong or stale
//! signature is a 401 that stores nothing.

use std::process::{Command, Stdio};

use chrono::Utc;
use secrecy::SecretString;
use serde_json::{Value, json};
use wallet_testkit::python_tools::venv_program;
use wallet_testkit::*;

/// The deployment's Standard Webhooks secret (24 bytes, as Svix makes them).
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// A secret the deployment does not know.
const UNKNOWN_SECRET: &str = "whsec_dGhlLW90aGVyLWtleS10aGUtb3RoZXIta2V5LTEyMzQ=";

/// Signs each request with the reference library: `{"secrets": [...], "id",
/// "timestamp", "body"}` in, the `webhook-signature` value out, one
/// signature a secret, space-separated, as a sender rotating its secret
/// sends them.
const SIGNER: &str = r#"
import json, sys
from datetime import datetime, timezone
from standardwebhooks.webhooks import Webhook

out = []
for request in json.load(sys.stdin):
    at = datetime.fromtimestamp(request["timestamp"], tz=timezone.utc)
    out.append(" ".join(
        Webhook(secret).sign(request["id"], at, request["body"]) for secret in request["secrets"]))
print(json.dumps(out))
"#;

/// The `webhook-signature` values the library makes for `requests`.
fn sign_with_the_reference_library(requests: &[Value]) -> Vec<String> {
    let mut child = Command::new(venv_program("python"))
        .args(["-c", SIGNER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the protocol venv's python runs");
    let stdin = child.stdin.take().expect("stdin");
    serde_json::to_writer(stdin, requests).expect("the requests, written");
    let output = child.wait_with_output().expect("the signer ends");
    assert!(output.status.success(), "the signer failed");
    serde_json::from_slice(&output.stdout).expect("a JSON list of signatures")
}

/// One delivery as a Standard Webhooks sender makes it.
#[derive(Clone)]
struct Signed {
    body: String,
    id: String,
    timestamp: i64,
    signature: String,
}

impl Signed {
    fn send(&self, app: &TestApp) -> reqwest::RequestBuilder {
        app.client
            .post(app.url("/api/v1/webhooks/deposits"))
            .header("content-type", "application/json")
            .header("webhook-id", &self.id)
            .header("webhook-timestamp", self.timestamp.to_string())
            .header("webhook-signature", &self.signature)
            .body(self.body.clone())
    }
}

/// Signs `(event, webhook-id, seconds from now, secrets)` each.
fn signed(deliveries: &[(&Value, &str, i64, &[&str])]) -> Vec<Signed> {
    let now = Utc::now().timestamp();
    let requests: Vec<Value> = deliveries
        .iter()
        .map(|(event, id, offset_s, secrets)| {
            json!({"secrets": secrets, "id": id, "timestamp": now + offset_s, "body": event.to_string()})
        })
        .collect();
    sign_with_the_reference_library(&requests)
        .into_iter()
        .zip(deliveries)
        .map(|(signature, (event, id, offset_s, _))| Signed {
            body: event.to_string(),
            id: (*id).to_owned(),
            timestamp: now + offset_s,
            signature,
        })
        .collect()
}

fn with_standard_webhooks(settings: &mut layered_wallet::settings::Settings) {
    with_deposits(settings);
    settings
        .provider_webhook_secrets
        .push(SecretString::from(SECRET.to_owned()));
}

#[tokio::test]
async fn deliveries_signed_by_the_reference_library_are_credited_once_each() {
    let app = spawn_app(with_standard_webhooks).await;
    let alice = app.sign_up("alice").await;
    let events: Vec<(String, Value)> = (1..=4)
        .map(|n| {
            let id = new_event_id();
            let event = deposit_event(&id, alice.wallet_id, 1_000 * n);
            (id, event)
        })
        .collect();
    // Each event three times; the last in the middle of a rotation, signed
    // under an old secret and the current one. Within the tolerance, either way.
    let mut deliveries: Vec<(&Value, &str, i64, &[&str])> = Vec::new();
    for (id, event) in &events {
        for offset_s in [-240, 0, 240] {
            deliveries.push((event, id, offset_s, &[SECRET]));
        }
    }
    let (last_id, last_event) = &events[3];
    deliveries.push((last_event, last_id, 0, &[UNKNOWN_SECRET, SECRET]));
    for delivery in signed(&deliveries) {
        let response = delivery.send(&app).send().await.expect("sent");
        let status = response.status().as_u16();
        let body: Value = response.json().await.expect("JSON");
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["status"], "credited", "{body}");
        assert_eq!(body["event_id"], delivery.id.as_str());
    }
    assert_eq!(app.deposit_count().await, 4, "one credit per event");
    for (id, _) in &events {
        assert_eq!(app.inbox_verdict(id).await.as_deref(), Some("credited"));
    }
    assert_eq!(app.balance(alice.wallet_id).await, 100_000 + 10_000);
    app.assert_invariants().await;
}

#[tokio::test]
async fn every_malformed_wrong_or_stale_standard_webhook_is_401_and_stores_nothing() {
    let app = spawn_app(with_standard_webhooks).await;
    let alice = app.sign_up("alice").await;
    let before = app.snapshot().await;
    let id = new_event_id();
    let event = deposit_event(&id, alice.wallet_id, 1_000);
    let other_id = new_event_id();
    let [good, ahead, behind, unknown, other] = <[Signed; 5]>::try_from(signed(&[
        (&event, &id, 0, &[SECRET]),
        (&event, &id, 330, &[SECRET]),
        (&event, &id, -330, &[SECRET]),
        (&event, &id, 0, &[UNKNOWN_SECRET]),
        (&event, &other_id, 0, &[SECRET]),
    ]))
    .ok()
    .expect("five signed deliveries");
    let mut tampered = event.clone();
    tampered["amount_minor"] = 99_999.into();
    let refused = [
        ("signed further ahead than the tolerance", ahead.send(&app)),
        ("signed further back than the tolerance", behind.send(&app)),
        ("under a secret the deployment lacks", unknown.send(&app)),
        ("webhook-id other than the event id", other.send(&app)),
        ("another body", good.send(&app).body(tampered.to_string())),
        (
            "a signature that is not base64",
            Signed {
                signature: "v1,%%%".into(),
                ..good.clone()
            }
            .send(&app),
        ),
        (
            "no webhook-timestamp",
            app.client
                .post(app.url("/api/v1/webhooks/deposits"))
                .header("content-type", "application/json")
                .header("webhook-id", &id)
                .header("webhook-signature", &good.signature)
                .body(good.body.clone()),
        ),
        (
            "both schemes at once",
            good.send(&app).header("provider-signature", "t=1,v1=00"),
        ),
    ];
    for (what, delivery) in refused {
        let (status, problem) = problem(delivery.send().await.expect("sent")).await;
        assert_eq!(status, 401, "{what}: {problem}");
        assert_eq!(problem["type"], "/problems/provider-signature-invalid", "{what}");
        assert!(!problem.to_string().contains(SECRET), "{what}: the secret leaked");
    }
    assert_eq!(app.snapshot().await, before, "nothing was stored");
    assert_eq!(app.inbox_rows().await, 0);
    // The one good delivery still credits: nothing above spoiled it.
    let response = good.send(&app).send().await.expect("sent");
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(app.deposit_count().await, 1);
}
