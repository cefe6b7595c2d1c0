//! Carrying sequences' recurrent state into their next block at a block boundary (TensorRT-LLM
//! `copyLinearAttentionBlock` / `copyLinearAttentionBlockBatch`; see `window::recurrent`).

use super::{absorb, KvCacheManager};
use crate::error::{KvError, KvResult};

impl KvCacheManager {
    /// For each `(sequence, position)`: in every window with recurrent-state pools, copies the
    /// state rows of the block ending at token `position` into the block starting there (only
    /// at a block boundary, and only into a block the sequence holds privately). All copies go
    /// out in one submission per window. Every id must be a live sequence (checked before
    /// anything is copied). Returns how many block copies were queued.
    pub fn copy_recurrent_state(&mut self, requests: &[(u64, usize)]) -> KvResult<usize> {
        for &(id, _) in requests {
            if !self.sequences.contains_key(&id) {
                return Err(KvError::InvalidArgument(format!(
                    "request {id} is not a live sequence"
                )));
            }
        }
        let mut copied = 0;
        for w in &mut self.windows {
            copied += w.copy_recurrent_state(requests);
            absorb(&mut self.events, w);
        }
        Ok(copied)
    }
}
