//! Builds the application: pools, migrations, the listeners, the sweeper.
//! The routes are in `router`.
//! `main` and the tests both go through `Application::build`, so the tests
//! run exactly the server users run.

use std::sync::Arc;

use actix_web::dev::Server;
use actix_web::{App, HttpServer, web};
use secrecy::ExposeSecret;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::account_limits::AccountLimits;
use crate::auth::TokenSigner;
use crate::database_hosts::{self, DatabaseHosts, PoolMoves};
use crate::decision::feed::DecisionFeed;
use crate::defense::cooldown::CooldownLock;
use crate::listener;
use crate::metrics::Metrics;
use crate::openapi;
use crate::redis_store::{RedisStore, StreamClient};
use crate::router;
use crate::settings::{Database, Settings};
use crate::state::AppState;
use crate::telemetry;

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

pub struct Application {
    port: u16,
    admin_port: u16,
    /// One server on both listeners: one set of workers, one shutdown.
    server: Server,
    sweeper: tokio::task::JoinHandle<()>,
    /// One task per command partition, when this instance consumes.
    consumers: Vec<tokio::task::JoinHandle<()>>,
    /// The payout dispatcher, when this instance sends payouts.
    dispatcher: Option<tokio::task::JoinHandle<()>>,
    stopper: crate::shutdown::Stopper,
}

