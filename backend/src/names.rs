//! Names people choose, and how two of them are compared.
//!
//! Money can be sent by name, so a name must mean one account to a person
//! reading it. Four rules:
//!
//! - **Allowed characters only:** each character of the name's NFKC form
//!   must be allowed in identifiers by UTS #39 (`Identifier_Status=Allowed`:
//!   letters, digits and marks of scripts in modern use, and `' - . : _ ·`),
//!   or be a single space between words. An allowlist, because the characters that render
//!   as nothing or as a blank keep growing (U+2800 BRAILLE PATTERN BLANK,
//!   U+3164 HANGUL FILLER, U+1D159 a musical null notehead), and a denylist
//!   of categories misses them. A combining mark must sit on a letter or a
//!   digit, at most `MARKS_PER_CHARACTER_MAX` to one.
//! - **One script, or a safe mix:** a name may mix Latin with at most one
//!   other script in modern use, but never with Cyrillic or Greek, whose
//!   letters copy Latin ones (UTS #39's *moderately restrictive* level).
//! - **One key per name:** Unicode NFKC normalisation plus case folding, so
//!   `bob`, `BOB` and `ｂｏｂ` are the same name. Lookups and sign-ins match on
//!   the key (an exact match of the stored name wins, for accounts created
//!   before keys existed).
//! - **No look-alikes:** a name whose UTS #39 confusable skeleton equals an
//!   existing name's is refused (`paypal` written all in Cyrillic, `bob1`
//!   next to `bobl`).
//!
//! Both the key and the skeleton are unique in the schema
//! (migrations/20261202000001_accounts.sql), so two sign-ups racing for
//! look-alike names cannot both win.

use unicode_normalization::UnicodeNormalization;
use unicode_properties::{GeneralCategoryGroup, UnicodeGeneralCategory};
use unicode_security::{GeneralSecurityProfile, RestrictionLevel, RestrictionLevelDetection};

use crate::problem::Problem;

/// A name that passed the rules, with what it is compared by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComparableName {
    /// As the person typed it: what pages show.
    pub display: String,
    /// NFKC + case folding: what lookups match on.
    pub key: String,
    /// The confusable skeleton of the key: what look-alikes share.
    pub skeleton: String,
}

/// The lookup key of any text: NFKC, case folded, NFKC again (case folding
/// can undo a normalisation).
pub fn key_of(name: &str) -> String {
    let normalised: String = name.nfkc().collect();
    caseless::default_case_fold_str(&normalised).nfkc().collect()
}

fn skeleton_of(key: &str) -> String {
    unicode_security::confusable_detection::skeleton(key).collect()
}

impl ComparableName {
    /// Applies the rules to a name someone chose. `chars_max` is the
    /// `user_name_chars_max` setting.
    pub fn parse(name: &str, chars_max: usize) -> Result<Self, Problem> {
        let chars = name.chars().count();
        if chars == 0 || chars > chars_max {
            return Err(
                Problem::validation(format!("A name has 1 to {chars_max} characters."))
                    .detail_is_for_people(),
            );
        }
        if name.trim() != name {
            return Err(
                Problem::validation("A name cannot start or end with a space.").detail_is_for_people()
            );
        }
        // A blank other than a plain space would pass as one after NFKC.
        if let Some(blank) = name.chars().find(|c| c.is_whitespace() && *c != ' ') {
            return Err(Problem::validation(format!(
                "A name may hold plain spaces only. It cannot hold U+{:04X}.",
                u32::from(blank)
            ))
            .detail_is_for_people());
        }
        // The rules read the name as NFKC makes it, as UTS #39 expects:
        // `ｂｏｂ` is `bob`.
        let normalised: String = name.nfkc().collect();
        if normalised.trim() != normalised {
            return Err(
                Problem::validation("A name cannot start or end with a space.").detail_is_for_people()
            );
        }
        if let Some(refused) = first_refused(&normalised) {
            return Err(Problem::validation(format!(
                "A name may hold letters, digits, the marks that go on them, single spaces between words and \
                 ' - . : _ ·. It cannot hold U+{:04X}.",
                u32::from(refused)
            ))
            .detail_is_for_people());
        }
        if !normalised
            .split(' ')
            .collect::<String>()
            .as_str()
            .check_restriction_level(RestrictionLevel::ModeratelyRestrictive)
        {
            return Err(Problem::validation(
                "A name cannot mix Latin letters with Cyrillic or Greek ones, or mix more than two scripts: such \
                 names can copy another name letter for letter.",
            )
            .detail_is_for_people());
        }
        let key = key_of(name);
        let skeleton = skeleton_of(&key);
        Ok(Self {
            display: name.to_owned(),
            key,
            skeleton,
        })
    }
}

/// The rules' spacing, as the OpenAPI document's pattern (ECMA-262): words
/// of non-blank characters, one plain space between two. The rest of the
/// rules are beyond a regular expression; `ComparableName::parse` applies
/// them all.
pub const SPACING_PATTERN: &str = r"^\S+( \S+)*$";

/// Combining marks one character may carry beyond what NFKC composes into
/// it: enough for any language's letters, too few to pile marks into a
/// blur.
pub const MARKS_PER_CHARACTER_MAX: usize = 2;

