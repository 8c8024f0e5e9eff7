//! Liveness, readiness and the metrics: what operators and orchestrators ask.

use actix_web::{HttpResponse, web};
use serde::Serialize;

use crate::settings::{Config, IdempotencyMode, InboxMode, RowGuardMode, StoreErrorPolicy};
use crate::state::AppState;

/// The process is up. Touches nothing else, so an orchestrator does not
/// restart us because a dependency is down.
#[utoipa::path(get, path = "/healthz", tag = "health", responses((status = 200)))]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({ "status": "ok" }))
}

/// The admin listener's readiness report.
#[derive(Clone, Serialize)]
pub struct Readiness {
    pub status: &'static str,
    pub postgres: &'static str,
    pub redis: &'static str,
    /// Requests let through while Redis could not be asked.
    pub cooldown_fail_open_passes: u64,
    pub mode: DefenseMode,
}

/// Which defenses this instance runs, and how.
#[derive(Clone, Serialize)]
pub struct DefenseMode {
    /// False when any layer is off or naive (a demonstration instance).
    pub safe: bool,
    pub cooldown: &'static str,
    pub idempotency: IdempotencyMode,
    pub row_guard: RowGuardMode,
    /// Deposits' edge lock on each event: `on` or `off` (off is safe; the
    /// inbox still applies each event once).
    pub event_lock: &'static str,
    pub inbox: InboxMode,
    /// The unsafe switches in effect, by name.
    pub unsafe_modes: Vec<&'static str>,
}

impl DefenseMode {
    pub fn of(config: &Config) -> Self {
        let unsafe_modes = config.unsafe_modes();
        Self {
            safe: unsafe_modes.is_empty(),
            cooldown: if config.cooldown.enabled { "on" } else { "off" },
            idempotency: config.idempotency.mode,
            row_guard: config.row_guard.mode,
            event_lock: if config.deposits.event_lock_enabled {
                "on"
            } else {
                "off"
            },
            inbox: config.deposits.inbox_mode,
            unsafe_modes,
        }
    }
}

/// What the public `/readyz` says: the verdict only. The details (pool
/// states, fail-open counts, defense modes) are for operators, on the admin
/// listener.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ReadinessStatus {
    /// `ready`, `degraded` (Redis is down and the cooldown fails open), or
    /// `not_ready`.
    pub status: &'static str,
}

/// Ready to take traffic: PostgreSQL answers, and Redis answers or the
/// policy lets transfers go on without it. Under `fail_open` a Redis outage
/// leaves the instance ready with status `degraded` (and the
/// `wallet_cooldown_degraded` gauge at 1): every instance shares the one
/// Redis, so answering 503 would make a load balancer remove them all while
/// they can still serve. Under `fail_closed`, and whenever PostgreSQL is
/// down, 503. This is the probe for load balancers; the admin listener's
/// `/readyz` says why.
#[utoipa::path(get, path = "/readyz", tag = "health",
    responses((status = 200, body = ReadinessStatus), (status = 503, body = ReadinessStatus)))]
pub async fn readyz(state: web::Data<AppState>, last: web::Data<LastVerdict>) -> HttpResponse {
    let readiness = probe(&state, &last).await;
    let body = ReadinessStatus {
        status: readiness.status,
    };
    answer(readiness.is_ready(), body)
}

/// The admin listener's `/readyz`: the same verdict and status code, with
/// each store's state, the fail-open count and the defense modes.
pub async fn readyz_detailed(state: web::Data<AppState>, last: web::Data<LastVerdict>) -> HttpResponse {
    let readiness = probe(&state, &last).await;
    answer(readiness.is_ready(), readiness)
}

/// 200 when ready, 503 when not, with `body` either way.
fn answer(ready: bool, body: impl Serialize) -> HttpResponse {
    if ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

impl Readiness {
    fn is_ready(&self) -> bool {
        self.status != "not_ready"
    }
}

/// The last readiness verdict of this instance and when it was reached:
/// probes are answered from it for `readiness_cache_ms`.
#[derive(Default)]
pub struct LastVerdict(tokio::sync::Mutex<Option<Probed>>);

struct Probed {
    readiness: Readiness,
    at: std::time::Instant,
}

/// The stores' readiness, probed at most once per `readiness_cache_ms` on
/// this instance: probes that come while one is under way wait for it and
/// share its verdict, so that anyone calling `/readyz` in a loop costs the
/// stores nothing more.
async fn probe(state: &AppState, last: &LastVerdict) -> Readiness {
    let mut last = last.0.lock().await;
    if let Some(probed) = last.as_ref()
        && probed.at.elapsed() < state.config.http.readiness_cache
    {
        return probed.readiness.clone();
    }
    let readiness = probe_stores(state).await;
    *last = Some(Probed {
        readiness: readiness.clone(),
        at: std::time::Instant::now(),
    });
    readiness
}

async fn probe_stores(state: &AppState) -> Readiness {
    let probe_timeout = state.config.database.acquire_wait_max;
    let postgres = tokio::time::timeout(probe_timeout, sqlx::query("SELECT 1").execute(&state.db)).await;
    let postgres_ok = matches!(postgres, Ok(Ok(_)));

    let redis = match &state.redis {
        None => "disabled",
        Some(store) => {
            let ping = async {
                let mut conn = store.get().await?;
                redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .map_err(|e| e.to_string())
            };
            let timeout = state.config.redis.command_timeout;
            match tokio::time::timeout(timeout, ping).await {
                Ok(Ok(_)) => "ok",
                _ if state.config.cooldown.on_store_error == StoreErrorPolicy::FailOpen => "degraded",
                _ => "unreachable",
            }
        }
    };
    state
        .metrics
        .cooldown_degraded
        .set(i64::from(redis == "degraded"));
    let ready = postgres_ok && redis != "unreachable";
    Readiness {
        status: match (ready, redis) {
            (false, _) => "not_ready",
            (true, "degraded") => "degraded",
            (true, _) => "ready",
        },
        postgres: if postgres_ok { "ok" } else { "unreachable" },
        redis,
        cooldown_fail_open_passes: state.cooldown.fail_open_passes(),
        mode: DefenseMode::of(&state.config),
    }
}

/// `GET /metrics`: Prometheus text, with the PostgreSQL pool gauges and
/// the sweeper's backlog refreshed now. (Redis has a connection per thread
/// that uses it, not a pool.)
pub async fn metrics(state: web::Data<AppState>) -> actix_web::HttpResponse {
    // One descent of the `expires_at` index, bounded like any checkout; a
    // scrape while PostgreSQL is away keeps the last reading.
    let oldest_expired = tokio::time::timeout(
        state.config.database.acquire_wait_max,
        crate::sweep::oldest_expired_idempotency_key_age_s(&state.db),
    )
    .await;
    if let Ok(Ok(age_s)) = oldest_expired {
        state.metrics.idempotency_oldest_expired_age.set(age_s);
    }
    let db_size = state.db.size() as usize;
    let db_idle = state.db.num_idle();
    state.metrics.set_pool(
        "postgres",
        db_size.saturating_sub(db_idle),
        db_idle,
        state.config.database.pool_connections_max as usize,
    );
    state
        .metrics
        .set_transfer_admission(state.transfer_admission.occupancy());
    actix_web::HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(state.metrics.render())
}