impl Application {
    /// Validates the settings, connects lazily (the server starts even if a
    /// store is down, and /readyz says so), migrates if asked, and binds.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let config = settings.validate()?;
        let unsafe_modes = config.unsafe_modes();
        if !unsafe_modes.is_empty() {
            tracing::warn!(
                modes = %unsafe_modes.join(", "),
                "UNSAFE DEMONSTRATION MODE: this instance can charge twice, overdraw or lose updates. \
                 Never run it with real money."
            );
        }
        let db = db_pool(&config.database)?;
        if config.database.migrate_on_start {
            let owner = migration_pool(&config.database)?;
            migrate(&owner).await?;
            owner.close().await;
            crate::system_accounts::ensure(&db, &config)
                .await
                .map_err(|error| anyhow::anyhow!("failed to make the demo recipient: {error}"))?;
            crate::system_accounts::ensure_provider_clearing(&db, &config)
                .await
                .map_err(|error| {
                    anyhow::anyhow!("failed to make the provider's clearing account: {error}")
                })?;
            crate::system_accounts::ensure_payout_accounts(&db, &config)
                .await
                .map_err(|error| anyhow::anyhow!("failed to make the payouts' clearing accounts: {error}"))?;
        }
        let backlog = config.http.listen_backlog_connections;
        listener::warn_if_the_kernel_caps(backlog);
        let listener =
            listener::bind((config.http.host.as_str(), config.http.port), backlog).map_err(|error| {
                anyhow::anyhow!(
                    "failed to bind {}:{}: {error}",
                    config.http.host,
                    config.http.port
                )
            })?;
        let public_address = reachable_from_here(listener.local_addr()?);
        let port = public_address.port();
        let admin_listener = listener::bind(config.http.admin_addr.as_str(), backlog).map_err(|error| {
            anyhow::anyhow!(
                "failed to bind admin_http_addr {}: {error}",
                config.http.admin_addr
            )
        })?;
        let admin_port = admin_listener.local_addr()?.port();
        let metrics = Metrics::new();
        metrics.cooldown_window.set(config.cooldown.ttl.as_secs_f64());
        let (redis, redis_client) = if config.uses_redis() {
            (
                Some(
                    RedisStore::connect(&config.redis)?
                        .count_round_trips_in(metrics.redis_round_trips.clone()),
                ),
                Some(StreamClient::for_config(&config.redis)?),
            )
        } else {
            (None, None)
        };
        let commands_client = match config.commands.redis_url.expose_secret() {
            "" => redis_client.clone(),
            url => Some(StreamClient::Single(redis::Client::open(url).map_err(
                |error| anyhow::anyhow!("invalid commands_redis_url: {error}"),
            )?)),
        };
        let feed = DecisionFeed::start(
            redis.clone().filter(|_| config.feed.enabled),
            redis_client.filter(|_| config.feed.enabled),
            &config.feed,
            &config.redis,
            metrics.clone(),
        );
        let instance_id: Arc<str> = if config.http.instance_id.is_empty() {
            default_instance_id().into()
        } else {
            config.http.instance_id.as_str().into()
        };
        let state = AppState {
            cooldown: CooldownLock::new(&config, redis.clone(), metrics.cooldown_fail_open.clone()),
            event_lock: crate::deposit::edge::EventLock::new(&config, redis.clone()),
            provider_signatures: crate::deposit::signature::ProviderSignatures::new(
                config.deposits.provider_webhook_secrets.clone(),
                config.deposits.signature_tolerance,
            ),
            account_limits: Arc::new(AccountLimits::new(
                &config,
                redis.clone(),
                metrics.account_limits_fail_open.clone(),
            )),
            tokens: TokenSigner::new(&config.accounts.token_signing_key),
            passwords: crate::auth::PasswordWorkers::start(
                config.accounts.password_hash_threads,
                config.accounts.password_hash_queue_max,
            ),
            db: db.clone(),
            redis,
            metrics,
            feed,
            stream_slots: Arc::new(tokio::sync::Semaphore::new(config.feed.streams_max)),
            public_address,
            lab_runs: Arc::new(tokio::sync::Semaphore::new(config.race_lab.runs_in_flight_max)),
            lab_requests: Arc::new(tokio::sync::Semaphore::new(
                config.race_lab.requests_in_flight_max,
            )),
            lab_db_slots: Arc::new(tokio::sync::Semaphore::new(config.race_lab.db_connections_max)),
            lab_passes: Arc::new(crate::race_lab::pass::LabPasses::new(
                config.race_lab.passes_held_max,
            )),
            streams_per_user: Arc::default(),
            streams_per_address: Arc::default(),
            instance_id,
            transfer_admission: Arc::new(crate::transfer::admission::Admission::new(&config.database)),
            api_document: serde_json::to_vec(&openapi::document(&config))?.into(),
            draining: crate::shutdown::Draining::default(),
            config: Arc::new(config),
        };
        let sweeper = crate::sweep::spawn_sweeper(
            db,
            state.config.idempotency.sweep_interval,
            state.config.idempotency.sweep_batch_rows_max,
        );
        let consumers = match commands_client {
            Some(client) if state.config.commands.enabled => {
                crate::command::consumer::spawn(state.clone(), client)
            }
            _ => Vec::new(),
        };
        let dispatcher = crate::payout::dispatcher::spawn(state.clone())?;
        let http = state.config.http.clone();
        let workers = http.workers;
        let grace_s = http.shutdown_grace.as_secs();
        let doors = crate::shutdown::Doors::of(&[&listener, &admin_listener])?;
        let draining = state.draining.clone();
        let data = web::Data::new(state);
        // One per instance, shared by its workers: probes within
        // `readiness_cache_ms` of each other share one verdict.
        let last_verdict = web::Data::new(crate::routes::health::LastVerdict::default());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .app_data(last_verdict.clone())
                .app_data(telemetry::RoutePatterns(router::pattern_of))
                .app_data(web::FormConfig::default().error_handler(crate::web::pages::unreadable_form))
                .wrap(actix_web::middleware::from_fn(
                    crate::body_deadline::bound_body_wait,
                ))
                .wrap(actix_web::middleware::from_fn(
                    crate::shutdown::close_connections_while_draining,
                ))
                .wrap(actix_web::middleware::from_fn(
                    crate::shutdown::answer_before_the_grace_ends,
                ))
                .wrap(security_headers())
                .wrap(actix_web::middleware::from_fn(telemetry::trace_requests))
                .wrap(actix_web::middleware::from_fn(listener::keep_listeners_apart))
                .configure(router::configure_admin)
                .configure(router::configure)
        })
        .on_connect(move |connection, extensions| {
            let local_port = connection
                .downcast_ref::<actix_web::rt::net::TcpStream>()
                .and_then(|stream| stream.local_addr().ok())
                .map(|address| address.port());
            extensions.insert(if local_port == Some(admin_port) {
                listener::Listener::Admin
            } else {
                listener::Listener::Public
            });
        })
        .workers(workers)
        .max_connections(http.connections_per_worker_max)
        .keep_alive(http.keep_alive)
        .client_request_timeout(http.request_head_wait_max)
        // The answers given when the grace ends get time to go out.
        .shutdown_timeout(grace_s + crate::shutdown::LAST_ANSWERS.as_secs())
        // `main` handles the signals (`shutdown::Stopper`): it marks the
        // instance draining before the workers stop, and bounds the exit.
        .disable_signals()
        .listen(listener)?
        .listen(admin_listener)?
        .run();
        let stopper = crate::shutdown::Stopper {
            server: server.handle(),
            draining,
            doors: Arc::new(doors),
            grace: http.shutdown_grace,
            cleanup: http.shutdown_cleanup_max,
        };
        Ok(Self {
            port,
            admin_port,
            server,
            stopper,
            sweeper,
            consumers,
            dispatcher,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port of the admin listener (`/metrics`, the detailed `/readyz`).
    pub fn admin_port(&self) -> u16 {
        self.admin_port
    }

    /// Stops the server from elsewhere (tests, embedding).
    pub fn handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }

    /// Stops the instance as a signal does: draining first, within the
    /// grace (`shutdown`).
    pub fn stopper(&self) -> crate::shutdown::Stopper {
        self.stopper.clone()
    }

    /// Serves until stopped (`stopper`; `main` stops it on SIGTERM or
    /// SIGINT), then stops the background tasks.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let result = self.server.await;
        self.sweeper.abort();
        for consumer in &self.consumers {
            consumer.abort();
        }
        if let Some(dispatcher) = &self.dispatcher {
            dispatcher.abort();
        }
        result
    }
}

