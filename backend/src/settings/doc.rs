//! `docs/settings.md`, rendered from the declaration of every setting. A
//! test keeps the committed file equal to the rendering, so the document
//! cannot drift from the code.

use std::fmt::Write as _;

use super::declare::{Bounds, SettingDoc, Shown};
use super::{CONVENTIONAL_VARIABLES, SETTINGS_DOC};

/// What rewrites the document instead of failing when it is out of date.
const REGENERATE: &str = "UPDATE_SETTINGS_DOC=1 cargo test -p layered-wallet --lib settings";

const INTRODUCTION: &str = "\
Settings load in four layers, each overriding the one before:\n\
\n\
1. the defaults below;\n\
2. a TOML file, if the server is started with `--config FILE` (for example \
`wallet-server serve --config config/example.toml`); it needs only the settings it changes, and a name the \
server does not know stops it;\n\
3. `WALLET_<SETTING>` environment variables, the setting's name in upper case (for example \
`WALLET_COOLDOWN_TTL_MS=2000`); a list is comma-separated;\n\
4. the conventional variables";

const CHECKED_AT_START_UP: &str = "\
Every bound below is checked at start-up, together with the rules a single bound cannot state (the \
currency's format, the signing key's length, `trusted_proxies` parsing, a minimum not above its maximum, \
`db_statement_timeout_ms` against the waits it encloses, unsafe modes only with \
`allow_unsafe_demo_modes`). Every problem is reported at once, and the server does not start until there \
are none.";

/// The whole document.
pub fn render_settings_doc() -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<!-- Generated from backend/src/settings/declared.rs; do not edit. Regenerate: {REGENERATE} -->"
    );
    out.push_str("# Settings\n\n");
    out.push_str(INTRODUCTION);
    let conventional: Vec<String> = CONVENTIONAL_VARIABLES
        .iter()
        .map(|(variable, setting)| format!("`{variable}` (`{setting}`)"))
        .collect();
    let _ = writeln!(
        out,
        " {}, which win over all the others.\n",
        join_as_prose(&conventional, "and")
    );
    out.push_str(CHECKED_AT_START_UP);
    out.push('\n');

    let mut section = "";
    for setting in SETTINGS_DOC {
        if setting.section != section {
            section = setting.section;
            let _ = writeln!(out, "\n## {section}\n");
            out.push_str("| setting | environment | type | default | bounds | meaning |\n");
            out.push_str("|---|---|---|---|---|---|\n");
        }
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} | {} |",
            setting.name,
            variables(setting),
            type_text(setting),
            default_text(setting),
            setting.bounds.map(bounds_text).unwrap_or_default(),
            cell(&doc_text(setting)),
        );
    }
    out
}

/// `WALLET_<NAME>`, and the conventional variable that stands for it.
fn variables(setting: &SettingDoc) -> String {
    let mut names = vec![format!("`WALLET_{}`", setting.name.to_ascii_uppercase())];
    names.extend(
        CONVENTIONAL_VARIABLES
            .iter()
            .filter(|(_, name)| *name == setting.name)
            .map(|(variable, _)| format!("`{variable}`")),
    );
    names.join(", ")
}

fn type_text(setting: &SettingDoc) -> String {
    if setting.values.is_empty() {
        setting.type_name.to_owned()
    } else {
        let values: Vec<String> = setting.values.iter().map(|value| format!("`{value}`")).collect();
        join_as_prose(&values, "or")
    }
}

fn default_text(setting: &SettingDoc) -> String {
    match (setting.default)() {
        Shown::Value(text) => {
            let hint = match (setting.bounds, text.parse::<i128>()) {
                (Some(bounds), Ok(number)) => unit_hint(number, bounds.unit)
                    .map(|hint| format!(" ({hint})"))
                    .unwrap_or_default(),
                _ => String::new(),
            };
            format!("`{}`{hint}", text.replace('`', ""))
        }
        Shown::Empty => match setting.empty_means {
            Some(meaning) => format!("(empty: {meaning})"),
            None => "(empty)".to_owned(),
        },
        Shown::Hidden => "(set; not shown)".to_owned(),
    }
}

fn bounds_text(bounds: Bounds) -> String {
    let text = format!("{} – {} {}", bounds.min, bounds.max, bounds.unit);
    match (
        unit_hint(bounds.min, bounds.unit),
        unit_hint(bounds.max, bounds.unit),
    ) {
        (None, None) => text,
        (min, max) => format!(
            "{text} ({} – {})",
            min.unwrap_or_else(|| format!("{} B", bounds.min)),
            max.unwrap_or_else(|| format!("{} B", bounds.max))
        ),
    }
}

/// A byte count in the largest binary unit that divides it, since
/// `1099511627776` does not read as 1 TiB.
fn unit_hint(number: i128, unit: &str) -> Option<String> {
    if unit != "bytes" || number <= 0 {
        return None;
    }
    ["TiB", "GiB", "MiB", "KiB"]
        .iter()
        .zip([40, 30, 20, 10])
        .find(|(_, shift)| number % (1 << shift) == 0)
        .map(|(name, shift)| format!("{} {name}", number >> shift))
}

/// The doc comment's lines as one paragraph.
fn doc_text(setting: &SettingDoc) -> String {
    setting
        .doc
        .iter()
        .map(|line| line.trim())
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Text that cannot end a table cell early.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// `a`, `a and b`, `a, b and c`.
fn join_as_prose(items: &[String], last_separator: &str) -> String {
    match items {
        [] => String::new(),
        [only] => only.clone(),
        [init @ .., last] => format!("{} {last_separator} {last}", init.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// Where the document lives, from the repository's root.
    const SETTINGS_DOC_PATH: &str = "docs/settings.md";

    fn committed_path() -> PathBuf {
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join(SETTINGS_DOC_PATH)
    }

    /// CI runs every test, so a declaration changed without its document
    /// fails the build. `UPDATE_SETTINGS_DOC=1` rewrites the document.
    #[test]
    fn the_settings_document_is_up_to_date() {
        let rendered = render_settings_doc();
        let path = committed_path();
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed == rendered {
            return;
        }
        if std::env::var_os("UPDATE_SETTINGS_DOC").is_some() {
            std::fs::write(&path, &rendered).expect("docs/settings.md must be writable");
            return;
        }
        let first_difference = committed
            .lines()
            .zip(rendered.lines())
            .position(|(committed, rendered)| committed != rendered)
            .unwrap_or_else(|| committed.lines().count().min(rendered.lines().count()));
        panic!(
            "{SETTINGS_DOC_PATH} is out of date (first difference at line {}); regenerate it with \
             `{REGENERATE}`",
            first_difference + 1
        );
    }

    #[test]
    fn byte_counts_read_in_binary_units() {
        assert_eq!(unit_hint(1 << 40, "bytes").as_deref(), Some("1 TiB"));
        assert_eq!(unit_hint(16 * 1024, "bytes").as_deref(), Some("16 KiB"));
        assert_eq!(unit_hint(1_536, "bytes").as_deref(), None);
        assert_eq!(unit_hint(0, "bytes").as_deref(), None);
        assert_eq!(unit_hint(2_048, "ms").as_deref(), None);
    }

    #[test]
    fn secret_defaults_render_safely() {
        let rendered = render_settings_doc();
        assert!(
            rendered.contains("(empty: a random key per process"),
            "{rendered}"
        );
        assert!(rendered.contains("`postgres://postgres@127.0.0.1:5432/layered_wallet`"));
    }
}
