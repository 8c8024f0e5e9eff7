//! The chaos suite: a private PostgreSQL and Redis, several real
//! `wallet-server` processes, a storm of keyed clients that retry with
//! their key and of keyless double clicks, and one fault per test in the
//! middle of the storm. Each test checks the database afterwards (every key
//! at most one transfer, exactly the one its 201s name; money conserved;
//! no dangling claim), the answers (no 500, no request over its bound, no
//! false "nothing was changed"), readiness during the fault, and recovery.
//!
//! Money that arrives gets a storm of its own (`arrivals_*`): a payment
//! provider's deposits and a broker's commands through the same kind of
//! deployment, with a consumer killed or stalled, Redis restarted from its
//! append-only file, or PostgreSQL restarted, and `wallet-sim`'s database
//! checks afterwards.
//!
//! Money that leaves gets one too (`departures_*`): payouts through the
//! bank gateway simulator, with an instance killed mid-call, the gateway
//! killed, PostgreSQL restarted, or the hold's replies lost, then
//! `wallet-server reconcile` and both ledgers' checks.
//!
//! A replicated PostgreSQL gets its primary killed (`primary_failover_*`):
//! a primary and a standby under Patroni, the instances reaching them
//! through a URL that names both, the standby promoted. On asynchronous
//! replication the 201s the failover lost are counted, and each lost key
//! is sent again; on synchronous replication none may be lost.
//!
//! A Redis Cluster master is killed with its replica cut off
//! (`redis_master_failover_*`): the cooldown windows and the command
//! acknowledgements it held are lost, and PostgreSQL must still decide
//! every duplicate they let through.
//!
//! The faults run one at a time, so that each one's timings are its own.
//! `CHAOS_FULL=1` runs the bigger storm behind `docs/reliability.md`
//! (`./scripts/chaos`); without it, the subset CI runs.

use std::path::PathBuf;

use layered_wallet::settings::StoreErrorPolicy;
use wallet_testkit::chaos::{self, ArrivalFault, DepartureFault, Fault, Scale};
use wallet_testkit::replicated_postgres::Replication;

/// One fault at a time in this process.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn survive(fault: Fault) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_wallet-server"));
    let report = chaos::run(binary, fault, Scale::from_env()).await;
    report.publish();
    report.assert_held();
}

/// Money that arrives, with `fault` in the middle of its storm.
async fn arrive_through(fault: ArrivalFault) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_wallet-server"));
    let report = chaos::run_arrivals(binary, fault, Scale::from_env()).await;
    report.publish();
    report.assert_held();
}

/// Money that leaves, with `fault` in the middle of its storm.
async fn depart_through(fault: DepartureFault) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_wallet-server"));
    let report = chaos::run_departures(binary, fault, Scale::from_env()).await;
    report.publish();
    report.assert_held();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn departures_with_an_instance_killed_mid_call() {
    depart_through(DepartureFault::InstanceKilled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn departures_with_the_gateway_killed() {
    depart_through(DepartureFault::GatewayKilled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn departures_with_postgres_restarted() {
    depart_through(DepartureFault::PostgresRestarted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn departures_with_the_holds_replies_lost() {
    depart_through(DepartureFault::HoldRepliesLost).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn arrivals_with_a_consumer_killed() {
    arrive_through(ArrivalFault::ConsumerKilled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn arrivals_with_a_consumer_stalled_past_the_claim_time() {
    arrive_through(ArrivalFault::ConsumerStalled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn arrivals_with_redis_restarted_from_its_append_only_file() {
    arrive_through(ArrivalFault::RedisRestarted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn arrivals_with_postgres_restarted() {
    arrive_through(ArrivalFault::PostgresRestarted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_under_fail_open() {
    survive(Fault::RedisKilled(StoreErrorPolicy::FailOpen)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_under_fail_closed() {
    survive(Fault::RedisKilled(StoreErrorPolicy::FailClosed)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_fast_restart() {
    survive(Fault::PostgresFastRestart).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_crash() {
    survive(Fault::PostgresCrash).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instance_killed() {
    survive(Fault::InstanceKilled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn database_connections_cut() {
    survive(Fault::ConnectionsCut).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commit_replies_lost() {
    survive(Fault::CommitRepliesLost).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn primary_failover_asynchronous() {
    survive(Fault::PrimaryFailover(Replication::Asynchronous)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn primary_failover_synchronous() {
    survive(Fault::PrimaryFailover(Replication::Synchronous)).await;
}

/// A Redis master failover, run by `run`, published at `place` in its table.
async fn redis_fails_over(run: impl std::future::Future<Output = chaos::RedisFailoverReport>, place: usize) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let report = run.await;
    report.publish(place);
    report.assert_held();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_master_failover_with_windows_held() {
    redis_fails_over(chaos::run_cooldown_failover(), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_master_failover_with_commands_acknowledged() {
    redis_fails_over(chaos::run_commands_failover(), 1).await;
}
