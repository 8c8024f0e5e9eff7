//! Publishing transfer commands to a test app's streams, as an issuer does,
//! and reading what became of them.

use std::time::Duration;

use layered_wallet::command::{Command, GROUP, Streams, new_command_id};
use layered_wallet::domain::WalletId;
use layered_wallet::settings::Settings;
use serde_json::Value;
use uuid::Uuid;

use crate::{TestApp, redis_url};

/// Consumes commands, with a short claim time and short waits so that the
/// tests' stalls and crashes play out in a second or two.
pub fn with_commands(settings: &mut Settings) {
    settings.commands_enabled = true;
    settings.commands_claim_idle_ms = 1_000;
    settings.commands_read_wait_ms = 100;
    settings.commands_retry_backoff_ms = 100;
}

/// A command moving `amount_minor` from `from` to `to`.
pub fn transfer_command(from: Uuid, to: Uuid, amount_minor: i64) -> Command {
    Command {
        command_id: new_command_id(),
        issuer: "payroll".into(),
        from: WalletId(from),
        to: WalletId(to),
        amount_minor,
    }
}

/// A Redis of the test's own, started as a deployment starts its
/// commands' Redis: `deploy/redis-start.sh` with `deploy/redis-commands.conf`,
/// users and all, with passwords of its own. The shipped file's keys are
/// under `lw:`, so an app on it uses that prefix: nothing else shares this
/// server.
pub struct ShippedCommandsRedis {
    pub port: u16,
    wallet_password: String,
    broker_password: String,
    child: Option<std::process::Child>,
    /// Its append-only file and its filled-in configuration; removed after
    /// the server is killed (fields drop after `drop`).
    _dir: crate::private_stores::ScratchDir,
}

impl ShippedCommandsRedis {
    /// The prefix the shipped ACL names.
    pub const KEY_PREFIX: &'static str = "lw:";

    pub fn start() -> Self {
        let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let dir = crate::private_stores::ScratchDir::new("shipped-redis");
        let port = crate::closed_port();
        let password = || format!("{}{}", Uuid::new_v4().simple(), Uuid::new_v4().simple());
        let (wallet_password, broker_password) = (password(), password());
        let child = std::process::Command::new("sh")
            .arg(repo.join("deploy/redis-start.sh"))
            .arg(repo.join("deploy/redis-commands.conf"))
            .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--dir"])
            .arg(dir.path())
            .env("REDIS_WALLET_PASSWORD", &wallet_password)
            .env("REDIS_BROKER_PASSWORD", &broker_password)
            .env("REDIS_CONF_OUT", dir.path().join("redis.conf"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("sh runs deploy/redis-start.sh");
        crate::private_stores::wait_until_listening(port, "the shipped commands' Redis");
        Self {
            port,
            wallet_password,
            broker_password,
            child: Some(child),
            _dir: dir,
        }
    }

    /// The URL of one of the shipped users (`wallet`, `broker`), or of
    /// nobody signed in (`None`).
    pub fn url_as(&self, user: Option<&str>) -> String {
        let password = match user {
            Some("wallet") => &self.wallet_password,
            Some("broker") => &self.broker_password,
            Some(other) => panic!("the shipped ACL has no user {other}"),
            None => return format!("redis://127.0.0.1:{}", self.port),
        };
        format!(
            "redis://{}:{password}@127.0.0.1:{}",
            user.unwrap_or_default(),
            self.port
        )
    }

    pub async fn connect(&self, user: Option<&str>) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url_as(user))
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .expect("a connection to the shipped Redis")
    }
}

impl Drop for ShippedCommandsRedis {
    fn drop(&mut self) {
        crate::private_stores::kill_9(&mut self.child);
    }
}

async fn redis() -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis_url())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis")
}

impl TestApp {
    pub fn command_streams(&self) -> Streams {
        Streams::new(&self.redis_prefix, self.settings.commands_partitions)
    }

    /// Publishes `command` to its partition's stream; returns the entry id.
    pub async fn publish_command(&self, command: &Command) -> String {
        command
            .publication(&self.command_streams())
            .query_async(&mut redis().await)
            .await
            .expect("XADD")
    }

    /// Publishes `command` under an entry id the issuer chose
    /// (`XADD stream <id> …`) rather than one from Redis's clock; the id
    /// must exceed the stream's last.
    pub async fn publish_command_as(&self, command: &Command, entry_id: &str) -> String {
        let mut add = redis::cmd("XADD");
        add.arg(self.command_streams().stream_for(command.from))
            .arg(entry_id);
        for (name, value) in command.fields() {
            add.arg(name).arg(value);
        }
        add.query_async(&mut redis().await).await.expect("XADD")
    }

    /// Publishes any fields to `stream`: a command, or something that is not.
    pub async fn publish_fields(&self, stream: String, fields: &[(&str, String)]) -> String {
        let mut add = redis::cmd("XADD");
        add.arg(stream).arg("*");
        for (name, value) in fields {
            add.arg(*name).arg(value);
        }
        add.query_async(&mut redis().await).await.expect("XADD")
    }

