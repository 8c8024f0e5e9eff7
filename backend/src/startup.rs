//! Builds the application: the listeners, the shared state, the HTTP
//! server and the background tasks (sweeper, consumers, dispatcher). The
//! pools and migrations are in `database`, the routes in `router`.
//! `main` and the tests both go through `Application::build`, so the tests
//! run exactly the server users run.

use std::sync::Arc;

use actix_web::dev::Server;
use actix_web::{App, HttpServer, web};
use secrecy::ExposeSecret;
use sqlx::PgPool;

use crate::account_limits::AccountLimits;
use crate::auth::TokenSigner;
use crate::database::{db_pool, migrate, migration_pool};
use crate::defense::cooldown::CooldownLock;
use crate::feed::DecisionFeed;
use crate::listener;
use crate::metrics::Metrics;
use crate::openapi;
use crate::redis_store::{RedisStore, StreamClient};
use crate::router;
use crate::settings::{Config, Settings};
use crate::state::AppState;
use crate::telemetry;

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
        warn_if_unsafe(&config);
        let db = db_pool(&config.database)?;
        if config.database.migrate_on_start {
            prepare_database(&db, &config).await?;
        }
        let (listener, admin_listener) = bind_listeners(&config)?;
        let public_address = reachable_from_here(listener.local_addr()?);
        let port = public_address.port();
        let admin_port = admin_listener.local_addr()?.port();
        let (state, commands_client) = assemble_state(config, db.clone(), public_address)?;
        let sweeper = crate::sweep::spawn_sweeper(
            db,
            state.config.idempotency.sweep_interval,
            state.config.idempotency.sweep_batch_rows_max,
        );
        let consumers = match commands_client {
            Some(client) if state.config.commands.enabled => {
                crate::command::partition::spawn(state.clone(), client)
            }
            _ => Vec::new(),
        };
        let dispatcher = crate::payout::dispatcher::spawn(state.clone())?;
        let http = state.config.http.clone();
        let doors = crate::shutdown::Doors::of(&[&listener, &admin_listener])?;
        let draining = state.draining.clone();
        let server = http_server(state, listener, admin_listener, admin_port)?;
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
        for task in &self.consumers {
            task.abort();
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

/// A demonstration instance says so loudly, once, at start-up.
fn warn_if_unsafe(config: &Config) {
    let unsafe_modes = config.unsafe_modes();
    if !unsafe_modes.is_empty() {
        tracing::warn!(
            modes = %unsafe_modes.join(", "),
            "UNSAFE DEMONSTRATION MODE: this instance can charge twice, overdraw or lose updates. \
             Never run it with real money."
        );
    }
}

/// `migrate_on_start`: the schema, as its owner, then the accounts every
/// deployment has (the demo recipient and the clearing wallets).
async fn prepare_database(db: &PgPool, config: &Config) -> anyhow::Result<()> {
    let owner = migration_pool(&config.database)?;
    migrate(&owner).await?;
    owner.close().await;
    crate::system_accounts::ensure(db, config)
        .await
        .map_err(|error| anyhow::anyhow!("failed to make the demo recipient: {error}"))?;
    crate::system_accounts::ensure_provider_clearing(db, config)
        .await
        .map_err(|error| anyhow::anyhow!("failed to make the provider's clearing account: {error}"))?;
    crate::system_accounts::ensure_payout_accounts(db, config)
        .await
        .map_err(|error| anyhow::anyhow!("failed to make the payouts' clearing accounts: {error}"))
}

/// The public and the admin listener, each with the listen backlog.
fn bind_listeners(config: &Config) -> anyhow::Result<(std::net::TcpListener, std::net::TcpListener)> {
    let http = &config.http;
    let backlog = http.listen_backlog_connections;
    listener::warn_if_the_kernel_caps(backlog);
    let public = listener::bind((http.host.as_str(), http.port), backlog)
        .map_err(|error| anyhow::anyhow!("failed to bind {}:{}: {error}", http.host, http.port))?;
    let admin = listener::bind(http.admin_addr.as_str(), backlog)
        .map_err(|error| anyhow::anyhow!("failed to bind admin_http_addr {}: {error}", http.admin_addr))?;
    Ok((public, admin))
}

/// The Redis connections: the shared one and the stream client (none when
/// nothing uses Redis), and the commands' stream client, which may be a
/// Redis of its own (`commands_redis_url`).
fn connect_redis(
    config: &Config,
    metrics: &Metrics,
) -> anyhow::Result<(Option<RedisStore>, Option<StreamClient>, Option<StreamClient>)> {
    let (redis, redis_client) = if config.uses_redis() {
        (
            Some(RedisStore::connect(&config.redis)?.count_round_trips_in(metrics.redis_round_trips.clone())),
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
    Ok((redis, redis_client, commands_client))
}

/// Everything the handlers and the background tasks share, and the
/// commands' stream client for the consumers.
fn assemble_state(
    config: Config,
    db: PgPool,
    public_address: std::net::SocketAddr,
) -> anyhow::Result<(AppState, Option<StreamClient>)> {
    let metrics = Metrics::new();
    metrics.cooldown_window.set(config.cooldown.ttl.as_secs_f64());
    let (redis, redis_client, commands_client) = connect_redis(&config, &metrics)?;
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
    let transfers = crate::executors::Executors::new(
        db.clone(),
        crate::transfer::call::TransferCall::of(&config),
        config.database.transfer_executors,
        metrics.transfer_batch_transfers.clone(),
    );
    let state = AppState {
        cooldown: CooldownLock::new(&config, redis.clone(), metrics.cooldown_fail_open.clone()),
        event_lock: crate::defense::edge_lock::EventLock::new(&config, redis.clone()),
        provider_signatures: crate::auth::provider_signature::ProviderSignatures::new(
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
        db,
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
        lab_passes: Arc::new(crate::auth::lab_pass::LabPasses::new(
            config.race_lab.passes_held_max,
        )),
        streams_per_user: Arc::default(),
        streams_per_address: Arc::default(),
        instance_id,
        transfer_admission: Arc::new(crate::admission::Admission::new(&config.database)),
        transfers,
        api_document: serde_json::to_vec(&openapi::document(&config))?.into(),
        draining: crate::shutdown::Draining::default(),
        config: Arc::new(config),
    };
    Ok((state, commands_client))
}

/// The HTTP server on both listeners: one set of workers, the middleware
/// in the order a request meets it (outermost last), and the connection
/// bounds.
fn http_server(
    state: AppState,
    listener: std::net::TcpListener,
    admin_listener: std::net::TcpListener,
    admin_port: u16,
) -> anyhow::Result<Server> {
    let http = state.config.http.clone();
    let draining = state.draining.clone();
    let body_wait = crate::body_deadline::BodyWait(http.request_body_wait_max);
    let data = web::Data::new(state);
    // One per instance, shared by its workers: probes within
    // `readiness_cache_ms` of each other share one verdict.
    let last_verdict = web::Data::new(crate::routes::health::LastVerdict::default());
    let server = HttpServer::new(move || {
        // Runs on each worker's thread as it starts: the transfer executors
        // run beside the requests they serve (`crate::executors`).
        data.transfers.start_on_this_thread();
        App::new()
            .app_data(data.clone())
            .app_data(draining.clone())
            .app_data(body_wait)
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
    .workers(http.workers)
    .max_connections(http.connections_per_worker_max)
    .keep_alive(http.keep_alive)
    .client_request_timeout(http.request_head_wait_max)
    // The answers given when the grace ends get time to go out.
    .shutdown_timeout(http.shutdown_grace.as_secs() + crate::shutdown::LAST_ANSWERS.as_secs())
    // `main` handles the signals (`shutdown::Stopper`): it marks the
    // instance draining before the workers stop, and bounds the exit.
    .disable_signals()
    .listen(listener)?
    .listen(admin_listener)?
    .run();
    Ok(server)
}

fn security_headers() -> actix_web::middleware::DefaultHeaders {
    actix_web::middleware::DefaultHeaders::new()
        .add(("Content-Security-Policy", CONTENT_SECURITY_POLICY))
        .add(("X-Frame-Options", "DENY"))
        .add(("X-Content-Type-Options", "nosniff"))
        .add(("Referrer-Policy", "same-origin"))
        .add(("Cache-Control", "no-store"))
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
