//! The two listeners: the public one, behind the load balancer, and the
//! admin one (`/healthz`, the detailed `/readyz`, `/metrics`) for
//! operators and scrapers on the private network.

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
