//! Every bound the server enforces on what it reads, written into the
//! OpenAPI document from the declaration that enforces it: lengths and
//! ranges from this deployment's settings, patterns and enums from the
//! parsers' own constants and choices (each pattern's tests hold it equal
//! to the parser it describes).
//!
//! Where a rule is beyond a schema (a name's scripts and look-alikes, a
//! header read in any order), the schema states a narrower form the server
//! always accepts, its description says the rest, and a name's
//! `x-accepted-pattern` the wider form every accepted name keeps. So a
//! schema-valid request is refused only by a business rule no schema can
//! state (a balance too low, a target that does not exist), with that
//! rule's problem type.

use serde_json::{Value, json};

use crate::payout::DESTINATION_CHARS_MAX;
use crate::race_lab::switches::{IDEMPOTENCY_CHOICES, ROW_GUARD_CHOICES};
use crate::settings::{Config, choice_name};

/// A UUID in its canonical hyphenated form, the only one the server reads
/// (`domain::parse_uuid`).
const UUID: &str = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
/// A provider's event id, as `defense::inbox::is_event_id` reads it.
const EVENT_ID_PATTERN: &str = "^[A-Za-z0-9_.:-]{1,128}$";
/// A deposit's currency, as `DepositEvent::parse` reads it.
const CURRENCY_PATTERN: &str = "^[A-Z]{3}$";
/// Names every deployment accepts (unless taken, or reading like a taken
/// one): ASCII letters, digits and `' . _ : -`, single spaces between
/// words. All of it is Latin or common to every script, allowed in
/// identifiers and unchanged by NFKC, so no rule of `names` refuses it.
const NAME_ALWAYS_ACCEPTED: &str = r"^[A-Za-z0-9'._:-]+( [A-Za-z0-9'._:-]+)*$";

/// A bank account's reference, as `payout::is_destination` reads it.
fn destination_pattern() -> String {
    format!("^[A-Za-z0-9_.:-]{{1,{DESTINATION_CHARS_MAX}}}$")
}

fn uuid_pattern() -> String {
    format!("^{UUID}$")
}

/// The `Race-Lab-Switches` values that always parse (`Switches::parse`):
/// the members in one order, each at most once, `, ` between them. The
/// server also reads them in any order, with any spaces around `,` and
/// `=`; a regular expression would need every order spelled out.
fn switches_pattern() -> String {
    let names = |names: Vec<&str>| names.join("|");
    let members = [
        "cooldown=(on|off)".to_owned(),
        format!(
            "idempotency=({})",
            names(IDEMPOTENCY_CHOICES.iter().map(|c| choice_name(&c.mode)).collect())
        ),
        format!(
            "row_guard=({})",
            names(ROW_GUARD_CHOICES.iter().map(|c| choice_name(&c.mode)).collect())
        ),
        format!("run={UUID}"),
    ];
    let starting_at = |first: usize| {
        let rest: String = members[first + 1..].iter().map(|m| format!("(, {m})?")).collect();
        format!("{}{rest}", members[first])
    };
    let alternatives: Vec<String> = (0..members.len()).map(starting_at).collect();
    format!("^({})$", alternatives.join("|"))
}

/// The bounds of one operation's parameters.
pub(super) fn constrain_parameters(operation: &mut Value, config: &Config) {
    let page_max = match operation["operationId"].as_str() {
        Some("list_transfers" | "list_payouts") => config.money.transfers_page_rows_max,
        _ => config.feed.page_entries_max as i64,
    };
    // `get_mut`, not indexing: indexing a missing key would insert a null.
    let Some(parameters) = operation.get_mut("parameters").and_then(Value::as_array_mut) else {
        return;
    };
    for parameter in parameters {
        let schema = match parameter["name"].as_str() {
            Some("limit") => json!({ "type": "integer", "minimum": 1, "maximum": page_max }),
            Some("after") => json!({ "type": "string", "pattern": "^[0-9]{1,19}-[0-9]{1,19}$" }),
            Some("Idempotency-Key") => json!({
                "type": "string",
                "pattern": format!("^({UUID}|\"{UUID}\")$"),
            }),
            Some("id" | "before") => json!({ "type": "string", "format": "uuid", "pattern": uuid_pattern() }),
            Some("Race-Lab-Switches") => json!({ "type": "string", "pattern": switches_pattern() }),
            _ => continue,
        };
        parameter["schema"] = schema;
    }
}

/// Adds `bounds` to one property of a component schema. The schemas are
/// the handlers' own, so a missing one is a renamed type: every test that
/// builds the document says so.
fn bound(document: &mut Value, schema: &str, property: &str, bounds: Value) {
    let pointer = format!("/components/schemas/{schema}/properties/{property}");
    let target = document
        .pointer_mut(&pointer)
        .and_then(Value::as_object_mut)
        .unwrap_or_else(|| panic!("the OpenAPI document has no {pointer}"));
    if let Value::Object(bounds) = bounds {
        target.extend(bounds);
    }
}

/// The bounds of every body the server reads, and the enums of what it
/// answers.
pub(super) fn state(document: &mut Value, config: &Config) {
    let accounts = &config.accounts;
    bound(
        document,
        "Credentials",
        "name",
        json!({
            "minLength": 1,
            "maxLength": accounts.user_name_chars_max,
            "pattern": NAME_ALWAYS_ACCEPTED,
            "x-accepted-pattern": crate::names::SPACING_PATTERN,
        }),
    );
    let password =
        json!({ "minLength": accounts.password_chars_min, "maxLength": accounts.password_chars_max });
    bound(document, "Credentials", "password", password);
    let uuid = json!({ "pattern": uuid_pattern() });
    let amount = |max: i64| json!({ "minimum": 1, "maximum": max });
    for (schema, max) in [
        ("TransferBody", config.money.transfer_amount_minor_max),
        ("PayoutBody", config.payouts.amount_minor_max),
        ("DepositEventBody", config.deposits.amount_minor_max),
    ] {
        bound(document, schema, "amount_minor", amount(max));
        // Every body is read field by field, and a field it does not
        // know is refused (`problem::Fields`).
        document["components"]["schemas"][schema]["additionalProperties"] = json!(false);
    }
    for (schema, property) in [
        ("TransferBody", "from_wallet_id"),
        ("TransferBody", "to_wallet_id"),
        ("PayoutBody", "from_wallet_id"),
        ("DepositEventBody", "wallet_id"),
    ] {
        bound(document, schema, property, uuid.clone());
    }
    let destination =
        json!({ "minLength": 1, "maxLength": DESTINATION_CHARS_MAX, "pattern": destination_pattern() });
    bound(document, "PayoutBody", "destination", destination);
    bound(
        document,
        "DepositEventBody",
        "event_id",
        json!({ "pattern": EVENT_ID_PATTERN }),
    );
    bound(
        document,
        "DepositEventBody",
        "currency",
        json!({ "pattern": CURRENCY_PATTERN }),
    );
    bound(
        document,
        "TransferItem",
        "direction",
        json!({ "enum": ["sent", "received"] }),
    );
    bound(
        document,
        "DepositReceipt",
        "status",
        json!({ "enum": ["credited"] }),
    );
}

#[cfg(test)]
#[path = "bounds_tests.rs"]
mod tests;
