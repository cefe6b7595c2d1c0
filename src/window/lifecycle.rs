//! The scheduler capacity lifecycle in one window: growing and shrinking a sequence's blocks to
//! a capacity, suspending it (its blocks become movable to the host tier, never droppable), moving
//! suspended blocks to the host tier when the GPU pool needs room, and resuming (every block
//! back on the GPU, all or nothing).
//!
//! A suspended sequence keeps its references, so its blocks are never free and never dropped.
//! A primary block is *movable* when every reference to it comes from suspended sequences (no
//! active sequence reads it, no pin) and the window has a usable host tier: moving it copies its
//! row into a free host block and swaps the rows, so the block keeps its id (and the sequence its
//! block list) while its bytes now live on the host. Nothing moves at suspend time; blocks move
//! only when an allocation needs their GPU rows.

use super::WindowBlockManager;
use crate::pool::Level;
use crate::premixed::PremixedMap;
use crate::retention::BlockRetention;

/// Tokens read back from a sequence's key slots (`WindowBlockManager::read_tokens`), in position
/// order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlotTokens {
    pub token_ids: Vec<i32>,
    /// One per token; 0 when no key of the window has extra ids.
    pub extra_ids: Vec<u64>,
}

impl WindowBlockManager {
    /// Whether blocks can move to the host tier and back.
    pub fn host_tier_usable(&self) -> bool {
        self.cfg.num_secondary > 0 && self.cfg.onboard_blocks
    }

    /// Whether any sequence of this window is suspended.
    pub fn has_suspended(&self) -> bool {
        self.num_suspended > 0
    }

    pub fn is_suspended(&self, id: u64) -> bool {
        self.seqs.get(&id).is_some_and(|s| s.suspended_at.is_some())
    }

    /// Primary blocks that moving suspended sequences' blocks to the host tier could free, in
    /// the order they would move (oldest suspension first, each sequence last block first),
    /// skipping `exclude`d blocks and blocks of `except` (a sequence being resumed).
    fn movable_blocks(&self, except: Option<u64>, exclude: &dyn Fn(u32) -> bool) -> Vec<u32> {
        if !self.host_tier_usable() {
            return Vec::new();
        }
        let mut suspended: Vec<(u64, u64)> = self
            .seqs
            .iter()
            .filter_map(|(&id, s)| s.suspended_at.map(|t| (t, id)))
            .filter(|&(_, id)| Some(id) != except)
            .collect();
        if suspended.is_empty() {
            return Vec::new();
        }
        suspended.sort_unstable();
        // References from suspended sequences per block: movable when they are all of them.
        let mut held: PremixedMap<u32, u32> = PremixedMap::default();
        for &(_, id) in &suspended {
            let s = &self.seqs[&id];
            for beam in &s.beams {
                for &b in &beam[s.front_removed..] {
                    *held.entry(b).or_default() += 1;
                }
            }
        }
        let mut out = Vec::new();
        for &(_, id) in &suspended {
            let s = &self.seqs[&id];
            for beam in &s.beams {
                for &b in beam[s.front_removed..].iter().rev() {
                    let count = held.get_mut(&b).expect("counted above");
                    if self.arena.is_primary(b) && *count == self.arena.ref_count(b) && !exclude(b)
                    {
                        out.push(b);
                        // Listed once even when several beams or sequences hold it.
                        *count = 0;
                    }
                }
            }
        }
        out
    }

    /// Free host blocks that can receive moved blocks, not counting `exclude`d ones.
    fn free_host_blocks(&self, exclude_queued: usize) -> usize {
        self.queues
            .num_free(Level::Secondary)
            .saturating_sub(exclude_queued)
    }

    /// How many primary blocks moving suspended blocks to the host tier can free now (bounded
    /// by the free host blocks), not counting `exclude`d blocks nor `host_claims` free host
    /// blocks that the caller will take itself.
    pub fn movable_count(&self, exclude: &dyn Fn(u32) -> bool, host_claims: usize) -> usize {
        let free_host = self.free_host_blocks(host_claims);
        if free_host == 0 {
            return 0;
        }
        self.movable_blocks(None, exclude).len().min(free_host)
    }

