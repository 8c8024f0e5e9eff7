//! `wallet-sim gateway`: a bank gateway that money leaves through, as a
//! real HTTP server with its own PostgreSQL database, so that what it sent
//! survives its own restarts.
//!
//! It deduplicates by `Idempotency-Key` as a real payment API does: the
//! first request with a key is applied and its answer stored, in one
//! transaction; the same key again gets that answer back; the same key with
//! another payload is refused. And it misbehaves on purpose, as set on its
//! command line: latency, failures before anything is applied, answers
//! lost after the money was sent, a crash after sending, destinations it
//! refuses for good, keys forgotten after a retention period, and (for
//! demonstrations only) no deduplication at all.
//!
//! Its ledger (`gateway_sent`) is the truth about money that left: each row
//! is one sending. The checks of a payout run read it.
//!
//! It implements the protocol of `docs/gateway.openapi.yaml`, and
//! schemathesis holds it to that document (`backend/tests/gateway_protocol.rs`).

use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use chrono::Utc;
use rand::Rng;
use serde::Deserialize;
use serde_json::json;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

use layered_wallet::payout::gateway::{PROBLEM_CONTENT_TYPE, UNKNOWN_KEY_PROBLEM_TYPE};

/// The largest request body the gateway reads.
pub const GATEWAY_BODY_BYTES_MAX: usize = 16 * 1024;
/// Database connections the gateway holds at most.
pub const GATEWAY_POOL_CONNECTIONS_MAX: u32 = 16;
/// The longest `Idempotency-Key` it accepts.
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = 255;

/// The gateway's schema: the answers it stored per key, and every sending.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS gateway_requests (
    idempotency_key text PRIMARY KEY,
    fingerprint     text NOT NULL,
    status          smallint NOT NULL,
    body            text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS gateway_sent (
    id              uuid PRIMARY KEY,
    idempotency_key text NOT NULL,
    reference       text,
    destination     text NOT NULL,
    amount_minor    bigint NOT NULL CHECK (amount_minor > 0),
    currency        text NOT NULL,
    sent_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS gateway_sent_key_idx ON gateway_sent (idempotency_key);
";

#[derive(Debug, Clone, clap::Args)]
pub struct GatewayArgs {
    /// Where to listen, e.g. 127.0.0.1:8090.
    #[arg(long, default_value = "127.0.0.1:8090")]
    pub listen: String,
    /// The gateway's own database; its tables are made on start.
    #[arg(long, env = "GATEWAY_DATABASE_URL")]
    pub database_url: String,
    /// Added to every request before it is handled.
    #[arg(long, default_value_t = 0)]
    pub latency_ms: u64,
    /// Share of requests answered 503 before anything is applied.
    #[arg(long, default_value_t = 0.0)]
    pub failure_rate: f64,
    /// Share of sendings whose answer is held back for `lose_answer_ms`
    /// after the money was sent: the caller times out.
    #[arg(long, default_value_t = 0.0)]
    pub lose_answer_rate: f64,
    #[arg(long, default_value_t = 30_000)]
    pub lose_answer_ms: u64,
    /// Share of sendings after which the process exits at once, the money
    /// sent and no answer given.
    #[arg(long, default_value_t = 0.0)]
    pub crash_after_send_rate: f64,
    /// Destinations starting with this are refused for good (422): a
    /// closed account.
    #[arg(long, default_value = "closed-")]
    pub refuse_prefix: String,
    /// DEMO ONLY: every request sends money, whatever its key.
    #[arg(long)]
    pub no_dedup: bool,
    /// How long a key is remembered after its first request, as a real
    /// gateway's retention period; 0: for ever. A forgotten key is
    /// answered as unknown, and a request with it is applied afresh.
    #[arg(long, default_value_t = 0)]
    pub key_retention_ms: u64,
    /// Appends every payout request, as received, to this file (a JSON
    /// object a line): what the protocol tests hold the caller's requests
    /// to.
    #[arg(long)]
    pub record_requests: Option<std::path::PathBuf>,
}

/// Appends `request` (with `body`, when it has one) to
/// `--record-requests`, if set.
fn record(gateway: &Gateway, request: &HttpRequest, body: Option<&[u8]>) {
    let Some(path) = &gateway.args.record_requests else {
        return;
    };
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    let line = json!({
        "method": request.method().as_str(),
        "path": request.path(),
        "headers": {
            "idempotency-key": header("idempotency-key"),
            "content-type": header("content-type"),
            "traceparent": header("traceparent"),
        },
        "body": body.map(|body| String::from_utf8_lossy(body).into_owned()),
    });
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut file| std::io::Write::write_all(&mut file, format!("{line}\n").as_bytes()));
    if let Err(error) = appended {
        eprintln!("gateway: could not record a request: {error}");
    }
}

