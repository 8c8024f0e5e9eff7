//! Builds the application: pools, migrations, the route table, the sweeper.
//! `main` and the tests both go through `Application::build`, so the tests
//! run exactly the server users run.

use std::net::TcpListener;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::{App, HttpServer, web};
use secrecy::ExposeSecret;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::auth::TokenSigner;
use crate::defense::cooldown::CooldownLock;
use crate::defense::idempotency;
use crate::openapi;
use crate::routes::{self, health, transfers, users, wallets};
use crate::settings::Settings;
use crate::state::AppState;

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

pub struct Application {
    port: u16,
    server: Server,
    sweeper: tokio::task::JoinHandle<()>,
}

impl Application {
    /// Validates the settings, connects lazily (the server starts even if a
    /// store is down, and /readyz says so), migrates if asked, and binds.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        settings.validate()?;
        let db = db_pool(&settings)?;
        if settings.migrate_on_start {
            // sqlx takes an advisory lock, so instances starting together
            // do not race on the schema.
            MIGRATOR
                .run(&db)
                .await
                .map_err(|error| anyhow::anyhow!("failed to apply migrations: {error}"))?;
        }
        let listener = TcpListener::bind((settings.http_host.as_str(), settings.http_port))
            .map_err(|error| {
                anyhow::anyhow!(
                    "failed to bind {}:{}: {error}",
                    settings.http_host,
                    settings.http_port
                )
            })?;
        let port = listener.local_addr()?.port();
        let state = AppState {
            cooldown: CooldownLock::from_settings(&settings)?,
            tokens: TokenSigner::new(&settings.token_signing_key),
            db: db.clone(),
            settings: Arc::new(settings),
        };
        let sweeper = idempotency::spawn_sweeper(
            db,
            Duration::from_secs(state.settings.idempotency_sweep_interval_s),
            state.settings.idempotency_sweep_batch_rows_max,
        );
        let workers = state.settings.http_workers;
        let grace_s = state.settings.shutdown_grace_s;
        let data = web::Data::new(state);
        let server =
            HttpServer::new(move || App::new().app_data(data.clone()).configure(configure))
                .workers(workers)
                .shutdown_timeout(grace_s)
                .listen(listener)?
                .run();
        Ok(Self {
            port,
            server,
            sweeper,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server from elsewhere (tests, embedding).
    pub fn handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }

    /// Serves until SIGINT or SIGTERM, then drains in-flight requests for
    /// up to `shutdown_grace_s` and stops the sweeper.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let result = self.server.await;
        self.sweeper.abort();
        result
    }
}

/// The route table.
pub fn configure(config: &mut web::ServiceConfig) {
    config
        .route("/healthz", web::get().to(health::healthz))
        .route("/readyz", web::get().to(health::readyz))
        .route("/api/openapi.json", web::get().to(openapi::serve))
        .service(
            web::scope("/api/v1")
                .route("/users", web::post().to(users::sign_up))
                .route("/tokens", web::post().to(users::sign_in))
                .route("/tokens/current", web::delete().to(users::revoke_current))
                .route("/wallets/{id}", web::get().to(wallets::get_wallet))
                .route("/transfers", web::post().to(transfers::create_transfer))
                .route("/transfers", web::get().to(transfers::list_transfers))
                .route("/transfers/{id}", web::get().to(transfers::get_transfer)),
        )
        .default_service(web::to(routes::not_found));
}

/// A PostgreSQL pool with every limit explicit. Connects lazily.
pub fn db_pool(settings: &Settings) -> anyhow::Result<PgPool> {
    let options = PgConnectOptions::from_str(settings.database_url.expose_secret())
        .map_err(|_| anyhow::anyhow!("database_url is not a valid PostgreSQL URL"))?
        .application_name("layered-wallet")
        .options([(
            "statement_timeout",
            format!("{}ms", settings.db_statement_timeout_ms),
        )]);
    Ok(PgPoolOptions::new()
        .max_connections(settings.db_pool_connections_max)
        .min_connections(settings.db_pool_connections_min)
        .acquire_timeout(Duration::from_millis(settings.db_acquire_wait_ms_max))
        .connect_lazy_with(options))
}
