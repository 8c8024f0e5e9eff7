//! Parse, don't validate: the types a transfer is made of. Each has private
//! fields and one way in that checks the rule; the database repeats the same
//! rule as a CHECK constraint.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::problem::{FieldError, Fields, Problem, ProblemType};

/// The currency of lab money. No deployment may use it for real money
/// (`settings` refuses it), so the row guard's currency check is the wall
/// between the sandbox and real wallets.
pub const LAB_CURRENCY: &str = "LAB";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct UserId(pub Uuid);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WalletId(pub Uuid);

impl UserId {
    /// The id as `Display` writes it (lower-case, hyphenated), written into
    /// `buffer` rather than formatted: the Redis keys made for every
    /// request name their user.
    pub fn written_in(self, buffer: &mut [u8; uuid::fmt::Hyphenated::LENGTH]) -> &str {
        self.0.hyphenated().encode_lower(buffer)
    }
}

impl std::fmt::Display for UserId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::fmt::Display for WalletId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A positive amount in minor units (cents), at most the configured maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AmountMinor(i64);

impl AmountMinor {
    pub fn parse(value: i64, max: i64) -> Result<Self, Problem> {
        match Self::broken_rule(value, max) {
            Some(rule) => Err(Problem::validation(format!("amount_minor {rule}."))),
            None => Ok(Self(value)),
        }
    }

    /// The rule `value` breaks, said after the field's name; `None` when
    /// it keeps them all.
    pub(crate) fn broken_rule(value: i64, max: i64) -> Option<String> {
        if value <= 0 {
            Some("must be a positive integer".to_owned())
        } else if value > max {
            Some(format!("must be at most {max}"))
        } else {
            None
        }
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

/// The body of `POST /api/v1/transfers`, exactly as the client may send it.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TransferBody {
    pub from_wallet_id: Uuid,
    pub to_wallet_id: Uuid,
    /// Minor units (cents); positive.
    pub amount_minor: i64,
}

/// The wallet id in `field`, or `None` with the error noted.
pub(crate) fn wallet_id_field(fields: &mut Fields, field: &str) -> Option<Uuid> {
    let text = fields.string(field)?;
    let id = parse_uuid(&text);
    if id.is_none() {
        fields.refuse(
            field,
            "must be a wallet id: a UUID written as 8-4-4-4-12 hexadecimal digits",
        );
    }
    id
}

/// A UUID in its canonical hyphenated form only (what the OpenAPI document
/// promises), not the simple, braced or URN forms `Uuid` would also read.
pub fn parse_uuid(text: &str) -> Option<Uuid> {
    (text.len() == 36).then(|| Uuid::try_parse(text).ok()).flatten()
}

/// A transfer request that passed every check that needs no I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferRequest {
    pub from: WalletId,
    pub to: WalletId,
    pub amount: AmountMinor,
}

/// What is wrong with a transfer's `to_wallet_id` when it names its source.
const SAME_WALLET: &str = "must be another wallet than from_wallet_id";

/// A transfer names one wallet twice: a rule of its own, since no schema
/// can say that two fields differ.
fn same_wallet() -> Problem {
    let mut problem = Problem::new(
        ProblemType::SameWallet,
        "from_wallet_id and to_wallet_id name the same wallet; a transfer moves money between two wallets.",
    );
    problem.errors = Some(Box::new(vec![FieldError {
        pointer: "#/to_wallet_id".to_owned(),
        detail: SAME_WALLET.to_owned(),
    }]));
    problem
}

impl TransferRequest {
    /// Malformed JSON is a 400; well-formed JSON of the wrong shape or with
    /// a value outside the rules is a 422 naming each field it refuses
    /// (`errors[].pointer`). Wallet ids are read in their canonical form
    /// only, as everywhere else (`parse_uuid`).
    pub fn parse(body: &[u8], amount_minor_max: i64) -> Result<Self, Problem> {
        if let Some(plain) = Self::plain(body, amount_minor_max) {
            return Ok(plain);
        }
        let mut fields = Fields::of(body, &["from_wallet_id", "to_wallet_id", "amount_minor"])?;
        let from = wallet_id_field(&mut fields, "from_wallet_id");
        let to = wallet_id_field(&mut fields, "to_wallet_id");
        let amount_minor = fields.integer("amount_minor");
        if let Some(rule) = amount_minor.and_then(|minor| AmountMinor::broken_rule(minor, amount_minor_max)) {
            fields.refuse("amount_minor", rule);
        }
        // A body that breaks other rules too names this one with them; one
        // that breaks only this one gets the rule's own problem type.
        let same_wallet_named = from.is_some() && from == to;
        if same_wallet_named && !fields.is_clean() {
            fields.refuse("to_wallet_id", SAME_WALLET);
        }
        fields.finish("The transfer body is not valid")?;
        if same_wallet_named {
            return Err(same_wallet());
        }
        match (from, to, amount_minor) {
            (Some(from), Some(to), Some(amount_minor)) => {
                Self::new(WalletId(from), WalletId(to), amount_minor, amount_minor_max)
            }
            // `finish` refused any body missing one of them.
            _ => Err(Problem::validation("The transfer body is not valid.")),
        }
    }

