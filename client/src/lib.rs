//! A client for Layered Wallet's REST API that retries safely.
//!
//! The server keeps its half of the idempotency contract: a transfer sent
//! twice with one `Idempotency-Key` moves money once, and the second answer
//! replays the first. This crate keeps the other half, in one place
//! ([`RetryPolicy`] and [`Client::transfer`]):
//!
//! - **One key per payment.** You make an [`IdempotencyKey`] once per
//!   logical payment, and may store it before the first attempt; every
//!   retry sends the same key, above all after an unknown outcome (a
//!   time-out, a broken connection, `503 outcome-unknown`).
//! - **Retry what may still succeed:** connection errors, time-outs,
//!   `409` (the key is still in flight, or an optimistic write lost its
//!   race), `429`, `503`. Waits use
//!   exponential backoff with full jitter, and never less than the server's
//!   `Retry-After`.
//! - **Never retry what cannot:** `400`, `401`, `403`, `404`, `422` come
//!   back at once as [`Error::Refused`], with the problem's type.
//! - **A replay is reported as a replay** ([`Paid::replayed`]), and it is the
//!   same receipt as the original.
//! - **A keyless transfer is never retried** ([`Client::transfer_without_key`]):
//!   without a key the server cannot tell a retry from a second payment.
//!
//! What it cannot guarantee: a key is remembered by the server for its
//! retention (`idempotency_retention_hours`, 24 h by default). A retry
//! after that is a new payment. And when every attempt ends without an
//! answer, [`Error::GaveUp`] says so: the payment may have been made; look
//! it up (`GET /api/v1/transfers`) or retry later **with the same key**.
//!
//! ```no_run
//! # async fn pay() -> Result<(), wallet_client::Error> {
//! use wallet_client::{Client, IdempotencyKey, RetryPolicy, TransferOrder};
//!
//! let client = Client::new("http://127.0.0.1:8080", RetryPolicy::default())?;
//! let alice = client.sign_up("alice", "correct horse battery").await?;
//! let bob = client.sign_up("bob", "correct horse battery").await?;
//! let key = IdempotencyKey::new(); // store it with the order before the first attempt
//! let order = TransferOrder {
//!     from_wallet_id: alice.wallet_id,
//!     to_wallet_id: bob.wallet_id,
//!     amount_minor: 950,
//! };
//! let paid = client.with_token(&alice.token).transfer(&order, key).await?;
//! println!("paid once: {} (replayed: {})", paid.receipt.id, paid.replayed);
//! # Ok(())
//! # }
//! ```

mod client;
mod error;
mod retry;
mod types;

pub use client::{AttemptSeen, Client, DecisionStream, IDLE_CONNECTION_S_MAX, Observer, http_client_builder};
pub use error::{Error, FieldError, Problem};
pub use retry::{IdempotencyKey, RetryPolicy, may_succeed_later};
pub use types::{
    Decision, DecisionPage, DecisionSource, Paid, Payout, PayoutAccepted, PayoutOrder, PayoutReceipt,
    SignedIn, SignedUp, TransferItem, TransferOrder, TransferPage, TransferReceipt, Wallet,
};
