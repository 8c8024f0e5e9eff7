//! What a failed database call means for the client: whether anything can
//! have committed, and so whether the answer may say "nothing was changed".

use super::{Problem, ProblemType};

/// What a failed database call says about the work it carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatabaseFailure {
    /// Nothing can have committed: no connection could be had, or the
    /// connection broke inside a transaction that was never asked to commit
    /// (the caller knows which; see `transfer::execute`).
    NothingCommitted,
    /// PostgreSQL reported the error, so the statement (and the implicit or
    /// explicit transaction around it) rolled back, and the cause is one
    /// that passes: a shutdown, a timeout, too many connections, a
    /// serialization failure left after the retries.
    RolledBackTransient,
    /// PostgreSQL reported an error that retrying will not cure: a bug.
    RolledBackBug,
    /// The connection broke, or the answer could not be read, after the
    /// work may have been sent: it may have committed.
    Unknown,
}

impl DatabaseFailure {
    /// Classifies an error by what the error alone tells.
    pub fn of(error: &sqlx::Error) -> Self {
        match error {
            sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => DatabaseFailure::NothingCommitted,
            sqlx::Error::Database(db) => Self::of_sqlstate(db.code().as_deref().unwrap_or("")),
            _ => DatabaseFailure::Unknown,
        }
    }

    /// An error PostgreSQL reported, by its SQLSTATE: it rolled its
    /// statement back, and either passes with time or is a bug.
    pub fn of_sqlstate(code: &str) -> Self {
        match SqlState::of_code(code) {
            SqlState::RetryTransaction | SqlState::LockNotAvailable | SqlState::Transient => {
                DatabaseFailure::RolledBackTransient
            }
            SqlState::Other => DatabaseFailure::RolledBackBug,
        }
    }
}

/// What the service makes of a PostgreSQL error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlState {
    /// serialization_failure or deadlock_detected: the whole transaction
    /// may run again (`transfer_retries_max`).
    RetryTransaction,
    /// lock_not_available: a `lock_timeout` ran out waiting for a row.
    LockNotAvailable,
    /// A cause that passes with time: a shutdown, a timeout, too many
    /// connections, a connection exception.
    Transient,
    /// Anything else: retrying will not cure it.
    Other,
}

/// The SQLSTATEs the service acts on, in one table: an exact code, or a
/// class (its first two characters). Exact codes are looked up first.
const SQLSTATES: [(&str, SqlState); 7] = [
    ("40001", SqlState::RetryTransaction), // serialization_failure
    ("40P01", SqlState::RetryTransaction), // deadlock_detected
    ("55P03", SqlState::LockNotAvailable), // lock_not_available
    ("08", SqlState::Transient),           // connection exception
    ("40", SqlState::Transient),           // transaction rollback
    ("53", SqlState::Transient),           // insufficient resources
    ("57", SqlState::Transient), // operator intervention: 57014 statement timeout, 57P01-03 shutdowns
];

impl SqlState {
    pub fn of_code(code: &str) -> Self {
        let exact = SQLSTATES.iter().find(|(known, _)| *known == code);
        let class = || {
            SQLSTATES
                .iter()
                .find(|(known, _)| known.len() == 2 && code.get(..2) == Some(*known))
        };
        exact
            .or_else(class)
            .map_or(SqlState::Other, |(_, meaning)| *meaning)
    }

    /// The SQLSTATE of an error PostgreSQL reported; `None` for any other
    /// failure (a broken connection, a pool time-out).
    pub fn of(error: &sqlx::Error) -> Option<Self> {
        match error {
            sqlx::Error::Database(db) => Some(Self::of_code(db.code().as_deref().unwrap_or(""))),
            _ => None,
        }
    }
}

/// Logs a database error once, with its cause chain, and turns it into the
/// problem the client sees, saying "nothing was changed" only where that is
/// known.
pub fn from_database_error(error: &sqlx::Error, doing: &str) -> Problem {
    from_database_failure(DatabaseFailure::of(error), error, doing)
}

/// A failure of the one statement that does a request's work (a deposit's,
/// a payout's), said as what is known: a row lock waited out or nothing
/// committed ("nothing was changed"), or, when the connection broke after
/// the statement was sent (`may_have_committed`), `unknown`: a problem that
/// says the outcome is unknown and how to retry safely.
pub fn of_the_work(
    error: &sqlx::Error,
    may_have_committed: bool,
    doing: &str,
    unknown: impl FnOnce() -> Problem,
) -> Problem {
    if SqlState::of(error) == Some(SqlState::LockNotAvailable) {
        return Problem::unavailable(
            "The wallet is busy with other requests. Nothing was changed; retry shortly.",
        );
    }
    match DatabaseFailure::of(error) {
        DatabaseFailure::Unknown if may_have_committed => {
            tracing::error!(error = %error, "lost the database connection after sending the work of {doing}");
            unknown()
        }
        DatabaseFailure::Unknown => from_database_failure(DatabaseFailure::NothingCommitted, error, doing),
        failure => from_database_failure(failure, error, doing),
    }
}

