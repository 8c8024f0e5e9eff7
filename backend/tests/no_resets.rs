//! Every request an instance accepted is answered with a status: during a
//! store outage, and while the instance stops. A request that fails to
//! connect was never sent, and its client may safely try elsewhere; one
//! cut after it was sent leaves its client not knowing.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use layered_wallet::settings::StoreErrorPolicy;
use serde_json::json;
use uuid::Uuid;
use wallet_testkit::private_stores::PrivateRedis;
use wallet_testkit::server_process::ServerProcess;
use wallet_testkit::*;

/// Clients that each send transfers one after another, pausing between
/// them so that their pooled connections sit idle for every length up to
/// past the pool's idle timeout (4 s).
const CLIENTS: usize = 12;
const PAUSES_MS: [u64; 6] = [0, 900, 3_900, 4_100, 2_000, 4_500];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_outage_under_fail_closed_answers_every_keep_alive_request_with_a_503() {
    let mut redis = tokio::task::spawn_blocking(PrivateRedis::start)
        .await
        .expect("a private Redis");
    let app = spawn_app(|settings| {
        settings.redis_url = redis.url().into();
        settings.cooldown_on_store_error = StoreErrorPolicy::FailClosed;
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    let before = app.snapshot().await;
    redis.kill();
    // The service's own client builder: what its clients start from.
    let client = wallet_client::http_client_builder()
        .pool_max_idle_per_host(CLIENTS)
        .build()
        .expect("client");
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|number| {
            let request = app.transfer_request(&alice, bob.wallet_id, 1, None);
            let client = client.clone();
            tokio::spawn(async move {
                let mut answers = Vec::new();
                for round in 0..PAUSES_MS.len() {
                    // Each client takes the pauses in its own order.
                    let pause_ms = PAUSES_MS[(number + round) % PAUSES_MS.len()];
                    tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                    let request = request
                        .try_clone()
                        .expect("a body in memory")
                        .build()
                        .expect("request");
                    answers.push((pause_ms, client.execute(request).await));
                }
                answers
            })
        })
        .collect();
    let mut errors = Vec::new();
    for task in tasks {
        for (pause_ms, answer) in task.await.expect("client task") {
            match answer {
                Ok(response) => {
                    let (status, body) = problem(response).await;
                    assert_eq!(status, 503, "{body}");
                    assert_eq!(body["type"], "/problems/service-unavailable", "{body}");
                }
                Err(error) => errors.push(format!("after a pause of {pause_ms} ms: {error:?}")),
            }
        }
    }
    assert!(
        errors.is_empty(),
        "{} transport errors: {errors:#?}",
        errors.len()
    );
    assert_eq!(app.snapshot().await, before, "nothing was changed");
}

/// The shutdown grace the stopping instance gets, and how much longer a
/// busy machine may take than the exit bound the instance promises
/// (`shutdown_grace_s`, `shutdown::LAST_ANSWERS` for the last answers to go out, and
/// `shutdown_cleanup_ms_max`) to start the process, deliver the signal
/// and reap it.
const GRACE_S: u64 = 2;
const CLEANUP_MS: u64 = 2_000;
const EXIT_MARGIN_S: u64 = 8;
/// Clients paying in a loop while the instance stops.
const PAYERS: usize = 8;

/// A real `wallet-server` on a database of its own, with a short grace.
struct Instance {
    process: ServerProcess,
    database_url: String,
    database: String,
    log: PathBuf,
}

impl Instance {
    async fn start() -> Self {
        let (database, options) = create_database().await;
        let database_url = database_url_of(&options);
        let env: Vec<(String, String)> = [
            ("DATABASE_URL", database_url.clone()),
            ("REDIS_URL", redis_url()),
            (
                "WALLET_REDIS_KEY_PREFIX",
                format!("test:{}:", Uuid::new_v4().simple()),
            ),
            ("WALLET_TOKEN_SIGNING_KEY", SIGNING_KEY.to_owned()),
            ("WALLET_ADMIN_HTTP_ADDR", "127.0.0.1:0".to_owned()),
            ("WALLET_ACCOUNT_LIMITS_ENABLED", "false".to_owned()),
            ("WALLET_DEMO_RECIPIENT_NAME", String::new()),
            ("WALLET_SHUTDOWN_GRACE_S", GRACE_S.to_string()),
            ("WALLET_SHUTDOWN_CLEANUP_MS_MAX", CLEANUP_MS.to_string()),
            ("RUST_LOG", "info".to_owned()),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
        let log = std::env::temp_dir().join(format!("lw-stop-{}.log", Uuid::new_v4().simple()));
        let binary = PathBuf::from(env!("CARGO_BIN_EXE_wallet-server"));
        let process = ServerProcess::start(binary, env, log.clone()).await;
        Self {
            process,
            database_url,
            database,
            log,
        }
    }

    /// SIGTERM, and the time it takes the process to exit; fails past its
    /// bound and the margin.
    async fn stop(&mut self) -> Duration {
        self.process.terminate();
        let terminated = Instant::now();
        let bound = Duration::from_secs(GRACE_S)
            + layered_wallet::shutdown::LAST_ANSWERS
            + Duration::from_millis(CLEANUP_MS);
        let exited = self
            .process
            .wait_for_exit(bound + Duration::from_secs(EXIT_MARGIN_S))
            .await;
        assert!(
            exited.is_some(),
            "still running {:?} after SIGTERM; its log:\n{}",
            terminated.elapsed(),
            self.process.log()
        );
        // Each worker's transfer executors still hold their connections as
        // it stops, and give them back without a panic.
        let log = self.process.log();
        assert!(
            !log.contains("panicked"),
            "a thread panicked while the instance stopped; its log:\n{log}"
        );
        terminated.elapsed()
    }

    async fn count(&self, sql: &'static str) -> i64 {
        let db = sqlx::PgPool::connect(&self.database_url)
            .await
            .expect("the test's database");
        let count = sqlx::query_scalar(sql).fetch_one(&db).await.expect("count");
        db.close().await;
        count
    }

    async fn clean_up(self) {
        let _ = std::fs::remove_file(&self.log);
        drop(self.process);
        drop_database(&self.database).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_instance_stopped_under_load_answers_what_it_accepted_and_exits_within_its_bound() {
    let mut instance = Instance::start().await;
    let client = wallet_client::http_client_builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let base = instance.process.url("");
    let recipient = sign_up_at(&client, &base, "recipient").await;
    let mut payers = Vec::new();
    for number in 0..PAYERS {
        payers.push(sign_up_at(&client, &base, &format!("payer{number}")).await);
    }
    let stream = client
        .get(instance.process.url("/api/v1/decisions/stream"))
        .bearer_auth(&recipient.token)
        .send()
        .await
        .expect("the live stream opens");
    assert_eq!(stream.status(), 200);
    let stream_body = tokio::spawn(async move {
        let (mut stream, mut body) = (stream, String::new());
        while let Some(chunk) = stream
            .chunk()
            .await
            .map_err(|error| format!("{error:?}\n{body}"))?
        {
            body.push_str(&String::from_utf8_lossy(&chunk));
        }
        Ok::<_, String>(body)
    });

    let signalled = Arc::new(AtomicBool::new(false));
    let loops: Vec<_> = payers
        .into_iter()
        .map(|payer| {
            pay_until_refused(
                client.clone(),
                base.clone(),
                payer,
                recipient.wallet_id,
                signalled.clone(),
            )
        })
        .map(tokio::spawn)
        .collect();
    // The payers are in full swing: each has been answered a few times.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    signalled.store(true, Ordering::SeqCst);
    instance.stop().await;
    let mut fresh_201s = 0;
    let mut cut = Vec::new();
    for payer in loops {
        let (created, errors) = payer.await.expect("payer");
        fresh_201s += created;
        cut.extend(errors);
    }
    assert!(
        cut.is_empty(),
        "requests sent and never answered: {cut:#?}\n{}",
        instance.process.log()
    );
    let stream_body = stream_body.await.expect("stream task");
    let stream_body = stream_body.unwrap_or_else(|error| panic!("the live stream was cut: {error}"));
    assert!(
        stream_body.ends_with("event: end\ndata: {\"reason\":\"shutdown\"}\n\n"),
        "the live stream ends with its reason: {stream_body}"
    );
    let transfers = instance.count("SELECT count(*) FROM transfers").await;
    assert_eq!(transfers, fresh_201s, "every transfer made was answered 201");
    instance.clean_up().await;
}

/// A transfer still running when the grace ends (its ledger write sleeps
/// past it) is answered 503 `outcome-unknown` before the connection goes,
/// not cut: its client knows to retry with its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transfer_still_running_when_the_grace_ends_is_answered_outcome_unknown() {
    let mut instance = Instance::start().await;
    let client = wallet_client::http_client_builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let base = instance.process.url("");
    let (alice, bob) = (
        sign_up_at(&client, &base, "alice").await,
        sign_up_at(&client, &base, "bob").await,
    );
    let db = sqlx::PgPool::connect(&instance.database_url)
        .await
        .expect("the test's database");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE FUNCTION slow_down() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_sleep({}); RETURN NEW; END $$;
         CREATE TRIGGER slow_down BEFORE INSERT ON ledger_entries FOR EACH ROW EXECUTE FUNCTION slow_down();",
        GRACE_S * 4
    )))
    .execute(&db)
    .await
    .expect("a slow ledger");
    db.close().await;
    let transfer = client
        .post(format!("{base}/api/v1/transfers"))
        .bearer_auth(&alice.token)
        .header("Idempotency-Key", new_key())
        .json(&json!({ "from_wallet_id": alice.wallet_id, "to_wallet_id": bob.wallet_id, "amount_minor": 1 }))
        .send();
    let transfer = tokio::spawn(transfer);
    // The transfer is in its transaction, sleeping in the trigger.
    let asked = Instant::now();
    while instance
        .count(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event = 'PgSleep'",
        )
        .await
        == 0
    {
        assert!(
            asked.elapsed() < Duration::from_secs(30),
            "the transfer never reached its ledger write"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    instance.stop().await;
    let answer = transfer
        .await
        .expect("transfer task")
        .expect("an answer, not a cut connection");
    let (status, body) = problem(answer).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["type"], "/problems/outcome-unknown", "{body}");
    instance.clean_up().await;
}

/// Pays `to` in a loop, a new key each time, until after the SIGTERM a
/// request is refused at the door. Returns the fresh 201s, and every
/// request that was sent and got no answer.
async fn pay_until_refused(
    client: reqwest::Client,
    base: String,
    payer: TestUser,
    to: Uuid,
    signalled: Arc<AtomicBool>,
) -> (i64, Vec<String>) {
    let (mut created, mut cut) = (0, Vec::new());
    for amount in 1.. {
        let answer = client
            .post(format!("{base}/api/v1/transfers"))
            .bearer_auth(&payer.token)
            .header("Idempotency-Key", new_key())
            .json(&json!({ "from_wallet_id": payer.wallet_id, "to_wallet_id": to, "amount_minor": amount }))
            .send()
            .await;
        match answer {
            Ok(response) => {
                if response.status() == 201 {
                    created += 1;
                }
            }
            // Refused before anything was sent: the instance is gone.
            Err(error) if error.is_connect() && signalled.load(Ordering::SeqCst) => break,
            Err(error) => {
                cut.push(format!("{}: {error:?}", payer.name));
                break;
            }
        }
    }
    (created, cut)
}
