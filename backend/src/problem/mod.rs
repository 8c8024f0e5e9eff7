//! RFC 9457 problem details: the one shape of every error this service sends.
//!
//! A `Problem` carries what the client needs (a stable `type`, a human
//! `title` and `detail`, and which defense `layer` decided, when one did) and
//! nothing it must not see: causes and internal errors go to the log, never
//! into the body.
//!
//! Every problem type is a variant of [`ProblemType`]: its slug, status and
//! title for API clients, the sentence a person reads in the browser, and the
//! description `GET /problems/{slug}` shows. Adding a refusal starts there.
//!
//! - `catalogue`: every problem type, with its words and its status;
//! - `response`: a `Problem` and how it is sent over HTTP;
//! - `database`: what a failed database call means for the client, from
//!   one table of the SQLSTATEs the service acts on;
//! - `fields`: reading a JSON body field by field, so that a 422 names
//!   each field it refuses (`errors[].pointer`).

mod catalogue;
mod database;
mod fields;
mod response;

pub use catalogue::ProblemType;
pub use database::{DatabaseFailure, SqlState, from_database_error, from_database_failure, of_the_work};
pub use fields::{FieldError, Fields};
pub use response::{PROBLEM_CONTENT_TYPE, Problem, retry_after_s};
