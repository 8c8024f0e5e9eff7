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
    let digits = major.to_string();
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    let symbol = match currency {
        "USD" => "$".to_owned(),
        "EUR" => "€".to_owned(),
        "GBP" => "£".to_owned(),
        other => format!("{other} "),
    };
    format!("{sign}{symbol}{grouped}.{cents:02}")
}

/// `"12.50"`, `"12.5"`, `"12"`, `"1,234.50"` → minor units. At most two
/// decimals; positive; `None` for anything else.
pub fn parse_major(input: &str) -> Option<i64> {
    let cleaned: String = input
        .trim()
        .trim_start_matches('$')
        .chars()
        .filter(|c| *c != ',')
        .collect();
    let (whole, fraction) = match cleaned.split_once('.') {
        Some((whole, fraction)) => (whole, fraction),
        None => (cleaned.as_str(), ""),
    };
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    if !whole.bytes().all(|b| b.is_ascii_digit()) || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if fraction.len() > 2 || whole.len() > 15 {
        return None;
    }
    let whole: i64 = if whole.is_empty() { 0 } else { whole.parse().ok()? };
    let cents: i64 = match fraction.len() {
        0 => 0,
        1 => fraction.parse::<i64>().ok()? * 10,
        _ => fraction.parse().ok()?,
    };
    let minor = whole.checked_mul(MINOR_PER_MAJOR)?.checked_add(cents)?;
    (minor > 0).then_some(minor)
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
        assert_eq!(parse_major("12.50"), Some(1250));
        assert_eq!(parse_major("12.5"), Some(1250));
        assert_eq!(parse_major("12"), Some(1200));
        assert_eq!(parse_major(" $1,234.05 "), Some(123_405));
        assert_eq!(parse_major(".5"), Some(50));
        for bad in ["", "0", "0.00", "1.234", "-5", "abc", "1e3", "."] {
            assert_eq!(parse_major(bad), None, "{bad}");
        }
    }
}
