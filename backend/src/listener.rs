//! The two listeners: the public one, behind the load balancer, and the
//! admin one (`/healthz`, the detailed `/readyz`, `/metrics`) for
//! operators and scrapers on the private network; and how both are bound,
//! with a backlog a burst of new connections fits in.

/// Which listener a connection came in on, recorded when it is accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    Public,
    Admin,
}

/// What the admin listener serves; everything else there is a 404.
const ADMIN_PATHS: [&str; 3] = ["/healthz", "/readyz", "/metrics"];
/// ...and a broker command's outcome, under this prefix.
const ADMIN_PREFIX: &str = "/commands/";

/// Tells the routes which listener a request came in on, and keeps the
/// admin listener to its own paths: the public routes never answer there.
pub async fn keep_listeners_apart(
    request: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody>,
) -> Result<
    actix_web::dev::ServiceResponse<actix_web::body::EitherBody<impl actix_web::body::MessageBody>>,
    actix_web::Error,
> {
    let listener = request
        .conn_data::<Listener>()
        .copied()
        .unwrap_or(Listener::Public);
    actix_web::HttpMessage::extensions_mut(&request).insert(listener);
    let admin_path = ADMIN_PATHS.contains(&request.path()) || request.path().starts_with(ADMIN_PREFIX);
    if listener == Listener::Admin && !admin_path {
        let problem = crate::problem::Problem::not_found(format!(
            "The admin listener serves only {} and {ADMIN_PREFIX}{{command_id}}.",
            ADMIN_PATHS.join(", ")
        ));
        return Ok(request
            .into_response(problem.into_response())
            .map_into_right_body());
    }
    Ok(next.call(request).await?.map_into_left_body())
}

/// Where Linux says how many connections it queues for one listener at
/// most, whatever the listener asked for.
const SOMAXCONN: &str = "/proc/sys/net/core/somaxconn";

/// Binds a listener to the first address `address` resolves to that takes
/// it, as `std::net::TcpListener::bind` does, but with a backlog of
/// `backlog` connections (`http_listen_backlog_connections`) where std
/// asks for 128. A burst of new connections larger than the backlog
/// overflows it, and the kernel drops their handshakes: the clients try
/// again 1 s later, then 3 s, and a copy of a transfer can arrive after
/// its cooldown window has ended. `SO_REUSEADDR` is set, as std sets it,
/// so that an instance restarted on its port binds it at once.
pub fn bind(address: impl std::net::ToSocketAddrs, backlog: u32) -> std::io::Result<std::net::TcpListener> {
    let mut last_error = None;
    for address in address.to_socket_addrs()? {
        match bind_one(address, backlog) {
            Ok(listener) => return Ok(listener),
            Err(error) => last_error = Some(error),
        }
    }
    Err(last_error.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the address resolved to nothing",
        )
    }))
}

fn bind_one(address: std::net::SocketAddr, backlog: u32) -> std::io::Result<std::net::TcpListener> {
    let socket = if address.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(backlog)?.into_std()
}

/// The most the kernel queues for a listener (`net.core.somaxconn`), where
/// it says; `None` elsewhere.
pub fn kernel_backlog_cap() -> Option<u32> {
    std::fs::read_to_string(SOMAXCONN).ok()?.trim().parse().ok()
}

/// Says so at start-up when the kernel will queue fewer connections than
/// `backlog`. The server still starts, as Redis does: the kernel silently
/// lowers a backlog to its cap, which is a smaller door, not a broken one,
/// and a host's sysctl is not the server's to refuse; the warning names
/// both numbers and the sysctl that raises the cap.
pub fn warn_if_the_kernel_caps(backlog: u32) {
    if let Some(cap) = kernel_backlog_cap().filter(|cap| *cap < backlog) {
        tracing::warn!(
            http_listen_backlog_connections = backlog,
            somaxconn = cap,
            "the kernel queues at most {cap} connections per listener (net.core.somaxconn), fewer than \
             http_listen_backlog_connections ({backlog}); a burst of new connections past {cap} is dropped \
             and retried by its clients a second or more later. Raise the sysctl (sysctl -w \
             net.core.somaxconn={backlog}) or lower the setting"
        );
    }
}
