//! What a run proves, read from the database afterwards: every check is a
//! count that must be zero, with what it counts.

use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

/// One check: what it counts, and how many it found.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub what: String,
    pub found: i64,
}

/// The checks of a run; it passed when every one found nothing.
#[derive(Debug, Default, Serialize)]
pub struct Checks(pub Vec<Check>);

impl Checks {
    pub fn add(&mut self, what: impl Into<String>, found: i64) {
        self.0.push(Check {
            what: what.into(),
            found,
        });
    }

    pub fn passed(&self) -> bool {
        self.0.iter().all(|check| check.found == 0)
    }

    /// "N of M": the checks that found nothing, of all.
    pub fn at_zero(&self) -> String {
        let held = self.0.iter().filter(|check| check.found == 0).count();
        format!("{held} of {}", self.0.len())
    }

    pub fn print(&self) {
        println!("| check (each must be 0) | found |");
        println!("|---|---|");
        for check in &self.0 {
            println!("| {} | {} |", check.what, check.found);
        }
    }

    /// The service's own money invariants over the run's accounts: no money
    /// created or destroyed, no negative balance, every balance equal to its
    /// opening plus its ledger, every transfer two entries summing to zero,
    /// every payout's hold, settlement or release where its state says.
    pub async fn money_invariants(&mut self, db: &PgPool, users: &[Uuid]) -> anyhow::Result<()> {
        let (created, negative, unexplained, unbalanced, payouts, payout_accounts): (
            i64,
            i64,
            i64,
            i64,
            i64,
            i64,
        ) = sqlx::query_as("SELECT * FROM money_invariants($1)")
            .bind(users)
            .fetch_one(db)
            .await?;
        self.add("money created or destroyed (minor units)", created);
        self.add("negative balances", negative);
        self.add("balances not equal to opening plus ledger", unexplained);
        self.add("transfers whose ledger entries do not sum to zero", unbalanced);
        self.add("payouts whose transfers do not match their state", payouts);
        self.add(
            "holds or gateway wallets not holding what the payouts say",
            payout_accounts,
        );
        Ok(())
    }
}
