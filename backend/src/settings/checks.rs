//! Collects what is wrong with the settings, so that an operator sees every
//! problem at once and fixes a file in one pass.

use std::fmt::Display;

use super::SettingsError;

#[derive(Debug, Default)]
pub(super) struct Checks {
    problems: Vec<String>,
}

impl Checks {
    pub(super) fn require(&mut self, ok: bool, message: impl Into<String>) {
        if !ok {
            self.problems.push(message.into());
        }
    }

    /// Notes a problem if `value` lies outside `floor..=ceiling`. Every
    /// number has both, so that a typo such as an extra zero is refused at
    /// start-up rather than met at run time (a token lifetime that
    /// overflows, a pool PostgreSQL cannot serve).
    pub(super) fn within<T: PartialOrd + Display>(&mut self, name: &str, value: T, floor: T, ceiling: T) {
        self.require(
            floor <= value && value <= ceiling,
            format!("{name} must be between {floor} and {ceiling} (it is {value})"),
        );
    }

    #[cfg(test)]
    pub(super) fn problems(&self) -> &[String] {
        &self.problems
    }

    pub(super) fn finish<T>(self, checked: T) -> Result<T, SettingsError> {
        if self.problems.is_empty() {
            Ok(checked)
        } else {
            Err(SettingsError(self.problems))
        }
    }
}
