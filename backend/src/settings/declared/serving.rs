//! The settings of the HTTP listeners and of the process itself:
//! addresses, connection and body limits, shutdown, logging.
//!
//! Declared as `declared.rs` says: this file's macro adds its sections to
//! those gathered before it. The types it names are in scope where the
//! declaration expands, in `declared.rs`.

/// Adds this file's sections to the declaration (`declare_settings!`'s
/// `@gather`).
macro_rules! serving_settings {
    ([$($files:ident)*] $($sections:tt)*) => {
        $crate::settings::declare::declare_settings! { @gather [$($files)*] $($sections)*
            section "HTTP" {
                /// Address the public listener binds to.
                http_host: String = "127.0.0.1".into();
                /// Port of the public listener.
                http_port: u16 = 8080, within 0..=65_535 "port";
                /// `host:port` of the admin listener: `/metrics` and the detailed
                /// `/readyz`. Keep it off the public network; port 0 picks a free one.
                admin_http_addr: String = "127.0.0.1:9090".into();
                /// actix worker threads. One is the default: an I/O-bound service on
                /// a machine it shares with its stores does the same work with less
                /// CPU on one event loop, which has more to do each time it wakes
                /// (`docs/benchmarks.md`). Raise it, with `transfers_connections`, on
                /// a machine with cores to spare, or run more instances.
                http_workers: usize = 1, within 1..=256 "workers";
                /// Connections each worker holds open at once. Past it, the
                /// listeners stop accepting until one closes, and new connections
                /// wait in the kernel's backlog: idle keep-alive connections cannot
                /// take the process's memory and file descriptors without bound.
                http_connections_per_worker_max: usize = 10_000, within 1..=100_000 "connections";
                /// New connections the kernel queues for each listener until the
                /// server accepts them (`listen(2)`'s backlog). A burst past it is
                /// dropped at the door, and its clients try again 1 s later, then
                /// 3 s: a copy of a transfer can then arrive after its cooldown
                /// window and pay again. The kernel lowers it to
                /// `net.core.somaxconn` (4096 on Linux since 5.4); a larger value
                /// starts with a warning that names both.
                http_listen_backlog_connections: u32 = 2_048, within 1..=65_535 "connections";
                /// How long an idle keep-alive connection is kept open for its
                /// next request; 0 closes each connection after its response. A
                /// proxy in front must let its idle connections go sooner (nginx's
                /// `keepalive_timeout` in deploy/nginx is 4 s), or it may send a
                /// request on a connection being closed.
                http_keep_alive_s: u64 = 5, within 0..=3_600 "s";
                /// How long a new connection has to send a whole request head; one
                /// that sends it slower gets 408 and is closed, so that trickling
                /// headers cannot hold a connection.
                http_request_head_wait_ms_max: u64 = 5_000, within 100..=60_000 "ms";
                /// How long a request's body has, from the end of its head, to
                /// arrive whole; one that is slower gets 408 and its connection is
                /// closed, so that a body trickled in cannot hold a connection.
                http_request_body_wait_ms_max: u64 = 10_000, within 100..=300_000 "ms";
                /// Largest request body accepted; a larger one gets 413.
                request_body_bytes_max: usize = 16 * 1024, within 256..=(1024 * 1024) "bytes";
                /// An oversized body is read and thrown away up to this many bytes
                /// before the 413 is sent and the connection closed, so that a client
                /// still sending its body reads the answer instead of a reset.
                oversized_body_drain_bytes_max: usize = 8 * 1024 * 1024,
                    within 0..=(256 * 1024 * 1024) "bytes";
                /// How long an oversized body is drained at most (see
                /// `oversized_body_drain_bytes_max`).
                oversized_body_drain_ms_max: u64 = 2_000, within 0..=60_000 "ms";
                /// How long in-flight requests get to finish after SIGTERM or
                /// SIGINT. New connections are refused at once, and each answer in
                /// the meantime closes its connection. Keep it above `http_keep_alive_s`,
                /// so that idle connections are closed by their keep-alive, which
                /// clients expect, rather than cut when the grace ends.
                shutdown_grace_s: u64 = 10, within 0..=3_600 "s";
                /// After the grace (and a second for the answers given at its end),
                /// how long the process has to stop its background tasks and flush
                /// its spans before it exits whatever still runs.
                shutdown_cleanup_ms_max: u64 = 2_000, within 100..=60_000 "ms";
                /// How long a readiness verdict answers `/readyz`, so that probes
                /// from anyone cost the stores one round trip each per period at
                /// most; 0 probes on every call.
                readiness_cache_ms: u64 = 1_000, within 0..=60_000 "ms";
                /// How log lines are written.
                log_format: LogFormat = LogFormat::Text;
                /// Names this process in the decision feed and the logs. Empty: the
                /// host name and a random suffix.
                instance_id: String = String::new(), empty "the host name and a random suffix";
                /// Whether the cookies this service sets carry `Secure` (sent over
                /// HTTPS only). Set it where browsers reach the service over HTTPS,
                /// as behind a TLS load balancer. It is a setting and not the
                /// request's scheme, because `X-Forwarded-Proto` is any client's to
                /// send, and a proxy in front may overwrite it with its own `http`.
                cookies_secure: bool = false;
            }

        }
    };
}

pub(super) use serving_settings;
