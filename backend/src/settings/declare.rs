//! The machinery behind the one declaration of every setting
//! (`declared.rs`): the macro that turns it into `Settings`, its `Default`,
//! its bound checks and `SETTINGS_DOC`, and what each setting's type tells
//! the document.

use secrecy::{ExposeSecret, SecretString};

/// One setting as the document shows it, made by `declare_settings!` from
/// the setting's declaration.
#[derive(Debug, Clone, Copy)]
pub struct SettingDoc {
    /// The heading the setting is declared under.
    pub section: &'static str,
    pub name: &'static str,
    /// How the document names the type, for a type that is not a choice.
    pub type_name: &'static str,
    /// The values a choice accepts, as a file writes them; empty otherwise.
    pub values: &'static [&'static str],
    pub is_number: bool,
    /// Lists arrive comma-separated from the environment.
    pub is_list: bool,
    /// Every number's floor and ceiling.
    pub bounds: Option<Bounds>,
    /// What an empty value means, for a setting whose default is empty.
    pub empty_means: Option<&'static str>,
    /// The declaration's doc comment, one entry per line.
    pub doc: &'static [&'static str],
    /// The default as the document shows it. A function of the defaults
    /// alone: nothing read from a file or the environment can reach the
    /// document.
    pub default: fn() -> Shown,
}

/// A number's inclusive bounds, widened to `i128` so that one type holds
/// every integer type a setting uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub min: i128,
    pub max: i128,
    /// What the number counts, as the document writes it: `ms`, `bytes`,
    /// `connections`.
    pub unit: &'static str,
}

/// How a value may be shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shown {
    Value(String),
    Empty,
    /// A secret that might give something away.
    Hidden,
}

/// What the declaration needs from a setting's type.
pub trait SettingValue {
    const TYPE_NAME: &'static str;
    /// For a choice: the values it accepts, as a file writes them.
    const VALUES: &'static [&'static str] = &[];
    const IS_NUMBER: bool = false;
    const IS_LIST: bool = false;

    fn shown(&self) -> Shown;
}

macro_rules! integer_setting_values {
    ($($ty:ty),*) => {$(
        impl SettingValue for $ty {
            const TYPE_NAME: &'static str = "integer";
            const IS_NUMBER: bool = true;

            fn shown(&self) -> Shown {
                Shown::Value(self.to_string())
            }
        }
    )*};
}

integer_setting_values!(u16, u32, u64, usize, i64);

impl SettingValue for bool {
    const TYPE_NAME: &'static str = "boolean";

    fn shown(&self) -> Shown {
        Shown::Value(self.to_string())
    }
}

impl SettingValue for String {
    const TYPE_NAME: &'static str = "string";

    fn shown(&self) -> Shown {
        if self.is_empty() {
            Shown::Empty
        } else {
            Shown::Value(self.clone())
        }
    }
}

impl SettingValue for SecretString {
    const TYPE_NAME: &'static str = "string (secret)";

    /// A URL without a password may be shown; anything else is not, in
    /// case a default ever carries a credential.
    fn shown(&self) -> Shown {
        let secret = self.expose_secret();
        if secret.is_empty() {
            Shown::Empty
        } else if is_url_without_password(secret) {
            Shown::Value(secret.to_owned())
        } else {
            Shown::Hidden
        }
    }
}

impl SettingValue for Vec<String> {
    const TYPE_NAME: &'static str = "list of strings";
    const IS_LIST: bool = true;

    fn shown(&self) -> Shown {
        shown_list(self)
    }
}

impl SettingValue for Vec<SecretString> {
    const TYPE_NAME: &'static str = "list of strings (secret)";
    const IS_LIST: bool = true;

    fn shown(&self) -> Shown {
        shown_list(self)
    }
}

/// A list shows as its items joined, or hidden if any item is.
fn shown_list<T: SettingValue>(items: &[T]) -> Shown {
    let mut texts = Vec::with_capacity(items.len());
    for item in items {
        match item.shown() {
            Shown::Value(text) => texts.push(text),
            Shown::Empty => texts.push(String::new()),
            Shown::Hidden => return Shown::Hidden,
        }
    }
    if texts.is_empty() {
        Shown::Empty
    } else {
        Shown::Value(texts.join(", "))
    }
}

/// `scheme://host...` or `scheme://user@host...`, but not
/// `scheme://user:password@host...`.
fn is_url_without_password(text: &str) -> bool {
    let Some((_, rest)) = text.split_once("://") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    match authority.rsplit_once('@') {
        Some((user_info, _)) => !user_info.contains(':'),
        None => true,
    }
}

/// The choice a value names, as a file (or the race lab's form) writes
/// it; `None` for anything else.
pub fn parse_choice<T>(value: &str) -> Option<T>
where
    T: for<'de> serde::Deserialize<'de>,
{
    use serde::de::IntoDeserializer;
    let deserializer: serde::de::value::StrDeserializer<'_, serde::de::value::Error> =
        value.into_deserializer();
    T::deserialize(deserializer).ok()
}

/// A choice's value the way a file writes it: the listed value that
/// parses to `choice`; empty for a variant missing from `VALUES`, which
/// the declaration's tests catch for every default.
pub fn choice_name<T>(choice: &T) -> &'static str
where
    T: SettingValue + PartialEq + for<'de> serde::Deserialize<'de>,
{
    T::VALUES
        .iter()
        .copied()
        .find(|value| parse_choice::<T>(value).as_ref() == Some(choice))
        .unwrap_or_default()
}

