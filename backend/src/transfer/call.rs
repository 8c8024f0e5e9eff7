//! The two calls a transfer executor (`crate::executors`) makes:
//! `transfer()` for a transfer alone, `transfer_batch()` for the transfers
//! waiting together. Both answer in `transfer()`'s columns, which
//! `transaction::settle` reads.

use futures::TryStreamExt;
use sqlx::Row;
use sqlx::postgres::{PgConnection, PgRow};
use uuid::Uuid;

use crate::domain::TransferOrder;
use crate::executors::BatchedCall;
use crate::settings::Config;

/// `transfer()` and `transfer_batch()`, with the waits and the retention
/// every transfer of this deployment shares.
pub struct TransferCall {
    pub retention_hours: i32,
    pub claim_wait_ms: i32,
    pub wallet_wait_ms: i32,
}

impl TransferCall {
    pub fn of(config: &Config) -> Self {
        Self {
            retention_hours: i32::from(config.idempotency.retention_hours),
            claim_wait_ms: i32::from(config.idempotency.wait_ms_max),
            wallet_wait_ms: i32::from(config.database.wallet_lock_wait_ms_max),
        }
    }
}

impl BatchedCall for TransferCall {
    type Order = TransferOrder;

    async fn one(&self, connection: &mut PgConnection, order: &TransferOrder) -> Result<PgRow, sqlx::Error> {
        sqlx::query(
            "SELECT refused, claim, claim_ms, guard, guard_ms, balance_minor_after, created_at,
                    response_status, response_body, response_refusal, response_trace_id
             FROM transfer($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        )
        .bind(order.user.0)
        .bind(&order.token_hash[..])
        .bind(order.key)
        .bind(&order.fingerprint[..])
        .bind(self.retention_hours)
        .bind(self.claim_wait_ms)
        .bind(self.wallet_wait_ms)
        .bind(order.transfer_id)
        .bind(order.request.from.0)
        .bind(order.request.to.0)
        .bind(order.request.amount.get())
        .bind(&order.trace_id)
        .fetch_one(connection)
        .await
    }

    async fn many(
        &self,
        connection: &mut PgConnection,
        orders: &[TransferOrder],
    ) -> Result<Vec<Option<PgRow>>, sqlx::Error> {
        // A second copy of a key in the same call would find the first in
        // flight and be told 409. It is left out instead (`None`): the
        // executor runs it alone once this call has committed, and it
        // waits for the first copy or replays its answer, as a copy sent
        // a moment later would.
        let mut keys_seen = std::collections::HashSet::with_capacity(orders.len());
        let first_of_its_key: Vec<bool> = orders
            .iter()
            .map(|order| order.key.is_none_or(|key| keys_seen.insert((order.user, key))))
            .collect();
        let sent: Vec<&TransferOrder> = orders
            .iter()
            .zip(&first_of_its_key)
            .filter_map(|(order, first)| first.then_some(order))
            .collect();
        let mut rows = decided_together(self, connection, &sent).await?.into_iter();
        Ok(first_of_its_key
            .into_iter()
            .map(|first| if first { rows.next() } else { None })
            .collect())
    }
}

/// `transfer_batch()` for `orders`: each one's row, in their order. An
/// error undid the whole call; the executor then runs each order alone.
async fn decided_together(
    call: &TransferCall,
    connection: &mut PgConnection,
    orders: &[&TransferOrder],
) -> Result<Vec<PgRow>, sqlx::Error> {
    let column = |of: fn(&TransferOrder) -> Uuid| orders.iter().map(|order| of(order)).collect::<Vec<_>>();
    let query = sqlx::query(
        "SELECT idx, (answer).* FROM transfer_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
    )
    .bind(column(|order| order.user.0))
    .bind(
        orders
            .iter()
            .map(|order| &order.token_hash[..])
            .collect::<Vec<_>>(),
    )
    .bind(orders.iter().map(|order| order.key).collect::<Vec<_>>())
    .bind(
        orders
            .iter()
            .map(|order| &order.fingerprint[..])
            .collect::<Vec<_>>(),
    )
    .bind(column(|order| order.transfer_id))
    .bind(column(|order| order.request.from.0))
    .bind(column(|order| order.request.to.0))
    .bind(
        orders
            .iter()
            .map(|order| order.request.amount.get())
            .collect::<Vec<_>>(),
    )
    .bind(
        orders
            .iter()
            .map(|order| order.trace_id.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(call.retention_hours)
    .bind(call.claim_wait_ms)
    .bind(call.wallet_wait_ms);
    // Room for every row at once: grown row by row, the vector was
    // reallocated as the batch's rows came in.
    let mut rows = Vec::with_capacity(orders.len());
    let mut answered = query.fetch(connection);
    while let Some(row) = answered.try_next().await? {
        rows.push(row);
    }
    if rows.len() != orders.len() {
        return Err(sqlx::Error::Protocol(format!(
            "transfer_batch() answered {} rows for {} transfers",
            rows.len(),
            orders.len()
        )));
    }
    rows.into_iter()
        .zip(1..)
        .map(|(row, index)| {
            // `idx`, the first column, read by position: by name it was a
            // lookup for every row.
            let idx: i32 = row.try_get(0)?;
            if idx != index {
                return Err(sqlx::Error::Protocol(format!(
                    "transfer_batch() answered {idx} in place {index}"
                )));
            }
            Ok(row)
        })
        .collect()
}
