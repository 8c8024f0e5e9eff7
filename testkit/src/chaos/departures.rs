//! The chaos suite for money that leaves. The same private deployment as
//! the transfer storm, its instances sending payouts through the bank
//! gateway simulator (a process of its own, which loses some answers after
//! sending), with one fault in the middle: an instance killed mid-call, the
//! gateway killed and started again, PostgreSQL restarted, or the replies
//! to the hold's statement lost on the wire. People keep paying out
//! through it all, retrying with their key as the client crate does.
//!
//! Afterwards, `wallet-server reconcile` for whatever needs a person, then
//! the checks `wallet-sim payouts` makes, on both ledgers: every payout
//! sent at most once, every settled one exactly once, no released hold of a
//! payout that was sent, money conserved; and every 202 a client got names
//! a payout that exists.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use layered_wallet::settings::StoreErrorPolicy;
use rand::Rng;
use uuid::Uuid;
use wallet_client::{Client, IdempotencyKey, PayoutOrder, RetryPolicy};
use wallet_sim::checks::Checks;
use wallet_sim::payout_run;

use super::SETTLE_SECONDS_MAX;
use super::deployment::{Deployment, Extras};
use super::report::{assert_checks_held, counted, publish_row};
use super::scale::Scale;
use crate::gateway::{Gateway, wallet_sim_binary};
use crate::private_stores::PgStopMode;

/// People paying out at once.
const PAYERS: usize = 6;
/// Every n-th payout goes to a closed account.
const REFUSED_EVERY: usize = 10;
/// The instances' call time-out; the gateway holds a lost answer three times
/// as long.
const CALL_TIMEOUT_MS: u64 = 500;
const LEASE_MS: u64 = 2_000;
const ATTEMPTS_MAX: u32 = 6;
/// The gateway's knobs throughout the storm.
const GATEWAY_KNOBS: [&str; 4] = ["--lose-answer-rate", "0.2", "--lose-answer-ms", "1500"];
/// The pause between one person's payouts.
const PAYOUT_PAUSE_MS: u64 = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DepartureFault {
    /// One instance (a dispatcher with calls in flight) gets SIGKILL and is
    /// started again.
    InstanceKilled,
    /// The gateway gets SIGKILL and is started again on its database.
    GatewayKilled,
    /// `pg_ctl stop -m fast`, then start.
    PostgresRestarted,
    /// The replies to `payout()` are lost on the wire while the fault lasts:
    /// the hold committed, and its client does not know.
    HoldRepliesLost,
}

impl DepartureFault {
    pub const ALL: [DepartureFault; 4] = [
        DepartureFault::InstanceKilled,
        DepartureFault::GatewayKilled,
        DepartureFault::PostgresRestarted,
        DepartureFault::HoldRepliesLost,
    ];

    pub fn describe(self) -> &'static str {
        match self {
            DepartureFault::InstanceKilled => {
                "one instance `kill -9` with gateway calls in flight, then start"
            }
            DepartureFault::GatewayKilled => "the gateway `kill -9`, then start on its database",
            DepartureFault::PostgresRestarted => "PostgreSQL `stop -m fast`, then start",
            DepartureFault::HoldRepliesLost => "the replies to the hold's statement lost",
        }
    }
}

/// What a run of the departures storm came to.
#[derive(Debug)]
pub struct DeparturesReport {
    pub fault: DepartureFault,
    /// Payouts in the database, and those a client got a 202 for.
    pub payouts: usize,
    pub accepted: usize,
    /// Payouts by final state, after reconcile.
    pub states: Vec<(String, i64)>,
    /// Reconcile's work: settled, released, left.
    pub reconciled: (usize, usize, usize),
    pub checks: Checks,
    pub logs: PathBuf,
}

/// The departures table's header, matching `markdown_row`.
pub const DEPARTURES_REPORT_HEADER: &str = "| fault | payouts (202s) | final states | reconcile: settled, released | checks at zero |\n|---|---|---|---|---|";

impl DeparturesReport {
    /// Panics with every check that found something.
    pub fn assert_held(&self) {
        assert_checks_held(
            &self.checks,
            self.fault.describe(),
            &self.markdown_row(),
            &self.logs,
        );
    }

    /// One row of the departures table in `docs/reliability.md`.
    pub fn markdown_row(&self) -> String {
        format!(
            "| {} | {} ({}) | {} | {}, {} | {} |",
            self.fault.describe(),
            self.payouts,
            self.accepted,
            counted(&self.states),
            self.reconciled.0,
            self.reconciled.1,
            self.checks.at_zero(),
        )
    }

    /// Prints the row, and writes it for `scripts/chaos` (`publish_row`).
    pub fn publish(&self) {
        let place = DepartureFault::ALL
            .iter()
            .position(|f| *f == self.fault)
            .unwrap_or(DepartureFault::ALL.len());
        publish_row(
            "departures-",
            DEPARTURES_REPORT_HEADER,
            place,
            &self.markdown_row(),
        );
    }
}

