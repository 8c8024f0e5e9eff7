//! The one decision every `POST /api/v1/transfers` (and every deposit
//! delivery) ends in: which layer decided, and how. One type, reported the same way everywhere: the
//! `Defense-Decision` response header, the problem body, the request's
//! trace, the metrics, the log line and the decision feed.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Lower-case, as `HeaderName::from_static` requires; HTTP header names are
/// case-insensitive.
pub const HEADER: &str = "defense-decision";

/// Which defense made a decision. `None` is for requests refused before the
/// layers (bad input, authentication) and for infrastructure failures
/// outside them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    Cooldown,
    Idempotency,
    RowGuard,
    /// A deposit's or a command's lock on its event id, in Redis.
    EdgeLock,
    /// A deposit's or a command's claim of its event id, in PostgreSQL.
    Inbox,
    /// The bank gateway's answer to a payout, recorded by the dispatcher.
    Gateway,
    #[serde(rename = "none")]
    NoLayer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The transfer was made.
    Accepted,
    /// Refused by the layer (a cooldown window, an unknown target).
    Rejected,
    /// A retry answered with the stored response.
    Replayed,
    /// The key's first request was still running.
    InFlight,
    /// The key belongs to a different request.
    KeyReused,
    /// The event id was delivered before with different contents.
    PayloadChanged,
    InsufficientFunds,
    /// An optimistic write found the balance changed since it was read
    /// (the demonstration mode `optimistic_version`); nothing was changed.
    Conflict,
    /// The transfer was made while Redis was unreachable and the cooldown
    /// failed open: correct, but without the edge's protection.
    Degraded,
    /// Bad input.
    Invalid,
    /// Not authenticated, or not allowed to debit the wallet.
    Unauthorized,
    /// Our failure (a store unavailable); safe to retry.
    Error,
}

impl Layer {
    pub fn as_str(self) -> &'static str {
        match self {
            Layer::Cooldown => "cooldown",
            Layer::Idempotency => "idempotency",
            Layer::RowGuard => "row_guard",
            Layer::EdgeLock => "edge_lock",
            Layer::Inbox => "inbox",
            Layer::Gateway => "gateway",
            Layer::NoLayer => "none",
        }
    }

    /// The layer's name as pages show it to people; `None` before the
    /// layers.
    pub fn name_for_people(self) -> Option<&'static str> {
        match self {
            Layer::Cooldown => Some("Cooldown lock"),
            Layer::Idempotency => Some("Idempotency key"),
            Layer::RowGuard => Some("Row guard"),
            Layer::EdgeLock => Some("Edge lock"),
            Layer::Inbox => Some("Inbox"),
            Layer::Gateway => Some("Bank gateway"),
            Layer::NoLayer => None,
        }
    }
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Rejected => "rejected",
            Outcome::Replayed => "replayed",
            Outcome::InFlight => "in_flight",
            Outcome::KeyReused => "key_reused",
            Outcome::PayloadChanged => "payload_changed",
            Outcome::InsufficientFunds => "insufficient_funds",
            Outcome::Conflict => "conflict",
            Outcome::Degraded => "degraded",
            Outcome::Invalid => "invalid",
            Outcome::Unauthorized => "unauthorized",
            Outcome::Error => "error",
        }
    }
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decision {
    pub layer: Layer,
    pub outcome: Outcome,
}

impl Decision {
    pub const fn new(layer: Layer, outcome: Outcome) -> Self {
        Self { layer, outcome }
    }

    /// The `Defense-Decision` header: an RFC 8941 dictionary whose values
    /// are tokens, e.g. `layer=cooldown, outcome=rejected`.
    pub fn header_value(self) -> String {
        format!("layer={}, outcome={}", self.layer, self.outcome)
    }

    /// Puts the `Defense-Decision` header on a response: the one place it
    /// is set, for the API and the browser alike.
    pub fn mark(self, response: &mut actix_web::HttpResponse) {
        use actix_web::http::header::{HeaderName, HeaderValue};
        thread_local! {
            /// Each decision's header value, made once per thread: there
            /// are a few dozen, and every response carries one.
            static VALUES: std::cell::RefCell<std::collections::HashMap<Decision, HeaderValue>> =
                std::cell::RefCell::default();
        }
        let value = VALUES.with_borrow_mut(|values| {
            if let Some(value) = values.get(&self) {
                return Some(value.clone());
            }
            let value = HeaderValue::from_str(&self.header_value()).ok()?;
            values.insert(self, value.clone());
            Some(value)
        });
        if let Some(value) = value {
            response
                .headers_mut()
                .insert(HeaderName::from_static(HEADER), value);
        }
    }

    /// Parses a `Defense-Decision` header (clients and the load test).
    pub fn parse_header(value: &str) -> Option<Self> {
        let mut layer = None;
        let mut outcome = None;
        for member in value.split(',') {
            let (name, item) = member.trim().split_once('=')?;
            let item = item.trim().trim_matches('"');
            match name.trim() {
                "layer" => layer = serde_json::from_value(serde_json::Value::String(item.into())).ok(),
                "outcome" => outcome = serde_json::from_value(serde_json::Value::String(item.into())).ok(),
                _ => {}
            }
        }
        Some(Self {
            layer: layer?,
            outcome: outcome?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_is_a_dictionary_of_tokens_and_parses_back() {
        let decision = Decision::new(Layer::RowGuard, Outcome::InsufficientFunds);
        assert_eq!(
            decision.header_value(),
            "layer=row_guard, outcome=insufficient_funds"
        );
        assert_eq!(Decision::parse_header(&decision.header_value()), Some(decision));
        let none = Decision::new(Layer::NoLayer, Outcome::Invalid);
        assert_eq!(Decision::parse_header(&none.header_value()), Some(none));
        assert_eq!(Decision::parse_header("layer=nope, outcome=accepted"), None);
    }
}
