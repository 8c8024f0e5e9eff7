//! The bounds on live decision streams one holder keeps open on one
//! instance: each user (`decision_streams_per_user_max`) and each client
//! address (`decision_streams_per_address_max`), beside the instance-wide
//! bound (`decision_streams_max`, a semaphore in `AppState`).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

/// How many live streams each holder (a user, an address) keeps open on
/// this instance.
pub struct StreamsPer<K> {
    open: std::sync::Mutex<HashMap<K, usize>>,
}

impl<K> Default for StreamsPer<K> {
    fn default() -> Self {
        Self {
            open: std::sync::Mutex::default(),
        }
    }
}

/// One holder's claim on a stream; gives it back when the stream ends.
pub struct StreamSlot<K: Eq + Hash + Copy> {
    streams: Arc<StreamsPer<K>>,
    holder: K,
}

impl<K: Eq + Hash + Copy> StreamsPer<K> {
    pub fn claim(streams: &Arc<Self>, holder: K, max: usize) -> Option<StreamSlot<K>> {
        let mut open = streams.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(holder).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(StreamSlot {
            streams: streams.clone(),
            holder,
        })
    }
}

impl<K: Eq + Hash + Copy> Drop for StreamSlot<K> {
    fn drop(&mut self) {
        let mut open = self.streams.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.holder) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.holder);
            }
        }
    }
}
