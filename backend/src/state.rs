//! What every handler shares.

use std::sync::Arc;

use crate::auth::TokenSigner;
use crate::defense::cooldown::CooldownLock;
use crate::feed::DecisionFeed;
use crate::metrics::Metrics;
use crate::settings::Config;

#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub db: sqlx::PgPool,
    /// Shared by the cooldown, the decision feed and the account limits;
    /// `None` when none is enabled.
    pub redis: Option<crate::redis_store::RedisStore>,
    pub cooldown: CooldownLock,
    /// Layer 1 for deposits: the lock on each event.
    pub event_lock: crate::defense::edge_lock::EventLock,
    /// Who may deposit: the payment provider's signatures.
    pub provider_signatures: crate::auth::provider_signature::ProviderSignatures,
    pub account_limits: Arc<crate::account_limits::AccountLimits>,
    pub tokens: TokenSigner,
    pub passwords: crate::auth::PasswordWorkers,
    pub metrics: Metrics,
    pub feed: DecisionFeed,
    /// Bounds the live decision streams this instance serves at once.
    pub stream_slots: Arc<tokio::sync::Semaphore>,
    /// ...and those each user holds on it.
    pub streams_per_user: Arc<crate::feed::stream_slots::StreamsPer<crate::domain::UserId>>,
    pub streams_per_address: Arc<crate::feed::stream_slots::StreamsPer<std::net::IpAddr>>,
    pub instance_id: Arc<str>,
    /// Where this instance's public listener answers from this host: the
    /// race lab fires its bursts at it, like any client.
    pub public_address: std::net::SocketAddr,
    /// Bounds the race-lab runs this instance fires at once.
    pub lab_runs: Arc<tokio::sync::Semaphore>,
    /// Bounds the lab requests all those runs have in flight at once.
    pub lab_requests: Arc<tokio::sync::Semaphore>,
    /// The PostgreSQL connections the lab's transactions may hold at once.
    pub lab_db_slots: Arc<tokio::sync::Semaphore>,
    /// The passes its bursts carry: switches are honoured with one only.
    pub lab_passes: Arc<crate::auth::lab_pass::LabPasses>,
    /// The places for transfers in flight (`transfers_in_flight_max`).
    pub transfer_admission: Arc<crate::admission::Admission>,
    /// The executors that own the transfer path's connections; admitted
    /// transfers wait for those of their HTTP worker (`crate::executors`).
    pub transfers: crate::executors::Executors<crate::transfer::call::TransferCall>,
    /// Set once the instance starts stopping: live streams end, and each
    /// answer closes its connection.
    pub draining: crate::shutdown::Draining,
    /// The OpenAPI document, serialised once at start-up.
    pub api_document: actix_web::web::Bytes,
}
