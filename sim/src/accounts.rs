//! The people a run's money moves between: accounts made through the API,
//! as anyone would make them.

use sqlx::PgPool;
use uuid::Uuid;
use wallet_client::{Client, RetryPolicy};

/// A run's account: who, and the wallet money arrives in or leaves.
#[derive(Debug, Clone, Copy)]
pub struct Account {
    pub user_id: Uuid,
    pub wallet_id: Uuid,
}

/// Signs up `count` accounts through `targets`, named after the run.
pub async fn sign_up(targets: &[String], count: usize) -> anyhow::Result<Vec<Account>> {
    let urls: Vec<&str> = targets.iter().map(String::as_str).collect();
    let client = Client::over(&urls, RetryPolicy::default())?;
    let run = &Uuid::new_v4().simple().to_string()[..8];
    let mut accounts = Vec::with_capacity(count);
    for index in 0..count {
        let password = Uuid::new_v4().simple().to_string();
        let signed_up = client.sign_up(&format!("sim-{run}-{index}"), &password).await?;
        accounts.push(Account {
            user_id: signed_up.user_id,
            wallet_id: signed_up.wallet_id,
        });
    }
    Ok(accounts)
}

/// The deployment's currency, as its wallets hold it.
pub async fn currency_of(db: &PgPool, account: &Account) -> anyhow::Result<String> {
    Ok(sqlx::query_scalar("SELECT currency FROM wallets WHERE id = $1")
        .bind(account.wallet_id)
        .fetch_one(db)
        .await?)
}

/// Each account's balance now, in the accounts' order.
pub async fn balances(db: &PgPool, accounts: &[Account]) -> anyhow::Result<Vec<i64>> {
    let wallets: Vec<Uuid> = accounts.iter().map(|account| account.wallet_id).collect();
    let rows: Vec<(Uuid, i64)> = sqlx::query_as("SELECT id, balance_minor FROM wallets WHERE id = ANY($1)")
        .bind(&wallets)
        .fetch_all(db)
        .await?;
    wallets
        .iter()
        .map(|wallet| {
            rows.iter()
                .find(|(id, _)| id == wallet)
                .map(|(_, balance)| *balance)
                .ok_or_else(|| anyhow::anyhow!("wallet {wallet} is gone"))
        })
        .collect()
}
