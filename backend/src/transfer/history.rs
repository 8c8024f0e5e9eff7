//! The caller's history, in one place for the API and the wallet page.

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// One page of a user's history: sent and received, newest first.
///
/// Each direction is its own bounded index scan (`transfers_from_wallet_idx`,
/// `transfers_to_wallet_idx`, each stopping after `$3` rows past the
/// cursor), merged: an `OR` of the two could use neither index for order and
/// would sort all of a busy wallet's transfers for every page.
///
/// The cursor counts only if it is one of the user's own transfers: another
/// user's transfer id gives the same empty page as an id that does not
/// exist, so it reveals nothing.
///
/// A payout's hold and release are transfers with the holds wallet; the
/// other side is named by the payout's bank account instead, through the
/// payouts' unique indexes on those transfers.
pub const HISTORY_PAGE_SQL: &str = "
WITH mine AS (SELECT id FROM wallets WHERE user_id = $1 AND lab_slot IS NULL),
cursor AS (
    SELECT 'infinity'::timestamptz AS created_at, 'ffffffff-ffff-ffff-ffff-ffffffffffff'::uuid AS id
    WHERE $2::uuid IS NULL
    UNION ALL
    SELECT t.created_at, t.id FROM transfers t
    WHERE t.id = $2
      AND (t.from_wallet_id IN (SELECT id FROM mine) OR t.to_wallet_id IN (SELECT id FROM mine))
),
page AS (
    SELECT sent.* FROM mine m CROSS JOIN LATERAL (
        SELECT t.id, t.from_wallet_id, t.to_wallet_id, t.amount_minor, t.created_at, true AS sent
        FROM transfers t
        WHERE t.from_wallet_id = m.id
          AND (t.created_at, t.id) < ((SELECT created_at FROM cursor), (SELECT id FROM cursor))
        ORDER BY t.created_at DESC, t.id DESC
        LIMIT $3) sent
    UNION ALL
    SELECT received.* FROM mine m CROSS JOIN LATERAL (
        SELECT t.id, t.from_wallet_id, t.to_wallet_id, t.amount_minor, t.created_at, false AS sent
        FROM transfers t
        WHERE t.to_wallet_id = m.id
          AND (t.created_at, t.id) < ((SELECT created_at FROM cursor), (SELECT id FROM cursor))
        ORDER BY t.created_at DESC, t.id DESC
        LIMIT $3) received
)
SELECT p.id, p.from_wallet_id, p.to_wallet_id, p.amount_minor, p.created_at, p.sent,
       coalesce(
           (SELECT CASE WHEN po.hold_transfer_id = p.id THEN 'bank account ' || po.destination
                        ELSE 'bank account ' || po.destination || ' (refused: the money came back)' END
              FROM payouts po WHERE po.hold_transfer_id = p.id OR po.release_transfer_id = p.id),
           u.name) AS counterpart_name
FROM page p
JOIN wallets w ON w.id = CASE WHEN p.sent THEN p.to_wallet_id ELSE p.from_wallet_id END
JOIN users u ON u.id = w.user_id
ORDER BY p.created_at DESC, p.id DESC
LIMIT $3";

/// A row of `HISTORY_PAGE_SQL`.
#[derive(sqlx::FromRow)]
pub struct HistoryRow {
    pub id: Uuid,
    pub from_wallet_id: Uuid,
    pub to_wallet_id: Uuid,
    pub amount_minor: i64,
    pub created_at: DateTime<Utc>,
    /// Sent by the user (else received).
    pub sent: bool,
    /// The other side's name.
    pub counterpart_name: String,
}

/// The transfers touching `user_id`'s wallets, newest first, older than
/// `before` (one of the user's own transfers) when given.
pub async fn list_for_user(
    db: &sqlx::PgPool,
    user_id: Uuid,
    before: Option<Uuid>,
    limit: i64,
) -> Result<Vec<HistoryRow>, sqlx::Error> {
    sqlx::query_as::<_, HistoryRow>(HISTORY_PAGE_SQL)
        .bind(user_id)
        .bind(before)
        .bind(limit)
        .fetch_all(db)
        .await
}

/// One transfer, if `user_id` sent or received it.
pub async fn find_for_user(
    db: &sqlx::PgPool,
    user_id: Uuid,
    id: Uuid,
) -> Result<Option<HistoryRow>, sqlx::Error> {
    sqlx::query_as::<_, HistoryRow>(
        "SELECT t.id, t.from_wallet_id, t.to_wallet_id, t.amount_minor, t.created_at,
                f.user_id = $2 AS sent,
                CASE WHEN f.user_id = $2 THEN ru.name ELSE fu.name END AS counterpart_name
         FROM transfers t
         JOIN wallets f ON f.id = t.from_wallet_id
         JOIN wallets r ON r.id = t.to_wallet_id
         JOIN users fu ON fu.id = f.user_id
         JOIN users ru ON ru.id = r.user_id
         WHERE t.id = $1 AND (f.user_id = $2 OR r.user_id = $2)",
    )
    .bind(id)
    .bind(user_id)
    .fetch_optional(db)
    .await
}