/// The first character the rules refuse, if any: one not allowed in
/// identifiers, a space beside another, or a mark that sits on nothing, on
/// a space, or on too many marks already.
fn first_refused(name: &str) -> Option<char> {
    let mut previous: Option<char> = None;
    let mut marks_in_a_row = 0;
    for c in name.chars() {
        let is_mark = c.general_category_group() == GeneralCategoryGroup::Mark;
        let allowed = match c {
            ' ' => previous != Some(' '),
            c if is_mark => {
                marks_in_a_row += 1;
                c.identifier_allowed()
                    && marks_in_a_row <= MARKS_PER_CHARACTER_MAX
                    && previous.is_some_and(|p| {
                        p.is_alphanumeric() || p.general_category_group() == GeneralCategoryGroup::Mark
                    })
            }
            c => c.identifier_allowed(),
        };
        if !allowed {
            return Some(c);
        }
        if !is_mark {
            marks_in_a_row = 0;
        }
        previous = Some(c);
    }
    None
}

/// The `WHERE` condition that finds a user by a typed name, on `users u`:
/// `$1` is the name as typed, `$2` its key (`key_of`). Pair it with
/// `ORDER BY u.name = $1 DESC` so that an exact match wins.
pub const MATCHES_NAME: &str = "(u.name = $1 OR u.name_key = $2)";

/// Accounts read per step of `backfill`: bounds its memory on a large,
/// older table.
const BACKFILL_BATCH_ROWS: i64 = 1_000;

/// Fills in the key and skeleton of accounts created before they existed,
/// oldest first. An account whose key or skeleton is already taken by an
/// older one keeps NULLs (and its exact name) and is logged. Runs after the
/// migrations; after the first run only such look-alikes are left to read.
pub async fn backfill(db: &sqlx::PgPool) -> Result<(), sqlx::Error> {
    let mut after: Option<(chrono::DateTime<chrono::Utc>, uuid::Uuid)> = None;
    loop {
        let legacy = sqlx::query_as::<_, (chrono::DateTime<chrono::Utc>, uuid::Uuid, String)>(
            "SELECT created_at, id, name FROM users
              WHERE name_skeleton IS NULL AND ($1::timestamptz IS NULL OR (created_at, id) > ($1, $2))
              ORDER BY created_at, id LIMIT $3",
        )
        .bind(after.map(|(created_at, _)| created_at))
        .bind(after.map(|(_, id)| id))
        .bind(BACKFILL_BATCH_ROWS)
        .fetch_all(db)
        .await?;
        let Some(&(created_at, id, _)) = legacy.last() else {
            return Ok(());
        };
        after = Some((created_at, id));
        for (_, id, name) in legacy {
            let key = key_of(&name);
            let skeleton = skeleton_of(&key);
            let updated = sqlx::query("UPDATE users SET name_key = $2, name_skeleton = $3 WHERE id = $1")
                .bind(id)
                .bind(&key)
                .bind(&skeleton)
                .execute(db)
                .await;
            match updated {
                Ok(_) => {}
                Err(sqlx::Error::Database(error)) if error.is_unique_violation() => {
                    tracing::warn!(
                        user.id = %id,
                        "an account created before look-alike checks reads like an older one; \
                         it keeps working under its exact name only"
                    );
                }
                Err(error) => return Err(error),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(name: &str) -> Result<ComparableName, Problem> {
        ComparableName::parse(name, 64)
    }

    #[test]
    fn case_and_width_do_not_make_a_new_name() {
        let bob = parse("bob").expect("valid");
        assert_eq!(parse("BOB").expect("valid").key, bob.key);
        assert_eq!(parse("ｂｏｂ").expect("valid").key, bob.key);
        assert_eq!(
            parse("Straße").expect("valid").key,
            parse("STRASSE").expect("valid").key
        );
    }

    #[test]
    fn look_alikes_share_a_skeleton() {
        let paypal = parse("paypal").expect("valid");
        // All Cyrillic: one script, so allowed, and caught by its skeleton.
        let cyrillic = parse("\u{0440}\u{0430}\u{0443}\u{0440}\u{0430}\u{04CF}").expect("valid");
        assert_ne!(paypal.key, cyrillic.key);
        assert_eq!(paypal.skeleton, cyrillic.skeleton);
        // Mixed with Latin: refused outright.
        assert!(parse("p\u{0430}ypal").is_err());
        assert_eq!(
            parse("bob1").expect("valid").skeleton,
            parse("bobl").expect("valid").skeleton
        );
        assert_ne!(parse("alice").expect("valid").skeleton, paypal.skeleton);
    }

    #[test]
    fn invisible_and_unassigned_characters_are_refused() {
        for name in [
            "bob\u{200B}",
            "\u{202E}bob",
            "bo\u{0007}b",
            "bob\u{E000}",
            "bob\u{0378}",
            "bob\u{2028}",
            " bob",
            "",
        ] {
            assert!(parse(name).is_err(), "{name:?}");
        }
        assert!(parse("Zoë Ångström").is_ok());
        assert!(parse(&"a".repeat(65)).is_err());
    }
}
