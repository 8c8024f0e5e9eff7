//! A test app: the server on a thread and runtime of its own, on a random
//! port, with the test's own pool on its database; and how it is spawned,
//! killed and cleaned up.

use layered_wallet::settings::Settings;
use layered_wallet::startup::Application;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use uuid::Uuid;

use crate::proxy;
use crate::telemetry::install_telemetry;
use crate::{
    assert_redis_reachable, create_database, database_url_of, database_url_via, drop_database, test_settings,
};

pub struct TestApp {
    pub address: String,
    /// The admin listener: `/metrics` and the detailed `/readyz`.
    pub admin_address: String,
    /// The test's own pool on the app's database, for asserting on state.
    pub db: PgPool,
    pub db_options: PgConnectOptions,
    pub redis_prefix: String,
    pub client: reqwest::Client,
    pub settings: Settings,
    server: Option<(actix_web::dev::ServerHandle, std::thread::JoinHandle<()>)>,
    /// Shares its database with another TestApp, which drops it.
    second_instance: bool,
}

/// A fresh database and Redis prefix, and an app on them with `adjust`
/// applied to the settings.
pub async fn spawn_app(adjust: impl FnOnce(&mut Settings)) -> TestApp {
    assert_redis_reachable().await;
    let (_, options) = create_database().await;
    let prefix = format!("test:{}:", Uuid::new_v4().simple());
    let mut settings = test_settings(&database_url_of(&options), &prefix);
    adjust(&mut settings);
    spawn_with(settings, options).await
}

/// Like `spawn_app`, with a counting proxy between the app and PostgreSQL.
pub async fn spawn_app_behind_proxy(adjust: impl FnOnce(&mut Settings)) -> (TestApp, proxy::CountingProxy) {
    assert_redis_reachable().await;
    let (_, options) = create_database().await;
    let upstream = format!("127.0.0.1:{}", options.get_port())
        .parse()
        .expect("address");
    let proxy = proxy::CountingProxy::start(upstream).await;
    let prefix = format!("test:{}:", Uuid::new_v4().simple());
    let mut settings = test_settings(&database_url_via(&options, proxy.port), &prefix);
    adjust(&mut settings);
    (spawn_with(settings, options).await, proxy)
}

/// A second app on the same database and Redis prefix as `first`: another
/// instance of one deployment, with its own pools.
pub async fn spawn_second_instance(first: &TestApp) -> TestApp {
    spawn_second_instance_with(first, |_| {}).await
}

/// Like `spawn_second_instance`, with `adjust` applied to its settings.
pub async fn spawn_second_instance_with(first: &TestApp, adjust: impl FnOnce(&mut Settings)) -> TestApp {
    let mut settings = first.settings.clone();
    settings.http_port = 0;
    adjust(&mut settings);
    let mut second = spawn_with(settings, first.db_options.clone()).await;
    second.mark_second_instance();
    second
}

pub async fn spawn_with(settings: Settings, db_options: PgConnectOptions) -> TestApp {
    install_telemetry();
    // The server runs on a thread and runtime of its own, so that it outlives
    // nothing it should not: dropping the TestApp stops it and closes its
    // pools, and the test's database is dropped after it.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let server_settings = settings.clone();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("server runtime");
        runtime.block_on(async move {
            let app = Application::build(server_settings)
                .await
                .expect("the app must start");
            let _ = started_tx.send((app.port(), app.admin_port(), app.handle()));
            let _ = app.run_until_stopped().await;
        });
    });
    let (port, admin_port, handle) = started_rx.await.expect("the app started");
    let db = PgPoolOptions::new()
        .max_connections(3)
        .connect_with(db_options.clone())
        .await
        .expect("the test connects to its database");
    TestApp {
        address: format!("http://127.0.0.1:{port}"),
        admin_address: format!("http://127.0.0.1:{admin_port}"),
        db,
        db_options,
        redis_prefix: settings.redis_key_prefix.clone(),
        client: wallet_client::http_client_builder()
            .pool_max_idle_per_host(256)
            .build()
            .expect("client"),
        settings,
        server: Some((handle, thread)),
        second_instance: false,
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        let Some((handle, thread)) = self.server.take() else {
            return;
        };
        let database = self.db_options.get_database().map(str::to_owned);
        let second_instance = self.second_instance;
        // Blocking here is fine: the server lives on its own thread.
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                handle.stop(false).await;
                let _ = thread.join();
                if let (Some(database), false) = (database, second_instance) {
                    drop_database(&database).await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

impl TestApp {
    /// Stops the server at once, as a crash would: open connections are
    /// dropped, in-flight requests fail.
    pub async fn kill(&mut self) {
        if let Some((handle, thread)) = self.server.take() {
            handle.stop(false).await;
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }

    pub fn port(&self) -> u16 {
        self.address
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0)
    }

    /// This app shares its database with another, which drops it.
    pub fn mark_second_instance(&mut self) {
        self.second_instance = true;
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("{}{path}", self.admin_address)
    }
}
