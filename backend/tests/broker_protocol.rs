//! The broker protocol held to its document, `docs/broker.asyncapi.yaml`:
//! the document is a valid AsyncAPI 3.0 document (checked against the
//! specification's own JSON Schema, npm `@asyncapi/specs`), and commands
//! published and results and dead letters read with only what it says
//! (stream names, the consumer group, field names) come out as it says,
//! with the database agreeing.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::Command;

use layered_wallet::domain::WalletId;
use serde_json::Value;
use uuid::Uuid;
use wallet_testkit::python_tools::venv_program;
use wallet_testkit::*;

/// The specification's JSON Schemas, as its own tools ship them.
const ASYNCAPI_SPECS: &str = "@asyncapi/specs@6.11.1";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The AsyncAPI 3.0.0 JSON Schema, installed pinned under `.tmp/`.
fn asyncapi_schema() -> PathBuf {
    let prefix = repo().join(".tmp/asyncapi-specs");
    std::fs::create_dir_all(&prefix).expect("creating .tmp/asyncapi-specs");
    let script = r#"
        set -e
        if [ "$(cat "$PREFIX/installed" 2>/dev/null)" = "$WANTED" ]; then exit 0; fi
        npm install --prefix "$PREFIX" --silent --no-audit --no-fund "$WANTED"
        printf '%s' "$WANTED" > "$PREFIX/installed"
    "#;
    let status = Command::new("flock")
        .arg(prefix.join("install.lock"))
        .args(["sh", "-c", script])
        .env("PREFIX", &prefix)
        .env("WANTED", ASYNCAPI_SPECS)
        .status()
        .expect("flock and sh run");
    assert!(
        status.success(),
        "installing {ASYNCAPI_SPECS} failed: npm (Node.js) must be installed: apt-get install nodejs npm"
    );
    prefix.join("node_modules/@asyncapi/specs/schemas/3.0.0-without-$id.json")
}

/// Reads the YAML document as JSON, after checking it against the AsyncAPI
/// 3.0.0 schema (PyYAML and jsonschema_rs, from the tests' Python tools).
const READER: &str = r#"
import json, sys
import jsonschema_rs, yaml
document = yaml.safe_load(open(sys.argv[1]))
errors = [f"{e.instance_path}: {e.message}" for e in jsonschema_rs.validator_for(json.load(open(sys.argv[2]))).iter_errors(document)]
if errors:
    sys.exit("not a valid AsyncAPI 3.0 document:\n" + "\n".join(errors))
print(json.dumps(document))
"#;

/// The broker protocol's document, as the test reads every name from it.
struct Protocol(Value);

impl Protocol {
    fn read() -> Self {
        let schema = asyncapi_schema();
        let output = Command::new(venv_program("python"))
            .args(["-c", READER])
            .arg(repo().join("docs/broker.asyncapi.yaml"))
            .arg(schema)
            .output()
            .expect("the tests' Python runs");
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{said}");
        Self(serde_json::from_slice(&output.stdout).expect("the document as JSON"))
    }

    /// Follows a local `$ref` (`#/a/b`), as many times as it takes.
    fn resolved<'a>(&'a self, mut item: &'a Value) -> &'a Value {
        while let Some(reference) = item["$ref"].as_str() {
            item = self
                .0
                .pointer(reference.trim_start_matches('#'))
                .expect(reference);
        }
        item
    }

    fn channel(&self, name: &str) -> &Value {
        &self.0["channels"][name]
    }

    /// A channel's only message.
    fn message(&self, channel: &str) -> &Value {
        let messages = self.channel(channel)["messages"].as_object().expect("messages");
        assert_eq!(messages.len(), 1, "{channel} has one message");
        self.resolved(messages.values().next().expect("a message"))
    }

    /// A channel's stream key: its address with `prefix` and, when given,
    /// `partitionTag` filled in from the parameter's template.
    fn stream(&self, channel: &str, prefix: &str, partition: Option<u16>) -> String {
        let address = self.channel(channel)["address"].as_str().expect("an address");
        let mut key = address.replace("{prefix}", prefix);
        if let Some(n) = partition {
            let tag = self.channel(channel)["parameters"]["partitionTag"]["x-template"]
                .as_str()
                .expect("the partition tag's template");
            key = key.replace("{partitionTag}", &tag.replace("<n>", &n.to_string()));
        }
        assert!(!key.contains("{prefix}") && !key.contains("{partitionTag}"));
        key
    }