/// What every public response carries. Scripts and styles come only from
/// this origin (the pages have no inline script, style or handler), no
/// other site may frame a page (clickjacking), browsers must not guess
/// content types, and other sites are not told which page linked to them.
/// Nothing is kept by a browser or a proxy: answers carry tokens, balances,
/// transfers and decisions, and pages are a signed-in person's. Only the
/// static files, which say otherwise themselves, may be cached.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

fn security_headers() -> actix_web::middleware::DefaultHeaders {
    actix_web::middleware::DefaultHeaders::new()
        .add(("Content-Security-Policy", CONTENT_SECURITY_POLICY))
        .add(("X-Frame-Options", "DENY"))
        .add(("X-Content-Type-Options", "nosniff"))
        .add(("Referrer-Policy", "same-origin"))
        .add(("Cache-Control", "no-store"))
}

/// Applies pending migrations, then fills in what a migration cannot
/// compute in SQL (the comparable names of older accounts). sqlx takes an
/// advisory lock, so instances starting together do not race on the schema.
pub async fn migrate(db: &PgPool) -> anyhow::Result<()> {
    MIGRATOR.run(db).await.map_err(|error| match error {
        // Checked before anything is applied, so the database is untouched.
        sqlx::migrate::MigrateError::VersionMissing(version) => anyhow::anyhow!(
            "this database was made by an earlier build: it records migration {version}, which the schema's \
             baseline no longer has (migrations/README.md). Nothing was changed. Drop the database and create \
             it empty, or point DATABASE_URL at a new one; ./scripts/serve does this for its own local database"
        ),
        sqlx::migrate::MigrateError::VersionMismatch(version) => anyhow::anyhow!(
            "this database was made by an earlier build: its migration {version} differs from the schema's \
             baseline of that number (migrations/README.md). Nothing was changed. Drop the database and create \
             it empty, or point DATABASE_URL at a new one; ./scripts/serve does this for its own local database"
        ),
        error => anyhow::anyhow!("failed to apply migrations: {error}"),
    })?;
    crate::names::backfill(db)
        .await
        .map_err(|error| anyhow::anyhow!("failed to fill in the comparable names: {error}"))
}

