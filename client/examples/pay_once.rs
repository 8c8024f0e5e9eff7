//! Pays once, however the network behaves.
//!
//! ```sh
//! cargo run -p wallet-client --example pay_once -- http://127.0.0.1:8080
//! ```
//!
//! It signs up a payer and a payee, then pays 9.50 of demo money from one
//! to the other with one idempotency key kept across every retry. The
//! client's tests run `pay_once` through a proxy that cuts the connection
//! after the server has answered, and count the transfers in the database.

use wallet_client::{Client, Error, IdempotencyKey, Paid, RetryPolicy, TransferOrder};

/// Pays `order` as the holder of `token`, exactly once.
pub async fn pay_once(server: &str, token: &str, order: &TransferOrder) -> Result<Paid, Error> {
    let client = Client::new(server, RetryPolicy::default())?.with_token(token);
    // One key for this payment. A real program stores it with the order
    // before the first attempt, so that a restart retries with it too.
    let key = IdempotencyKey::new();
    client.transfer(order, key).await
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let server = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:8080".to_owned());
    let client = Client::new(&server, RetryPolicy::default())?;
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let payer = client
        .sign_up(&format!("payer-{suffix}"), "correct horse battery")
        .await?;
    let payee = client
        .sign_up(&format!("payee-{suffix}"), "correct horse battery")
        .await?;
    let order = TransferOrder {
        from_wallet_id: payer.wallet_id,
        to_wallet_id: payee.wallet_id,
        amount_minor: 950,
    };
    let paid = pay_once(&server, &payer.token, &order).await?;
    println!(
        "paid {} once: transfer {} after {} attempt(s){}",
        order.amount_minor,
        paid.receipt.id,
        paid.attempts,
        if paid.replayed {
            ", the answer replayed"
        } else {
            ""
        }
    );
    Ok(())
}
