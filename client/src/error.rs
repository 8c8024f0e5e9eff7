//! What can go wrong, typed, so that a caller can tell a refusal (final:
//! do not retry) from an outcome nobody knows yet (retry with the same key).

use serde::Deserialize;

/// An RFC 9457 problem as the server sends it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Problem {
    /// `/problems/<slug>`; `GET` it for an explanation.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    #[serde(default)]
    pub detail: String,
    /// The defense that decided, on a transfer's problem.
    #[serde(default)]
    pub layer: Option<String>,
    /// Each field a validation problem refused, with its JSON Pointer.
    #[serde(default)]
    pub errors: Vec<FieldError>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct FieldError {
    pub pointer: String,
    pub detail: String,
}

impl Problem {
    /// The slug of the problem's type: `insufficient-funds`.
    pub fn slug(&self) -> &str {
        self.kind.trim_start_matches("/problems/")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server refused the request, and the same request would be
    /// refused again (400, 401, 403, 404, 422 and the like). Nothing was
    /// changed by it; it was not retried.
    /// Boxed: the other variants are small.
    #[error("refused with {} ({}): {}", .0.status, .0.slug(), .0.detail)]
    Refused(Box<Problem>),
    /// Every attempt allowed ended without a final answer. For a keyed
    /// transfer the payment may have been made once, never twice: look it
    /// up, or retry later with the same key.
    #[error("gave up after {attempts} attempts; last: {last}")]
    GaveUp { attempts: u32, last: String },
    /// A keyless transfer's request was sent and no answer came: it may
    /// have been made. It is never retried, since without a key a retry
    /// could pay twice.
    #[error("the outcome of a keyless request is unknown: {0}")]
    OutcomeUnknown(String),
    /// The server failed in a way it should not (a 5xx other than 503).
    /// For a keyed transfer, retry later with the same key.
    #[error("the server answered {status}: {body}")]
    Unexpected { status: u16, body: String },
    /// The request could not be built or sent at all (a bad address), or
    /// a success's body could not be read.
    #[error("{0}")]
    Request(String),
}