/// A payout as the gateway's API takes it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PayoutBody {
    #[serde(deserialize_with = "whole_number")]
    amount_minor: i64,
    currency: String,
    destination: String,
    /// The caller's own name for the payout, kept with each sending: what
    /// the checks group sendings by, whatever key each attempt carried.
    /// Optional, but never `null` (`docs/gateway.openapi.yaml`).
    #[serde(default, deserialize_with = "present_string")]
    reference: Option<String>,
}

/// An integer as JSON Schema has it: `7482.0` is one too.
fn whole_number<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    let number = serde_json::Number::deserialize(deserializer)?;
    number
        .as_i64()
        .or_else(|| {
            number
                .as_f64()
                .filter(|n| n.fract() == 0.0 && n.abs() < 9.0e18)
                .map(|n| n as i64)
        })
        .ok_or_else(|| serde::de::Error::custom("amount_minor must be an integer"))
}

/// A field that may be left out, but is a string when it is there.
fn present_string<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    String::deserialize(deserializer).map(Some)
}

/// Whether `key` is an `Idempotency-Key` the protocol allows: 1 to 255
/// URL-safe characters, so that a look-up can name it in its path.
fn is_key(key: &str) -> bool {
    (1..=IDEMPOTENCY_KEY_BYTES_MAX).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._~-".contains(&b))
}

impl PayoutBody {
    fn problem(&self) -> Option<&'static str> {
        if self.amount_minor <= 0 {
            return Some("amount_minor must be a positive integer");
        }
        if self.currency.len() != 3 || !self.currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return Some("currency must be three capital letters");
        }
        if self.destination.is_empty()
            || self.destination.len() > 64
            || !self
                .destination
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
        {
            return Some("destination must be 1 to 64 letters, digits and - _ . :");
        }
        if self.reference.as_ref().is_some_and(|reference| {
            reference.chars().count() > 64 || reference.chars().any(char::is_control)
        }) {
            return Some("reference must be at most 64 characters, none of them control characters");
        }
        None
    }

    /// What makes two requests with one key the same request.
    fn fingerprint(&self) -> String {
        format!(
            "{}|{}|{}|{}",
            self.amount_minor,
            self.currency,
            self.destination,
            self.reference.as_deref().unwrap_or_default()
        )
    }
}

struct Gateway {
    db: PgPool,
    args: GatewayArgs,
}

/// Makes the schema, then serves until the process ends.
pub async fn serve(args: GatewayArgs) -> anyhow::Result<()> {
    let db = PgPoolOptions::new()
        .max_connections(GATEWAY_POOL_CONNECTIONS_MAX)
        .connect(&args.database_url)
        .await?;
    sqlx::raw_sql(SCHEMA).execute(&db).await?;
    let listen = args.listen.clone();
    let gateway = web::Data::new(Gateway { db, args });
    eprintln!("gateway listening on http://{listen}");
    HttpServer::new(move || {
        App::new()
            .app_data(gateway.clone())
            .app_data(web::PayloadConfig::new(GATEWAY_BODY_BYTES_MAX))
            .route(
                "/healthz",
                web::get().to(|| async { HttpResponse::Ok().body("ok") }),
            )
            // Resources, so that another method is answered 405.
            .service(web::resource("/v1/payouts").route(web::post().to(send_payout)))
            .service(web::resource("/v1/payouts/{key}").route(web::get().to(payout_by_key)))
    })
    .bind(&listen)?
    .run()
    .await?;
    Ok(())
}

fn answer(status: StatusCode, body: &str) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("application/json")
        .body(body.to_owned())
}

