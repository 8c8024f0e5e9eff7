//! What a test app's stores hold, read straight from them: balances and
//! counts, the snapshot a refusal must leave untouched, the cooldown's
//! Redis keys, and the money invariants.

use std::collections::HashMap;

use sqlx::PgPool;
use uuid::Uuid;

use crate::{TestApp, redis_url};

impl TestApp {
    /// The wallet of the user called `name`.
    pub async fn wallet_of(&self, name: &str) -> Uuid {
        sqlx::query_scalar("SELECT w.id FROM wallets w JOIN users u ON u.id = w.user_id WHERE u.name = $1 AND w.lab_slot IS NULL")
            .bind(name)
            .fetch_one(&self.db)
            .await
            .expect("the user's wallet")
    }

    pub async fn balance(&self, wallet: Uuid) -> i64 {
        sqlx::query_scalar("SELECT balance_minor FROM wallets WHERE id = $1")
            .bind(wallet)
            .fetch_one(&self.db)
            .await
            .expect("wallet balance")
    }

    pub async fn count(&self, sql: &'static str) -> i64 {
        sqlx::query_scalar(sql)
            .fetch_one(&self.db)
            .await
            .expect("count query")
    }

    /// Makes every ledger write of this test's database take `seconds`
    /// longer (a trigger that sleeps), so that a transfer's transaction is
    /// still running when the next request arrives.
    pub async fn slow_down_ledger_writes(&self, seconds: u32) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE FUNCTION slow_down() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_sleep({seconds}); RETURN NEW; END $$;
             CREATE TRIGGER slow_down BEFORE INSERT ON ledger_entries FOR EACH ROW EXECUTE FUNCTION slow_down();"
        )))
        .execute(&self.db)
        .await
        .expect("a slow ledger");
    }

    pub async fn transfer_count(&self) -> i64 {
        self.count("SELECT count(*) FROM transfers").await
    }

    /// Everything a refusal must leave untouched.
    pub async fn snapshot(&self) -> StateSnapshot {
        let balances = sqlx::query_as::<_, (Uuid, i64)>("SELECT id, balance_minor FROM wallets")
            .fetch_all(&self.db)
            .await
            .expect("balances")
            .into_iter()
            .collect();
        StateSnapshot {
            balances,
            transfers: self.transfer_count().await,
            ledger_entries: self.count("SELECT count(*) FROM ledger_entries").await,
            idempotency_keys: self.count("SELECT count(*) FROM idempotency_keys").await,
            inbox_rows: self.inbox_rows().await,
        }
    }

    /// The money invariants, checked on the database after every
    /// concurrency test.
    pub async fn assert_invariants(&self) {
        let violations = money_invariant_violations(&self.db).await;
        assert!(violations.is_empty(), "{}", violations.join("; "));
    }

    pub async fn cooldown_keys(&self) -> Vec<String> {
        let client = redis::Client::open(redis_url()).expect("redis url");
        let mut conn = client.get_multiplexed_async_connection().await.expect("redis");
        redis::cmd("KEYS")
            .arg(format!("{}cooldown:*", self.redis_prefix))
            .query_async(&mut conn)
            .await
            .expect("KEYS")
    }
}

/// The money invariants (the SQL function `money_invariants()`, the one
/// definition the load test uses too): no money created or destroyed, no
/// negative balance, every balance explained by its ledger, every transfer
/// recorded as exactly two entries that sum to zero, every payout's hold,
/// settlement or release where its state says. Returns what broke.
pub async fn money_invariant_violations(db: &PgPool) -> Vec<String> {
    let (created, negative, unexplained, unbalanced, payouts, payout_accounts): (
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
    ) = sqlx::query_as("SELECT * FROM money_invariants()")
        .fetch_one(db)
        .await
        .expect("money_invariants()");
    let mut violations = Vec::new();
    if created != 0 {
        violations.push(format!("money was created or destroyed: {created} minor units"));
    }
    if negative > 0 {
        violations.push(format!("{negative} balances went negative"));
    }
    if unexplained > 0 {
        violations.push(format!("{unexplained} balances do not match their ledger"));
    }
    if unbalanced > 0 {
        violations.push(format!(
            "{unbalanced} transfers are not recorded as two entries summing to zero"
        ));
    }
    if payouts > 0 {
        violations.push(format!("{payouts} payouts' transfers do not match their state"));
    }
    if payout_accounts > 0 {
        violations.push(format!(
            "{payout_accounts} holds or gateway wallets do not hold what the payouts say"
        ));
    }
    violations
}

#[derive(Debug, PartialEq, Eq)]
pub struct StateSnapshot {
    pub balances: HashMap<Uuid, i64>,
    pub transfers: i64,
    pub ledger_entries: i64,
    pub idempotency_keys: i64,
    pub inbox_rows: i64,
}