/// Starts a deployment that sends payouts through a gateway process, has
/// people pay out with `fault` in the middle, reconciles, and checks.
pub async fn run_departures(binary: PathBuf, fault: DepartureFault, scale: Scale) -> DeparturesReport {
    let mut gateway = Gateway::start(&wallet_sim_binary(), &GATEWAY_KNOBS).await;
    let extras = Extras {
        env: [
            ("WALLET_PAYOUT_GATEWAY_URL", gateway.url.clone()),
            ("WALLET_PAYOUT_CALL_TIMEOUT_MS", CALL_TIMEOUT_MS.to_string()),
            ("WALLET_PAYOUT_LEASE_MS", LEASE_MS.to_string()),
            ("WALLET_PAYOUT_RETRY_BASE_MS", "50".to_owned()),
            ("WALLET_PAYOUT_RETRY_CAP_MS", "1000".to_owned()),
            ("WALLET_PAYOUT_ATTEMPTS_MAX", ATTEMPTS_MAX.to_string()),
            ("WALLET_PAYOUT_DISPATCH_IDLE_MS", "50".to_owned()),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect(),
        redis_args: Vec::new(),
        replicated: None,
    };
    let mut deployment = Deployment::start_with(
        binary.clone(),
        scale.instances,
        StoreErrorPolicy::FailOpen,
        extras,
    )
    .await;
    let urls: Vec<String> = deployment.instances.iter().map(|i| i.url("")).collect();
    let targets: Vec<&str> = urls.iter().map(String::as_str).collect();
    let policy = RetryPolicy {
        base: Duration::from_millis(50),
        cap: Duration::from_secs(1),
        attempts_max: u32::MAX,
        request_timeout: Duration::from_secs(5),
        call_time_max: Duration::from_secs(SETTLE_SECONDS_MAX),
        jitter: true,
    };
    let client = Client::over(&targets, policy).expect("a client");
    let mut payers = Vec::with_capacity(PAYERS);
    for number in 0..PAYERS {
        let user = deployment.sign_up(&format!("payer{number}")).await;
        payers.push(user);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let accepted: Arc<Mutex<Vec<Uuid>>> = Arc::default();
    let paying: Vec<_> = payers
        .iter()
        .enumerate()
        .map(|(number, payer)| {
            let client = client.with_token(&payer.token);
            let (stop, accepted, wallet) = (stop.clone(), accepted.clone(), payer.wallet_id);
            tokio::spawn(async move {
                let mut n = number;
                while !stop.load(Ordering::SeqCst) {
                    let destination = if n % REFUSED_EVERY == 0 {
                        format!("closed-{n}")
                    } else {
                        format!("acct-{n}")
                    };
                    let order = PayoutOrder {
                        from_wallet_id: wallet,
                        amount_minor: rand::thread_rng().gen_range(100..=2_000),
                        destination,
                    };
                    // A call that ends without an answer leaves its payout
                    // to the database's checks.
                    if let Ok(paid) = client.pay_out(&order, IdempotencyKey::new()).await {
                        accepted.lock().expect("accepted").push(paid.receipt.id);
                    }
                    n += PAYERS;
                    tokio::time::sleep(Duration::from_millis(PAYOUT_PAUSE_MS)).await;
                }
            })
        })
        .collect();

    tokio::time::sleep(scale.before_fault).await;
    match fault {
        DepartureFault::InstanceKilled => {
            deployment.instances[0].kill_9();
            tokio::time::sleep(scale.fault_length).await;
            deployment.instances[0].start_again().await;
        }
        DepartureFault::GatewayKilled => {
            gateway.kill();
            tokio::time::sleep(scale.fault_length).await;
            gateway.start_again(&GATEWAY_KNOBS).await;
        }
        DepartureFault::PostgresRestarted => {
            tokio::task::block_in_place(|| deployment.server().stop(PgStopMode::Fast));
            tokio::time::sleep(scale.fault_length).await;
            tokio::task::block_in_place(|| deployment.server().start_again());
        }
        DepartureFault::HoldRepliesLost => {
            deployment.proxy().keep_losing_replies_to(&["FROM payout("]);
            tokio::time::sleep(scale.fault_length).await;
            deployment.proxy().stop_losing_replies();
        }
    }
    tokio::time::sleep(scale.after_fault).await;
    stop.store(true, Ordering::SeqCst);
    for payer in paying {
        payer.await.expect("a payer");
    }

    let db = deployment.db.clone();
    let users: Vec<Uuid> = payers.iter().map(|payer| payer.user_id).collect();
    let payouts = wait_until_settled(&db, &users).await;
    let reconciled = payout_run::reconcile(
        Path::new(&binary),
        &deployment.server().url("wallet"),
        &gateway.url,
    )
    .await
    .expect("wallet-server reconcile");
    let mut checks = Checks::default();
    let accepted = std::mem::take(&mut *accepted.lock().expect("accepted"));
    let lost_acceptances = accepted.iter().filter(|id| !payouts.contains(id)).count();
    checks.add(
        "202s naming a payout that does not exist",
        lost_acceptances as i64,
    );
    payout_run::check(&db, &gateway.db, &users, &payouts, &mut checks)
        .await
        .expect("the payouts' checks");
    let states =
        sqlx::query_as("SELECT state::text, count(*) FROM payouts WHERE id = ANY($1) GROUP BY 1 ORDER BY 1")
            .bind(&payouts)
            .fetch_all(&db)
            .await
            .expect("states");
    DeparturesReport {
        fault,
        payouts: payouts.len(),
        accepted: accepted.len(),
        states,
        reconciled,
        checks,
        logs: deployment.logs.path().to_path_buf(),
    }
}

/// Waits until no payout of `users` is pending or sent (the dispatchers
/// are done with each), at most `SETTLE_SECONDS_MAX`; every payout's id.
async fn wait_until_settled(db: &sqlx::PgPool, users: &[Uuid]) -> Vec<Uuid> {
    let waited = payout_run::wait_until_dispatched(
        db,
        payout_run::PayoutsOf::Users(users),
        Duration::from_secs(SETTLE_SECONDS_MAX),
        async || Ok(()),
    )
    .await;
    if !matches!(waited, Ok(true)) {
        eprintln!(
            "chaos: payouts were still pending or sent after {SETTLE_SECONDS_MAX} s; the checks say which"
        );
    }
    sqlx::query_scalar("SELECT id FROM payouts WHERE user_id = ANY($1)")
        .bind(users)
        .fetch_all(db)
        .await
        .expect("the payouts")
}