    /// Nearly every body is plain: the three fields once each and nothing
    /// else, ids without escapes, a whole amount, every rule kept. Read
    /// straight into its fields, such a body costs no map and no strings.
    /// Any other body, and every one that breaks a rule, is `None`, and
    /// `parse` reads it field by field, which names what is wrong; so this
    /// accepts only what that would accept, with the same values.
    fn plain(body: &[u8], amount_minor_max: i64) -> Option<Self> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Plain<'a> {
            from_wallet_id: &'a str,
            to_wallet_id: &'a str,
            amount_minor: i64,
        }
        let plain: Plain = serde_json::from_slice(body).ok()?;
        let from = parse_uuid(plain.from_wallet_id)?;
        let to = parse_uuid(plain.to_wallet_id)?;
        Self::new(WalletId(from), WalletId(to), plain.amount_minor, amount_minor_max).ok()
    }

    /// The same rules for a request that did not come as JSON (the
    /// browser's form).
    pub fn new(
        from: WalletId,
        to: WalletId,
        amount_minor: i64,
        amount_minor_max: i64,
    ) -> Result<Self, Problem> {
        if from == to {
            return Err(same_wallet());
        }
        Ok(Self {
            from,
            to,
            amount: AmountMinor::parse(amount_minor, amount_minor_max)?,
        })
    }

    /// This transfer's body in its one spelling. Joined from its pieces:
    /// through `format!`, each id and the amount took a formatter call on
    /// every transfer. The spelling is part of every stored fingerprint, so
    /// it never changes.
    pub fn canonical_json(&self) -> CanonicalBody {
        let mut amount = itoa::Buffer::new();
        let mut from = [0; uuid::fmt::Hyphenated::LENGTH];
        let mut to = [0; uuid::fmt::Hyphenated::LENGTH];
        let pieces = [
            r#"{"amount_minor":"#,
            amount.format(self.amount.get()),
            r#","from_wallet_id":""#,
            self.from.0.hyphenated().encode_lower(&mut from),
            r#"","to_wallet_id":""#,
            self.to.0.hyphenated().encode_lower(&mut to),
            r#""}"#,
        ];
        CanonicalBody::spelled(pieces.concat())
    }
}

/// A request's body in its one spelling, whatever the client's key order or
/// whitespace: the cooldown's body scope and the input to the idempotency
/// fingerprint. Every stored fingerprint hashes this spelling, so only a
/// request's own `canonical_json()` makes one, and a caller spells it once
/// for both uses.
pub struct CanonicalBody(String);

