//! Each pattern of the document against the parser it describes: what the
//! pattern admits, the parser reads; where the pattern is the whole rule,
//! what the parser reads, the pattern admits.

use regex::Regex;
use serde_json::Value;

use super::*;
use crate::names::ComparableName;
use crate::race_lab::switches::Switches;
use crate::settings::Settings;

fn matches(pattern: &str, text: &str) -> bool {
    Regex::new(pattern).expect("the pattern compiles").is_match(text)
}

/// Strings around a rule's edges: every single character of the first 256
/// and a few beyond, each also at the longest length and one past it.
fn samples(longest: usize) -> Vec<String> {
    let mut samples = vec![String::new()];
    for c in (0u32..256)
        .chain([0x00B7, 0x00E9, 0x0430, 0x200B, 0x4E2D])
        .filter_map(char::from_u32)
    {
        samples.push(c.to_string());
        samples.push(format!("a{c}b"));
        samples.push(c.to_string().repeat(longest));
        samples.push(c.to_string().repeat(longest + 1));
    }
    samples
}

#[test]
fn event_ids_and_destinations_are_exactly_their_patterns() {
    for text in samples(128) {
        assert_eq!(
            matches(EVENT_ID_PATTERN, &text),
            crate::defense::inbox::is_event_id(&text),
            "{text:?}"
        );
    }
    for text in samples(DESTINATION_CHARS_MAX) {
        assert_eq!(
            matches(&destination_pattern(), &text),
            crate::payout::is_destination(&text),
            "{text:?}"
        );
    }
}

#[test]
fn currencies_are_exactly_their_pattern() {
    let event = |currency: &str| {
        format!(
            r#"{{"event_id":"e","wallet_id":"0190f0a0-0000-7000-8000-000000000001","amount_minor":1,"currency":{},"occurred_at":"2026-12-02T18:00:00Z"}}"#,
            Value::String(currency.to_owned())
        )
    };
    for text in samples(3)
        .iter()
        .chain(&["USD".to_owned(), "usd".to_owned(), "US".to_owned()])
    {
        let parsed = crate::deposit::DepositEvent::parse(event(text).as_bytes()).is_ok();
        assert_eq!(matches(CURRENCY_PATTERN, text), parsed, "{text:?}");
    }
}

/// The schema's `currency_code` domain holds the same rule, for deposits
/// and payouts alike: a currency the document admits is one a row accepts.
#[test]
fn the_schema_holds_currencies_to_the_same_pattern() {
    let schema = include_str!("../../../migrations/20261202000002_wallets_and_ledger.sql");
    let domain = format!("CREATE DOMAIN currency_code AS text CHECK (VALUE ~ '{CURRENCY_PATTERN}');");
    assert!(schema.contains(&domain), "the migration must declare `{domain}`");
}

#[test]
fn every_name_of_the_narrow_form_is_accepted() {
    let allowed = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789'._:-";
    let mut names: Vec<String> = allowed.chars().map(String::from).collect();
    names.push(
        allowed
            .chars()
            .collect::<Vec<_>>()
            .chunks(7)
            .map(String::from_iter)
            .collect::<Vec<_>>()
            .join(" "),
    );
    names.push("-".repeat(64));
    names.push("a b c d".to_owned());
    for name in names.iter().filter(|name| name.chars().count() <= 64) {
        assert!(matches(NAME_ALWAYS_ACCEPTED, name), "{name:?}");
        assert!(matches(crate::names::SPACING_PATTERN, name), "{name:?}");
        assert!(ComparableName::parse(name, 64).is_ok(), "{name:?}");
    }
    for refused in [" a", "a ", "a  b", "a\tb", "a!"] {
        assert!(!matches(NAME_ALWAYS_ACCEPTED, refused), "{refused:?}");
    }
}

#[test]
fn every_switches_value_of_the_pattern_parses() {
    let run = "0190f0a0-0000-7000-8000-00000000000A";
    let cooldowns = [None, Some("cooldown=on"), Some("cooldown=off")];
    let idempotency: Vec<Option<String>> = std::iter::once(None)
        .chain(
            IDEMPOTENCY_CHOICES
                .iter()
                .map(|c| Some(format!("idempotency={}", choice_name(&c.mode)))),
        )
        .collect();
    let row_guards: Vec<Option<String>> = std::iter::once(None)
        .chain(
            ROW_GUARD_CHOICES
                .iter()
                .map(|c| Some(format!("row_guard={}", choice_name(&c.mode)))),
        )
        .collect();
    let mut checked = 0;
    for cooldown in cooldowns {
        for idempotency in &idempotency {
            for row_guard in &row_guards {
                for run in [None, Some(format!("run={run}"))] {
                    let members: Vec<String> = [
                        cooldown.map(str::to_owned),
                        idempotency.clone(),
                        row_guard.clone(),
                        run,
                    ]
                    .into_iter()
                    .flatten()
                    .collect();
                    if members.is_empty() {
                        continue;
                    }
                    let value = members.join(", ");
                    assert!(matches(&switches_pattern(), &value), "{value:?}");
                    assert!(Switches::parse(&value).is_some(), "{value:?}");
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 100);
    for refused in [
        "cooldown=maybe",
        "idempotency=off",
        "cooldown=on, cooldown=off",
        "run=x",
        "",
    ] {
        assert!(!matches(&switches_pattern(), refused), "{refused:?}");
    }
}

#[test]
fn the_document_states_the_settings_bounds() {
    let config = Settings::default().validate().expect("defaults must validate");
    let document = crate::openapi::document(&config);
    let at = |pointer: &str| document.pointer(pointer).cloned().unwrap_or(Value::Null);
    let password = "/components/schemas/Credentials/properties/password";
    assert_eq!(
        at(&format!("{password}/minLength")),
        config.accounts.password_chars_min
    );
    assert_eq!(
        at(&format!("{password}/maxLength")),
        config.accounts.password_chars_max
    );
    let payouts = &document["paths"]["/api/v1/payouts"]["get"]["parameters"];
    let limit = payouts
        .as_array()
        .and_then(|parameters| parameters.iter().find(|p| p["name"] == "limit"))
        .expect("a limit parameter");
    assert_eq!(limit["schema"]["maximum"], config.money.transfers_page_rows_max);
    let deposit = "/components/schemas/DepositEventBody";
    assert_eq!(at(&format!("{deposit}/additionalProperties")), false);
    assert_eq!(
        at(&format!("{deposit}/properties/amount_minor/maximum")),
        config.deposits.amount_minor_max
    );
}
