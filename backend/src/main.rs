//! `wallet-server [serve|migrate] [--config FILE]`
//!
//! `serve` (the default) runs the HTTP server; `migrate` applies pending
//! migrations and exits.

use std::path::PathBuf;

use layered_wallet::settings::Settings;
use layered_wallet::startup::{self, Application};
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
            "serve" | "migrate" => command = arg,
            "-h" | "--help" => {
                println!("usage: wallet-server [serve|migrate] [--config FILE]");
                return Ok(());
            }
            other => anyhow::bail!("unknown argument {other:?}; try --help"),
        }
    }

    let settings = Settings::load(config_file.as_deref())?;
    let _telemetry = telemetry::init(settings.log_format);
    settings.validate()?;

    if command == "migrate" {
        let db = startup::db_pool(&settings)?;
        startup::MIGRATOR.run(&db).await?;
        tracing::info!("migrations applied");
        return Ok(());
    }

    let app = Application::build(settings).await?;
    tracing::info!(port = app.port(), "wallet-server listening");
    app.run_until_stopped().await?;
    Ok(())
}
