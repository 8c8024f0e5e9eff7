//! Logs and traces.
//!
//! Logs: readable lines by default, JSON with `log_format = json`; filter
//! with `RUST_LOG` (default `info`).
//!
//! Traces: every request gets an OpenTelemetry server span (continuing the
//! caller's W3C `traceparent` when there is one) with a child span per
//! defense layer visited. Spans are exported over OTLP/HTTP only when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set (the standard `OTEL_*` variables
//! configure the exporter); without it, trace ids are still made and
//! returned to clients, and nothing is exported or logged about exporting.

use std::io::IsTerminal;
use std::rc::Rc;
use std::time::Instant;

use actix_web::HttpMessage;
use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanExporter};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};
use uuid::Uuid;

use crate::settings::LogFormat;

/// Keeps the tracer provider alive, when there is one; dropping it flushes
/// pending spans.
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = &self.provider {
            let _ = provider.shutdown();
        }
    }
}

/// The server's set-up: logs to stdout, spans to OTLP when configured.
pub fn init(format: LogFormat) -> TelemetryGuard {
    let exporter = std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").and_then(|_| {
        match opentelemetry_otlp::SpanExporter::builder().with_http().build() {
            Ok(exporter) => Some(exporter),
            Err(error) => {
                eprintln!("OTLP exporter not started: {error}");
                None
            }
        }
    });
    // Nothing to export to: no OpenTelemetry layer at all, for building
    // span data nobody reads cost a tenth of a transfer's CPU. Trace ids
    // are still made (or continued from the caller) per request, returned
    // to clients and written to the feed: see `trace_requests`.
    let provider = exporter.map(|exporter| {
        SdkTracerProvider::builder()
            .with_resource(resource())
            .with_batch_exporter(exporter)
            .build()
    });
    install(format, true, provider)
}

/// Tests' set-up: spans go to `exporter` (an in-memory one), logs only when
/// `logs` is true.
pub fn init_with_exporter<E: SpanExporter + 'static>(
    format: LogFormat,
    logs: bool,
    exporter: E,
) -> TelemetryGuard {
    let provider = SdkTracerProvider::builder()
        .with_resource(resource())
        .with_simple_exporter(exporter)
        .build();
    install(format, logs, Some(provider))
}

fn resource() -> opentelemetry_sdk::Resource {
    let builder = opentelemetry_sdk::Resource::builder();
    // OTEL_SERVICE_NAME, when set, wins over this default.
    if std::env::var_os("OTEL_SERVICE_NAME").is_some() {
        builder.build()
    } else {
        builder.with_service_name("layered-wallet").build()
    }
}

fn install(format: LogFormat, logs: bool, provider: Option<SdkTracerProvider>) -> TelemetryGuard {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let filter = || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let otel = provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("layered-wallet"))
            .with_filter(EnvFilter::new("info"))
    });
    // Logs go to stderr, so that a subcommand's stdout carries only its
    // data; colour only when a person is watching and has not opted out.
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let fmt = logs.then(|| match format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_filter(filter())
            .boxed(),
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(colour)
            .with_filter(filter())
            .boxed(),
    });
    // `try_init`: a test process builds many apps and initialises once.
    let _ = tracing_subscriber::registry().with(otel).with(fmt).try_init();
    TelemetryGuard { provider }
}

/// What the middleware learns about a request, for the handlers.
#[derive(Debug, Clone)]
pub struct RequestContext {
    pub request_id: String,
    /// 32 lowercase hex digits; all zeros only if tracing is not set up.
    pub trace_id: String,
    /// The request's W3C `traceparent`, for work that continues its trace
    /// later (a payout's dispatch), whether or not spans are recorded.
    pub traceparent: Option<String>,
    pub started: Instant,
}

impl RequestContext {
    /// The context the middleware made for this request, shared rather
    /// than copied: a handler that reads it takes one reference count, not
    /// three strings.
    pub fn of(request: &actix_web::HttpRequest) -> Rc<Self> {
        request
            .extensions()
            .get::<Rc<RequestContext>>()
            .cloned()
            .unwrap_or_else(|| {
                Rc::new(RequestContext {
                    request_id: Uuid::new_v4().to_string(),
                    trace_id: "0".repeat(32),
                    traceparent: None,
                    started: Instant::now(),
                })
            })
    }
}

struct HeaderExtractor<'a>(&'a actix_web::http::header::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// A client's `X-Request-Id` is kept if it is short and plain; otherwise we
/// make one.
fn request_id_of(request: &ServiceRequest) -> String {
    request
        .headers()
        .get("x-request-id")
        .and_then(|value| value.to_str().ok())
        .filter(|id| !id.is_empty() && id.len() <= 64)
        .filter(|id| {
            id.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
        })
        .map(str::to_owned)
        .unwrap_or_else(|| Uuid::new_v4().to_string())
}