fn error(status: StatusCode, code: &str, message: &str) -> HttpResponse {
    answer(status, &json!({ "error": code, "message": message }).to_string())
}

fn chance(rate: f64) -> bool {
    rate > 0.0 && rand::thread_rng().r#gen::<f64>() < rate
}

async fn send_payout(request: HttpRequest, body: web::Bytes, gateway: web::Data<Gateway>) -> HttpResponse {
    record(&gateway, &request, Some(&body));
    let args = &gateway.args;
    if args.latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(args.latency_ms)).await;
    }
    let Some(key) = request
        .headers()
        .get("idempotency-key")
        .and_then(|value| value.to_str().ok())
        .filter(|key| is_key(key))
        .map(str::to_owned)
    else {
        return error(
            StatusCode::BAD_REQUEST,
            "idempotency_key_required",
            "every payout needs an Idempotency-Key of 1 to 255 letters, digits and . _ ~ -",
        );
    };
    let payout: PayoutBody = match serde_json::from_slice(&body) {
        Ok(payout) => payout,
        Err(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_body",
                "the body must be {\"amount_minor\",\"currency\",\"destination\"}",
            );
        }
    };
    if let Some(problem) = payout.problem() {
        return error(StatusCode::UNPROCESSABLE_ENTITY, "invalid_payout", problem);
    }
    if chance(args.failure_rate) {
        return HttpResponse::ServiceUnavailable()
            .insert_header(("Retry-After", "1"))
            .content_type("application/json")
            .body(json!({"error": "unavailable", "message": "nothing was sent; try again"}).to_string());
    }
    match apply(&gateway, &key, &payout).await {
        Ok(Applied::Replayed { status, body }) => HttpResponse::build(status)
            .insert_header(("Idempotent-Replayed", "true"))
            .content_type("application/json")
            .body(body),
        Ok(Applied::KeyReused) => error(
            StatusCode::CONFLICT,
            "idempotency_key_reused",
            "this Idempotency-Key was used for another payout",
        ),
        Ok(Applied::Fresh { status, body, sent }) => {
            if sent && chance(args.crash_after_send_rate) {
                eprintln!("gateway: crashing after sending, as asked");
                std::process::exit(137);
            }
            if sent && chance(args.lose_answer_rate) {
                tokio::time::sleep(Duration::from_millis(args.lose_answer_ms)).await;
            }
            answer(status, &body)
        }
        Err(database) => {
            eprintln!("gateway: database error: {database}");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "nothing was sent; try again",
            )
        }
    }
}

enum Applied {
    Fresh {
        status: StatusCode,
        body: String,
        sent: bool,
    },
    Replayed {
        status: StatusCode,
        body: String,
    },
    KeyReused,
}

/// Forgets the keys older than `--key-retention-ms`, as a gateway past its
/// retention period does; the ledger of sendings stays.
async fn forget_old_keys(gateway: &Gateway) -> Result<(), sqlx::Error> {
    if gateway.args.key_retention_ms > 0 {
        sqlx::query("DELETE FROM gateway_requests WHERE created_at < now() - make_interval(secs => $1)")
            .bind(gateway.args.key_retention_ms as f64 / 1000.0)
            .execute(&gateway.db)
            .await?;
    }
    Ok(())
}

