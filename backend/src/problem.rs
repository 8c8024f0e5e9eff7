//! RFC 9457 problem details: the one shape of every error this service sends.
//!
//! A `Problem` carries what the client needs (a stable `type`, a human
//! `title` and `detail`, and which defense `layer` decided, when one did) and
//! nothing it must not see: causes and internal errors go to the log, never
//! into the body.
//!
//! Every problem type is a variant of [`ProblemType`]: its slug, status and
//! title for API clients, the sentence a person reads in the browser, and the
//! description `GET /problems/{slug}` shows. Adding a refusal starts there.

use std::borrow::Cow;
use std::fmt;

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;

use crate::decision::Layer;

pub const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";

/// Every problem type this service answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProblemType {
    MalformedRequest,
    ValidationFailed,
    Unauthorized,
    CsrfTokenInvalid,
    NotYourWallet,
    NotFound,
    MethodNotAllowed,
    NameTaken,
    PayloadTooLarge,
    UnsupportedMediaType,
    IdempotencyKeyReused,
    IdempotencyKeyInFlight,
    CooldownActive,
    TooManyAttempts,
    TooManyStreams,
    InsufficientFunds,
    UnknownTargetWallet,
    CurrencyMismatch,
    RaceLabSwitchesOff,
    LabWalletsOnly,
    ServiceUnavailable,
    OutcomeUnknown,
    InternalError,
}

/// What the catalogue says about one problem type.
struct Entry {
    slug: &'static str,
    status: StatusCode,
    title: &'static str,
    /// What a person reads in the browser: no field names, no jargon.
    for_people: &'static str,
    /// What `GET /problems/{slug}` explains to API clients.
    description: &'static str,
}

impl ProblemType {
    pub const ALL: [ProblemType; 23] = [
        ProblemType::MalformedRequest,
        ProblemType::ValidationFailed,
        ProblemType::Unauthorized,
        ProblemType::CsrfTokenInvalid,
        ProblemType::NotYourWallet,
        ProblemType::NotFound,
        ProblemType::MethodNotAllowed,
        ProblemType::NameTaken,
        ProblemType::PayloadTooLarge,
        ProblemType::UnsupportedMediaType,
        ProblemType::IdempotencyKeyReused,
        ProblemType::IdempotencyKeyInFlight,
        ProblemType::CooldownActive,
        ProblemType::TooManyAttempts,
        ProblemType::TooManyStreams,
        ProblemType::InsufficientFunds,
        ProblemType::UnknownTargetWallet,
        ProblemType::CurrencyMismatch,
        ProblemType::RaceLabSwitchesOff,
        ProblemType::LabWalletsOnly,
        ProblemType::ServiceUnavailable,
        ProblemType::OutcomeUnknown,
        ProblemType::InternalError,
    ];

