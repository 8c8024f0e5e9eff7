//! Reading a request's headers. A header that carries one value (a key, a
//! token, a signature, the lab's switches) is refused when it comes twice:
//! two proxies, or a client and a proxy, could each read a different copy,
//! and one of them would act on what the other never checked.

use actix_web::HttpRequest;
use actix_web::http::header::HeaderValue;

use crate::problem::Problem;

/// The value of `name` when it came at most once.
pub fn single<'r>(request: &'r HttpRequest, name: &str) -> Result<Option<&'r HeaderValue>, Problem> {
    let mut values = request.headers().get_all(name);
    let first = values.next();
    if values.next().is_some() {
        return Err(Problem::validation(format!(
            "Send the {name} header once at most. Nothing was changed."
        )));
    }
    Ok(first)
}
