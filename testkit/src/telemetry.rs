//! One telemetry pipeline for the whole test process, keeping the spans in
//! memory: tracing can be installed only once per process, and every app
//! the process spawns reports into it.

use std::sync::OnceLock;

use opentelemetry_sdk::trace::InMemorySpanExporter;

/// Every span the apps in this test process finished, for tests that
/// assert on traces. TEST_LOG=1 also prints the servers' logs.
pub fn spans() -> &'static InMemorySpanExporter {
    install_telemetry()
}

pub(crate) fn install_telemetry() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let guard = layered_wallet::telemetry::init_with_exporter(
            layered_wallet::settings::LogFormat::Text,
            std::env::var_os("TEST_LOG").is_some(),
            exporter.clone(),
        );
        // The provider lives as long as the test process.
        std::mem::forget(guard);
        exporter
    })
}