    fn entry(self) -> Entry {
        use ProblemType::*;
        let (slug, status, title, for_people, description) = match self {
            MalformedRequest => (
                "malformed-request",
                StatusCode::BAD_REQUEST,
                "Malformed request",
                "We could not read what your browser sent. Reload the page and try again.",
                "The body is not valid JSON, or a header the deployment requires (such as Idempotency-Key) is missing. Nothing was changed.",
            ),
            ValidationFailed => (
                "validation-failed",
                StatusCode::UNPROCESSABLE_ENTITY,
                "The request is not valid",
                "Something in the form is not valid. Check the recipient and the amount, then try again.",
                "A value broke a rule: amounts are positive integers of minor units up to the maximum, the wallets differ, the key is a UUID. Nothing was changed.",
            ),
            Unauthorized => (
                "unauthorized",
                StatusCode::UNAUTHORIZED,
                "Authentication required",
                "Your session has ended. Please sign in again.",
                "Send a valid bearer token: from POST /api/v1/users or POST /api/v1/tokens. A revoked or expired token is refused like a missing one. Nothing was changed.",
            ),
            CsrfTokenInvalid => (
                "csrf-token-invalid",
                StatusCode::FORBIDDEN,
                "CSRF token missing or invalid",
                "This form expired. Reload the page and try again.",
                "A browser request authenticated by the session cookie must carry the page's CSRF token. Nothing was changed.",
            ),
            NotYourWallet => (
                "not-your-wallet",
                StatusCode::FORBIDDEN,
                "Not your wallet",
                "You can only send money from your own wallet.",
                "Only the owner of a wallet can send money from it. Nothing was changed.",
            ),
            NotFound => (
                "not-found",
                StatusCode::NOT_FOUND,
                "Not found",
                "There is nothing here, or it is not yours.",
                "There is nothing at this address, or it is not yours.",
            ),
            MethodNotAllowed => (
                "method-not-allowed",
                StatusCode::METHOD_NOT_ALLOWED,
                "Method not allowed",
                "This address does not take that kind of request.",
                "The path exists, but not for this method. The Allow header lists the methods it takes. Nothing was changed.",
            ),
            NameTaken => (
                "name-taken",
                StatusCode::CONFLICT,
                "Name taken",
                "That name is taken, or looks too much like someone else's. Please pick another.",
                "Another user has this name, or a name that reads the same: names are compared after Unicode NFKC normalisation and case folding, and refused when their UTS #39 confusable skeleton matches an existing name's. Nothing was changed.",
            ),
            PayloadTooLarge => (
                "payload-too-large",
                StatusCode::PAYLOAD_TOO_LARGE,
                "Request body too large",
                "What you sent is too large.",
                "The body is larger than request_body_bytes_max. Nothing was changed.",
            ),
            UnsupportedMediaType => (
                "unsupported-media-type",
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Unsupported media type",
                "Your browser sent the form in a format we do not accept. Reload the page and try again.",
                "Send JSON with Content-Type: application/json. Nothing was changed.",
            ),
            IdempotencyKeyReused => (
                "idempotency-key-reused",
                StatusCode::UNPROCESSABLE_ENTITY,
                "Idempotency key reused",
                "This form was already used for a different transfer, so nothing was sent. Check the form below and send again.",
                "The Idempotency-Key was already used for a request with a different method, path or body. Nothing was changed. Use a new key for a new transfer.",
            ),
            IdempotencyKeyInFlight => (
                "idempotency-key-in-flight",
                StatusCode::CONFLICT,
                "Request with this key still in progress",
                "This transfer is still being processed. Wait a moment, then send the same form again to see its result.",
                "The first request with this Idempotency-Key had not finished within idempotency_wait_ms_max. Retry with the same key after Retry-After to get its result.",
            ),
            CooldownActive => (
                "cooldown-active",
                StatusCode::TOO_MANY_REQUESTS,
                "Too soon after your last transfer",
                "You sent a transfer moments ago. Transfers are spaced a few seconds apart so that duplicates cannot slip through; please try again shortly.",
                "A transfer by you started within the cooldown window (cooldown_ttl_ms). The Redis cooldown lock refused this one before any database work, so nothing was changed. Retry after the Retry-After header's seconds; a retry with the same Idempotency-Key then replays or completes exactly once.",
            ),
            TooManyAttempts => (
                "too-many-attempts",
                StatusCode::TOO_MANY_REQUESTS,
                "Too many attempts",
                "There have been too many attempts from here or for this name. Please wait a little and try again.",
                "Sign-ups and sign-ins are limited per client address and per name (signup_per_address_per_hour_max, signup_per_name_per_hour_max, signin_per_address_per_minute_max, signin_per_name_per_minute_max), shared by every instance. Nothing was changed. Retry after the Retry-After header's seconds.",
            ),
            TooManyStreams => (
                "too-many-streams",
                StatusCode::TOO_MANY_REQUESTS,
                "Too many live feeds",
                "You have too many live feeds open. Close one and try again.",
                "Each user may hold decision_streams_per_user_max live decision streams on an instance at once. Close one, or wait for one to end, and retry.",
            ),
            InsufficientFunds => (
                "insufficient-funds",
                StatusCode::UNPROCESSABLE_ENTITY,
                "Insufficient funds",
                "Your balance is too low for this amount. Nothing was sent.",
                "The guarded debit found the source balance lower than the amount. Nothing moved. A retry with the same key replays this answer.",
            ),
            UnknownTargetWallet => (
                "unknown-target-wallet",
                StatusCode::UNPROCESSABLE_ENTITY,
                "Unknown target wallet",
                "We could not find the recipient's wallet. Nothing was sent.",
                "No wallet has the id given as to_wallet_id. Nothing moved.",
            ),
            CurrencyMismatch => (
                "currency-mismatch",
                StatusCode::UNPROCESSABLE_ENTITY,
                "The wallets hold different currencies",
                "The recipient's wallet holds a different currency, and this service does not convert money. Nothing was sent.",
                "The source and target wallets hold different currencies; the row guard never moves minor units from one currency to another. Nothing moved.",
            ),
            RaceLabSwitchesOff => (
                "race-lab-switches-off",
                StatusCode::FORBIDDEN,
                "Race-lab switches are turned off here",
                "This deployment runs every race-lab request through all three defenses, so layers cannot be switched off. Nothing was sent.",
                "The request carried a Race-Lab-Switches header, and this deployment has race_lab_switches_enabled off. Send the request without the header. Nothing was changed.",
            ),
            LabWalletsOnly => (
                "lab-wallets-only",
                StatusCode::UNPROCESSABLE_ENTITY,
                "Switches apply to lab wallets only",
                "Switching a defense off is only possible between your two lab wallets, never with real money. Nothing was sent.",
                "The request carried a Race-Lab-Switches header, but its wallets are not both race-lab wallets. The transaction checked the wallets before doing anything, and the naive statements match lab rows only. Nothing was changed.",
            ),
            ServiceUnavailable => (
                "service-unavailable",
                StatusCode::SERVICE_UNAVAILABLE,
                "Service temporarily unavailable",
                "The service is briefly unavailable. Nothing was changed; please try again in a moment.",
                "A store the service depends on is unreachable or saturated, or PostgreSQL rolled the work back (a timeout, a shutdown). Nothing was changed; retrying after Retry-After is safe.",
            ),
            OutcomeUnknown => (
                "outcome-unknown",
                StatusCode::SERVICE_UNAVAILABLE,
                "Outcome unknown",
                "We lost contact with the database while your transfer was being made, so we cannot tell yet whether it went through. Send this same form again in a moment: it is safe, the transfer either completes once or shows as already done.",
                "The connection to PostgreSQL broke after the transfer was sent to it, so the service cannot tell whether it committed. Retry with the same Idempotency-Key after Retry-After: the retry replays the committed transfer, or makes it exactly once. Without a key, look for the transfer in GET /api/v1/transfers before retrying, or you may pay twice.",
            ),
            InternalError => (
                "internal-error",
                StatusCode::INTERNAL_SERVER_ERROR,
                "Internal error",
                "Something went wrong on our side. Check your history before trying again.",
                "Something failed on our side. If it was a transfer, retry with the same Idempotency-Key (which replays it if it was made), or look for it in GET /api/v1/transfers before retrying without one.",
            ),
        };
        Entry {
            slug,
            status,
            title,
            for_people,
            description,
        }
    }

