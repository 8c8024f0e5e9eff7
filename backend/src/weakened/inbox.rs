//! DEMO ONLY: the inbox done wrong (`inbox_mode = check_then_insert`, or a
//! race-lab run's switch). The production inbox claims the event id
//! insert-first in the credit's transaction (`crate::defense::inbox`).
//!
//! The mistake the inbox exists to avoid, kept so that the double credit can
//! be shown: look the event up, credit, record the event afterwards. Two
//! deliveries that arrive together both look before either has recorded,
//! both see nothing, and both credit. Never use outside a demonstration.

use actix_web::http::StatusCode;
use uuid::Uuid;

use crate::defense::Refusal;
use crate::defense::idempotency::StoredResponse;
use crate::deposit::transaction::{self, DepositVerdict, database_refusal};
use crate::deposit::{DepositEvent, Origin};
use crate::domain::UserId;
use crate::ending::Settled;
use crate::state::AppState;

/// `deposit_credit()`'s row.
#[derive(sqlx::FromRow)]
struct Credit {
    outcome: String,
    owner: Option<Uuid>,
    created_at: Option<chrono::DateTime<chrono::Utc>>,
}

pub async fn execute(
    state: &AppState,
    event: &DepositEvent,
    fingerprint: &[u8; 32],
    trace_id: &str,
    origin: Origin,
    naive_window: std::time::Duration,
) -> Result<Settled, Refusal> {
    let config = &state.config;
    // Look: has the event been recorded? If so, or if the event is refused
    // before any credit, the production path answers (a read, or a refusal).
    let recorded: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM inbox WHERE source = $1::inbox_source AND event_id = $2
                          AND verdict IS NOT NULL AND expires_at > now())",
    )
    .bind(origin.source)
    .bind(&event.event_id)
    .fetch_one(&state.db)
    .await
    .map_err(|error| database_refusal(&error, false))?;
    let over_limit = event.amount_minor > config.deposits.amount_minor_max;
    let now = chrono::Utc::now();
    let too_old =
        event.occurred_at < now - chrono::Duration::hours(config.deposits.event_age_hours_max.into());
    let in_future = event.occurred_at > now + chrono::Duration::seconds(transaction::future_s(config).into());
    if recorded || over_limit || too_old || in_future {
        return transaction::execute(state, event, fingerprint, trace_id, origin).await;
    }
    // The window between looking and recording, where a concurrent
    // delivery of the same event looks too and sees nothing either.
    tokio::time::sleep(naive_window).await;

    // Credit, in a transaction of its own.
    let transfer_id = Uuid::now_v7();
    let mut tx = state
        .db
        .begin()
        .await
        .map_err(|error| database_refusal(&error, false))?;
    let credit: Credit = sqlx::query_as(
        "SELECT outcome::text AS outcome, owner, created_at FROM deposit_credit($1, $2, $3, $4, $5, $6)",
    )
    .bind(transfer_id)
    .bind(event.wallet.0)
    .bind(event.amount_minor)
    .bind(&event.currency)
    .bind(i32::from(config.database.wallet_lock_wait_ms_max))
    .bind(origin.clearing.map(|wallet| wallet.0))
    .fetch_one(&mut *tx)
    .await
    .map_err(|error| database_refusal(&error, false))?;
    let verdict = DepositVerdict::of_name(&credit.outcome).ok_or_else(|| {
        tracing::error!(
            outcome = credit.outcome,
            "deposit_credit() answered an unknown outcome"
        );
        database_refusal(&sqlx::Error::Protocol("unknown outcome".into()), false)
    })?;
    let response = match (verdict.refusal(Some(trace_id)), credit.created_at) {
        (Some(problem), _) => StoredResponse {
            status: problem.status,
            body: problem.body(),
        },
        (None, created_at) => StoredResponse {
            status: StatusCode::OK.as_u16(),
            body: sqlx::query_scalar("SELECT deposit_receipt($1, $2, $3, $4, $5, $6)")
                .bind(&event.event_id)
                .bind(transfer_id)
                .bind(event.wallet.0)
                .bind(event.amount_minor)
                .bind(&event.currency)
                .bind(created_at)
                .fetch_one(&mut *tx)
                .await
                .map_err(|error| database_refusal(&error, false))?,
        },
    };
    tx.commit()
        .await
        .map_err(|error| database_refusal(&error, true))?;

    // Record the event afterwards. A concurrent delivery's record loses
    // silently; its credit has already happened.
    let credited = verdict == DepositVerdict::Credited;
    let recorded = sqlx::query(
        "INSERT INTO inbox (source, event_id, fingerprint, expires_at, verdict, response_status, response_body,
                            response_trace_id, transfer_id)
         VALUES ($9::inbox_source, $1, $2, now() + make_interval(hours => $3), $4, $5, $6, $7, $8)
         ON CONFLICT (source, event_id) DO NOTHING",
    )
    .bind(&event.event_id)
    .bind(&fingerprint[..])
    .bind(i32::from(config.deposits.inbox_retention_hours))
    .bind(credit.outcome.as_str())
    .bind(i16::try_from(response.status).unwrap_or_default())
    .bind(credited.then_some(response.body.as_str()))
    .bind(trace_id)
    .bind(credited.then_some(transfer_id))
    .bind(origin.source)
    .execute(&state.db)
    .await;
    if let Err(error) = recorded {
        tracing::warn!(error = %error, "the naive inbox could not record a credited event");
    }
    Ok(Settled {
        decision: verdict.decision(),
        response,
        owner: credit.owner.map(UserId),
        replayed: false,
    })
}
