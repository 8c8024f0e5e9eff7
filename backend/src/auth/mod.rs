//! Who is calling: passwords, bearer tokens and their verification.
//!
//! A bearer token is `lw1.<payload>.<mac>` in URL-safe base64, where the
//! payload is the user id, an expiry time and 256 random bits, and the mac is
//! HMAC-SHA-256 over the payload with `token_signing_key`. The MAC lets the
//! edge of the transfer route learn the caller without a database query, so
//! a request the cooldown refuses costs no PostgreSQL work at all.
//!
//! The database keeps only the SHA-256 of each token, which is how a token is
//! revoked: every route checks that the hash is still present (the transfer
//! route does so inside its transaction), so a revoked or expired token
//! moves no money.

//!
//! `token`: issuing, verifying, storing and revoking tokens; `csrf`: the
//! session's CSRF token; `password`: argon2id on threads of their own.

mod csrf;
pub mod lab_pass;
mod password;
pub mod provider_signature;
mod token;

pub use password::*;
pub use token::*;
