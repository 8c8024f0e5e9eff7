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

    /// A CSRF value for a form shown before sign-in, where there is no
    /// session to derive it from: a random nonce and a MAC of it, so that a
    /// value this server did not make (a cookie planted from a sibling
    /// domain, say) is refused.
    pub fn pre_session_csrf(&self) -> String {
        let nonce: [u8; 16] = rand::random();
        let nonce = hex::encode(nonce);
        let mac = self.pre_session_mac(&nonce);
        format!("{nonce}.{mac}")
    }

    /// Whether `value` is one `pre_session_csrf` made, in constant time.
    pub fn pre_session_csrf_is_ours(&self, value: &str) -> bool {
        let Some((nonce, presented)) = value.split_once('.') else {
            return false;
        };
        let Ok(presented) = hex::decode(presented) else {
            return false;
        };
        let mut mac = self.mac();
        mac.update(b"pre-session-csrf:");
        mac.update(nonce.as_bytes());
        mac.verify_slice(&presented).is_ok()
    }

    fn pre_session_mac(&self, nonce: &str) -> String {
        let mut mac = self.mac();
        mac.update(b"pre-session-csrf:");
        mac.update(nonce.as_bytes());
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