    /// The name of the payload property titled `title`.
    fn field(&self, channel: &str, title: &str) -> String {
        let properties = self.message(channel)["payload"]["properties"]
            .as_object()
            .expect("properties");
        properties
            .iter()
            .find(|(_, schema)| self.resolved(schema)["title"] == title || schema["title"] == title)
            .map(|(name, _)| name.clone())
            .unwrap_or_else(|| panic!("{channel} has no field titled {title}"))
    }

    /// The field a message correlates on (`$message.payload#/<field>`).
    fn correlation_field(&self, channel: &str) -> String {
        let location = self.message(channel)["correlationId"]["location"]
            .as_str()
            .expect("a correlation id");
        location.split_once("#/").expect("a payload pointer").1.to_owned()
    }

    /// Every field a payload may hold, and those it must.
    fn fields(&self, channel: &str) -> (BTreeSet<String>, BTreeSet<String>) {
        let payload = &self.message(channel)["payload"];
        let names = |value: &Value| -> BTreeSet<String> {
            match value {
                Value::Object(map) => map.keys().cloned().collect(),
                Value::Array(items) => items
                    .iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect(),
                _ => BTreeSet::new(),
            }
        };
        (names(&payload["properties"]), names(&payload["required"]))
    }

    /// The outcomes the document names.
    fn outcomes(&self) -> BTreeSet<String> {
        self.0["components"]["schemas"]["outcome"]["oneOf"]
            .as_array()
            .expect("the outcomes")
            .iter()
            .map(|outcome| outcome["const"].as_str().expect("a const").to_owned())
            .collect()
    }
}

/// A command's fields by the document's titles, as an issuer fills them.
fn command(protocol: &Protocol, id: &str, from: Uuid, to: Uuid, amount: i64) -> Vec<(String, String)> {
    vec![
        (protocol.correlation_field("commands"), id.to_owned()),
        (protocol.field("commands", "Issuer"), "payroll".to_owned()),
        (protocol.field("commands", "Source wallet"), from.to_string()),
        (protocol.field("commands", "Target wallet"), to.to_string()),
        (protocol.field("commands", "Amount"), amount.to_string()),
    ]
}

async fn redis() -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis_url())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis")
}

async fn publish(stream: &str, fields: &[(String, String)]) -> String {
    let mut add = redis::cmd("XADD");
    add.arg(stream).arg("*");
    for (name, value) in fields {
        add.arg(name).arg(value);
    }
    add.query_async(&mut redis().await).await.expect("XADD")
}

/// The consumer groups reading `stream`, with how many entries each has
/// delivered and not acknowledged.
async fn groups_of(stream: &str) -> Vec<(String, i64)> {
    let groups: Vec<HashMap<String, redis::Value>> = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(stream)
        .query_async(&mut redis().await)
        .await
        .expect("XINFO GROUPS");
    let field = |info: &HashMap<String, redis::Value>, name: &str| info.get(name).cloned().expect(name);
    groups
        .iter()
        .map(|info| {
            let name = redis::from_redis_value(field(info, "name")).expect("a group's name");
            (
                name,
                redis::from_redis_value(field(info, "pending")).expect("a count"),
            )
        })
        .collect()
}