/// Which route pattern a path matches (`router::pattern_of`), given to the
/// app as data so that labelling a request needs no knowledge of the
/// routes here.
#[derive(Clone, Copy)]
pub struct RoutePatterns(pub fn(&str) -> Option<&'static str>);

/// The request middleware: a server span per request, the request id and
/// trace id for handlers, `X-Request-Id` and `traceparent` on the response,
/// and the request latency histogram.
pub async fn trace_requests(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = Instant::now();
    let request_id = request_id_of(&request);
    // Both come from fixed sets, so that a client cannot mint metric series
    // (or span names) by inventing methods or paths.
    let route = request
        .app_data::<RoutePatterns>()
        .and_then(|patterns| (patterns.0)(request.path()))
        .unwrap_or("unmatched");
    let method = method_label(request.method());
    let span = tracing::info_span!(
        "http.request",
        otel.name = %format!("{method} {route}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
        request.id = %request_id,
        defense.layer = tracing::field::Empty,
        defense.outcome = tracing::field::Empty,
    );
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(request.headers()));
    let caller = parent.span().span_context().clone();
    let _ = span.set_parent(parent);
    let recorded = span.context().span().span_context().clone();
    let span_context = if recorded.is_valid() {
        recorded
    } else {
        made_here(&caller)
    };
    let traceparent = traceparent_of_context(&span_context);
    request.extensions_mut().insert(Rc::new(RequestContext {
        request_id: request_id.clone(),
        trace_id: span_context.trace_id().to_string(),
        traceparent: traceparent.clone(),
        started,
    }));
    let state = public_api_state(&request);

    let mut response = next.call(request).instrument(span.clone()).await?;

    let status = response.status();
    span.record("http.response.status_code", status.as_u16());
    if let Some(state) = state {
        state
            .metrics
            .http_latency
            .with_label_values(&[route, method, status_class(status.as_u16())])
            .observe(started.elapsed().as_secs_f64());
    }
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        headers.insert(HeaderName::from_static("x-request-id"), value);
    }
    if let Some(traceparent) = traceparent
        && let Ok(value) = HeaderValue::from_str(&traceparent)
    {
        headers.insert(HeaderName::from_static("traceparent"), value);
    }
    Ok(response)
}

/// The app's state, for the latency histogram, which is the public API's:
/// scrapes and probes on the admin listener would only add noise to it. The
/// state, not its metrics: one reference count, where cloning the metrics
/// took one for each of them.
fn public_api_state(request: &ServiceRequest) -> Option<actix_web::web::Data<crate::state::AppState>> {
    let on_admin_listener =
        request.extensions().get::<crate::listener::Listener>() == Some(&crate::listener::Listener::Admin);
    request
        .app_data::<actix_web::web::Data<crate::state::AppState>>()
        .filter(|_| !on_admin_listener)
        .cloned()
}

/// A request's trace identity when no span is recorded: the caller's trace
/// continued when it sent a valid `traceparent`, a new one otherwise, each
/// with a span id of its own. Not sampled: nothing is exported.
fn made_here(caller: &opentelemetry::trace::SpanContext) -> opentelemetry::trace::SpanContext {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    let trace_id = if caller.is_valid() {
        caller.trace_id()
    } else {
        TraceId::from_bytes(rand::random::<[u8; 16]>())
    };
    SpanContext::new(
        trace_id,
        SpanId::from_bytes(rand::random::<[u8; 8]>()),
        TraceFlags::default(),
        false,
        TraceState::default(),
    )
}

/// A span's W3C `traceparent`, for work that continues its trace elsewhere
/// (a payout's dispatcher, the gateway it calls); `None` when tracing is
/// not set up.
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    traceparent_of_context(&span.context().span().span_context().clone())
}

fn traceparent_of_context(span_context: &opentelemetry::trace::SpanContext) -> Option<String> {
    span_context.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            span_context.trace_id(),
            span_context.span_id(),
            span_context.trace_flags().to_u8()
        )
    })
}

/// Makes `span` a child of the span a stored `traceparent` names, so that
/// work done later (a dispatcher's call) shows in the trace of the request
/// that asked for it.
pub fn continue_trace(span: &tracing::Span, traceparent: &str) {
    struct One<'a>(&'a str);
    impl Extractor for One<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            (key == "traceparent").then_some(self.0)
        }
        fn keys(&self) -> Vec<&str> {
            vec!["traceparent"]
        }
    }
    let parent = TraceContextPropagator::new().extract(&One(traceparent));
    let _ = span.set_parent(parent);
}

/// The standard methods by name; anything else a client sends is `other`.
fn method_label(method: &actix_web::http::Method) -> &'static str {
    use actix_web::http::Method;
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => "other",
    }
}

/// `2xx`, `4xx`, …: the metric label, without formatting a string per request.
fn status_class(status: u16) -> &'static str {
    match status / 100 {
        1 => "1xx",
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        _ => "5xx",
    }
}