    pub fn slug(self) -> &'static str {
        self.entry().slug
    }

    pub fn status(self) -> StatusCode {
        self.entry().status
    }

    pub fn title(self) -> &'static str {
        self.entry().title
    }

    /// The sentence the browser shows a person for this problem.
    pub fn for_people(self) -> &'static str {
        self.entry().for_people
    }

    /// What the problem means, for `GET /problems/{slug}`.
    pub fn description(self) -> &'static str {
        self.entry().description
    }

    pub fn from_slug(slug: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.slug() == slug)
    }

    /// The type of a stored problem body (`"type": "/problems/<slug>"`).
    pub fn of_body(body: &str) -> Option<Self> {
        #[derive(serde::Deserialize)]
        struct Typed<'a> {
            #[serde(rename = "type", borrow)]
            uri: Cow<'a, str>,
        }
        let typed: Typed<'_> = serde_json::from_str(body).ok()?;
        Self::from_slug(typed.uri.strip_prefix("/problems/")?)
    }
}

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
    /// The detail is a sentence for people more precise than the type's
    /// own (the cooldown's, which says when the next transfer is possible).
    #[serde(skip)]
    detail_is_for_people: bool,
    #[serde(skip)]
    retry_after_s: Option<u64>,
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

    pub fn with_retry_after_s(mut self, seconds: u64) -> Self {
        self.retry_after_s = Some(seconds);
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
        self.retry_after_s
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
            response.insert_header((header::RETRY_AFTER, seconds.to_string()));
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

/// What a failed database call says about the work it carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatabaseFailure {
    /// Nothing can have committed: no connection could be had, or the
    /// connection broke inside a transaction that was never asked to commit
    /// (the caller knows which; see `transfer::execute`).
    NothingCommitted,
    /// PostgreSQL reported the error, so the statement (and the implicit or
    /// explicit transaction around it) rolled back, and the cause is one
    /// that passes: a shutdown, a timeout, too many connections, a
    /// serialization failure left after the retries.
    RolledBackTransient,
    /// PostgreSQL reported an error that retrying will not cure: a bug.
    RolledBackBug,
    /// The connection broke, or the answer could not be read, after the
    /// work may have been sent: it may have committed.
    Unknown,
}

impl DatabaseFailure {
    /// Classifies an error by what the error alone tells.
    pub fn of(error: &sqlx::Error) -> Self {
        match error {
            sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => DatabaseFailure::NothingCommitted,
            sqlx::Error::Database(db) => Self::of_sqlstate(db.code().as_deref().unwrap_or("")),
            _ => DatabaseFailure::Unknown,
        }
    }

    /// An error PostgreSQL reported, by its SQLSTATE.
    pub fn of_sqlstate(code: &str) -> Self {
        match sqlstate_class(code) {
            SqlStateClass::Transient => DatabaseFailure::RolledBackTransient,
            SqlStateClass::Other => DatabaseFailure::RolledBackBug,
        }
    }
}

enum SqlStateClass {
    Transient,
    Other,
}