    /// GPU utilization of this window: (total − free − movable) / total, where movable counts
    /// suspended blocks that could go to the host tier (all of them, host space aside).
    pub fn utilization(&self) -> f64 {
        let total = self.cfg.num_primary;
        if total == 0 {
            return 0.0;
        }
        let free = self.queues.num_free(Level::Primary);
        let movable = self.movable_blocks(None, &|_| false).len();
        (total.saturating_sub(free + movable)) as f64 / total as f64
    }

    /// Moves suspended blocks to the host tier until `needed` primary blocks are free (or
    /// nothing more can move), skipping `exclude`d blocks; returns how many moved. Free host
    /// blocks that are queued are the destinations (their cached content is dropped).
    pub fn make_room(
        &mut self,
        needed: usize,
        exclude: &dyn Fn(u32) -> bool,
        now_ms: u64,
    ) -> usize {
        let free = self.queues.num_free(Level::Primary);
        if free >= needed {
            return 0;
        }
        let candidates = self.movable_blocks(None, exclude);
        let mut moved = 0;
        for b in candidates.into_iter().take(needed - free) {
            if !self.move_down(b, now_ms) {
                break;
            }
            moved += 1;
        }
        self.flush_copies();
        moved
    }

    /// Moves the held primary block `b` into the next free host block; false when none is free.
    pub(super) fn move_down(&mut self, b: u32, now_ms: u64) -> bool {
        let Some((host, _)) = self.queues.peek(Level::Secondary) else {
            return false;
        };
        self.queues.claim(host);
        self.evict_from_tree(host);
        self.tree.disown_key(host);
        self.bump_epoch(host);
        self.queue_copy(b, host, 0);
        self.copy_log
            .note_moved_held(self.arena.row(b), self.arena.row(host));
        self.arena.swap_rows(b, host);
        // `host` now owns a GPU row and nothing else: a free primary block.
        self.queues.release(host, Level::Primary, false, now_ms);
        self.stats.offloaded += 1;
        self.stats.suspended_moved_to_host += 1;
        self.record_level_change(b, Level::Primary, Level::Secondary);
        true
    }

    /// Suspends sequence `id` (it must be active).
    pub fn suspend(&mut self, id: u64) {
        self.suspend_clock += 1;
        let t = self.suspend_clock;
        let s = self.seqs.get_mut(&id).expect("sequence exists");
        debug_assert!(s.suspended_at.is_none());
        s.suspended_at = Some(t);
        self.num_suspended += 1;
    }

    /// Whether the GPU pool can take back every block of `id` that is on the host tier (moving
    /// other suspended blocks down where it has no free block).
    pub fn can_resume(&self, id: u64) -> bool {
        let n = self.host_blocks_of(id).len();
        let free = self.queues.num_free(Level::Primary);
        if n <= free {
            return true;
        }
        // Each onboarding gives a host block back, each move down takes one: after the first
        // `free` onboardings, moves and onboardings alternate, so one free host block suffices.
        let deficit = n - free;
        let movable = self.movable_blocks(Some(id), &|_| false).len();
        let host_free = self.queues.num_free(Level::Secondary) + free;
        deficit <= movable && host_free >= 1
    }

    /// Resumes sequence `id` (checked with `can_resume`): its host blocks come back to the GPU, moving other
    /// suspended blocks down where the pool has no free block.
    pub fn resume(&mut self, id: u64, now_ms: u64) {
        let blocks = self.host_blocks_of(id);
        self.seqs
            .get_mut(&id)
            .expect("sequence exists")
            .suspended_at = None;
        self.num_suspended -= 1;
        for b in blocks {
            if self.queues.num_free(Level::Primary) == 0 {
                let victim = self.movable_blocks(Some(id), &|_| false)[0];
                let moved = self.move_down(victim, now_ms);
                debug_assert!(moved, "resume was planned");
            }
            self.onboard(b, now_ms);
        }
        self.flush_copies();
    }

