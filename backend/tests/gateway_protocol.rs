//! Both sides of the bank gateway protocol held to its document,
//! `docs/gateway.openapi.yaml`: the wallet's requests (the dispatcher's
//! sendings and reconcile's look-ups) validate against it, and the gateway
//! simulator passes a schemathesis run against it with every check.

use std::path::PathBuf;
use std::process::Command;

use layered_wallet::payout::gateway::{GatewayAnswer, GatewayClient};
use wallet_testkit::gateway::{Gateway, wallet_sim_binary};
use wallet_testkit::python_tools::venv_program;
use wallet_testkit::*;

fn document() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/gateway.openapi.yaml")
}

/// Checks each recorded request (a JSON object a line) against the
/// document: its operation by method and path, its parameters and its body,
/// with the JSON Schema validator schemathesis itself uses. Prints each
/// failure, then how many requests were checked.
const VALIDATOR: &str = r#"
import json, re, sys
import jsonschema_rs, yaml

document = yaml.safe_load(open(sys.argv[1]))

def valid(schema, value):
    return jsonschema_rs.validator_for({**schema, "components": document["components"]}).is_valid(value)

def dereferenced(item):
    while "$ref" in item:
        target = document
        for part in item["$ref"].split("/")[1:]:
            target = target[part]
        item = target
    return item

def operation_of(request):
    for template, item in document["paths"].items():
        names = re.findall(r"\{(\w+)\}", template)
        pattern = re.sub(r"\\\{\w+\\\}", "([^/]+)", re.escape(template))
        match = re.fullmatch(pattern, request["path"])
        if match and request["method"].lower() in item:
            return item[request["method"].lower()], dict(zip(names, match.groups()))
    return None, {}

failures, checked = [], 0
for line in open(sys.argv[2]):
    request = json.loads(line)
    checked += 1
    said = f"{request['method']} {request['path']}"
    operation, path_values = operation_of(request)
    if operation is None:
        failures.append(f"{said} is no operation of the document")
        continue
    for parameter in map(dereferenced, operation.get("parameters", [])):
        if parameter["in"] == "path":
            value = path_values.get(parameter["name"])
        else:
            value = request["headers"].get(parameter["name"].lower())
        if value is None:
            if parameter.get("required"):
                failures.append(f"{said}: {parameter['name']} is missing")
        elif not valid(parameter["schema"], value):
            failures.append(f"{said}: {parameter['name']} {value!r} breaks its schema")
    if "requestBody" in operation:
        media = operation["requestBody"]["content"]
        content_type = (request["headers"].get("content-type") or "").split(";")[0].strip()
        if content_type not in media:
            failures.append(f"{said}: content type {content_type!r} is not in the document")
        elif not valid(media[content_type]["schema"], json.loads(request["body"])):
            failures.append(f"{said}: the body {request['body']} breaks its schema")
for failure in failures:
    print(failure)
print(f"checked {checked}")
"#;

#[tokio::test]
async fn the_wallets_requests_to_the_gateway_validate_against_the_protocol() {
    let scratch = tempfile_dir();
    let recorded = scratch.join("requests.jsonl");
    let recorded_arg = recorded.to_string_lossy().into_owned();
    let gateway = Gateway::start(&wallet_sim_binary(), &["--record-requests", &recorded_arg]).await;
    let app = spawn_app(with_payouts(&gateway.url)).await;
    let alice = app.sign_up("alice").await;
    let sent = app.pay_out(&alice, 2_500, "acct-42").await;
    assert_eq!(app.wait_for_payout(sent, &["settled"]).await, "settled");
    // Another person's: one person's payouts are spaced by the cooldown.
    let bob = app.sign_up("bob").await;
    let refused = app.pay_out(&bob, 1_000, "closed-7").await;
    assert_eq!(app.wait_for_payout(refused, &["failed"]).await, "failed");
    // Reconcile's look-ups, through the wallet's own client: a sent key, a
    // refused one, and one the gateway never received.
    let client = GatewayClient::new(&gateway.url, std::time::Duration::from_secs(5)).expect("a client");
    assert!(matches!(
        client.look_up(&sent.to_string()).await,
        GatewayAnswer::Sent { .. }
    ));
    assert_eq!(
        client.look_up(&refused.to_string()).await,
        GatewayAnswer::Refused {
            reason: "destination_refused: the destination account is closed".into()
        }
    );
    let never = uuid::Uuid::now_v7().to_string();
    assert_eq!(client.look_up(&never).await, GatewayAnswer::NeverReceived);
    let stored: String = sqlx::query_scalar("SELECT gateway_reference FROM payouts WHERE id = $1")
        .bind(sent)
        .fetch_one(&app.db)
        .await
        .expect("the payout");
    let sendings = wallet_sim::gateway::sendings_by_key(&gateway.db)
        .await
        .expect("the ledger");
    assert_eq!(
        sendings,
        vec![(sent.to_string(), 1)],
        "one sending, under the payout's key"
    );
    let id: String = sqlx::query_scalar("SELECT id::text FROM gateway_sent")
        .fetch_one(&gateway.db)
        .await
        .expect("the sending");
    assert_eq!(stored, id, "the 2xx body's id is the payout's gateway_reference");

    let output = Command::new(venv_program("python"))
        .args(["-c", VALIDATOR])
        .arg(document())
        .arg(&recorded)
        .output()
        .expect("the protocol venv's python runs");
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        report.trim(),
        "checked 5",
        "every request, and no failure:\n{report}"
    );
}

#[tokio::test]
async fn the_gateway_simulator_passes_schemathesis_against_the_protocol() {
    // A refusal for a closed account is a business answer no schema can
    // foresee: the prefix is one no schema-valid destination has, so any
    // 4xx to a schema-valid request is a real disagreement.
    let gateway = Gateway::start(&wallet_sim_binary(), &["--refuse-prefix", "closed/"]).await;
    let seed = rand::random::<u32>().to_string();
    println!("schemathesis seed {seed}");
    let output = Command::new(venv_program("st"))
        .arg("run")
        .arg(document())
        .args(["--url", &gateway.url, "--checks", "all", "--max-examples", "100"])
        .args(["--seed", &seed, "--no-color"])
        .output()
        .expect("schemathesis runs");
    assert!(
        output.status.success(),
        "the simulator broke the protocol (seed {seed}):\n{}",
        String::from_utf8_lossy(&output.stdout)
    );
    let sendings = wallet_sim::gateway::sendings_by_key(&gateway.db)
        .await
        .expect("the ledger");
    assert!(
        sendings.iter().all(|(_, count)| *count == 1),
        "a key sent twice: {sendings:?}"
    );
}

/// A directory of this test's own, under the system's temporary one.
fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gateway-protocol-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}
