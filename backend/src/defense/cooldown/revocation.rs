//! The cooldown's part in revoking a token: a token's MAC is checked
//! without I/O, so revoking one writes a revocation entry to Redis that the
//! cooldown's script reads before it takes a window (see the module doc of
//! `cooldown`, **Revoked tokens**).

use super::CooldownLock;
use crate::auth::VerifiedToken;

impl CooldownLock {
    /// The revocation entry of one token.
    pub fn revocation_key(&self, token: &VerifiedToken) -> String {
        // Hex into a buffer on the stack: `hex::encode` builds its string
        // one char at a time, and this key is made for every transfer.
        let mut hex = [0u8; 64];
        hex::encode_to_slice(token.hash, &mut hex).expect("32 bytes are 64 hex digits");
        let hash = std::str::from_utf8(&hex).expect("hex digits are ASCII");
        let mut buffer = [0; uuid::fmt::Hyphenated::LENGTH];
        let user = token.user_id.written_in(&mut buffer);
        [&self.key_prefix, "revoked:{", user, "}:", hash].concat()
    }

    /// Writes the revocation entry of a token that was just revoked, to
    /// expire when the token would have. Best effort: if Redis is down, the
    /// transaction's own check still refuses the token, and the window it
    /// takes then is given back.
    pub async fn note_revoked(&self, token: &VerifiedToken) {
        self.held.forget_user(token.user_id);
        let Some(store) = &self.store else {
            return;
        };
        let key = self.revocation_key(token);
        let expires_at_ms = token.expires_at.timestamp_millis();
        let attempt = async {
            let mut conn = store.get().await?;
            redis::cmd("SET")
                .arg(&key)
                .arg(1)
                .arg("PXAT")
                .arg(expires_at_ms)
                .query_async::<()>(&mut conn)
                .await
                .map_err(|e| e.to_string())
        };
        match tokio::time::timeout(self.command_timeout, attempt).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(error, "could not record a token's revocation in Redis"),
            Err(_elapsed) => tracing::warn!("recording a token's revocation in Redis timed out"),
        }
    }
}
