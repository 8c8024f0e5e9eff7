//! Every setting, declared once: its doc comment, name, type, default and,
//! for a number, its bounds and unit. `Settings`, its `Default`, the bound
//! checks and `docs/settings.md` all follow from this list
//! (`declare.rs`), which is written in the sibling files, a group of
//! sections each, and gathered here into one declaration. A limit's unit is the last word of its name, or the
//! word before `_max` / `_min`; the names are the contract with config
//! files and `WALLET_*` variables.
//!
//! Rules that tie one setting to another, or that a string must follow,
//! are code in `sections.rs`.

mod accounts;
mod demos;
mod feed;
mod flows;
mod layers;
mod serving;
mod stores;

use secrecy::SecretString;

use super::declare::declare_settings;
use super::{
    CooldownScope, IdempotencyMode, InboxMode, LogFormat, PayoutMode, RowGuardMode, StoreErrorPolicy,
};
use accounts::accounts_settings;
use demos::demos_settings;
use feed::feed_settings;
use flows::flows_settings;
use layers::layers_settings;
use serving::serving_settings;
use stores::stores_settings;

// Each file declares its sections, in the order the document lists them.
declare_settings! { @gather [serving_settings stores_settings layers_settings flows_settings demos_settings feed_settings accounts_settings] }

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::checks::Checks;
    use crate::settings::declare::{SettingDoc, Shown};

    /// Units that measure (time, size, money), and the word that names
    /// each in a setting's name.
    const MEASURES: &[(&str, &str)] = &[
        ("ms", "ms"),
        ("s", "s"),
        ("hours", "hours"),
        ("bytes", "bytes"),
        ("minor units", "minor"),
    ];

    fn default_number(setting: &SettingDoc) -> i128 {
        match (setting.default)() {
            Shown::Value(text) => text
                .parse()
                .unwrap_or_else(|error| panic!("{}: {text:?}: {error}", setting.name)),
            other => panic!("{}: a number's default shows as {other:?}", setting.name),
        }
    }

    #[test]
    fn every_number_has_bounds_and_nothing_else_does() {
        for setting in SETTINGS_DOC {
            assert_eq!(setting.is_number, setting.bounds.is_some(), "{}", setting.name);
        }
    }

    #[test]
    fn every_default_lies_within_its_bounds() {
        let mut check = Checks::default();
        Settings::default().check_bounds(&mut check);
        assert!(check.problems().is_empty(), "{:?}", check.problems());
        for setting in SETTINGS_DOC {
            if let Some(bounds) = setting.bounds {
                let default = default_number(setting);
                assert!(
                    bounds.min <= default && default <= bounds.max,
                    "{}: {default} outside {bounds:?}",
                    setting.name
                );
            }
        }
    }

    /// A measured limit ends in its unit, or in its unit and then `_max` /
    /// `_min` (`cooldown_ttl_ms`, `request_body_bytes_max`); a count ends
    /// in `_max` / `_min` or in what it counts (`http_workers`).
    #[test]
    fn every_name_ends_in_its_unit() {
        for setting in SETTINGS_DOC {
            let Some(bounds) = setting.bounds else { continue };
            let name = setting.name;
            let stem = name
                .strip_suffix("_max")
                .or_else(|| name.strip_suffix("_min"))
                .unwrap_or(name);
            let measure = MEASURES.iter().find(|(unit, _)| *unit == bounds.unit);
            match measure {
                Some((_, word)) => assert!(stem.ends_with(&format!("_{word}")), "{name}: unit {word}"),
                None => assert!(
                    stem != name || name.ends_with(&format!("_{}", bounds.unit)),
                    "{name}: a count ends in _max, _min or _{}",
                    bounds.unit
                ),
            }
            for (unit, word) in MEASURES {
                if stem.ends_with(&format!("_{word}")) {
                    assert_eq!(bounds.unit, *unit, "{name} is named in {word}");
                }
            }
        }
    }

    #[test]
    fn a_setting_says_what_empty_means_exactly_when_its_default_is_empty() {
        for setting in SETTINGS_DOC {
            let empty = (setting.default)() == Shown::Empty;
            assert_eq!(empty, setting.empty_means.is_some(), "{}", setting.name);
        }
    }

    #[test]
    fn every_choice_defaults_to_one_of_its_values() {
        for setting in SETTINGS_DOC.iter().filter(|setting| !setting.values.is_empty()) {
            let Shown::Value(default) = (setting.default)() else {
                panic!("{}: a choice's default must show", setting.name);
            };
            assert!(
                setting.values.contains(&default.as_str()),
                "{}: {default}",
                setting.name
            );
        }
    }

    #[test]
    fn every_setting_has_a_doc_and_one_section() {
        let mut sections_seen: Vec<&str> = Vec::new();
        for setting in SETTINGS_DOC {
            assert!(!setting.doc.is_empty(), "{} has no doc", setting.name);
            if sections_seen.last() != Some(&setting.section) {
                assert!(
                    !sections_seen.contains(&setting.section),
                    "section {:?} is declared twice",
                    setting.section
                );
                sections_seen.push(setting.section);
            }
        }
    }
}
