//! Money as people read and type it: `$1,234.50`, never `123450`.

/// Minor units per major unit; every currency this demo supports has two
/// decimals.
const MINOR_PER_MAJOR: i64 = 100;

/// `123450, "USD"` → `$1,234.50`.
pub fn format(minor: i64, currency: &str) -> String {
    let sign = if minor < 0 { "-" } else { "" };
    let abs = minor.unsigned_abs();
    let major = abs / MINOR_PER_MAJOR as u64;
    let cents = abs % MINOR_PER_MAJOR as u64;
    let grouped = group_thousands(major);
    let symbol = match currency {
        "USD" => "$".to_owned(),
        "EUR" => "€".to_owned(),
        "GBP" => "£".to_owned(),
        other => format!("{other} "),
    };
    format!("{sign}{symbol}{grouped}.{cents:02}")
}

/// `1234567` → `1,234,567`: digits grouped in threes with commas, as
/// people read amounts and milliseconds alike.
pub fn group_thousands(number: u64) -> String {
    let digits = number.to_string();
    let mut grouped = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

/// What people call the currency, for hints: "US dollars".
pub fn currency_name(currency: &str) -> String {
    match currency {
        "USD" => "US dollars".to_owned(),
        "EUR" => "euros".to_owned(),
        "GBP" => "pounds sterling".to_owned(),
        other => other.to_owned(),
    }
}

/// The one grammar of a typed amount (`parse_typed`); the wallet form has
/// no HTML `pattern`, so that the server's sentence, which quotes what was
/// read, is what a person sees:
/// digits with an optional dot and at most two decimals, and a comma only as
/// a true thousands separator (`1,234.50`). Spaces around it are allowed.
/// No signs, no currency symbols, no exponents, no other digits than 0-9.
pub const AMOUNT_PATTERN: &str = r" *(?:[1-9][0-9]{0,2}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]{1,2})? *";

fn amount_grammar() -> &'static regex::Regex {
    static GRAMMAR: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    GRAMMAR.get_or_init(|| {
        #[expect(clippy::expect_used, reason = "a constant pattern, tested below")]
        regex::Regex::new(&format!("^(?:{AMOUNT_PATTERN})$")).expect("AMOUNT_PATTERN compiles")
    })
}

/// Why a typed amount was refused, in a sentence for the person who typed
/// it. Every sentence quotes what was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmountRefused(pub String);

/// A typed amount → minor units, or the reason it is not one. `max_minor`
/// is the largest single transfer.
pub fn parse_typed(input: &str, max_minor: i64, currency: &str) -> Result<i64, AmountRefused> {
    let typed = input.trim_matches(' ');
    let refuse = |why: String| Err(AmountRefused(why));
    if typed.is_empty() {
        return refuse("Enter an amount, such as 12.50.".to_owned());
    }
    if !amount_grammar().is_match(input) {
        return refuse(why_not_an_amount(typed));
    }
    let digits: String = typed.chars().filter(|c| *c != ',').collect();
    let (whole, cents) = digits.split_once('.').unwrap_or((digits.as_str(), ""));
    let whole_minor = whole
        .parse::<i64>()
        .ok()
        .and_then(|whole| whole.checked_mul(MINOR_PER_MAJOR));
    let cents = format!("{cents:0<2}").parse::<i64>().unwrap_or(0);
    let Some(minor) = whole_minor.and_then(|whole| whole.checked_add(cents)) else {
        return refuse(too_large(typed, max_minor, currency));
    };
    if minor == 0 {
        return refuse(format!(
            "We read “{typed}” as zero. Enter an amount above {}.",
            format(0, currency)
        ));
    }
    if minor > max_minor {
        return refuse(too_large(typed, max_minor, currency));
    }
    Ok(minor)
}

fn too_large(typed: &str, max_minor: i64, currency: &str) -> String {
    format!(
        "We read “{typed}”, which is more than the largest single transfer, {}.",
        format(max_minor, currency)
    )
}

/// The sentence for input outside the grammar: what was read, and what
/// would be right.
fn why_not_an_amount(typed: &str) -> String {
    let example = "Type digits with a dot for the cents, such as 9.50 or 1,234.50.";
    if typed.chars().any(|c| c.is_numeric() && !c.is_ascii_digit()) {
        return format!("We read “{typed}”, which has digits other than 0 to 9. {example}");
    }
    if typed.starts_with('-') {
        return format!("We read “{typed}”, a negative amount. Amounts are always positive. {example}");
    }
    if typed.starts_with(['$', '€', '£']) || typed.ends_with(['$', '€', '£']) {
        return format!("We read “{typed}” with a currency sign. Type the number alone. {example}");
    }
    let (whole, fraction) = typed.split_once('.').unwrap_or((typed, ""));
    if !fraction.is_empty() && fraction.chars().all(|c| c.is_ascii_digit()) && fraction.len() > 2 {
        return format!(
            "We read “{typed}”, which has more than two decimals. Amounts go down to the cent. {example}"
        );
    }
    if whole.contains(',') {
        return format!(
            "We read “{typed}”. A comma may only separate thousands, as in 1,234.50; for cents use a dot, \
             as in 9.50."
        );
    }
    format!("We read “{typed}”, which is not an amount. {example}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_with_symbol_separators_and_two_decimals() {
        assert_eq!(format(123_450, "USD"), "$1,234.50");
        assert_eq!(format(5, "EUR"), "€0.05");
        assert_eq!(format(-100_000_000, "USD"), "-$1,000,000.00");
        assert_eq!(format(100, "CHF"), "CHF 1.00");
    }

    #[test]
    fn parses_what_people_type() {
        let parse = |typed: &str| parse_typed(typed, 10_000_000, "USD");
        for (typed, minor) in [
            ("12.50", 1250),
            ("12.5", 1250),
            ("12", 1200),
            (" 1,234.05 ", 123_405),
            ("12,345", 1_234_500),
            ("0.01", 1),
            ("100000", 10_000_000),
        ] {
            assert_eq!(parse(typed), Ok(minor), "{typed}");
        }
    }

    #[test]
    fn refuses_everything_else_and_says_what_it_read() {
        for typed in [
            "9,50",
            "1,0.5",
            "12,50",
            "1.005",
            "1e3",
            "-1",
            "$2",
            "٣",
            "１２",
            ".5",
            "1.",
            "0",
            "0.00",
            "01,000",
            "1,23",
            "100000.01",
            "99999999999999999999",
            "abc",
            "1 000",
        ] {
            let refused = parse_typed(typed, 10_000_000, "USD").expect_err(typed);
            assert!(
                refused.0.contains(typed.trim()) || typed.trim().is_empty(),
                "{typed}: {}",
                refused.0
            );
        }
        assert!(
            parse_typed("9,50", 10_000_000, "USD")
                .expect_err("comma")
                .0
                .contains("for cents use a dot")
        );
        assert!(
            parse_typed("200,000", 10_000_000, "USD")
                .expect_err("max")
                .0
                .contains("$100,000.00")
        );
    }
}
