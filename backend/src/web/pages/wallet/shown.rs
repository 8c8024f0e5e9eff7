//! The page a wallet form leads to, kept (`kept_pages`) so that the form
//! can redirect to it (post/redirect/get): reloading the address shows the
//! same page and sends nothing. One per person, replaced by their next
//! form, for `wallet_page_retention_s`.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::super::Notice;
use crate::domain::UserId;
use crate::kept_pages::{self, Kind};
use crate::state::AppState;

/// A transfer read back to the person before any money moves.
#[derive(Serialize, Deserialize)]
pub(super) struct Draft {
    pub(super) to_wallet_id: Uuid,
    pub(super) recipient_name: String,
    pub(super) amount_minor: i64,
    pub(super) typed_recipient: String,
    pub(super) typed_amount: String,
    pub(super) idempotency_key: Uuid,
}

/// A payout read back to the person before any money is set aside.
#[derive(Serialize, Deserialize)]
pub(super) struct PayoutDraft {
    pub(super) destination: String,
    pub(super) amount_minor: i64,
    pub(super) typed_amount: String,
    pub(super) idempotency_key: Uuid,
}

/// What a wallet form leads to.
#[derive(Serialize, Deserialize)]
pub(super) enum Shown {
    /// The wallet with a notice; `recipient` and `amount` refill the form
    /// after a refusal, so that it can be corrected.
    Wallet {
        notice: Notice,
        recipient: String,
        amount: String,
    },
    /// A confirmation, perhaps again after Send, with why. Send counts down
    /// until `send_again_at_ms` (Unix milliseconds) after a cooldown
    /// refusal.
    Review {
        draft: Draft,
        notice: Option<Notice>,
        send_again_at_ms: Option<i64>,
    },
    /// A payout's confirmation, as a transfer's.
    PayoutReview {
        draft: PayoutDraft,
        notice: Option<Notice>,
        send_again_at_ms: Option<i64>,
    },
}

impl Shown {
    /// The address that shows it, kept as `id`.
    pub(super) fn address(&self, id: &impl std::fmt::Display) -> String {
        match self {
            Shown::Wallet { .. } => format!("/wallet?shown={id}"),
            Shown::Review { .. } => format!("/wallet/review?shown={id}"),
            Shown::PayoutReview { .. } => format!("/wallet/payout/review?shown={id}"),
        }
    }
}

/// Keeps `shown` as `user`'s page, replacing the one before; its id.
pub(super) async fn keep(state: &AppState, user: UserId, shown: &Shown) -> Result<Uuid, sqlx::Error> {
    kept_pages::keep(
        &state.db,
        user,
        Kind::Wallet,
        shown,
        state.config.demo.wallet_pages,
    )
    .await
}

/// `user`'s page `id`, unless a later form replaced it or it expired.
pub(super) async fn load(state: &AppState, user: UserId, id: &str) -> Result<Option<Shown>, sqlx::Error> {
    match crate::domain::parse_uuid(id) {
        Some(id) => kept_pages::load(&state.db, Kind::Wallet, id, Some(user)).await,
        None => Ok(None),
    }
}

/// The seconds left until `send_again_at_ms`, if any are.
pub(super) fn seconds_until(send_again_at_ms: Option<i64>) -> Option<u64> {
    let left_ms = send_again_at_ms? - chrono::Utc::now().timestamp_millis();
    (left_ms > 0).then(|| u64::try_from(left_ms).unwrap_or(0).div_ceil(1000))
}
