//! RFC 9457 problem details: the one shape of every error this service sends.
//!
//! A `Problem` carries what the client needs (a stable `type`, a human
//! `title` and `detail`, and which defense `layer` decided, when one did) and
//! nothing it must not see: causes and internal errors go to the log, never
//! into the body.

use std::fmt;

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;

use crate::decision::Layer;

pub const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// Serialised as `type`, a relative URI reference: `/problems/<slug>`.
    #[serde(rename = "type", serialize_with = "problem_type_uri")]
    #[schema(value_type = String, example = "/problems/insufficient-funds")]
    pub slug: &'static str,
    pub title: &'static str,
    pub status: u16,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer: Option<Layer>,
    /// The request's trace id, on transfer problems: the key to its trace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    #[serde(skip)]
    retry_after_s: Option<u64>,
    #[serde(skip)]
    www_authenticate: Option<&'static str>,
}

impl Problem {
    pub fn new(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            slug,
            title,
            status: status.as_u16(),
            detail: detail.into(),
            layer: None,
            trace_id: None,
            retry_after_s: None,
            www_authenticate: None,
        }
    }

    pub fn with_layer(mut self, layer: Layer) -> Self {
        self.layer = Some(layer);
        self
    }

    pub fn with_trace_id(mut self, trace_id: &str) -> Self {
        self.trace_id = Some(trace_id.to_owned());
        self
    }

    pub fn with_retry_after_s(mut self, seconds: u64) -> Self {
        self.retry_after_s = Some(seconds);
        self
    }

    pub fn with_www_authenticate(mut self, challenge: &'static str) -> Self {
        self.www_authenticate = Some(challenge);
        self
    }

    pub fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The exact bytes sent to the client; the idempotency layer stores
    /// these so that a replay is byte-for-byte the original.
    pub fn body(&self) -> String {
        // Serialising a struct of strings and integers cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn into_response(self) -> HttpResponse {
        self.error_response()
    }

    // Problems shared by several routes.

    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "malformed-request",
            "Malformed request",
            detail,
        )
    }

    pub fn validation(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation-failed",
            "The request is not valid",
            detail,
        )
    }

    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not-found", "Not found", detail)
    }

    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Authentication required",
            detail,
        )
        .with_www_authenticate("Bearer")
    }

    pub fn invalid_token(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Authentication required",
            detail,
        )
        .with_www_authenticate("Bearer error=\"invalid_token\"")
    }

    pub fn payload_too_large(limit_bytes: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload-too-large",
            "Request body too large",
            format!("The request body must be at most {limit_bytes} bytes."),
        )
    }

    pub fn unsupported_media_type() -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
            "Unsupported media type",
            "Send the body as JSON with Content-Type: application/json.",
        )
    }

    /// A store we depend on is down or saturated. Retrying later is safe.
    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service-unavailable",
            "Service temporarily unavailable",
            detail,
        )
        .with_retry_after_s(1)
    }

    pub fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal-error",
            "Internal error",
            "Something went wrong on our side. Nothing was changed; it is safe to retry.",
        )
    }
}

fn problem_type_uri<S: serde::Serializer>(slug: &&'static str, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(&format_args!("/problems/{slug}"))
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.status, self.title, self.detail)
    }
}

impl ResponseError for Problem {
    fn status_code(&self) -> StatusCode {
        Problem::status_code(self)
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status_code());
        response.insert_header((header::CONTENT_TYPE, PROBLEM_CONTENT_TYPE));
        if let Some(seconds) = self.retry_after_s {
            response.insert_header((header::RETRY_AFTER, seconds.to_string()));
        }
        if let Some(challenge) = self.www_authenticate {
            response.insert_header((header::WWW_AUTHENTICATE, HeaderValue::from_static(challenge)));
        }
        response.body(self.body())
    }
}

/// Log an infrastructure error once, with its cause chain, and turn it into
/// the problem the client sees. PostgreSQL being unreachable or saturated is
/// a 503 (retry later); anything else is a 500.
pub fn from_database_error(error: &sqlx::Error, doing: &str) -> Problem {
    match error {
        sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed => {
            tracing::error!(error = %error, "database unavailable while {doing}");
            Problem::unavailable("The database is unavailable. Nothing was changed; retry shortly.")
        }
        _ => {
            tracing::error!(error = ?error, "database error while {doing}");
            Problem::internal()
        }
    }
}
