//! Layered Wallet: wallet transfers behind three stacked defenses against
//! duplicate and racing requests. Start at [`transfer::pipeline`], which
//! reads as the three layers in order, and at [`defense`], one file a layer.
//! Deposits from a payment provider have three layers of their own:
//! [`deposit::pipeline`]; a broker's transfer commands too:
//! [`command::pipeline`]. Money that leaves, through a bank
//! gateway: [`payout`].

pub mod account_limits;
pub mod admission;
pub mod auth;
pub mod body_deadline;
pub mod command;
pub mod database;
pub mod database_hosts;
pub mod decision;
pub mod defense;
pub mod deposit;
pub mod domain;
pub mod ending;
pub mod executors;
pub mod feed;
pub mod headers;
pub mod kept_pages;
pub mod listener;
pub mod metrics;
pub mod names;
pub mod openapi;
pub mod payout;
pub mod problem;
pub mod race_lab;
pub mod redis_store;
pub mod router;
pub mod routes;
pub mod settings;
pub mod shutdown;
pub mod startup;
pub mod state;
pub mod sweep;
pub mod system_accounts;
pub mod telemetry;
pub mod transfer;
pub mod weakened;
pub mod web;