/// SQLSTATE classes whose errors pass with time: 08 connection exception,
/// 40 transaction rollback, 53 insufficient resources, 57 operator
/// intervention (57014 statement timeout, 57P01-03 shutdowns), and 55P03
/// lock not available.
fn sqlstate_class(code: &str) -> SqlStateClass {
    match code.get(..2) {
        Some("08" | "40" | "53" | "57") => SqlStateClass::Transient,
        _ if code == "55P03" => SqlStateClass::Transient,
        _ => SqlStateClass::Other,
    }
}

/// Logs a database error once, with its cause chain, and turns it into the
/// problem the client sees, saying "nothing was changed" only where that is
/// known.
pub fn from_database_error(error: &sqlx::Error, doing: &str) -> Problem {
    from_database_failure(DatabaseFailure::of(error), error, doing)
}

pub fn from_database_failure(failure: DatabaseFailure, error: &sqlx::Error, doing: &str) -> Problem {
    match failure {
        DatabaseFailure::NothingCommitted | DatabaseFailure::RolledBackTransient => {
            tracing::error!(error = %error, "database unavailable while {doing}");
            Problem::unavailable("The database is unavailable. Nothing was changed; retry shortly.")
        }
        DatabaseFailure::Unknown => {
            tracing::error!(error = %error, "lost the database connection while {doing}");
            Problem::new(
                ProblemType::ServiceUnavailable,
                "The connection to the database broke. Retry shortly.",
            )
            .with_retry_after_s(1)
        }
        DatabaseFailure::RolledBackBug => {
            tracing::error!(error = ?error, "database error while {doing}");
            Problem::internal()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_type_has_a_distinct_slug_and_a_sentence_for_people() {
        let mut slugs = std::collections::HashSet::new();
        for kind in ProblemType::ALL {
            assert!(slugs.insert(kind.slug()), "{kind:?}");
            assert_eq!(ProblemType::from_slug(kind.slug()), Some(kind));
            let sentence = kind.for_people();
            assert!(sentence.ends_with('.'), "{kind:?}: {sentence}");
            for api_word in [
                "_id",
                "amount_minor",
                "Idempotency-Key",
                "Bearer",
                "JSON",
                "/api/",
            ] {
                assert!(
                    !sentence.contains(api_word),
                    "{kind:?} speaks API to people: {sentence}"
                );
            }
        }
    }

    /// Every error PostgreSQL reports rolled its statement back; the ones
    /// that pass are 503 "nothing was changed", the rest a 500 that claims
    /// nothing.
    #[test]
    fn each_sqlstate_class_maps_to_its_answer() {
        for (code, meaning, failure, status) in [
            (
                "57P01",
                "admin shutdown",
                DatabaseFailure::RolledBackTransient,
                503,
            ),
            (
                "57P02",
                "crash shutdown",
                DatabaseFailure::RolledBackTransient,
                503,
            ),
            (
                "57P03",
                "cannot connect now",
                DatabaseFailure::RolledBackTransient,
                503,
            ),
            (
                "57014",
                "statement timeout",
                DatabaseFailure::RolledBackTransient,
                503,
            ),
            (
                "53300",
                "too many connections",
                DatabaseFailure::RolledBackTransient,
                503,
            ),
            (
                "08006",
                "connection failure",
                DatabaseFailure::RolledBackTransient,
                503,
            ),
            (
                "40001",
                "serialization failure",
                DatabaseFailure::RolledBackTransient,
                503,
            ),
            ("40P01", "deadlock", DatabaseFailure::RolledBackTransient, 503),
            (
                "55P03",
                "lock not available",
                DatabaseFailure::RolledBackTransient,
                503,
            ),
            ("23505", "unique violation", DatabaseFailure::RolledBackBug, 500),
            ("42P01", "undefined table", DatabaseFailure::RolledBackBug, 500),
            ("P0001", "raise exception", DatabaseFailure::RolledBackBug, 500),
        ] {
            assert_eq!(DatabaseFailure::of_sqlstate(code), failure, "{code} {meaning}");
            let problem = from_database_failure(failure, &sqlx::Error::PoolTimedOut, "testing");
            assert_eq!(problem.status, status, "{code} {meaning}");
            assert_eq!(
                problem.detail.contains("Nothing was changed"),
                status == 503,
                "{code}"
            );
        }
        assert_eq!(
            DatabaseFailure::of(&sqlx::Error::PoolTimedOut),
            DatabaseFailure::NothingCommitted
        );
        let broken = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(DatabaseFailure::of(&broken), DatabaseFailure::Unknown);
        let unknown = from_database_failure(DatabaseFailure::Unknown, &broken, "testing");
        assert!(!unknown.detail.contains("Nothing was changed"));
    }

    #[test]
    fn a_body_names_its_type() {
        let body = Problem::new(ProblemType::InsufficientFunds, "x").body();
        assert_eq!(ProblemType::of_body(&body), Some(ProblemType::InsufficientFunds));
        assert_eq!(ProblemType::of_body("{}"), None);
    }
}