impl CanonicalBody {
    /// For a request's `canonical_json()` alone.
    pub(crate) fn spelled(spelling: String) -> Self {
        Self(spelling)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// SHA-256 of method, path and this body: the same body sent to another
    /// endpoint is another operation, so a key used for both is a key
    /// reused.
    pub fn fingerprint(&self, method: &str, path: &str) -> [u8; 32] {
        let mut hasher = Sha256::new();
        hasher.update(method.as_bytes());
        hasher.update(b"\n");
        hasher.update(path.as_bytes());
        hasher.update(b"\n");
        hasher.update(self.0.as_bytes());
        hasher.finalize().into()
    }
}

/// An id shortened for people: its last 8 hex digits, the part that
/// differs. Ids are UUIDv7, whose first digits are a timestamp, so two ids
/// made a second apart share their beginning and differ at the end.
pub fn short_id(id: Uuid) -> String {
    let hex = id.simple().to_string();
    format!("…{}", &hex[hex.len() - 8..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(json: &str) -> Result<TransferRequest, Problem> {
        TransferRequest::parse(json.as_bytes(), 1_000)
    }

    #[test]
    fn a_user_id_written_in_a_buffer_reads_as_it_displays() {
        let user = UserId(Uuid::now_v7());
        let mut buffer = [0; uuid::fmt::Hyphenated::LENGTH];
        assert_eq!(user.written_in(&mut buffer), user.to_string());
    }

    /// Every stored fingerprint hashes this spelling: a key sent before a
    /// change to it would no longer replay.
    #[test]
    fn the_canonical_body_is_spelled_as_it_always_was() {
        let request = body(r#"{"to_wallet_id":"0190b5c4-7e2a-7c11-9a3b-00000000abcd","amount_minor":907,"from_wallet_id":"0190B5C4-7E2A-7C11-9A3B-000000001234"}"#)
            .expect("valid");
        assert_eq!(
            request.canonical_json().as_str(),
            r#"{"amount_minor":907,"from_wallet_id":"0190b5c4-7e2a-7c11-9a3b-000000001234","to_wallet_id":"0190b5c4-7e2a-7c11-9a3b-00000000abcd"}"#
        );
    }

    #[test]
    fn the_fingerprint_ignores_key_order_and_whitespace() {
        let a = body(r#"{"from_wallet_id":"00000000-0000-0000-0000-000000000001","to_wallet_id":"00000000-0000-0000-0000-000000000002","amount_minor":5}"#).expect("valid");
        let b = body(
            r#"{ "amount_minor": 5, "to_wallet_id": "00000000-0000-0000-0000-000000000002",
            "from_wallet_id": "00000000-0000-0000-0000-000000000001" }"#,
        )
        .expect("valid");
        let fingerprint =
            |request: &TransferRequest, path| request.canonical_json().fingerprint("POST", path);
        assert_eq!(fingerprint(&a, "/p"), fingerprint(&b, "/p"));
        assert_ne!(fingerprint(&a, "/p"), fingerprint(&a, "/q"));
    }

    #[test]
    fn a_body_read_plainly_or_field_by_field_gives_the_same_transfer() {
        const FROM: &str = "00000000-0000-0000-0000-000000000001";
        const TO: &str = "00000000-0000-0000-0000-000000000002";
        let plain = format!(r#"{{"from_wallet_id":"{FROM}","to_wallet_id":"{TO}","amount_minor":5}}"#);
        let expected = TransferRequest::plain(plain.as_bytes(), 1_000).expect("a plain body");
        assert_eq!(body(&plain).expect("valid"), expected);
        // Each of these misses the plain reading (an escape, a whole number
        // written as a fraction, a repeated field) and is read field by
        // field, to the same transfer.
        for other in [
            format!(
                r#"{{"from_wallet_id":"\u0030{}","to_wallet_id":"{TO}","amount_minor":5}}"#,
                &FROM[1..]
            ),
            format!(r#"{{"from_wallet_id":"{FROM}","to_wallet_id":"{TO}","amount_minor":5.0}}"#),
            format!(
                r#"{{"amount_minor":7,"from_wallet_id":"{FROM}","to_wallet_id":"{TO}","amount_minor":5}}"#
            ),
        ] {
            assert_eq!(TransferRequest::plain(other.as_bytes(), 1_000), None, "{other}");
            assert_eq!(body(&other).expect("valid"), expected, "{other}");
        }
        // A plain body that breaks a rule is left to the reading that says
        // which.
        let same_wallet = plain.replace(TO, FROM);
        assert_eq!(TransferRequest::plain(same_wallet.as_bytes(), 1_000), None);
        assert_eq!(
            body(&same_wallet).expect_err("refused").kind,
            ProblemType::SameWallet
        );
    }

    #[test]
    fn syntax_errors_are_400_and_shape_errors_are_422() {
        assert_eq!(body("{").expect_err("bad").status, 400);
        assert_eq!(body(r#"{"amount_minor":"x"}"#).expect_err("bad").status, 422);
        let zero = r#"{"from_wallet_id":"00000000-0000-0000-0000-000000000001","to_wallet_id":"00000000-0000-0000-0000-000000000002","amount_minor":0}"#;
        assert_eq!(body(zero).expect_err("bad").status, 422);
        let too_much = zero.replace(":0}", ":1001}");
        assert_eq!(body(&too_much).expect_err("bad").status, 422);
        let same = r#"{"from_wallet_id":"00000000-0000-0000-0000-000000000001","to_wallet_id":"00000000-0000-0000-0000-000000000001","amount_minor":1}"#;
        assert_eq!(body(same).expect_err("bad").status, 422);
    }
}

/// One transfer as the transfer call takes it (`transfer()` alone, or
/// `transfer_batch()` with others): everything of the request, owned, so
/// that it can wait for an executor (`crate::executors`).
#[derive(Debug, Clone)]
pub struct TransferOrder {
    pub user: UserId,
    pub token_hash: [u8; 32],
    pub key: Option<Uuid>,
    pub fingerprint: [u8; 32],
    /// The id the transfer gets if it is made.
    pub transfer_id: Uuid,
    pub request: TransferRequest,
    /// Goes into stored problem bodies, so a replayed refusal still points
    /// at the trace of the request that decided it.
    pub trace_id: String,
}
