//! The CSRF token of a browser session.

use actix_web::HttpRequest;
use hmac::Mac;

use crate::problem::{Problem, ProblemType};

use super::token::{CSRF_HEADER, TokenSigner, VerifiedToken};

impl TokenSigner {
    /// The CSRF token of a session: a MAC of the session's token hash, so
    /// it needs no storage and is worthless without the session cookie.
    pub fn csrf_token(&self, session: &VerifiedToken) -> String {
        let mut mac = self.mac();
        mac.update(b"csrf:");
        mac.update(&session.hash);
        hex::encode(mac.finalize().into_bytes())
    }

    /// Checks a presented CSRF token in constant time.
    pub fn verify_csrf(&self, session: &VerifiedToken, presented: &str) -> bool {
        let Ok(presented) = hex::decode(presented.trim()) else {
            return false;
        };
        let mut mac = self.mac();
        mac.update(b"csrf:");
        mac.update(&session.hash);
        mac.verify_slice(&presented).is_ok()
    }

    /// For API calls that change state: a session-cookie caller must also
    /// present the CSRF token in `X-CSRF-Token`.
    pub fn require_csrf_header(&self, request: &HttpRequest, caller: &VerifiedToken) -> Result<(), Problem> {
        if !caller.via_session {
            return Ok(());
        }
        let presented = crate::headers::single(request, CSRF_HEADER)?
            .and_then(|value| value.to_str().ok())
            .unwrap_or("");
        if self.verify_csrf(caller, presented) {
            Ok(())
        } else {
            Err(Problem::new(
                ProblemType::CsrfTokenInvalid,
                "A request authenticated by the session cookie must carry the page's X-CSRF-Token.",
            ))
        }
    }
}
