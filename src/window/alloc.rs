//! Allocation: the next free block (offloading cached content to the host tier on eviction),
//! offload and onboard between tiers, and the queued block copies.

use super::WindowBlockManager;
use crate::error::{KvError, KvResult};
use crate::events::WindowEvent;
use crate::pool::{Level, MemRow};
use crate::retention::{BlockRetention, DEFAULT_PRIORITY};
use crate::transfer::RowCopy;

/// Outcome of `WindowBlockManager::offload`.
enum Offload {
    /// Moved; the host block (now primary) is returned claimed.
    Done(u32),
    /// Nothing changed.
    Skipped,
    /// The host block was a distant ancestor: the block left the tree and is claimed.
    Detached,
}

impl WindowBlockManager {
    pub(super) fn flush_copies(&mut self) {
        self.flush_disk_jobs();
        self.submit_copies();
    }

    /// Submits the copies queued by this call (the disk's jobs stay queued).
    pub(super) fn submit_copies(&mut self) {
        if !self.pending_copies.is_empty() {
            // After a failed submission the call is rolled back: move nothing more.
            if !self.copy_log.failed() {
                let result = self.engine.submit(&self.pending_copies);
                self.copy_log.record(&self.pending_copies, result);
            }
            self.pending_copies.clear();
        }
    }

    pub(super) fn queue_copy(&mut self, src: u32, dst: u32, num_tokens: usize) {
        self.pending_copies.push(RowCopy {
            src: self.arena.row(src),
            dst: self.arena.row(dst),
            num_tokens: num_tokens as u32,
        });
    }

    #[inline]
    pub(super) fn evict_from_tree(&mut self, block: u32) {
        let stats = &mut self.stats;
        let mut events = self.events.as_mut();
        let digests = &mut self.digests;
        self.tree.detach_subtree(block, |b, hash| {
            digests.forget(b);
            stats.evicted_from_tree += 1;
            if let Some(e) = events.as_mut() {
                e.push(WindowEvent::Removed(hash));
            }
        });
    }

    /// Takes the next block to evict from the primary queue, offloading its content to the host
    /// tier when its priority allows, and claims it with `retention`. Capacity must have been
    /// checked by the caller.
    #[inline]
    pub(super) fn get_free_block(&mut self, retention: BlockRetention, now_ms: u64) -> u32 {
        let (mut candidate, can_offload) = self
            .queues
            .peek(Level::Primary)
            .expect("capacity is checked before allocation");
        if self.cfg.contiguous_runs {
            candidate = self.next_in_run(candidate);
        }
        // The next two victims: bring in what evicting them touches while this one is handled.
        if let Some(next) = self.queues.next_queued(candidate) {
            self.tree.prefetch_neighbors(next);
            if let Some(after) = self.queues.next_queued(next) {
                self.queues.prefetch(after);
                self.tree.prefetch_block(after);
                self.arena.prefetch(after);
            }
        }
        if !self.tree.has_key(candidate) {
            self.stats.alloc_new += 1;
        }
        self.stats.alloc_total += 1;
        // Only cached content is worth a host block: a private block's tokens are unreachable.
        // (The free-host-block count first: without a host tier this is the whole test.)
        let offloaded = if can_offload
            && self.queues.num_free(Level::Secondary) > 0
            && self.tree.is_in_tree(candidate)
        {
            match self.offload(candidate, now_ms) {
                Offload::Done(host_block) => Some(host_block),
                Offload::Detached => Some(candidate),
                Offload::Skipped => None,
            }
        } else {
            None
        };
        let victim = offloaded.unwrap_or_else(|| {
            // Claimed by `finish_allocation` (one queue removal instead of two calls).
            self.evict_from_tree(candidate);
            candidate
        });
        self.finish_allocation(victim, retention)
    }

    /// The block owning the row after the previous allocation's, when it may replace the
    /// eviction candidate without changing what is evicted: it waits in the same queue (so it
    /// ranks equally) and is not in the reuse tree (so taking it loses nothing cached).
    fn next_in_run(&self, candidate: u32) -> u32 {
        let Some(prev) = self.last_alloc_row else {
            return candidate;
        };
        let row = MemRow {
            level: Level::Primary,
            index: prev + 1,
        };
        match self.arena.block_at(row) {
            Some(next)
                if next != candidate
                    && self.queues.queue_of(next) == self.queues.queue_of(candidate)
                    && !self.tree.is_in_tree(next) =>
            {
                next
            }
            _ => candidate,
        }
    }

