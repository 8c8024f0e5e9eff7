//! What the HTTP listeners and the process itself read: addresses, limits
//! on connections and bodies, shutdown, logging and trusted proxies.

use std::time::Duration;

use crate::settings::checks::Checks;
use crate::settings::{LogFormat, Settings};

#[derive(Debug, Clone)]
pub struct Http {
    pub host: String,
    pub port: u16,
    pub admin_addr: String,
    pub workers: usize,
    pub connections_per_worker_max: usize,
    /// Each listener's backlog, for the kernel to queue new connections in.
    pub listen_backlog_connections: u32,
    /// `None`: each connection is closed after its response.
    pub keep_alive: Option<Duration>,
    pub request_head_wait_max: Duration,
    pub request_body_wait_max: Duration,
    pub request_body_bytes_max: usize,
    pub oversized_body_drain_bytes_max: usize,
    pub oversized_body_drain_max: Duration,
    pub shutdown_grace: Duration,
    pub shutdown_cleanup_max: Duration,
    /// Cookies carry `Secure`.
    pub cookies_secure: bool,
    pub readiness_cache: Duration,
    pub log_format: LogFormat,
    /// Empty: the host name and a random suffix.
    pub instance_id: String,
    /// The load balancers whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<ipnet::IpNet>,
}

impl Http {
    pub(super) fn checked(s: &Settings, check: &mut Checks) -> Self {
        let trusted_proxies = s
            .trusted_proxies
            .iter()
            .filter_map(|entry| {
                let network = parse_network(entry);
                check.require(
                    network.is_some(),
                    format!("trusted_proxies: {entry:?} is not an IP address or a CIDR network"),
                );
                network
            })
            .collect();
        Self {
            host: s.http_host.clone(),
            port: s.http_port,
            admin_addr: s.admin_http_addr.clone(),
            workers: s.http_workers,
            connections_per_worker_max: s.http_connections_per_worker_max,
            listen_backlog_connections: s.http_listen_backlog_connections,
            keep_alive: (s.http_keep_alive_s > 0).then(|| Duration::from_secs(s.http_keep_alive_s)),
            request_head_wait_max: Duration::from_millis(s.http_request_head_wait_ms_max),
            request_body_wait_max: Duration::from_millis(s.http_request_body_wait_ms_max),
            request_body_bytes_max: s.request_body_bytes_max,
            oversized_body_drain_bytes_max: s.oversized_body_drain_bytes_max,
            oversized_body_drain_max: Duration::from_millis(s.oversized_body_drain_ms_max),
            shutdown_grace: Duration::from_secs(s.shutdown_grace_s),
            shutdown_cleanup_max: Duration::from_millis(s.shutdown_cleanup_ms_max),
            cookies_secure: s.cookies_secure,
            readiness_cache: Duration::from_millis(s.readiness_cache_ms),
            log_format: s.log_format,
            instance_id: s.instance_id.clone(),
            trusted_proxies,
        }
    }
}

/// An address (a network of one) or a CIDR network.
fn parse_network(entry: &str) -> Option<ipnet::IpNet> {
    let entry = entry.trim();
    entry
        .parse::<ipnet::IpNet>()
        .ok()
        .or_else(|| entry.parse::<std::net::IpAddr>().ok().map(ipnet::IpNet::from))
}