pub(super) fn shown_choice<T>(choice: &T) -> Shown
where
    T: SettingValue + PartialEq + for<'de> serde::Deserialize<'de> + std::fmt::Debug,
{
    match choice_name(choice) {
        "" => Shown::Value(format!("{choice:?}")),
        value => Shown::Value(value.to_owned()),
    }
}

/// Declares every setting once. Each entry is its doc comment, then
/// `name: Type = default`, then for a number `, within MIN..=MAX "unit"`,
/// and for a setting whose default is empty `, empty "what empty means"`.
/// From that come the `Settings` struct (one `pub` field per entry, with its
/// doc comment), its `Default`, `Settings::check_bounds` (one bound check
/// per number, its message made from the name) and `SETTINGS_DOC`.
///
/// A bound that is not a literal is written in parentheses, e.g.
/// `(256 * 1024 * 1024)`, and takes the setting's type.
///
/// The sections may come from files of their own: `@gather [a b c]` asks
/// macro `a` for its sections, which passes them on with `[b c]`, and so
/// on; the last hands every section gathered to the declaration. Each
/// file's macro is `([$($files:ident)*] $($sections:tt)*) =>
/// declare_settings! { @gather [$($files)*] $($sections)* section … }`.
macro_rules! declare_settings {
    (@some) => { None };
    (@some $value:expr) => { Some($value) };

    (@gather [] $($sections:tt)*) => {
        $crate::settings::declare::declare_settings! { $($sections)* }
    };
    (@gather [$file:ident $($files:ident)*] $($sections:tt)*) => {
        $file! { [$($files)*] $($sections)* }
    };

    ($(
        section $section:literal {$(
            $(#[doc = $doc:literal])*
            $name:ident: $ty:ty = $default:expr
            $(, within $min:tt ..= $max:tt $unit:literal)?
            $(, empty $empty_means:literal)?
            ;
        )*}
    )*) => {
        /// What an operator writes: flat, each name ending in its unit.
        /// Everything about a setting is declared in `declared.rs`.
        #[derive(Debug, Clone, serde::Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct Settings {$($(
            $(#[doc = $doc])*
            pub $name: $ty,
        )*)*}

        impl Default for Settings {
            fn default() -> Self {
                Self {$($(
                    $name: $default,
                )*)*}
            }
        }

        impl Settings {
            /// Notes every number that lies outside its declared bounds.
            // A bound that is an expression comes in parentheses.
            #[allow(unused_parens)]
            pub(in $crate::settings) fn check_bounds(&self, check: &mut $crate::settings::checks::Checks) {
                $($($(
                    check.within(stringify!($name), self.$name, $min, $max);
                )?)*)*
            }
        }

        /// Every setting, in declaration order, as the document shows it.
        pub const SETTINGS_DOC: &[$crate::settings::declare::SettingDoc] = &[$($(
            $crate::settings::declare::SettingDoc {
                section: $section,
                name: stringify!($name),
                type_name: <$ty as $crate::settings::declare::SettingValue>::TYPE_NAME,
                values: <$ty as $crate::settings::declare::SettingValue>::VALUES,
                is_number: <$ty as $crate::settings::declare::SettingValue>::IS_NUMBER,
                is_list: <$ty as $crate::settings::declare::SettingValue>::IS_LIST,
                bounds: declare_settings!(@some $(
                    $crate::settings::declare::Bounds {
                        min: {
                            #[allow(unused_parens)]
                            let min: $ty = $min;
                            min as i128
                        },
                        max: {
                            #[allow(unused_parens)]
                            let max: $ty = $max;
                            max as i128
                        },
                        unit: $unit,
                    }
                )?),
                empty_means: declare_settings!(@some $($empty_means)?),
                doc: &[$($doc),*],
                default: || {
                    $crate::settings::declare::SettingValue::shown(&<Settings as Default>::default().$name)
                },
            },
        )*)*];
    };
}

pub(super) use declare_settings;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_shows_only_when_it_is_a_url_without_a_password() {
        let shown = |text: &str| SecretString::from(text).shown();
        assert_eq!(
            shown("postgres://postgres@127.0.0.1:5432/layered_wallet"),
            Shown::Value("postgres://postgres@127.0.0.1:5432/layered_wallet".into())
        );
        assert_eq!(
            shown("redis://127.0.0.1:6379"),
            Shown::Value("redis://127.0.0.1:6379".into())
        );
        assert_eq!(shown("postgres://wallet:hunter2@db/wallet"), Shown::Hidden);
        assert_eq!(shown("redis://:hunter2@cache:6379"), Shown::Hidden);
        assert_eq!(shown("a-signing-key-of-at-least-32-bytes!!"), Shown::Hidden);
        assert_eq!(shown(""), Shown::Empty);
    }

    #[test]
    fn a_list_with_a_hidden_item_is_hidden() {
        let urls = vec![
            SecretString::from("redis://127.0.0.1:7101"),
            SecretString::from("redis://:hunter2@127.0.0.1:7102"),
        ];
        assert_eq!(urls.shown(), Shown::Hidden);
        assert_eq!(
            vec!["10.0.0.0/8".to_owned(), "127.0.0.1".to_owned()].shown(),
            Shown::Value("10.0.0.0/8, 127.0.0.1".into())
        );
        assert_eq!(Vec::<String>::new().shown(), Shown::Empty);
    }
}
