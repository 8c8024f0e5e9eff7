//! The test harness: each test gets its own server on a random port, its own
//! PostgreSQL database and its own Redis key prefix, so tests run in
//! parallel against the real stores. Nothing is mocked.
//!
//! If PostgreSQL or Redis is not reachable the harness panics with how to
//! start them; a test never quietly skips.
//!
//! The tests use the harness as one flat namespace (`use wallet_testkit::*`):
//! the private modules sort it by concern, and everything public in them is
//! re-exported here. The public modules are used by their paths
//! (`wallet_testkit::chaos::run`, `wallet_testkit::visitor::Visitor`,
//! `wallet_testkit::python_tools::protocol_venv`).

pub mod answer_cutter;
pub mod chaos;
pub mod gateway;
pub mod nginx;
pub mod private_redis_cluster;
pub mod private_stores;
pub mod proxy;
pub mod python_tools;
pub mod replicated_postgres;
pub mod server_process;
pub mod visitor;

mod app;
mod commands;
mod deposits;
mod http;
mod payouts;
mod settings;
mod state;
mod stores;
mod telemetry;

pub use app::{
    TestApp, spawn_app, spawn_app_behind_proxy, spawn_second_instance, spawn_second_instance_with, spawn_with,
};
pub use commands::{ShippedCommandsRedis, transfer_command, with_commands};
pub use deposits::{PROVIDER_SECRET, deposit_event, new_event_id};
pub use http::{TestUser, fire_together, fresh_transfers, new_key, problem, sign_up_at};
pub use payouts::{PAYOUT_WAIT_SECONDS_MAX, payout_body};
pub use settings::{
    SIGNING_KEY, expose, on_redis_cluster, test_settings, verified_token_for, with_deposits, with_payouts,
    without_cooldown,
};
pub use state::{StateSnapshot, money_invariant_violations};
pub use stores::{
    assert_redis_cluster_reachable, assert_redis_reachable, closed_port, create_database, database_url_as,
    database_url_of, database_url_via, drop_database, postgres_server_url, redis_cluster_urls, redis_url,
};
pub use telemetry::spans;
