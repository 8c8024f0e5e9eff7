//! A problem as the client gets it: the RFC 9457 body and the headers that
//! go with it (`Retry-After`, `WWW-Authenticate`, `Allow`).

use std::fmt;

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;

use super::ProblemType;
use crate::decision::Layer;

pub const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// Serialised as `type`, a relative URI reference: `/problems/<slug>`.
    #[serde(rename = "type", serialize_with = "problem_type_uri")]
    #[schema(value_type = String, example = "/problems/insufficient-funds")]
    pub kind: ProblemType,
    pub title: &'static str,
    pub status: u16,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer: Option<Layer>,
    /// The request's trace id, on transfer problems: the key to its trace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// On a validation problem, each field refused and why. Boxed, so that
    /// every other problem stays small.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<super::FieldError>>)]
    pub errors: Option<Box<Vec<super::FieldError>>>,
    /// The detail is a sentence for people more precise than the type's
    /// own (the cooldown's, which says when the next transfer is possible).
    #[serde(skip)]
    detail_is_for_people: bool,
    #[serde(skip)]
    /// Seconds; a `u32` (136 years) keeps every `Result<_, Problem>` small.
    retry_after_s: Option<u32>,
    #[serde(skip)]
    www_authenticate: Option<&'static str>,
    #[serde(skip)]
    allow: Option<&'static str>,
}

impl Problem {
    pub fn new(kind: ProblemType, detail: impl Into<String>) -> Self {
        Self {
            kind,
            title: kind.title(),
            status: kind.status().as_u16(),
            detail: detail.into(),
            layer: None,
            trace_id: None,
            errors: None,
            detail_is_for_people: false,
            retry_after_s: None,
            www_authenticate: None,
            allow: None,
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

    pub fn with_errors(mut self, errors: Vec<super::FieldError>) -> Self {
        self.errors = (!errors.is_empty()).then(|| Box::new(errors));
        self
    }

    /// A problem with one field of the body, which its detail is about.
    pub fn at_field(self, field: &str) -> Self {
        let error = super::FieldError::at(field, self.detail.clone());
        self.with_errors(vec![error])
    }

    pub fn with_retry_after_s(mut self, seconds: u64) -> Self {
        self.retry_after_s = Some(u32::try_from(seconds).unwrap_or(u32::MAX));
        self
    }

    pub fn with_www_authenticate(mut self, challenge: &'static str) -> Self {
        self.www_authenticate = Some(challenge);
        self
    }

    /// A 405 for a path that takes only `allow` (e.g. `GET, POST`).
    pub fn method_not_allowed(method: &str, path: &str, allow: &'static str) -> Self {
        let mut problem = Self::new(
            ProblemType::MethodNotAllowed,
            format!("{path} does not take {method}; it takes {allow}."),
        );
        problem.allow = Some(allow);
        problem
    }

    /// The detail is written for people as it stands: the browser shows it
    /// instead of the type's general sentence.
    pub fn detail_is_for_people(mut self) -> Self {
        self.detail_is_for_people = true;
        self
    }

    /// What the browser shows a person: never the API's wording.
    pub fn for_people(&self) -> &str {
        if self.detail_is_for_people {
            &self.detail
        } else {
            self.kind.for_people()
        }
    }

    pub fn retry_after_s(&self) -> Option<u64> {
        self.retry_after_s.map(u64::from)
    }

    /// Whether a browser form offers the same confirmation again, with the
    /// same key, after this refusal: nothing was done yet, or nobody knows
    /// whether it was, so sending it again is safe and the key makes it
    /// once. `Some` with the seconds to wait first, when a cooldown says
    /// how long; `None` for a refusal the same request would get again.
    pub fn send_again(&self) -> Option<Option<u64>> {
        match self.kind {
            ProblemType::CooldownActive => Some(self.retry_after_s()),
            ProblemType::IdempotencyKeyInFlight
            | ProblemType::VersionConflict
            | ProblemType::Overloaded
            | ProblemType::ServiceUnavailable
            | ProblemType::OutcomeUnknown => Some(None),
            _ => None,
        }
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
        Self::new(ProblemType::MalformedRequest, detail)
    }

    pub fn validation(detail: impl Into<String>) -> Self {
        Self::new(ProblemType::ValidationFailed, detail)
    }

    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(ProblemType::NotFound, detail)
    }

    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(ProblemType::Unauthorized, detail).with_www_authenticate("Bearer")
    }

    pub fn invalid_token(detail: impl Into<String>) -> Self {
        Self::new(ProblemType::Unauthorized, detail).with_www_authenticate("Bearer error=\"invalid_token\"")
    }

    /// A token whose MAC is good but that the database no longer holds.
    pub fn token_not_live() -> Self {
        Self::invalid_token("The bearer token has been revoked or has expired.")
    }

    pub fn payload_too_large(limit_bytes: usize) -> Self {
        Self::new(
            ProblemType::PayloadTooLarge,
            format!("The request body must be at most {limit_bytes} bytes."),
        )
    }

    pub fn unsupported_media_type() -> Self {
        Self::new(
            ProblemType::UnsupportedMediaType,
            "Send the body as JSON with Content-Type: application/json.",
        )
    }

    /// A store we depend on is down or saturated, and nothing was changed:
    /// no work was sent, or PostgreSQL reported rolling it back. Retrying
    /// later is safe.
    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(ProblemType::ServiceUnavailable, detail).with_retry_after_s(1)
    }

    /// The transfer reached PostgreSQL and the connection broke before its
    /// answer came back: it may have committed or not.
    pub fn outcome_unknown() -> Self {
        Self::new(
            ProblemType::OutcomeUnknown,
            "The connection to the database broke after this transfer was sent to it, so we cannot tell whether \
             it was made. Retry with the same Idempotency-Key: the retry shows the transfer if it was made, or \
             makes it exactly once. Without a key, look for it in GET /api/v1/transfers before retrying.",
        )
        .with_retry_after_s(1)
    }

    /// A bug of ours. The detail claims nothing about what happened.
    pub fn internal() -> Self {
        Self::new(
            ProblemType::InternalError,
            "Something went wrong on our side. If this was a transfer, retry with the same Idempotency-Key, \
             or look for it in GET /api/v1/transfers before retrying without one.",
        )
    }
}

fn problem_type_uri<S: serde::Serializer>(kind: &ProblemType, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(&format_args!("/problems/{}", kind.slug()))
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
            response.insert_header((header::RETRY_AFTER, HeaderValue::from(seconds)));
        }
        if let Some(challenge) = self.www_authenticate {
            response.insert_header((header::WWW_AUTHENTICATE, HeaderValue::from_static(challenge)));
        }
        if let Some(allow) = self.allow {
            response.insert_header((header::ALLOW, HeaderValue::from_static(allow)));
        }
        response.body(self.body())
    }
}

/// Seconds for a `Retry-After` header: rounded up, never zero.
pub fn retry_after_s(remaining: std::time::Duration) -> u64 {
    let started_second = u64::from(remaining.subsec_nanos() > 0);
    (remaining.as_secs() + started_second).max(1)
}

#[cfg(test)]
mod retry_after_tests {
    use std::time::Duration;

    use super::retry_after_s;

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        assert_eq!(retry_after_s(Duration::from_millis(0)), 1);
        assert_eq!(retry_after_s(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_s(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_s(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_s(Duration::from_millis(4999)), 5);
    }
}
