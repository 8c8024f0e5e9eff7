//! Payouts as a client makes them, and the state the tests assert on:
//! each payout's row, the holds, the gateway's ledger.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

use crate::{TestApp, TestUser};

/// How long a test waits for the dispatcher to bring a payout to a state.
pub const PAYOUT_WAIT_SECONDS_MAX: u64 = 30;

/// A payout body.
pub fn payout_body(from: Uuid, amount_minor: i64, destination: &str) -> Value {
    json!({ "from_wallet_id": from, "amount_minor": amount_minor, "destination": destination })
}

impl TestApp {
    /// `POST /api/v1/payouts` as `user`, with `key` when given.
    pub fn payout_request(
        &self,
        user: &TestUser,
        body: &Value,
        key: Option<Uuid>,
    ) -> reqwest::RequestBuilder {
        let request = self
            .client
            .post(self.url("/api/v1/payouts"))
            .bearer_auth(&user.token)
            .json(body);
        match key {
            Some(key) => request.header("Idempotency-Key", key.to_string()),
            None => request,
        }
    }

    /// Makes a payout of `amount_minor` to `destination`, with a key of its
    /// own, and returns its id; panics unless it is accepted.
    pub async fn pay_out(&self, user: &TestUser, amount_minor: i64, destination: &str) -> Uuid {
        let response = self
            .payout_request(
                user,
                &payout_body(user.wallet_id, amount_minor, destination),
                Some(Uuid::new_v4()),
            )
            .send()
            .await
            .expect("sent");
        let status = response.status().as_u16();
        let body: Value = response.json().await.expect("json");
        assert_eq!(status, 202, "{body}");
        body["id"].as_str().expect("an id").parse().expect("a uuid")
    }

    /// A payout's state, as the database holds it.
    pub async fn payout_state(&self, payout: Uuid) -> String {
        sqlx::query_scalar("SELECT state::text FROM payouts WHERE id = $1")
            .bind(payout)
            .fetch_one(&self.db)
            .await
            .expect("the payout's state")
    }

    /// Waits until the payout is in one of `states`; panics with where it
    /// stands after `PAYOUT_WAIT_SECONDS_MAX`.
    pub async fn wait_for_payout(&self, payout: Uuid, states: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(PAYOUT_WAIT_SECONDS_MAX);
        loop {
            let state = self.payout_state(payout).await;
            if states.contains(&state.as_str()) {
                return state;
            }
            assert!(
                Instant::now() < deadline,
                "payout {payout} is still {state} after {PAYOUT_WAIT_SECONDS_MAX} s; expected one of {states:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Payouts by state, for the whole database.
    pub async fn payouts_by_state(&self) -> Vec<(String, i64)> {
        sqlx::query_as("SELECT state::text, count(*) FROM payouts GROUP BY 1 ORDER BY 1")
            .fetch_all(&self.db)
            .await
            .expect("payouts by state")
    }

    /// What the holds wallet holds.
    pub async fn held_minor(&self) -> i64 {
        sqlx::query_scalar("SELECT balance_minor FROM wallets WHERE clearing_source = 'holds'")
            .fetch_one(&self.db)
            .await
            .expect("the holds wallet")
    }

    /// Outbox rows left.
    pub async fn outbox_rows(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM payout_outbox")
            .fetch_one(&self.db)
            .await
            .expect("outbox rows")
    }
}