    /// Claims the victim (if still queued) with its retention and gives it a new allocation
    /// epoch; it has left the tree.
    fn finish_allocation(&mut self, victim: u32, retention: BlockRetention) -> u32 {
        let row = self.arena.row(victim);
        if row.level == Level::Primary {
            self.last_alloc_row = Some(row.index);
        }
        self.queues.claim_with_retention(
            victim,
            BlockRetention {
                priority: Some(retention.priority.unwrap_or(DEFAULT_PRIORITY)),
                duration_ms: retention.duration_ms,
            },
        );
        self.bump_epoch(victim);
        self.reset_reuse(victim);
        self.tree.disown_key(victim);
        victim
    }

    /// Marks a block's content as replaced: a sequence that detached it may no longer store it.
    pub(super) fn bump_epoch(&mut self, block: u32) {
        self.alloc_epoch[block as usize] = self.alloc_epoch[block as usize].wrapping_add(1);
    }

    /// Moves the content of the free primary `block` into the next free host block. Both are
    /// claimed before their rows are swapped (TensorRT-LLM issue 11879: a block must leave its free
    /// queue under the level it was queued at, not the one its row moves to); the host block's
    /// cached content leaves the tree; `block` keeps its tree position, priority and expiry and is
    /// queued at the host level; the host block, now owning a primary row, is returned claimed.
    /// Skipped (nothing changed) when offloading is off, no host block is free, or the host block
    /// is a near ancestor of `block` (evicting it would detach `block`). A distant ancestor is only
    /// found after its eviction: then `block` has left the tree with it and is returned claimed.
    fn offload(&mut self, block: u32, now_ms: u64) -> Offload {
        const ANCESTOR_STEPS: u32 = 16;
        if !self.cfg.onboard_blocks {
            return Offload::Skipped;
        }
        let Some((host_block, _)) = self.queues.peek(Level::Secondary) else {
            return Offload::Skipped;
        };
        if self
            .tree
            .is_ancestor_within(host_block, block, ANCESTOR_STEPS)
            == Some(true)
        {
            return Offload::Skipped;
        }
        let was_cached = self.tree.is_in_tree(block);
        let expiry = self.queues.expiry(block);
        self.queues.claim(block);
        self.queues.claim(host_block);
        self.spill_to_disk(host_block);
        self.spill_to_remote(host_block);
        self.evict_from_tree(host_block);
        self.bump_epoch(host_block);
        if was_cached && !self.tree.is_in_tree(block) {
            self.queues
                .release(host_block, Level::Secondary, false, now_ms);
            return Offload::Detached;
        }
        self.queue_copy(block, host_block, 0);
        self.arena.swap_rows(block, host_block);
        self.queues.release(block, Level::Secondary, false, now_ms);
        self.queues.restore_expiry(block, expiry);
        self.stats.offloaded += 1;
        self.record_level_change(block, Level::Primary, Level::Secondary);
        Offload::Done(host_block)
    }

    /// Moves a claimed host block to the primary level (copy host → GPU, swap rows).
    pub(super) fn onboard(&mut self, block: u32, now_ms: u64) {
        if !self.cfg.onboard_blocks || self.arena.is_primary(block) {
            return;
        }
        let fresh = self.get_free_block(BlockRetention::default(), now_ms);
        self.queue_copy(block, fresh, 0);
        if self.arena.ref_count(block) > 0 {
            // A held block (a suspended sequence's): a rollback must bring its bytes back.
            self.copy_log
                .note_moved_held(self.arena.row(block), self.arena.row(fresh));
        }
        self.arena.swap_rows(block, fresh);
        self.queues
            .release(fresh, self.arena.level(fresh), false, now_ms);
        self.stats.onboarded += 1;
        self.record_level_change(block, Level::Secondary, Level::Primary);
    }

    /// An error for a block id out of range.
    fn check_block_id(&self, block: u32) -> KvResult<()> {
        if block as usize >= self.arena.len() {
            return Err(KvError::InvalidArgument(format!(
                "block id {block} out of range"
            )));
        }
        Ok(())
    }

    /// Sets a block's retention priority (TensorRT-LLM `KVCacheBlock::setPriority`): a
    /// sequence's block keeps it when released; a free block is queued again at it (at the back
    /// of that priority's queue). Reports the change to an event consumer when the block is
    /// cached.
    pub fn set_block_priority(&mut self, block: u32, priority: u8, now_ms: u64) -> KvResult<()> {
        if block as usize >= self.arena.len() {
            return Err(KvError::InvalidArgument(format!(
                "block id {block} out of range"
            )));
        }
        let old = self.queues.priority(block);
        self.queues.set_priority(block, priority, now_ms);
        self.record_priority_change(block, old, priority);
        Ok(())
    }

