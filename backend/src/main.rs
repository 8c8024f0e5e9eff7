//! `wallet-server [serve|migrate|reconcile|healthcheck] [--config FILE]`
//!
//! `serve` (the default) runs the HTTP server; `migrate` applies pending
//! migrations and exits; `reconcile` asks the bank gateway about every
//! payout that needs a person, settles or releases each from the answer,
//! prints what it did as JSON, and exits 1 if any is left; `healthcheck` asks the local server's `/readyz`
//! and exits 0 when it is ready (for container health checks, which have no
//! curl in the runtime image).

use std::path::PathBuf;

use layered_wallet::database;
use layered_wallet::settings::Settings;
use layered_wallet::startup::Application;
use layered_wallet::telemetry;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut command = "serve".to_owned();
    let mut config_file: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--config" => {
                config_file = Some(
                    args.next()
                        .ok_or_else(|| anyhow::anyhow!("--config needs a file"))?
                        .into(),
                );
            }
            "serve" | "migrate" | "reconcile" | "healthcheck" => command = arg,
            "-h" | "--help" => {
                println!("usage: wallet-server [serve|migrate|reconcile|healthcheck] [--config FILE]");
                return Ok(());
            }
            other => anyhow::bail!("unknown argument {other:?}; try --help"),
        }
    }

    let settings = Settings::load(config_file.as_deref())?;
    if command == "healthcheck" {
        std::process::exit(if healthcheck(settings.http_port) { 0 } else { 1 });
    }
    let _telemetry = telemetry::init(settings.log_format);
    let config = settings.validate()?;

    if command == "migrate" {
        let owner = database::migration_pool(&config.database)?;
        database::migrate(&owner).await?;
        layered_wallet::system_accounts::ensure(&owner, &config).await?;
        layered_wallet::system_accounts::ensure_provider_clearing(&owner, &config).await?;
        layered_wallet::system_accounts::ensure_payout_accounts(&owner, &config).await?;
        tracing::info!("migrations applied");
        return Ok(());
    }

    if command == "reconcile" {
        let db = database::db_pool(&config.database)?;
        let reconciled = layered_wallet::payout::reconcile::run(&db, &config).await?;
        println!("{}", serde_json::to_string_pretty(&reconciled)?);
        tracing::info!(
            settled = reconciled.settled.len(),
            released = reconciled.released.len(),
            left = reconciled.left.len(),
            "reconciled the payouts that needed a person"
        );
        std::process::exit(if reconciled.left.is_empty() { 0 } else { 1 });
    }

    let app = Application::build(settings).await?;
    tracing::info!(port = app.port(), "wallet-server listening");
    tokio::spawn(stop_on_signals(app.stopper()));
    app.run_until_stopped().await?;
    Ok(())
}

/// On SIGTERM or SIGINT: drain within the grace, and exit within
/// `shutdown_grace_s` + `shutdown_cleanup_ms_max` whatever is still running
/// then (a task stuck in a store call, a blocking thread the runtime would
/// wait for). A second signal exits at once.
async fn stop_on_signals(stopper: layered_wallet::shutdown::Stopper) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut terminate), Ok(mut interrupt)) =
        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        tracing::error!("could not listen for SIGTERM and SIGINT; stop this process with SIGKILL");
        return;
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    let bound = stopper.exit_bound();
    tracing::info!(
        grace_s = stopper.grace.as_secs(),
        exit_within_ms = bound.as_millis() as u64,
        "stopping: the listeners are closed, requests in flight get the grace"
    );
    // A thread of its own: it must fire even if the runtime is wedged.
    std::thread::spawn(move || {
        std::thread::sleep(bound);
        eprintln!(
            "wallet-server: still running {} ms after the stop signal; exiting",
            bound.as_millis()
        );
        std::process::exit(1);
    });
    let stopping = stopper.clone();
    tokio::spawn(async move { stopping.stop().await });
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    tracing::warn!("a second stop signal: exiting now");
    std::process::exit(1);
}

/// `GET /readyz` on the local port with a plain socket: true on a 200.
fn healthcheck(port: u16) -> bool {
    use std::io::{Read, Write};
    use std::time::Duration;
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(3)));
    let request = "GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.starts_with("HTTP/1.1 200")
}