/// A command's outcome at the documented endpoint: status and body.
async fn outcome_at_endpoint(app: &TestApp, protocol: &Protocol, command_id: &str) -> (u16, Value) {
    let endpoint = &protocol.0["info"]["x-outcome-endpoint"];
    assert_eq!(endpoint["listener"], "admin");
    let path = endpoint["path"]
        .as_str()
        .expect("a path")
        .replace("{command_id}", command_id);
    for _ in 0..300 {
        let response = app.client.get(app.admin_url(&path)).send().await.expect("send");
        let status = response.status().as_u16();
        if status != endpoint["not-found"] {
            return (status, response.json().await.expect("a JSON body"));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("{command_id} has no outcome after 30 s");
}

/// Waits (30 s at most) until `stream` holds `count` entries.
async fn wait_for_entries(app: &TestApp, stream: &str, count: usize) -> Vec<HashMap<String, String>> {
    for _ in 0..300 {
        let found = app.stream_entries(stream.to_owned()).await;
        if found.len() >= count {
            return found;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("{stream} holds fewer than {count} entries after 30 s");
}

/// The four entries one test publishes to the source wallet's partition.
struct Published {
    partition: u16,
    stream: String,
    good: String,
    refused: String,
    poison: String,
    /// The entry id of the one without a command id.
    no_id_entry: String,
}

/// A good command, a refused one, a poison one with a well-formed id (the
/// same wallet as source and target) and one without a usable id, all from
/// `alice`, each written with the document's field names.
async fn publish_four(protocol: &Protocol, app: &TestApp, alice: Uuid, bob: Uuid) -> Published {
    let partition = app.command_streams().partition_of(WalletId(alice));
    let stream = protocol.stream("commands", &app.redis_prefix, Some(partition));
    assert_eq!(stream, app.command_streams().stream_for(WalletId(alice)));
    let (fields, required) = protocol.fields("commands");
    assert_eq!(fields, required, "a command has exactly its required fields");
    let id = |name: &str| format!("cmd_{name}_{}", Uuid::now_v7().simple());
    let (good, refused, poison) = (id("good"), id("refused"), id("poison"));
    publish(&stream, &command(protocol, &good, alice, bob, 1_500)).await;
    publish(&stream, &command(protocol, &refused, alice, bob, 10_000_000)).await;
    publish(&stream, &command(protocol, &poison, alice, alice, 10)).await;
    let id_field = protocol.correlation_field("commands");
    let mut no_id = command(protocol, "", alice, bob, 10);
    no_id.retain(|(name, _)| *name != id_field);
    let no_id_entry = publish(&stream, &no_id).await;
    Published {
        partition,
        stream,
        good,
        refused,
        poison,
        no_id_entry,
    }
}

#[tokio::test]
async fn commands_published_by_the_document_come_out_as_it_says() {
    let protocol = Protocol::read();
    let app = spawn_app(with_commands).await;
    let (alice, bob) = app.alice_and_bob().await;
    let published = publish_four(&protocol, &app, alice.wallet_id, bob.wallet_id).await;

    let (status, applied) = outcome_at_endpoint(&app, &protocol, &published.good).await;
    assert_eq!(
        (status, &applied["outcome"]),
        (200, &Value::from("applied")),
        "{applied}"
    );
    let (_, refusal) = outcome_at_endpoint(&app, &protocol, &published.refused).await;
    assert_eq!(refusal["outcome"], "insufficient_funds", "{refusal}");
    let (_, dead) = outcome_at_endpoint(&app, &protocol, &published.poison).await;
    assert_eq!(dead["outcome"], "dead_lettered", "{dead}");
    assert!(
        dead["reason"]
            .as_str()
            .is_some_and(|r| r.contains("another wallet")),
        "{dead}"
    );

    let results = wait_for_entries(&app, &protocol.stream("results", &app.redis_prefix, None), 4).await;
    check_results(&protocol, &results, &published, [&applied, &refusal, &dead]);
    let letters = wait_for_entries(&app, &protocol.stream("deadLetters", &app.redis_prefix, None), 2).await;
    check_dead_letters(&protocol, &letters, &published);

    // The documented group read the partition and holds nothing.
    let group = protocol.channel("commands")["x-consumer-group"]
        .as_str()
        .expect("a group");
    app.wait_until_nothing_pending().await;
    assert!(
        groups_of(&published.stream)
            .await
            .contains(&(group.to_owned(), 0))
    );

    // The database: one transfer, the good command's, and nothing else.
    assert_eq!(app.transfer_count().await, 1);
    let transfer: Uuid = applied["transfer_id"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .expect("a transfer id");
    let (from, to, amount): (Uuid, Uuid, i64) =
        sqlx::query_as("SELECT from_wallet_id, to_wallet_id, amount_minor FROM transfers WHERE id = $1")
            .bind(transfer)
            .fetch_one(&app.db)
            .await
            .expect("the good command's transfer");
    assert_eq!((from, to, amount), (alice.wallet_id, bob.wallet_id, 1_500));
    assert_eq!(app.balance(alice.wallet_id).await, 100_000 - 1_500);
    app.assert_invariants().await;
}

/// One results entry a command, each with exactly the documented fields
/// and the same result body as the endpoint's; the one without a usable id
/// reported by where it was.
fn check_results(
    protocol: &Protocol,
    results: &[HashMap<String, String>],
    published: &Published,
    bodies: [&Value; 3],
) {
    assert_eq!(results.len(), 4, "{results:?}");
    let (result_fields, _) = protocol.fields("results");
    let (result_id, outcome, body) = (
        protocol.correlation_field("results"),
        protocol.field("results", "Outcome"),
        protocol.field("results", "Result"),
    );
    let result_of = |command_id: &str| {
        let entry = results
            .iter()
            .find(|entry| entry[&result_id] == command_id)
            .expect(command_id);
        assert_eq!(
            entry.keys().cloned().collect::<BTreeSet<_>>(),
            result_fields,
            "{entry:?}"
        );
        assert!(protocol.outcomes().contains(&entry[&outcome]), "{entry:?}");
        let body: Value = serde_json::from_str(&entry[&body]).expect("the result is JSON");
        (entry[&outcome].clone(), body)
    };
    let [applied, refusal, dead] = bodies;
    assert_eq!(
        result_of(&published.good),
        ("applied".to_owned(), applied.clone())
    );
    assert_eq!(
        result_of(&published.refused),
        ("insufficient_funds".to_owned(), refusal.clone())
    );
    assert_eq!(
        result_of(&published.poison),
        ("dead_lettered".to_owned(), dead.clone())
    );
    let (unnamed, where_it_was) = result_of("");
    assert_eq!(unnamed, "dead_lettered");
    assert_eq!(
        where_it_was["entry_id"],
        published.no_id_entry.as_str(),
        "{where_it_was}"
    );
    assert_eq!(where_it_was["partition"], published.partition, "{where_it_was}");
}

/// The poison and the entry without an id are dead letters, each with the
/// documented fields and the entry's own under the documented prefix; the
/// poison found by its command id.
fn check_dead_letters(protocol: &Protocol, letters: &[HashMap<String, String>], published: &Published) {
    assert_eq!(letters.len(), 2, "{letters:?}");
    let (letter_fields, letter_required) = protocol.fields("deadLetters");
    let own_field = protocol.message("deadLetters")["payload"]["patternProperties"]
        .as_object()
        .and_then(|patterns| patterns.keys().next())
        .map(|pattern| regex::Regex::new(pattern).expect("a pattern"))
        .expect("the entry's own fields' pattern");
    for letter in letters {
        let names: BTreeSet<String> = letter.keys().cloned().collect();
        assert!(letter_required.is_subset(&names), "{letter:?}");
        for name in names.difference(&letter_fields) {
            assert!(
                own_field.is_match(name),
                "{name} is no documented field: {letter:?}"
            );
        }
        let partition = &letter[&protocol.field("deadLetters", "Partition")];
        assert_eq!(*partition, published.partition.to_string());
        assert_eq!(letter[&protocol.field("deadLetters", "Deliveries")], "1");
    }
    // `^command\.` names `command.command_id`.
    let own_id = format!(
        "{}{}",
        own_field.as_str().trim_start_matches('^').replace('\\', ""),
        protocol.correlation_field("commands")
    );
    let poisoned = letters
        .iter()
        .find(|letter| letter.get(&own_id) == Some(&published.poison));
    let poisoned = poisoned.expect("the poison's dead letter, found by its command id");
    assert!(poisoned[&protocol.field("deadLetters", "Reason")].contains("another wallet"));
    let entry_field = protocol.field("deadLetters", "Entry id");
    let unnamed = letters
        .iter()
        .find(|letter| letter[&entry_field] == published.no_id_entry);
    assert!(unnamed.expect("the entry without an id").get(&own_id).is_none());
}