    /// The distinct blocks of sequence `id` whose bytes are on the host tier (none when
    /// onboarding is off: such blocks are then read where they are).
    fn host_blocks_of(&self, id: u64) -> Vec<u32> {
        if !self.cfg.onboard_blocks {
            return Vec::new();
        }
        let s = &self.seqs[&id];
        let mut blocks: Vec<u32> = s
            .beams
            .iter()
            .flat_map(|beam| beam[s.front_removed..].iter().copied())
            .filter(|&b| !self.arena.is_primary(b))
            .collect();
        blocks.sort_unstable();
        blocks.dedup();
        blocks
    }

    /// Blocks (all beams) that growing sequence `id` to `capacity` tokens allocates.
    pub fn blocks_to_grow(&self, id: u64, capacity: usize) -> usize {
        let s = &self.seqs[&id];
        self.blocks_for_tokens(capacity)
            .saturating_sub(s.beams[0].len())
            * s.beams.len()
    }

    /// Whether growing `id` to `capacity` tokens can be served, counting blocks that moving
    /// suspended blocks down would free.
    pub fn can_grow(&self, id: u64, capacity: usize) -> bool {
        let needed = self.blocks_to_grow(id, capacity);
        let free = self.queues.num_free(Level::Primary);
        needed <= free || needed <= free + self.movable_count(&|_| false, 0)
    }

    /// Grows sequence `id` to `capacity` tokens (checked with `can_grow`): new last blocks per
    /// beam with `retention`, after moving suspended blocks down if the pool needs room.
    pub fn grow(&mut self, id: u64, capacity: usize, retention: BlockRetention, now_ms: u64) {
        let needed = self.blocks_to_grow(id, capacity);
        if needed == 0 {
            return;
        }
        self.make_room(needed, &|_| false, now_ms);
        let target = self.blocks_for_tokens(capacity);
        let beams = self.seqs[&id].beams.len();
        while self.seqs[&id].beams[0].len() < target {
            for beam in 0..beams {
                let b = self.get_free_block(retention, now_ms);
                self.arena.add_refs(b, 1);
                self.seqs.get_mut(&id).expect("exists").beams[beam].push(b);
            }
        }
        self.flush_copies();
    }

    /// Writes tokens at positions `start..` of sequence `id` into its blocks' key slots (with
    /// reuse on; storing reads them there).
    pub fn write_tokens(&mut self, id: u64, start: usize, tokens: &[i32], extra: Option<&[u64]>) {
        if !self.cfg.enable_reuse {
            return;
        }
        let tpb = self.cfg.tokens_per_block;
        let s = &self.seqs[&id];
        for (i, &t) in tokens.iter().enumerate() {
            let pos = start + i;
            if pos / tpb < s.front_removed {
                // Detached by `slide_to_slots` before the token was known (see `lost_tokens`).
                continue;
            }
            for beam in &s.beams {
                self.tree
                    .write_token(beam[pos / tpb], pos % tpb, t, extra.map(|e| e[i]));
            }
        }
    }

    /// The tokens (and extra ids) at positions `start..end` of sequence `id`, read from its
    /// blocks' key slots; empty with reuse off (the slots are not written then).
    pub fn read_tokens(&self, id: u64, start: usize, end: usize) -> SlotTokens {
        let mut read = SlotTokens::default();
        if !self.cfg.enable_reuse {
            return read;
        }
        let tpb = self.cfg.tokens_per_block;
        let beam = &self.seqs[&id].beams[0];
        let n = end.saturating_sub(start);
        read.token_ids.reserve_exact(n);
        read.extra_ids.reserve_exact(n);
        for pos in start..end {
            let t = self.tree.slot_token(beam[pos / tpb], pos % tpb);
            read.token_ids.push(t.token_id);
            read.extra_ids.push(t.extra_id);
        }
        read
    }
}