    /// Offloads a primary block to the host tier (TensorRT-LLM `offloadBlock`). A free block
    /// moves with its tree position; returns false when it was not moved: no free host block,
    /// offloading off, or the host block is its ancestor. A block sequences hold moves too (its
    /// row swaps with a free host block's, as a suspended sequence's blocks do): its sequences
    /// keep it, their offset tables are refused until `onboard_block` brings it back, and
    /// storing stops before it; false when no host block is free or offloading is off. A
    /// pinned block is an error (its pin promises a reader the GPU row).
    pub fn offload_block(&mut self, block: u32, now_ms: u64) -> KvResult<bool> {
        self.check_block_id(block)?;
        if !self.arena.is_primary(block) {
            return Ok(false);
        }
        if self.arena.pins(block) > 0 {
            // A pin promises a reader (a cache transceiver) the GPU row until it is dropped.
            return Err(KvError::InvalidArgument(format!(
                "block {block} is pinned; unpin it before offloading it"
            )));
        }
        if self.arena.ref_count(block) > 0 {
            if !self.cfg.onboard_blocks || !self.move_down(block, now_ms) {
                return Ok(false);
            }
            self.prune_held_on_host();
            self.held_on_host.push(block);
            self.flush_copies();
            return Ok(true);
        }
        let moved = match self.offload(block, now_ms) {
            Offload::Done(host_block) => {
                self.queues
                    .release(host_block, Level::Primary, false, now_ms);
                true
            }
            Offload::Detached => {
                self.queues.release(block, Level::Primary, false, now_ms);
                false
            }
            Offload::Skipped => false,
        };
        self.flush_copies();
        Ok(moved)
    }

    /// Forgets the held blocks moved to the host tier that came back or were freed.
    fn prune_held_on_host(&mut self) {
        let arena = &self.arena;
        self.held_on_host
            .retain(|&b| !arena.is_primary(b) && arena.ref_count(b) > 0);
    }

    /// Whether an explicit `offload_block` may have left a held block on the host tier (the
    /// offset tables check their blocks only then).
    pub fn may_hold_on_host(&self) -> bool {
        !self.held_on_host.is_empty()
    }

    /// Whether `block` is a held block an explicit `offload_block` moved to the host tier.
    pub fn is_held_on_host(&self, block: u32) -> bool {
        !self.arena.is_primary(block)
            && self.arena.ref_count(block) > 0
            && self.held_on_host.contains(&block)
    }

    /// Brings a host block to the GPU tier now (TensorRT-LLM `onboardBlock`). A free, cached
    /// block's content moves into the next free primary block's row (evicting, and offloading,
    /// as allocation does) and the block is queued at the primary level, keeping its tree
    /// position, priority and expiry. A held block `offload_block` moved to the host tier comes
    /// back the same way and its sequences keep it. Returns false when it does not move:
    /// already on the GPU, nothing cached in it, onboarding off, or no free primary block. The
    /// blocks of a suspended sequence come back when it resumes (an error here).
    pub fn onboard_block(&mut self, block: u32, now_ms: u64) -> KvResult<bool> {
        self.check_block_id(block)?;
        if !self.cfg.onboard_blocks {
            // Sequences then read host blocks where they are.
            return Ok(false);
        }
        let held = self.arena.ref_count(block) > 0;
        if held && !self.arena.is_primary(block) && !self.is_held_on_host(block) {
            return Err(KvError::InvalidArgument(format!(
                "block {block} belongs to a suspended sequence; it comes back when the \
                 sequence resumes"
            )));
        }
        if self.arena.is_primary(block)
            || (!held && !self.tree.is_in_tree(block))
            || self.queues.num_free(Level::Primary) == 0
        {
            return Ok(false);
        }
        if held {
            self.onboard(block, now_ms);
            self.prune_held_on_host();
            self.flush_copies();
            return Ok(true);
        }
        let expiry = self.queues.expiry(block);
        self.queues.claim(block);
        self.onboard(block, now_ms);
        self.queues
            .release(block, self.arena.level(block), false, now_ms);
        self.queues.restore_expiry(block, expiry);
        self.flush_copies();
        Ok(true)
    }
}
