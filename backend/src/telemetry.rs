//! Logging set-up: readable lines by default, JSON with `log_format = json`.
//! Filter with `RUST_LOG` (default `info`).

use tracing_subscriber::EnvFilter;

use crate::settings::LogFormat;

pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    // `try_init` so that tests, which build many apps in one process, can
    // call this repeatedly.
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}
