//! Delivering a payment provider's deposit events to a test app, signed as
//! the provider signs them.

use chrono::{DateTime, Utc};
use layered_wallet::auth::provider_signature as signature;
use secrecy::SecretString;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::TestApp;

/// The secret test apps share with the tests' provider.
pub const PROVIDER_SECRET: &str = "test-provider-secret-test-provider-secret-0123";

/// A deposit event for `wallet`, happened just now.
pub fn deposit_event(event_id: &str, wallet: Uuid, amount_minor: i64) -> Value {
    json!({
        "event_id": event_id,
        "wallet_id": wallet,
        "amount_minor": amount_minor,
        "currency": "USD",
        "occurred_at": Utc::now().to_rfc3339(),
    })
}

/// A fresh event id, as a provider names its events.
pub fn new_event_id() -> String {
    format!("evt_{}", Uuid::new_v4().simple())
}

impl TestApp {
    /// A delivery of `event` to this app, signed now with the tests' secret.
    pub fn deposit_request(&self, event: &Value) -> reqwest::RequestBuilder {
        self.deposit_request_signed(event, PROVIDER_SECRET, Utc::now())
    }

    /// A delivery signed with `secret` at `at`: a wrong secret or an old
    /// time, for the signature's tests.
    pub fn deposit_request_signed(
        &self,
        event: &Value,
        secret: &str,
        at: DateTime<Utc>,
    ) -> reqwest::RequestBuilder {
        let body = serde_json::to_vec(event).expect("an event serialises");
        let header = signature::header_for(&SecretString::from(secret.to_owned()), at, &body);
        self.client
            .post(self.url("/api/v1/webhooks/deposits"))
            .header("content-type", "application/json")
            .header(signature::HEADER, header)
            .body(body)
    }

    /// Deletes the answers deposits left at the edge, so that the next
    /// delivery is answered by the inbox.
    pub async fn forget_event_answers(&self) {
        let client = redis::Client::open(crate::redis_url()).expect("redis url");
        let mut conn = client.get_multiplexed_async_connection().await.expect("redis");
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}event:*", self.redis_prefix))
            .query_async(&mut conn)
            .await
            .expect("KEYS");
        for key in keys {
            redis::cmd("DEL")
                .arg(key)
                .query_async::<()>(&mut conn)
                .await
                .expect("DEL");
        }
    }

    /// Rows in the inbox.
    pub async fn inbox_rows(&self) -> i64 {
        self.count("SELECT count(*) FROM inbox").await
    }

    /// The verdict the inbox stored for a provider's event, if it holds
    /// the event.
    pub async fn inbox_verdict(&self, event_id: &str) -> Option<String> {
        sqlx::query_scalar("SELECT verdict FROM inbox WHERE source = 'provider' AND event_id = $1")
            .bind(event_id)
            .fetch_optional(&self.db)
            .await
            .expect("the inbox")
            .flatten()
    }

    /// Deposits credited: transfers out of the provider's clearing wallet.
    pub async fn deposit_count(&self) -> i64 {
        self.count(
            "SELECT count(*) FROM transfers t JOIN wallets c ON c.id = t.from_wallet_id
             WHERE c.clearing_source IS NOT NULL",
        )
        .await
    }
}