/// Claims the key, sends (or refuses), and stores the answer, in one
/// transaction; or answers what the key's first request got.
async fn apply(gateway: &Gateway, key: &str, payout: &PayoutBody) -> Result<Applied, sqlx::Error> {
    forget_old_keys(gateway).await?;
    let refused = payout.destination.starts_with(&gateway.args.refuse_prefix);
    let sending = Uuid::now_v7();
    let (status, body) = if refused {
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            json!({"error": "destination_refused", "message": "the destination account is closed"})
                .to_string(),
        )
    } else {
        (
            StatusCode::CREATED,
            json!({
                "id": sending,
                "status": "sent",
                "amount_minor": payout.amount_minor,
                "currency": payout.currency,
                "destination": payout.destination,
                "sent_at": Utc::now().to_rfc3339(),
            })
            .to_string(),
        )
    };
    let mut tx = gateway.db.begin().await?;
    if !gateway.args.no_dedup {
        // The claim waits for a concurrent request with the same key to
        // commit, then sees its row.
        let claimed = sqlx::query(
            "INSERT INTO gateway_requests (idempotency_key, fingerprint, status, body) VALUES ($1, $2, $3, $4)
             ON CONFLICT (idempotency_key) DO NOTHING",
        )
        .bind(key)
        .bind(payout.fingerprint())
        .bind(i16::try_from(status.as_u16()).unwrap_or_default())
        .bind(&body)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if !claimed {
            let (fingerprint, stored_status, stored_body): (String, i16, String) = sqlx::query_as(
                "SELECT fingerprint, status, body FROM gateway_requests WHERE idempotency_key = $1",
            )
            .bind(key)
            .fetch_one(&mut *tx)
            .await?;
            tx.commit().await?;
            if fingerprint != payout.fingerprint() {
                return Ok(Applied::KeyReused);
            }
            let status = u16::try_from(stored_status)
                .ok()
                .and_then(|code| StatusCode::from_u16(code).ok())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return Ok(Applied::Replayed {
                status,
                body: stored_body,
            });
        }
    }
    if !refused {
        sqlx::query(
            "INSERT INTO gateway_sent (id, idempotency_key, reference, destination, amount_minor, currency)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(sending)
        .bind(key)
        .bind(&payout.reference)
        .bind(&payout.destination)
        .bind(payout.amount_minor)
        .bind(&payout.currency)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(Applied::Fresh {
        status,
        body,
        sent: !refused,
    })
}

/// The answer the first request with `key` got, for a caller that lost it
/// (reconciliation); when no request with the key was applied (or it was
/// forgotten), the protocol's unknown-key answer: 404, problem+json, of
/// type `UNKNOWN_KEY_PROBLEM_TYPE`, the one answer a caller may release a
/// hold on.
async fn payout_by_key(
    request: HttpRequest,
    key: web::Path<String>,
    gateway: web::Data<Gateway>,
) -> HttpResponse {
    record(&gateway, &request, None);
    if !is_key(&key) {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_key",
            "an Idempotency-Key is 1 to 255 letters, digits and . _ ~ -",
        );
    }
    let stored: Result<Option<(i16, String)>, sqlx::Error> = match forget_old_keys(&gateway).await {
        Ok(()) => {
            sqlx::query_as("SELECT status, body FROM gateway_requests WHERE idempotency_key = $1")
                .bind(key.as_str())
                .fetch_optional(&gateway.db)
                .await
        }
        Err(database) => Err(database),
    };
    match stored {
        Ok(Some((status, body))) => answer(
            u16::try_from(status)
                .ok()
                .and_then(|code| StatusCode::from_u16(code).ok())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            &body,
        ),
        Ok(None) => HttpResponse::NotFound()
            .content_type(PROBLEM_CONTENT_TYPE)
            .body(
                json!({
                    "type": UNKNOWN_KEY_PROBLEM_TYPE,
                    "title": "No payout with this Idempotency-Key",
                    "status": 404,
                    "detail": "no payout was sent or refused with this Idempotency-Key within the key retention period",
                    "error": "unknown_idempotency_key",
                })
                .to_string(),
            ),
        Err(database) => {
            eprintln!("gateway: database error: {database}");
            error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "try again")
        }
    }
}

/// Sendings per idempotency key, from the gateway's ledger: what a payout
/// run's checks count (a key sent more than once is money sent twice).
pub async fn sendings_by_key(db: &PgPool) -> Result<Vec<(String, i64)>, sqlx::Error> {
    sqlx::query_as("SELECT idempotency_key, count(*) FROM gateway_sent GROUP BY idempotency_key ORDER BY 1")
        .fetch_all(db)
        .await
}

/// Sendings and the money sent per payout (the `reference` the caller
/// gave), whatever key each attempt carried: a payout sent more than once
/// is money sent twice.
pub async fn sendings_by_reference(db: &PgPool) -> Result<Vec<(String, i64, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT reference, count(*), sum(amount_minor)::bigint FROM gateway_sent
          WHERE reference IS NOT NULL GROUP BY reference ORDER BY 1",
    )
    .fetch_all(db)
    .await
}
