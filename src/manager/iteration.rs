//! Once-per-iteration work: expiring retentions, explicit offload and onboard, and flushing and
//! delivering the iteration's events.

use std::sync::Arc;

use super::{absorb, KvCacheManager};
use crate::error::KvResult;
use crate::events::{EventDelivery, KvCacheEvent};

impl KvCacheManager {
    /// Expires timed retentions and syncs transfers (once per iteration). It also ends the
    /// step: the tokens a sequence gets until the next call are one step, whose first token's
    /// window a sliding window keeps whole (`WindowBlockManager::add_token`).
    pub fn refresh_blocks(&mut self) {
        self.iteration += 1;
        let now = self.op_now_ms();
        for w in &mut self.windows {
            w.refresh(now);
            absorb(&mut self.events, w);
        }
    }

    /// Offloads a primary block of one window to the host tier; a held block stays its
    /// sequences' (`WindowBlockManager::offload_block`).
    pub fn offload_block(&mut self, window_size: usize, block: u32) -> KvResult<bool> {
        let now = self.op_now_ms();
        let i = self.window_index(window_size)?;
        let done = self.windows[i].offload_block(block, now)?;
        absorb(&mut self.events, &mut self.windows[i]);
        Ok(done)
    }

    /// Brings a host block of one window back to the GPU tier: a free cached one, or a held one
    /// `offload_block` moved (`WindowBlockManager::onboard_block`).
    pub fn onboard_block(&mut self, window_size: usize, block: u32) -> KvResult<bool> {
        let now = self.op_now_ms();
        let i = self.window_index(window_size)?;
        let done = self.windows[i].onboard_block(block, now)?;
        absorb(&mut self.events, &mut self.windows[i]);
        Ok(done)
    }

    /// Sets the retention priority of one block of one window (TensorRT-LLM
    /// `KVCacheBlock::setPriority`); `priority` in 0..=100.
    pub fn set_block_priority(
        &mut self,
        window_size: usize,
        block: u32,
        priority: i32,
    ) -> KvResult<()> {
        let priority = crate::retention::check_priority(priority, "block")?;
        let now = self.op_now_ms();
        let i = self.window_index(window_size)?;
        self.windows[i].set_block_priority(block, priority, now)?;
        absorb(&mut self.events, &mut self.windows[i]);
        Ok(())
    }

    /// Ends the iteration's events (TensorRT-LLM `flushIterationEvents`): commits every window's
    /// pending removals and hands the events to the delivery buffer. Returns how many.
    pub fn flush_iteration_events(&mut self) -> usize {
        let Some(q) = &mut self.events else {
            return 0;
        };
        let batch = q.flush();
        let n = batch.len();
        self.delivery.push(batch);
        n
    }

    /// The delivery buffer, drained by `EventDelivery::drain` from any thread.
    pub fn event_delivery(&self) -> Arc<EventDelivery> {
        self.delivery.clone()
    }

    /// Flushes and drains without waiting (single-threaded use and tests).
    pub fn take_flushed_events(&mut self) -> Vec<KvCacheEvent> {
        self.flush_iteration_events();
        self.delivery.drain(std::time::Duration::ZERO).events
    }
}
