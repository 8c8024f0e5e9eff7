//! Commands for several Redis keys, grouped so that a cluster takes them.

use crate::redis_store::RedisStore;

/// Commands on several keys: one pipeline on a single server; on a
/// cluster, one per key, so that each pipeline's keys live in one slot.
pub(super) struct Pipelines {
    cluster: bool,
    pipes: Vec<redis::Pipeline>,
    by_key: std::collections::HashMap<String, usize>,
}

impl Pipelines {
    pub(super) fn new(cluster: bool) -> Self {
        Self {
            cluster,
            pipes: Vec::new(),
            by_key: std::collections::HashMap::new(),
        }
    }

    pub(super) fn for_key(&mut self, key: &str) -> &mut redis::Pipeline {
        let index = if self.cluster {
            match self.by_key.get(key) {
                Some(index) => *index,
                None => {
                    self.pipes.push(redis::pipe());
                    self.by_key.insert(key.to_owned(), self.pipes.len() - 1);
                    self.pipes.len() - 1
                }
            }
        } else {
            if self.pipes.is_empty() {
                self.pipes.push(redis::pipe());
            }
            0
        };
        &mut self.pipes[index]
    }

    pub(super) async fn send(&self, store: &RedisStore) -> Result<(), String> {
        if self.pipes.is_empty() {
            return Ok(());
        }
        let mut conn = store.get().await?;
        for pipe in &self.pipes {
            pipe.query_async::<()>(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}