pub fn from_database_failure(failure: DatabaseFailure, error: &sqlx::Error, doing: &str) -> Problem {
    match failure {
        DatabaseFailure::NothingCommitted | DatabaseFailure::RolledBackTransient => {
            tracing::error!(error = %error, "database unavailable while {doing}");
            Problem::unavailable("The database is unavailable. Nothing was changed; retry shortly.")
        }
        DatabaseFailure::Unknown => {
            tracing::error!(error = %error, "lost the database connection while {doing}");
            Problem::new(
                ProblemType::ServiceUnavailable,
                "The connection to the database broke. Retry shortly.",
            )
            .with_retry_after_s(1)
        }
        DatabaseFailure::RolledBackBug => {
            tracing::error!(error = ?error, "database error while {doing}");
            Problem::internal()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every error PostgreSQL reports rolled its statement back; the ones
    /// that pass are 503 "nothing was changed", the rest a 500 that claims
    /// nothing.
    #[test]
    fn each_sqlstate_class_maps_to_its_answer() {
        for (code, meaning, failure, status) in [
            (
                "57P01",
                "admin shutdown",
                DatabaseFailure::RolledBackTransient,
                503,
            ),
            (
                "57P02",
                "crash shutdown",
                DatabaseFailure::RolledBackTransient,
                503,
            ),
            (
                "57P03",
                "cannot connect now",
                DatabaseFailure::RolledBackTransient,
                503,
            ),
            (
                "57014",
                "statement timeout",
                DatabaseFailure::RolledBackTransient,
                503,
            ),
            (
                "53300",
                "too many connections",
                DatabaseFailure::RolledBackTransient,
                503,
            ),
            (
                "08006",
                "connection failure",
                DatabaseFailure::RolledBackTransient,
                503,
            ),
            (
                "40001",
                "serialization failure",
                DatabaseFailure::RolledBackTransient,
                503,
            ),
            ("40P01", "deadlock", DatabaseFailure::RolledBackTransient, 503),
            (
                "55P03",
                "lock not available",
                DatabaseFailure::RolledBackTransient,
                503,
            ),
            ("23505", "unique violation", DatabaseFailure::RolledBackBug, 500),
            ("42P01", "undefined table", DatabaseFailure::RolledBackBug, 500),
            ("P0001", "raise exception", DatabaseFailure::RolledBackBug, 500),
        ] {
            assert_eq!(DatabaseFailure::of_sqlstate(code), failure, "{code} {meaning}");
            let problem = from_database_failure(failure, &sqlx::Error::PoolTimedOut, "testing");
            assert_eq!(problem.status, status, "{code} {meaning}");
            assert_eq!(
                problem.detail.contains("Nothing was changed"),
                status == 503,
                "{code}"
            );
        }
        assert_eq!(
            DatabaseFailure::of(&sqlx::Error::PoolTimedOut),
            DatabaseFailure::NothingCommitted
        );
        let broken = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(DatabaseFailure::of(&broken), DatabaseFailure::Unknown);
        let unknown = from_database_failure(DatabaseFailure::Unknown, &broken, "testing");
        assert!(!unknown.detail.contains("Nothing was changed"));
    }

    /// An exact code wins over its class: a deadlock is retried, though
    /// its class (40) would only say "transient".
    #[test]
    fn the_sqlstate_table_reads_exact_codes_before_classes() {
        assert_eq!(SqlState::of_code("40001"), SqlState::RetryTransaction);
        assert_eq!(SqlState::of_code("40P01"), SqlState::RetryTransaction);
        assert_eq!(SqlState::of_code("40002"), SqlState::Transient);
        assert_eq!(SqlState::of_code("55P03"), SqlState::LockNotAvailable);
        assert_eq!(SqlState::of_code("55000"), SqlState::Other);
        assert_eq!(SqlState::of_code("57014"), SqlState::Transient);
        assert_eq!(SqlState::of_code(""), SqlState::Other);
        assert_eq!(SqlState::of(&sqlx::Error::PoolTimedOut), None);
    }
}