    /// Makes the consumer group of `stream` and reads its newest entries
    /// as `consumer`, which then never acknowledges them: a consumer that
    /// died holding them.
    pub async fn take_as_a_consumer_that_dies(&self, stream: &str, consumer: &str) -> Vec<String> {
        let mut conn = redis().await;
        let created: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(stream)
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut conn)
            .await;
        if let Err(error) = created {
            assert_eq!(error.code(), Some("BUSYGROUP"), "{error}");
        }
        let reply: layered_wallet::feed::XreadReply = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(GROUP)
            .arg(consumer)
            .arg("STREAMS")
            .arg(stream)
            .arg(">")
            .query_async(&mut conn)
            .await
            .expect("XREADGROUP");
        reply
            .into_iter()
            .flatten()
            .flat_map(|(_, entries)| entries.into_iter().map(|(id, _)| id))
            .collect()
    }

    /// Marks `entry_id` as delivered `count` times to `consumer`.
    pub async fn set_deliveries(&self, stream: &str, consumer: &str, entry_id: &str, count: u32) {
        redis::cmd("XCLAIM")
            .arg(stream)
            .arg(GROUP)
            .arg(consumer)
            .arg(0)
            .arg(entry_id)
            .arg("RETRYCOUNT")
            .arg(count)
            .arg("JUSTID")
            .query_async::<Vec<String>>(&mut redis().await)
            .await
            .expect("XCLAIM");
    }

    /// A command's outcome from the admin listener: status and body.
    pub async fn command_outcome(&self, command_id: &str) -> (u16, Value) {
        let response = self
            .client
            .get(self.admin_url(&format!("/commands/{command_id}")))
            .send()
            .await
            .expect("send");
        let status = response.status().as_u16();
        (status, response.json().await.expect("a JSON body"))
    }

    /// Waits (at most 30 s) until the command has an outcome; returns it.
    pub async fn wait_for_outcome(&self, command_id: &str) -> Value {
        for _ in 0..300 {
            let (status, body) = self.command_outcome(command_id).await;
            if status == 200 {
                return body;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("command {command_id} has no outcome after 30 s");
    }

    /// Waits (at most 30 s) until no command is pending in any partition:
    /// everything delivered was acknowledged.
    pub async fn wait_until_nothing_pending(&self) {
        for _ in 0..300 {
            // An entry just published is neither pending nor handled until
            // a consumer reads it: wait for both, in this order. Asked the
            // other way round, an entry read between the two questions
            // would be neither pending (yet) nor undelivered (any more).
            if self.commands_undelivered().await == 0 && self.commands_pending().await == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "commands still pending after 30 s: {}",
            self.commands_pending().await
        );
    }

    /// Who holds each partition's lease, by partition; `None` for a free one.
    pub async fn lease_holders(&self) -> Vec<Option<String>> {
        let mut conn = redis().await;
        let streams = self.command_streams();
        let mut holders = Vec::new();
        for partition in 0..streams.partitions() {
            let holder: Option<String> = redis::cmd("GET")
                .arg(streams.lease(partition))
                .query_async(&mut conn)
                .await
                .expect("GET");
            holders.push(holder);
        }
        holders
    }

    /// Waits (30 s at most) until the partitions' leases satisfy `wanted`.
    pub async fn wait_for_lease_holders(&self, what: &str, wanted: impl Fn(&[Option<String>]) -> bool) {
        for _ in 0..300 {
            if wanted(&self.lease_holders().await) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("after 30 s, not {what}: {:?}", self.lease_holders().await);
    }

    pub async fn commands_pending(&self) -> u64 {
        let mut conn = redis().await;
        let streams = self.command_streams();
        let mut pending = 0;
        for partition in 0..streams.partitions() {
            let summary: redis::RedisResult<(u64, Option<String>, Option<String>, redis::Value)> =
                redis::cmd("XPENDING")
                    .arg(streams.stream(partition))
                    .arg(GROUP)
                    .query_async(&mut conn)
                    .await;
            pending += summary.map(|(count, ..)| count).unwrap_or(0);
        }
        pending
    }

    /// Streams whose newest entry the group has not read yet.
    pub async fn commands_undelivered(&self) -> u64 {
        let mut conn = redis().await;
        let streams = self.command_streams();
        let mut undelivered = 0;
        for partition in 0..streams.partitions() {
            let stream = streams.stream(partition);
            let newest: Vec<(String, Vec<(String, String)>)> = redis::cmd("XREVRANGE")
                .arg(&stream)
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(1)
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            let Some((newest, _)) = newest.into_iter().next() else {
                continue;
            };
            let groups: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(&stream)
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            let delivered = groups
                .iter()
                .find(|group| group.get("name").is_some_and(|name| value_text(name) == GROUP))
                .and_then(|group| group.get("last-delivered-id").map(value_text));
            if delivered.is_none_or(|delivered| stream_id(&delivered) < stream_id(&newest)) {
                undelivered += 1;
            }
        }
        undelivered
    }

    /// The entries of one of the commands' own streams (dead letters,
    /// results), oldest first, as field maps.
    pub async fn stream_entries(&self, stream: String) -> Vec<std::collections::HashMap<String, String>> {
        let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
            .arg(stream)
            .arg("-")
            .arg("+")
            .query_async(&mut redis().await)
            .await
            .expect("XRANGE");
        entries
            .into_iter()
            .map(|(_, fields)| fields.into_iter().collect())
            .collect()
    }
}

fn value_text(value: &redis::Value) -> String {
    match value {
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        redis::Value::SimpleString(text) => text.clone(),
        other => format!("{other:?}"),
    }
}

/// A stream id as a pair of numbers, so that ids compare as Redis orders them.
fn stream_id(id: &str) -> (u64, u64) {
    let (millis, sequence) = id.split_once('-').unwrap_or((id, "0"));
    (millis.parse().unwrap_or(0), sequence.parse().unwrap_or(0))
}