/// A PostgreSQL pool with every limit explicit, as the server's role.
/// Connects lazily.
pub fn db_pool(database: &Database) -> anyhow::Result<PgPool> {
    pool_for(database, database.url.expose_secret(), "database_url")
}

/// A pool as the owning role, for migrations: `database_migration_url`,
/// or `database_url` when that is empty.
pub fn migration_pool(database: &Database) -> anyhow::Result<PgPool> {
    let url = database.migration_url.expose_secret();
    if url.is_empty() {
        db_pool(database)
    } else {
        pool_for(database, url, "database_migration_url")
    }
}

fn pool_for(database: &Database, url: &str, setting: &str) -> anyhow::Result<PgPool> {
    let statement_timeout = format!("{}ms", database.statement_timeout.as_millis());
    let hosts = DatabaseHosts::parse(url)
        .map_err(|why| anyhow::anyhow!("{setting} is not a valid PostgreSQL URL: {why}"))?
        .map(|server| {
            server
                .application_name("layered-wallet")
                .options([("statement_timeout", statement_timeout.as_str())])
        });
    let writes_required = hosts.writes_required();
    let moves = Arc::new(PoolMoves::default());
    let moves_at_checkout = moves.clone();
    let check_idle_after = database.idle_check_after;
    let pool = PgPoolOptions::new()
        .max_connections(database.pool_connections_max)
        .min_connections(database.pool_connections_min)
        .acquire_timeout(database.acquire_wait_max)
        // `target_session_attrs=read-write`: a server that only reads (a
        // standby, a demoted primary) is refused, as libpq would.
        .after_connect(move |connection, _| {
            Box::pin(async move {
                if writes_required && !database_hosts::accepts_writes(connection).await? {
                    return Err(sqlx::Error::Protocol(
                        "the server takes no writes (target_session_attrs=read-write)".into(),
                    ));
                }
                Ok(())
            })
        })
        // A connection that broke while idle (a restart, a proxy's idle
        // timeout) must be found before a transfer is sent down it, or
        // the client is told "outcome unknown" where nothing was sent. The
        // check costs a round trip, so a deployment whose connections do
        // not break while idle may skip it for connections used within
        // `db_idle_check_after_ms` (0, the default: always check). One
        // opened before the pool moved to another server is closed.
        .test_before_acquire(false)
        .before_acquire(move |connection, meta| {
            let left_behind = moves_at_checkout.predates_last_move(meta.age);
            Box::pin(async move {
                if left_behind {
                    return Ok(false);
                }
                if check_idle_after.is_zero() || meta.idle_for >= check_idle_after {
                    sqlx::Connection::ping(connection).await?;
                }
                Ok(true)
            })
        })
        .connect_lazy_with(hosts.first());
    if hosts.has_alternatives() {
        database_hosts::watch(pool.clone(), hosts, moves, database.host_watch);
    }
    Ok(pool)
}

/// A bound address as a client on this host dials it: an unspecified
/// address (0.0.0.0, ::) is reached through loopback.
fn reachable_from_here(bound: std::net::SocketAddr) -> std::net::SocketAddr {
    match bound.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            (std::net::Ipv4Addr::LOCALHOST, bound.port()).into()
        }
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
            (std::net::Ipv6Addr::LOCALHOST, bound.port()).into()
        }
        _ => bound,
    }
}

/// The host name and a short random suffix: unique per process.
fn default_instance_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_else(|_| "wallet".to_owned());
    format!("{host}-{}", &uuid::Uuid::new_v4().simple().to_string()[..6])
}
