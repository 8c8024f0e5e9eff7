//! The bound on live decision streams each user holds on one instance
//! (`decision_streams_per_user_max`), beside the instance-wide bound
//! (`decision_streams_max`, a semaphore in `AppState`).

use std::collections::HashMap;
use std::sync::Arc;

use crate::domain::UserId;

/// How many live streams each user holds on this instance.
#[derive(Default)]
pub struct StreamsPerUser {
    open: std::sync::Mutex<HashMap<UserId, usize>>,
}

/// One user's claim on a stream; gives it back when the stream ends.
pub struct UserStreamSlot {
    streams: Arc<StreamsPerUser>,
    user: UserId,
}

impl StreamsPerUser {
    pub fn claim(streams: &Arc<Self>, user: UserId, max: usize) -> Option<UserStreamSlot> {
        let mut open = streams.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(user).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(UserStreamSlot {
            streams: streams.clone(),
            user,
        })
    }
}

impl Drop for UserStreamSlot {
    fn drop(&mut self) {
        let mut open = self.streams.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.user) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.user);
            }
        }
    }
}
