//! `WindowBlockManager`: the blocks of one attention-window size. Allocation through
//! `get_free_block` (with offload-on-evict), admission (a read-only planning walk, then claims,
//! then onboarding, copies and allocation), store for reuse, release, sliding-window detach and
//! onboard/offload.
//!
//! Every mutating entry point checks capacity before it changes anything, so a failure leaves
//! the window exactly as it was.

use std::collections::HashMap;

use crate::error::{KvError, KvResult};
use crate::events::{StoredBlock, WindowEvent};
use crate::eviction::FreeQueues;
use crate::key::{lookup_hash, multimodal_keys_for_range, BlockKeyRef, MmKey, MultimodalItem};
use crate::pool::{BlockArena, Level, PoolGeometry};
use crate::retention::{BlockRetention, RetentionConfig, DEFAULT_PRIORITY};
use crate::transfer::{CopyEngine, RowCopy};
use crate::tree::{PremixedMap, ReuseTree};

/// Static configuration of one window.
#[derive(Clone, Debug)]
pub struct WindowConfig {
    pub window_size: usize,
    pub num_primary: usize,
    pub num_secondary: usize,
    pub tokens_per_block: usize,
    /// Most tokens a sequence may hold in this window (`max(window, max_sequence_length)`).
    pub max_token_num: usize,
    pub max_blocks_per_seq: usize,
    pub enable_reuse: bool,
    pub enable_partial_reuse: bool,
    pub copy_on_partial_reuse: bool,
    pub onboard_blocks: bool,
    pub offload_min_priority: u8,
    pub geometry: PoolGeometry,
}

impl WindowConfig {
    /// A window narrower than the maximum sequence length detaches out-of-window blocks.
    pub fn is_swa(&self, max_sequence_length: usize) -> bool {
        self.window_size < max_sequence_length
    }
}

/// Cumulative allocation counters (reference §2.9).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowStats {
    pub alloc_total: u64,
    pub alloc_new: u64,
    pub reused: u64,
    pub missed: u64,
    pub offloaded: u64,
    pub onboarded: u64,
    pub evicted_from_tree: u64,
}

/// The tokens and key attributes of a sequence, from which block keys are cut.
#[derive(Clone, Copy, Debug)]
pub struct KeySource<'a> {
    pub token_ids: &'a [i32],
    pub extra_ids: Option<&'a [u64]>,
    pub lora_task_id: Option<u64>,
    pub cache_salt: Option<u64>,
    pub mm_items: &'a [MultimodalItem],
}

impl<'a> KeySource<'a> {
    /// The key of tokens `[start, end)`; multimodal keys are written into `scratch`.
    pub fn key<'s>(
        &'s self,
        start: usize,
        end: usize,
        scratch: &'s mut Vec<MmKey>,
    ) -> BlockKeyRef<'s> {
        if self.mm_items.is_empty() {
            scratch.clear();
        } else {
            multimodal_keys_for_range(self.mm_items, start as i32, end as i32, scratch);
        }
        BlockKeyRef {
            token_ids: &self.token_ids[start..end],
            extra_ids: self.extra_ids.map(|e| &e[start..end]),
            lora_task_id: self.lora_task_id,
            extra_keys: scratch,
            cache_salt: self.cache_salt,
        }
    }
}

/// What admission of one sequence will do in this window, decided without changing anything.
#[derive(Clone, Debug, Default)]
pub struct AdmissionPlan {
    pub steps: Vec<PlannedReuse>,
    /// Reused prompt tokens.
    pub matched_tokens: usize,
    pub num_context_blocks: usize,
    /// Context blocks shared by all beams (the rest are per beam).
    pub num_shared_blocks: usize,
    /// Primary blocks admission takes from the free queue while it runs (allocations, claimed
    /// free blocks, protected copy sources).
    pub primary_blocks_needed: usize,
    /// Blocks allocated through `get_free_block` (misses, per-beam blocks, copy destinations,
    /// onboarding): the request's `alloc_total` delta.
    pub allocations: usize,
    /// Free primary copy sources claimed only while the copy is queued; they return afterwards.
    pub protected_primary: usize,
    /// Free primary blocks an earlier request of the batch only protected (as a copy source)
    /// that this request keeps: they do not return to the free queue.
    pub adopted_protected: usize,
}

impl AdmissionPlan {
    /// Net free primary blocks this request consumes once the batch is admitted.
    pub fn free_blocks_consumed(&self) -> usize {
        self.primary_blocks_needed - self.protected_primary + self.adopted_protected
    }
}

/// What the requests of the admission batch planned so far have claimed in this block (phase
/// 1). Later requests plan against it: a claimed block is in use, a taken-over block is no longer
/// shareable, and nothing is claimed or onboarded twice. Stored densely per block and valid
/// while its epoch is the current batch's (starting a batch clears everything in O(1)).
#[derive(Clone, Copy, Debug, Default)]
struct ClaimUse {
    taken_over: bool,
    onboarded: bool,
    /// Claimed from the primary free queue only to protect a copy source (so far).
    protected_only: bool,
}

/// Outcome of `WindowBlockManager::offload`.
enum Offload {
    /// Moved; the host block (now primary) is returned claimed.
    Done(u32),
    /// Nothing changed.
    Skipped,
    /// The host block was a distant ancestor: the block left the tree and is claimed.
    Detached,
}

/// One request of an admission batch, with its checked plan.
#[derive(Clone, Copy, Debug)]
pub struct AdmitItem<'a> {
    pub id: u64,
    pub src: KeySource<'a>,
    pub input_length: usize,
    pub beam_width: usize,
    pub retention: &'a RetentionConfig,
    pub plan: &'a AdmissionPlan,
}

/// One reused context block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlannedReuse {
    /// Exact match of a full block: shared.
    Share { block: u32 },
    /// Partial match of an unreferenced leaf: it leaves the tree and becomes this sequence's.
    TakeOver { block: u32, tokens: usize },
    /// Partial match of a referenced or inner block: its first `tokens` tokens are copied.
    Copy { source: u32, tokens: usize },
}

/// Per-sequence blocks in this window.
#[derive(Clone, Debug)]
struct SeqBlocks {
    /// Block ids per beam, in token order (front-detached ids stay listed).
    beams: Vec<Vec<u32>>,
    front_removed: usize,
    /// Allocation epoch of each front-detached block when it was detached: if a block has been
    /// allocated again since, its content is someone else's and this sequence must not store.
    detached_epochs: Vec<u32>,
}

/// The block manager of one attention-window size.
pub struct WindowBlockManager {
    cfg: WindowConfig,
    arena: BlockArena,
    queues: FreeQueues,
    tree: ReuseTree,
    engine: Box<dyn CopyEngine>,
    seqs: PremixedMap<u64, SeqBlocks>,
    /// Incremented every time a block is handed out by `get_free_block`.
    alloc_epoch: Vec<u32>,
    /// Batch claims (see `ClaimUse`), valid where `claim_epoch` equals `batch_epoch`.
    claim_use: Vec<ClaimUse>,
    claim_epoch: Vec<u32>,
    batch_epoch: u32,
    pending_copies: Vec<RowCopy>,
    stats: WindowStats,
    scheduling_free: usize,
    mm_scratch: Vec<MmKey>,
    /// Raw events of the running operation; `None` when events are off (costs nothing then).
    events: Option<Vec<WindowEvent>>,
}

impl std::fmt::Debug for WindowBlockManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowBlockManager")
            .field("window_size", &self.cfg.window_size)
            .field("free_primary", &self.queues.num_free(Level::Primary))
            .field("free_secondary", &self.queues.num_free(Level::Secondary))
            .finish()
    }
}

impl WindowBlockManager {
    pub fn new(cfg: WindowConfig, engine: Box<dyn CopyEngine>) -> Self {
        let n = cfg.num_primary + cfg.num_secondary;
        let arena = BlockArena::new(cfg.num_primary, cfg.num_secondary);
        let mut queues = FreeQueues::new(n, cfg.offload_min_priority);
        for b in 0..n as u32 {
            queues.release(b, arena.level(b), false, 0);
        }
        WindowBlockManager {
            tree: ReuseTree::new(n, cfg.tokens_per_block),
            alloc_epoch: vec![0; n],
            claim_use: vec![ClaimUse::default(); n],
            claim_epoch: vec![0; n],
            batch_epoch: 1,
            scheduling_free: cfg.num_primary,
            cfg,
            arena,
            queues,
            engine,
            seqs: PremixedMap::default(),
            pending_copies: Vec::new(),
            stats: WindowStats::default(),
            mm_scratch: Vec::new(),
            events: None,
        }
    }

    /// Starts recording events (see `take_events`).
    pub fn enable_events(&mut self) {
        self.tree.track_hashes();
        self.events.get_or_insert_with(Vec::new);
    }

    /// The events recorded since the last call, in order.
    pub fn take_events(&mut self) -> Vec<WindowEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn record_level_change(&mut self, block: u32, from: Level, to: Level) {
        if let Some(events) = &mut self.events {
            if self.tree.is_in_tree(block) {
                events.push(WindowEvent::Updated {
                    block_hash: self.tree.hash(block),
                    cache_level: Some((from, to)),
                    priority: None,
                });
            }
        }
    }

    fn record_priority_change(&mut self, block: u32, from: u8, to: u8) {
        if let Some(events) = &mut self.events {
            if from != to && self.tree.is_in_tree(block) {
                events.push(WindowEvent::Updated {
                    block_hash: self.tree.hash(block),
                    cache_level: None,
                    priority: Some((from, to)),
                });
            }
        }
    }

    pub fn config(&self) -> &WindowConfig {
        &self.cfg
    }

    pub fn window_size(&self) -> usize {
        self.cfg.window_size
    }

    pub fn stats(&self) -> WindowStats {
        self.stats
    }

    pub fn num_free(&self, level: Level) -> usize {
        self.queues.num_free(level)
    }

    pub fn num_blocks(&self) -> usize {
        self.arena.len()
    }

    pub fn num_in_tree(&self) -> usize {
        self.tree.num_in_tree()
    }

    pub fn arena(&self) -> &BlockArena {
        &self.arena
    }

    pub fn tree(&self) -> &ReuseTree {
        &self.tree
    }

    pub fn queues(&self) -> &FreeQueues {
        &self.queues
    }

    pub fn engine(&self) -> &dyn CopyEngine {
        self.engine.as_ref()
    }

    pub fn engine_mut(&mut self) -> &mut dyn CopyEngine {
        self.engine.as_mut()
    }

    pub fn has_sequence(&self, id: u64) -> bool {
        self.seqs.contains_key(&id)
    }

    /// Block ids of one beam of a sequence (front-detached ids included).
    pub fn block_ids(&self, id: u64, beam: usize) -> Option<&[u32]> {
        self.seqs
            .get(&id)
            .and_then(|s| s.beams.get(beam))
            .map(|v| &v[..])
    }

    pub fn front_blocks_removed(&self, id: u64) -> usize {
        self.seqs.get(&id).map_or(0, |s| s.front_removed)
    }

    /// False once a block this sequence detached (sliding window) was allocated to someone
    /// else: storing the sequence would then insert foreign content under its keys.
    pub fn is_valid_for_store(&self, id: u64) -> bool {
        self.seqs.get(&id).is_some_and(|s| {
            s.detached_epochs
                .iter()
                .zip(&s.beams[0])
                .all(|(&epoch, &b)| self.alloc_epoch[b as usize] == epoch)
        })
    }

    pub fn priority(&self, block: u32) -> u8 {
        self.queues.priority(block)
    }

    fn flush_copies(&mut self) {
        if !self.pending_copies.is_empty() {
            self.engine.submit(&self.pending_copies);
            self.pending_copies.clear();
        }
    }

    fn queue_copy(&mut self, src: u32, dst: u32, num_tokens: usize) {
        self.pending_copies.push(RowCopy {
            src: self.arena.row(src),
            dst: self.arena.row(dst),
            num_tokens: num_tokens as u32,
        });
    }

    fn evict_from_tree(&mut self, block: u32) {
        let stats = &mut self.stats;
        let mut events = self.events.as_mut();
        self.tree.detach_subtree(block, |_, hash| {
            stats.evicted_from_tree += 1;
            if let Some(e) = events.as_mut() {
                e.push(WindowEvent::Removed(hash));
            }
        });
    }

    /// Takes the next block to evict from the primary queue, offloading its content to the host
    /// tier when its priority allows, and claims it with `retention`. Capacity must have been
    /// checked by the caller.
    fn get_free_block(&mut self, retention: BlockRetention, now_ms: u64) -> u32 {
        let (candidate, can_offload) = self
            .queues
            .peek(Level::Primary)
            .expect("capacity is checked before allocation");
        if !self.tree.has_key(candidate) {
            self.stats.alloc_new += 1;
        }
        self.stats.alloc_total += 1;
        // Only cached content is worth a host block: a private block's tokens are unreachable.
        let offloaded = if self.tree.is_in_tree(candidate) && can_offload {
            match self.offload(candidate, now_ms) {
                Offload::Done(host_block) => Some(host_block),
                Offload::Detached => Some(candidate),
                Offload::Skipped => None,
            }
        } else {
            None
        };
        let victim = offloaded.unwrap_or_else(|| {
            self.queues.claim(candidate);
            self.evict_from_tree(candidate);
            candidate
        });
        self.finish_allocation(victim, retention)
    }

    /// Gives a claimed, tree-less block its retention and a new allocation epoch.
    fn finish_allocation(&mut self, victim: u32, retention: BlockRetention) -> u32 {
        self.queues.claim_with_retention(
            victim,
            BlockRetention {
                priority: Some(retention.priority.unwrap_or(DEFAULT_PRIORITY)),
                duration_ms: retention.duration_ms,
            },
        );
        self.bump_epoch(victim);
        victim
    }

    /// Marks a block's content as replaced: a sequence that detached it may no longer store it.
    fn bump_epoch(&mut self, block: u32) {
        self.alloc_epoch[block as usize] = self.alloc_epoch[block as usize].wrapping_add(1);
    }

    /// Moves the content of the free primary `block` into the next free host block. Both are
    /// claimed before their rows are swapped (seed 004); the host block's cached content leaves
    /// the tree; `block` keeps its tree position, priority and expiry and is queued at the host
    /// level; the host block, now owning a primary row, is returned claimed. Skipped (nothing
    /// changed) when offloading is off, no host block is free, or the host block is a near
    /// ancestor of `block` (evicting it would detach `block`). A distant ancestor is only found
    /// after its eviction: then `block` has left the tree with it and is returned claimed.
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
    fn onboard(&mut self, block: u32, now_ms: u64) {
        if !self.cfg.onboard_blocks || self.arena.is_primary(block) {
            return;
        }
        let fresh = self.get_free_block(BlockRetention::default(), now_ms);
        self.queue_copy(block, fresh, 0);
        self.arena.swap_rows(block, fresh);
        self.queues
            .release(fresh, self.arena.level(fresh), false, now_ms);
        self.stats.onboarded += 1;
        self.record_level_change(block, Level::Secondary, Level::Primary);
    }

    /// Offloads an unreferenced primary block to the host tier (TensorRT-LLM `offloadBlock`).
    /// Returns false when it was not moved: no free host block, offloading off, or the host
    /// block is its ancestor.
    pub fn offload_block(&mut self, block: u32, now_ms: u64) -> KvResult<bool> {
        if block as usize >= self.arena.len() {
            return Err(KvError::InvalidArgument(format!(
                "block id {block} out of range"
            )));
        }
        if self.arena.ref_count(block) > 0 {
            return Err(KvError::InvalidArgument(format!(
                "block {block} is referenced; only free blocks can be offloaded"
            )));
        }
        if !self.arena.is_primary(block) {
            return Ok(false);
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

    fn is_unused(&self, block: u32) -> bool {
        self.arena.ref_count(block) == 0
    }

    /// Number of context blocks and of those shared among beams.
    pub fn context_blocks(&self, input_length: usize, beam_width: usize) -> (usize, usize) {
        let eff = input_length.min(self.cfg.max_token_num);
        let n = eff.div_ceil(self.cfg.tokens_per_block);
        let shared = if self.cfg.enable_reuse {
            if beam_width > 1 {
                n.saturating_sub(1)
            } else {
                n
            }
        } else if beam_width == 1 || eff % self.cfg.tokens_per_block == 0 {
            n
        } else {
            n.saturating_sub(1)
        };
        (n, shared)
    }

    /// Plans the admission of a sequence without changing anything: walks the tree for the
    /// reusable prefix (at most `cap_tokens` tokens, never the last prompt token) and counts
    /// the primary blocks it will take.
    pub fn plan_admission(
        &mut self,
        src: &KeySource<'_>,
        input_length: usize,
        beam_width: usize,
        cap_tokens: usize,
    ) -> AdmissionPlan {
        let tpb = self.cfg.tokens_per_block;
        let (num_context, num_shared) = self.context_blocks(input_length, beam_width);
        let mut plan = AdmissionPlan {
            num_context_blocks: num_context,
            num_shared_blocks: num_shared,
            ..AdmissionPlan::default()
        };
        let mut claimed_free_primary = 0;
        let mut new_blocks = 0;
        let unused = |w: &Self, b: u32| w.is_unused(b) && w.claim_of(b).is_none();
        if self.cfg.enable_reuse {
            let reusable = input_length - 1;
            let mut scratch = std::mem::take(&mut self.mm_scratch);
            let mut parent = self.tree.root();
            for bi in 0..num_shared {
                let start = bi * tpb;
                let end = ((bi + 1) * tpb).min(reusable);
                if start >= end {
                    break;
                }
                let key = src.key(start, end, &mut scratch);
                let lookup = lookup_hash(&key);
                let Some(m) = self.tree.find_match(
                    parent,
                    &key,
                    lookup,
                    self.cfg.enable_partial_reuse,
                    self.cfg.copy_on_partial_reuse,
                    |b| unused(self, b),
                ) else {
                    break;
                };
                let room = cap_tokens.saturating_sub(plan.matched_tokens);
                if room == 0 {
                    break;
                }
                let taken_over = self.claim_of(m.block).is_some_and(|c| c.taken_over);
                let step = if !m.partial && m.num_tokens <= room && !taken_over {
                    PlannedReuse::Share { block: m.block }
                } else {
                    let tokens = m.num_tokens.min(room);
                    let capped = tokens < m.num_tokens;
                    if capped && !self.cfg.enable_partial_reuse {
                        break;
                    }
                    if !capped && unused(self, m.block) && self.tree.is_leaf(m.block) {
                        PlannedReuse::TakeOver {
                            block: m.block,
                            tokens,
                        }
                    } else {
                        PlannedReuse::Copy {
                            source: m.block,
                            tokens,
                        }
                    }
                };
                let (block, tokens) = match step {
                    PlannedReuse::Share { block } => (block, m.num_tokens),
                    PlannedReuse::TakeOver { block, tokens } => (block, tokens),
                    PlannedReuse::Copy { source, tokens } => (source, tokens),
                };
                let earlier = self.claim_of(block);
                let is_copy = matches!(step, PlannedReuse::Copy { .. });
                if earlier.is_none() && self.queues.queued_level(block) == Some(Level::Primary) {
                    claimed_free_primary += 1;
                    if is_copy {
                        plan.protected_primary += 1;
                    }
                }
                if !is_copy && earlier.is_some_and(|c| c.protected_only) {
                    plan.adopted_protected += 1;
                }
                let onboard_needed = !is_copy
                    && self.cfg.onboard_blocks
                    && !self.arena.is_primary(block)
                    && !earlier.is_some_and(|c| c.onboarded);
                if onboard_needed || is_copy {
                    new_blocks += 1;
                }
                plan.matched_tokens += tokens;
                plan.steps.push(step);
                if !matches!(step, PlannedReuse::Share { .. }) {
                    break;
                }
                parent = block;
            }
            self.mm_scratch = scratch;
        }
        new_blocks += num_shared - plan.steps.len();
        new_blocks += (num_context - num_shared) * beam_width;
        plan.allocations = new_blocks;
        plan.primary_blocks_needed = new_blocks + claimed_free_primary;
        plan
    }

    /// Starts planning a new batch: forgets the previous batch's claims.
    pub fn begin_batch(&mut self) {
        self.batch_epoch = self.batch_epoch.wrapping_add(1);
        if self.batch_epoch == 0 {
            self.claim_epoch.fill(0);
            self.batch_epoch = 1;
        }
    }

    fn claim_of(&self, block: u32) -> Option<ClaimUse> {
        (self.claim_epoch[block as usize] == self.batch_epoch)
            .then(|| self.claim_use[block as usize])
    }

    /// Records a planned request's claims so that later requests of the batch plan around them.
    pub fn record_claims(&mut self, plan: &AdmissionPlan) {
        for step in &plan.steps {
            let (block, taken_over, onboarded, is_copy) = match *step {
                PlannedReuse::Share { block } => (block, false, self.cfg.onboard_blocks, false),
                PlannedReuse::TakeOver { block, .. } => {
                    (block, true, self.cfg.onboard_blocks, false)
                }
                PlannedReuse::Copy { source, .. } => (source, false, false, true),
            };
            let i = block as usize;
            let free_primary = self.queues.queued_level(block) == Some(Level::Primary);
            if self.claim_epoch[i] != self.batch_epoch {
                self.claim_epoch[i] = self.batch_epoch;
                self.claim_use[i] = ClaimUse {
                    taken_over,
                    onboarded,
                    protected_only: is_copy && free_primary,
                };
            } else {
                let c = &mut self.claim_use[i];
                c.taken_over |= taken_over;
                c.onboarded |= onboarded;
                if !is_copy {
                    c.protected_only = false;
                }
            }
        }
    }

    /// Fails with `OutOfBlocks` when one plan needs more primary blocks than are free.
    #[cfg(test)]
    fn check_plan(&self, plan: &AdmissionPlan) -> KvResult<()> {
        let available = self.queues.num_free(Level::Primary);
        if plan.primary_blocks_needed > available {
            return Err(KvError::OutOfBlocks {
                window_size: self.cfg.window_size,
                needed: plan.primary_blocks_needed,
                available,
            });
        }
        Ok(())
    }

    /// Executes the checked plans of an admission batch (every plan made against the claims of
    /// the requests before it). Phase 1 claims every reused block and copy source of every
    /// request, so no allocation of phase 2 can evict a block the batch reuses; phase 2 onboards,
    /// copies and allocates request by request; the copies of the batch are submitted together.
    /// Returns each request's `alloc_new` delta (blocks that never held tokens).
    pub fn admit_batch(&mut self, items: &[AdmitItem<'_>], now_ms: u64) -> Vec<u64> {
        let tpb = self.cfg.tokens_per_block;
        let mut protected = Vec::new();
        for item in items {
            debug_assert!(!self.seqs.contains_key(&item.id));
            for (bi, step) in item.plan.steps.iter().enumerate() {
                let r = item.retention.block_retention(bi, tpb);
                match *step {
                    PlannedReuse::Share { block } => self.claim_for_reuse(block, r),
                    PlannedReuse::TakeOver { block, .. } => {
                        self.evict_from_tree(block);
                        self.claim_for_reuse(block, r);
                        // This sequence will write the block: one that detached it may no
                        // longer store it.
                        self.alloc_epoch[block as usize] =
                            self.alloc_epoch[block as usize].wrapping_add(1);
                    }
                    PlannedReuse::Copy { source, .. } => {
                        if self.queues.claim(source) {
                            protected.push(source);
                        }
                    }
                }
            }
        }
        let mut scratch = std::mem::take(&mut self.mm_scratch);
        let mut alloc_new = Vec::with_capacity(items.len());
        for item in items {
            let before = self.stats;
            self.allocate_planned(item, &mut scratch, now_ms);
            debug_assert_eq!(
                (self.stats.alloc_total - before.alloc_total) as usize,
                item.plan.allocations,
                "planned allocations are exact"
            );
            alloc_new.push(self.stats.alloc_new - before.alloc_new);
        }
        self.mm_scratch = scratch;
        for source in protected {
            if self.arena.ref_count(source) == 0 {
                self.queues
                    .release(source, self.arena.level(source), false, now_ms);
            }
        }
        self.flush_copies();
        alloc_new
    }

    /// Phase 2 of one request: onboards its reused host blocks, copies partial matches,
    /// allocates misses and per-beam blocks, and records the sequence.
    fn allocate_planned(&mut self, item: &AdmitItem<'_>, scratch: &mut Vec<MmKey>, now_ms: u64) {
        let AdmitItem {
            id,
            src,
            input_length,
            beam_width,
            retention,
            plan,
        } = *item;
        let tpb = self.cfg.tokens_per_block;
        let reusable = input_length - 1;
        let mut beams = vec![Vec::with_capacity(plan.num_context_blocks + 1); beam_width];
        let bw = beam_width as u32;
        for (bi, step) in plan.steps.iter().enumerate() {
            let r = retention.block_retention(bi, tpb);
            let block = match *step {
                PlannedReuse::Share { block } => {
                    self.onboard(block, now_ms);
                    block
                }
                PlannedReuse::TakeOver { block, .. } => {
                    self.onboard(block, now_ms);
                    let end = ((bi + 1) * tpb).min(reusable);
                    let key = src.key(bi * tpb, end, scratch);
                    self.tree.set_key(block, &key);
                    block
                }
                PlannedReuse::Copy { source, tokens } => {
                    let fresh = self.get_free_block(r, now_ms);
                    self.queue_copy(source, fresh, tokens);
                    let end = ((bi + 1) * tpb).min(reusable);
                    let key = src.key(bi * tpb, end, scratch);
                    self.tree.set_key(fresh, &key);
                    fresh
                }
            };
            self.arena.add_refs(block, bw);
            for beam in &mut beams {
                beam.push(block);
            }
            self.stats.reused += 1;
        }
        for bi in plan.steps.len()..plan.num_shared_blocks {
            let r = retention.block_retention(bi, tpb);
            let block = self.get_free_block(r, now_ms);
            self.set_context_key(block, &src, bi, reusable, scratch);
            self.arena.add_refs(block, bw);
            for beam in &mut beams {
                beam.push(block);
            }
            self.stats.missed += 1;
        }
        for bi in plan.num_shared_blocks..plan.num_context_blocks {
            let r = retention.block_retention(bi, tpb);
            for beam in &mut beams {
                let block = self.get_free_block(r, now_ms);
                self.set_context_key(block, &src, bi, reusable, scratch);
                self.arena.add_refs(block, 1);
                beam.push(block);
            }
            self.stats.missed += 1;
        }
        self.seqs.insert(
            id,
            SeqBlocks {
                beams,
                front_removed: 0,
                detached_epochs: Vec::new(),
            },
        );
    }

    /// Gives a freshly allocated context block its key (when reuse is on).
    fn set_context_key(
        &mut self,
        block: u32,
        src: &KeySource<'_>,
        bi: usize,
        reusable: usize,
        scratch: &mut Vec<MmKey>,
    ) {
        let tpb = self.cfg.tokens_per_block;
        let start = bi * tpb;
        let end = ((bi + 1) * tpb).min(reusable);
        if !self.cfg.enable_reuse || start >= end {
            return;
        }
        let key = src.key(start, end, scratch);
        self.tree.set_key(block, &key);
    }

    fn claim_for_reuse(&mut self, block: u32, r: BlockRetention) {
        let old = self.queues.priority(block);
        self.queues.claim_with_retention(block, r);
        if let Some(new) = r.priority {
            self.record_priority_change(block, old, new);
        }
    }

    /// Blocks `add_token` needs in this window when the sequence grows to `num_tokens`, and the
    /// blocks it frees first by detaching out-of-window front blocks.
    fn token_needs(&self, seq: &SeqBlocks, num_tokens: usize, swa: bool) -> (usize, usize, usize) {
        let tpb = self.cfg.tokens_per_block;
        let mut detach = 0;
        let mut freed = 0;
        if swa && seq.beams.len() == 1 {
            let mut removed = seq.front_removed;
            while num_tokens - removed * tpb >= self.cfg.window_size + tpb {
                let b = seq.beams[0][removed];
                if self.arena.ref_count(b) == 1 {
                    freed += 1;
                }
                removed += 1;
                detach += 1;
            }
        }
        let new_blocks = if (num_tokens - 1) % tpb == 0 {
            seq.beams.len()
        } else {
            0
        };
        (detach, freed, new_blocks)
    }

    /// Checks that growing sequence `id` to `num_tokens` tokens can be served.
    pub fn check_add_token(&self, id: u64, num_tokens: usize, swa: bool) -> KvResult<()> {
        let seq = &self.seqs[&id];
        let (_, freed, needed) = self.token_needs(seq, num_tokens, swa);
        let available = self.queues.num_free(Level::Primary) + freed;
        if needed > available {
            return Err(KvError::OutOfBlocks {
                window_size: self.cfg.window_size,
                needed,
                available,
            });
        }
        Ok(())
    }

    /// Grows sequence `id` to `num_tokens` tokens: detaches out-of-window blocks (SWA), then
    /// allocates a new last block (per beam with beam search) when a block boundary is crossed.
    pub fn add_token(
        &mut self,
        id: u64,
        num_tokens: usize,
        swa: bool,
        decode: BlockRetention,
        now_ms: u64,
    ) {
        let (detach, _, needed) = self.token_needs(&self.seqs[&id], num_tokens, swa);
        for _ in 0..detach {
            let seq = self.seqs.get_mut(&id).expect("sequence exists");
            let b = seq.beams[0][seq.front_removed];
            seq.front_removed += 1;
            seq.detached_epochs.push(self.alloc_epoch[b as usize]);
            if self.arena.remove_ref(b) == 0 {
                self.queues.release(b, self.arena.level(b), false, now_ms);
            }
        }
        if needed > 0 {
            let beam_width = self.seqs[&id].beams.len();
            if beam_width == 1 {
                let b = self.get_free_block(decode, now_ms);
                self.arena.add_refs(b, 1);
                self.seqs.get_mut(&id).expect("exists").beams[0].push(b);
            } else {
                for beam in 0..beam_width {
                    let b = self.get_free_block(decode, now_ms);
                    self.arena.add_refs(b, 1);
                    self.seqs.get_mut(&id).expect("exists").beams[beam].push(b);
                }
            }
            self.flush_copies();
        }
    }

    /// Number of listed blocks (front-detached included) a sequence of `num_tokens` needs.
    pub fn blocks_for_tokens(&self, num_tokens: usize) -> usize {
        num_tokens
            .min(self.cfg.max_token_num)
            .div_ceil(self.cfg.tokens_per_block)
    }

    /// Whether shrinking sequence `id` to `num_tokens` would release a front-detached block.
    pub fn can_shrink_to(&self, id: u64, num_tokens: usize) -> bool {
        let seq = &self.seqs[&id];
        self.blocks_for_tokens(num_tokens) > seq.front_removed
    }

    /// The block a sequence shrunk to `num_tokens` tokens will write again from position
    /// `num_tokens` on, with the tokens it keeps — when that block is cached or shared, so its
    /// content must not change under the tree or another sequence.
    fn rewritten_shared_block(&self, id: u64, num_tokens: usize) -> Option<(usize, u32, usize)> {
        let tpb = self.cfg.tokens_per_block;
        let kept = num_tokens % tpb;
        if kept == 0 {
            return None;
        }
        let index = num_tokens / tpb;
        let block = *self.seqs[&id].beams[0].get(index)?;
        (self.tree.is_in_tree(block) || self.arena.ref_count(block) > 1)
            .then_some((index, block, kept))
    }

    /// Checks that shrinking sequence `id` to `num_tokens` tokens can be served: a shared block
    /// that will be written again needs a fresh block for its copy.
    pub fn check_remove_tokens(&self, id: u64, num_tokens: usize) -> KvResult<()> {
        let Some((_, block, _)) = self.rewritten_shared_block(id, num_tokens) else {
            return Ok(());
        };
        if self.arena.ref_count(block) == 1 {
            return Ok(());
        }
        let seq = &self.seqs[&id];
        let keep = self.blocks_for_tokens(num_tokens);
        let freed = seq.beams[0][keep..]
            .iter()
            .filter(|&&b| self.arena.ref_count(b) == 1)
            .count();
        let available = self.queues.num_free(Level::Primary) + freed;
        if available == 0 {
            return Err(KvError::OutOfBlocks {
                window_size: self.cfg.window_size,
                needed: 1,
                available,
            });
        }
        Ok(())
    }

    /// Shrinks sequence `id` to `num_tokens` tokens (beam width 1), releasing surplus last blocks
    /// to the front of their queue (they are the next to evict). The new last block will be
    /// written again past the kept tokens: if other sequences share it, it is copied into a fresh
    /// block first (copy on write); if only the reuse tree holds it, it leaves the tree.
    pub fn remove_tokens(
        &mut self,
        id: u64,
        num_tokens: usize,
        decode: BlockRetention,
        now_ms: u64,
    ) {
        let keep = self.blocks_for_tokens(num_tokens);
        let seq = self.seqs.get_mut(&id).expect("sequence exists");
        let mut released = Vec::new();
        for beam in seq.beams.iter_mut() {
            while beam.len() > keep {
                released.push(beam.pop().expect("non-empty"));
            }
        }
        for b in released {
            if self.arena.remove_ref(b) == 0 {
                self.queues.release(b, self.arena.level(b), true, now_ms);
            }
        }
        if let Some((index, block, kept)) = self.rewritten_shared_block(id, num_tokens) {
            if self.arena.ref_count(block) > 1 {
                let fresh = self.get_free_block(decode, now_ms);
                self.queue_copy(block, fresh, kept);
                self.arena.remove_ref(block);
                self.arena.add_refs(fresh, 1);
                self.seqs.get_mut(&id).expect("exists").beams[0][index] = fresh;
                self.flush_copies();
            } else {
                self.evict_from_tree(block);
            }
        }
    }

    /// Stores the first `num_tokens` tokens of sequence `id` (beam 0 blocks) in the reuse tree.
    /// Only full blocks unless `allow_partial`. Existing equal blocks are descended into and the
    /// sequence's own copies stay private; with `pin`, every block on the path gets a pin.
    /// Returns the ids of the newly stored blocks and of the pinned blocks.
    pub fn store_blocks(
        &mut self,
        id: u64,
        src: &KeySource<'_>,
        num_tokens: usize,
        allow_partial: bool,
        pin: bool,
    ) -> (Vec<u32>, Vec<u32>) {
        let tpb = self.cfg.tokens_per_block;
        let mut stored = Vec::new();
        let mut pinned = Vec::new();
        let Some(seq) = self.seqs.get_mut(&id) else {
            return (stored, pinned);
        };
        // Taken out for the walk (no copy); put back below.
        let ids = std::mem::take(&mut seq.beams[0]);
        let num_blocks = if allow_partial {
            num_tokens.div_ceil(tpb)
        } else {
            num_tokens / tpb
        }
        .min(ids.len());
        // Resume after the deepest block of ours already in the tree with a full-length key:
        // the path to it spells our prefix (no need to walk it again, e.g. for every decode
        // block). Pinning needs the whole path, so it walks from the root.
        let mut first = 0;
        let mut parent = self.tree.root();
        if !pin {
            if let Some(i) = (0..num_blocks).rev().find(|&i| {
                let b = ids[i];
                self.tree.is_in_tree(b)
                    && self.tree.key(b).len() == ((i + 1) * tpb).min(num_tokens) - i * tpb
            }) {
                first = i + 1;
                parent = ids[i];
            }
        }
        let mut scratch = std::mem::take(&mut self.mm_scratch);
        let mut matching = true;
        for (i, &block) in ids.iter().enumerate().take(num_blocks).skip(first) {
            let start = i * tpb;
            let end = ((i + 1) * tpb).min(num_tokens);
            let key = src.key(start, end, &mut scratch);
            let lookup = lookup_hash(&key);
            let existing = if matching {
                let found = self.tree.find_exact(parent, &key, lookup);
                matching = found.is_some();
                found
            } else {
                None
            };
            let node = match existing {
                Some(n) => n,
                None => {
                    if self.tree.is_in_tree(block) || !self.arena.is_primary(block) {
                        break;
                    }
                    self.tree.set_key(block, &key);
                    if !self.tree.insert_with_lookup(parent, block, lookup) {
                        break;
                    }
                    stored.push(block);
                    block
                }
            };
            if pin {
                self.arena.pin(node);
                self.queues.claim(node);
                pinned.push(node);
            }
            parent = node;
        }
        self.mm_scratch = scratch;
        self.seqs.get_mut(&id).expect("exists").beams[0] = ids;
        self.record_stored(&stored);
        (stored, pinned)
    }

    fn record_stored(&mut self, stored: &[u32]) {
        let (Some(events), Some(&first)) = (&mut self.events, stored.first()) else {
            return;
        };
        let parent = self.tree.parent(first).expect("just stored");
        let parent_hash = (parent != self.tree.root()).then(|| self.tree.hash(parent));
        let blocks = stored
            .iter()
            .map(|&b| {
                let key = self.tree.key(b);
                StoredBlock {
                    hash: self.tree.hash(b),
                    token_ids: key.token_ids.to_vec(),
                    extra_ids: key.extra_ids.map(|e| e.to_vec()),
                    lora_task_id: key.lora_task_id,
                    cache_level: self.arena.level(b),
                    priority: self.queues.priority(b),
                    mm_keys: key.extra_keys.to_vec(),
                    cache_salt: key.cache_salt,
                }
            })
            .collect();
        events.push(WindowEvent::Stored {
            parent_hash,
            blocks,
        });
    }

    /// Releases every block of sequence `id`, last to first, and forgets the sequence.
    pub fn release_sequence(&mut self, id: u64, now_ms: u64) {
        let Some(seq) = self.seqs.remove(&id) else {
            return;
        };
        let len = seq.beams[0].len();
        for idx in (seq.front_removed..len).rev() {
            for beam in seq.beams.iter().rev() {
                let b = beam[idx];
                if self.arena.remove_ref(b) == 0 {
                    self.queues.release(b, self.arena.level(b), false, now_ms);
                }
            }
        }
    }

    /// Pins every listed (not detached) block of sequence `id`.
    pub fn pin_sequence(&mut self, id: u64) {
        let Some(seq) = self.seqs.get(&id) else {
            return;
        };
        let mut blocks = Vec::new();
        for beam in &seq.beams {
            blocks.extend_from_slice(&beam[seq.front_removed..]);
        }
        for b in blocks {
            self.arena.pin(b);
        }
    }

    /// Checks that every id is a pinned block.
    pub fn check_unpin(&self, ids: &[u32]) -> KvResult<()> {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &b in ids {
            if b as usize >= self.arena.len() {
                return Err(KvError::InvalidArgument(format!(
                    "block id {b} out of range"
                )));
            }
            let c = counts.entry(b).or_default();
            *c += 1;
            if *c > self.arena.pins(b) {
                return Err(KvError::InvalidArgument(format!("block {b} is not pinned")));
            }
        }
        Ok(())
    }

    /// Drops one pin of each block, releasing blocks whose last reference it was.
    pub fn unpin(&mut self, ids: &[u32], now_ms: u64) {
        for &b in ids {
            if self.arena.unpin(b) == 0 {
                self.queues.release(b, self.arena.level(b), false, now_ms);
            }
        }
    }

    /// Number of consecutive full prompt blocks found in the tree from the root (optionally only
    /// those currently referenced).
    pub fn count_reusable_blocks(
        &mut self,
        src: &KeySource<'_>,
        input_length: usize,
        only_allocated: bool,
    ) -> usize {
        if !self.cfg.enable_reuse || input_length == 0 {
            return 0;
        }
        let tpb = self.cfg.tokens_per_block;
        let full = (input_length - 1) / tpb;
        let mut scratch = std::mem::take(&mut self.mm_scratch);
        let mut parent = self.tree.root();
        let mut count = 0;
        for bi in 0..full {
            let key = src.key(bi * tpb, (bi + 1) * tpb, &mut scratch);
            let Some(b) = self.tree.find_exact(parent, &key, lookup_hash(&key)) else {
                break;
            };
            if !only_allocated || self.arena.ref_count(b) > 0 {
                count += 1;
            }
            parent = b;
        }
        self.mm_scratch = scratch;
        count
    }

    /// Expires timed retentions and waits for outstanding copies.
    pub fn refresh(&mut self, now_ms: u64) {
        let mut decayed = Vec::new();
        self.queues
            .refresh(now_ms, |block, old| decayed.push((block, old)));
        for (block, old) in decayed {
            self.record_priority_change(block, old, DEFAULT_PRIORITY);
        }
        self.flush_copies();
        self.engine.sync();
    }

    pub fn start_scheduling(&mut self) {
        self.arena.start_scheduling();
        self.scheduling_free = self.queues.num_free(Level::Primary);
    }

    pub fn scheduling_remove_sequence(&mut self, id: u64) {
        let Some(seq) = self.seqs.get(&id) else {
            return;
        };
        let mut freed = 0;
        for beam in &seq.beams {
            for &b in &beam[seq.front_removed..] {
                if self.arena.scheduling_remove_ref(b) {
                    freed += 1;
                }
            }
        }
        self.scheduling_free += freed;
    }

    pub fn scheduling_free_blocks(&self) -> usize {
        self.scheduling_free
    }

    /// Checks the invariants of reference §10 for this window. `tokens_of` gives each
    /// sequence's (token count, input length).
    pub fn verify(
        &self,
        tokens_of: impl Fn(u64) -> Option<(usize, usize)>,
        max_sequence_length: usize,
    ) -> Result<(), String> {
        let w = self.cfg.window_size;
        self.queues
            .verify()
            .map_err(|e| format!("window {w}: {e}"))?;
        self.arena
            .verify_rows()
            .map_err(|e| format!("window {w}: {e}"))?;
        self.tree.verify().map_err(|e| format!("window {w}: {e}"))?;
        let n = self.arena.len();
        let mut expected_refs = vec![0u32; n];
        let swa = self.cfg.is_swa(max_sequence_length);
        let tpb = self.cfg.tokens_per_block;
        for (&id, seq) in &self.seqs {
            let Some((num_tokens, input_length)) = tokens_of(id) else {
                return Err(format!("window {w}: blocks held for unknown sequence {id}"));
            };
            for beam in &seq.beams {
                if beam.len() != self.blocks_for_tokens(num_tokens) {
                    return Err(format!(
                        "window {w}: sequence {id} lists {} blocks for {num_tokens} tokens",
                        beam.len()
                    ));
                }
                for &b in &beam[seq.front_removed..] {
                    expected_refs[b as usize] += 1;
                    if !self.arena.is_primary(b) {
                        return Err(format!(
                            "window {w}: sequence {id} references non-primary block {b}"
                        ));
                    }
                }
            }
            // The prompt is allocated whole; detaching starts with the first generated token.
            let generating = num_tokens > input_length;
            if swa
                && generating
                && seq.beams.len() == 1
                && num_tokens - seq.front_removed * tpb >= w + tpb
            {
                return Err(format!(
                    "window {w}: sequence {id} holds blocks outside its window"
                ));
            }
        }
        for b in 0..n as u32 {
            let refs = self.arena.ref_count(b);
            let want = expected_refs[b as usize] + self.arena.pins(b);
            if refs != want {
                return Err(format!(
                    "window {w}: block {b} has {refs} references, sequences and pins account for {want}"
                ));
            }
            match self.queues.queued_level(b) {
                Some(level) if refs > 0 => {
                    return Err(format!(
                        "window {w}: block {b} is queued at {level:?} with {refs} references"
                    ));
                }
                Some(level) if level != self.arena.level(b) => {
                    return Err(format!(
                        "window {w}: block {b} is queued at {level:?} but its row is {:?}",
                        self.arena.level(b)
                    ));
                }
                None if refs == 0 => {
                    return Err(format!(
                        "window {w}: block {b} is neither referenced nor free"
                    ));
                }
                _ => {}
            }
        }
        if self.queues.num_free(Level::Primary) > self.cfg.num_primary
            || self.queues.num_free(Level::Secondary) > self.cfg.num_secondary
        {
            return Err(format!("window {w}: more free blocks than blocks"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::NullEngine;

    const TPB: usize = 4;

    fn window(primary: usize, secondary: usize, window_size: usize) -> WindowBlockManager {
        let cfg = WindowConfig {
            window_size,
            num_primary: primary,
            num_secondary: secondary,
            tokens_per_block: TPB,
            max_token_num: 64.max(window_size),
            max_blocks_per_seq: 16,
            enable_reuse: true,
            enable_partial_reuse: true,
            copy_on_partial_reuse: true,
            onboard_blocks: true,
            offload_min_priority: 30,
            geometry: PoolGeometry {
                num_layers: 1,
                kv_factor: 2,
                num_kv_heads: 1,
                size_per_head: 1,
                tokens_per_block: TPB,
                bytes_per_element: 1,
            },
        };
        WindowBlockManager::new(cfg, Box::new(NullEngine::default()))
    }

    fn src(tokens: &[i32]) -> KeySource<'_> {
        KeySource {
            token_ids: tokens,
            extra_ids: None,
            lora_task_id: None,
            cache_salt: None,
            mm_items: &[],
        }
    }

    fn admit(w: &mut WindowBlockManager, id: u64, tokens: &[i32]) -> AdmissionPlan {
        let s = src(tokens);
        let plan = w.plan_admission(&s, tokens.len(), 1, usize::MAX);
        w.check_plan(&plan).unwrap();
        let retention = RetentionConfig::default();
        let item = AdmitItem {
            id,
            src: s,
            input_length: tokens.len(),
            beam_width: 1,
            retention: &retention,
            plan: &plan,
        };
        w.admit_batch(&[item], 0);
        plan
    }

    fn store_and_release(w: &mut WindowBlockManager, id: u64, tokens: &[i32]) {
        w.store_blocks(id, &src(tokens), tokens.len() - 1, true, false);
        w.release_sequence(id, 0);
    }

    #[test]
    fn plan_counts_primary_blocks_taken() {
        let mut w = window(8, 0, 64);
        let prompt: Vec<i32> = (0..9).collect();
        let plan = admit(&mut w, 1, &prompt);
        assert_eq!(plan.primary_blocks_needed, 3, "3 misses");
        // Reusing blocks held by a running sequence takes nothing from the free queue.
        let plan = w.plan_admission(&src(&prompt), 9, 1, usize::MAX);
        assert_eq!(plan.matched_tokens, 0, "nothing stored yet");
        store_and_release(&mut w, 1, &prompt);
        admit(&mut w, 2, &prompt);
        let plan = w.plan_admission(&src(&prompt), 9, 1, usize::MAX);
        assert_eq!(plan.matched_tokens, 8);
        assert_eq!(
            plan.primary_blocks_needed, 1,
            "two shared in-use blocks + one miss"
        );
        w.release_sequence(2, 0);
        let plan = w.plan_admission(&src(&prompt), 9, 1, usize::MAX);
        assert_eq!(
            plan.primary_blocks_needed, 3,
            "free cached blocks are claimed from the queue"
        );
    }

    #[test]
    fn copy_of_a_free_inner_block_protects_the_source() {
        let mut w = window(8, 0, 64);
        let long: Vec<i32> = (0..13).collect();
        admit(&mut w, 1, &long);
        store_and_release(&mut w, 1, &long);
        // Diverges inside the second block, which is an inner node: copy, not take over.
        let mut other: Vec<i32> = (0..6).collect();
        other.extend([90, 91, 92]);
        let plan = w.plan_admission(&src(&other), other.len(), 1, usize::MAX);
        assert_eq!(
            plan.steps,
            vec![
                PlannedReuse::Share { block: 0 },
                PlannedReuse::Copy {
                    source: 1,
                    tokens: 2
                }
            ]
        );
        // share (claim 1) + copy source protection (1) + copy destination (1) + one miss.
        assert_eq!(plan.primary_blocks_needed, 4);
    }

    #[test]
    fn cap_turns_a_full_match_into_a_partial_copy() {
        let mut w = window(8, 0, 64);
        let prompt: Vec<i32> = (0..9).collect();
        admit(&mut w, 1, &prompt);
        store_and_release(&mut w, 1, &prompt);
        let plan = w.plan_admission(&src(&prompt), 9, 1, 6);
        assert_eq!(plan.matched_tokens, 6);
        assert!(matches!(
            plan.steps[1],
            PlannedReuse::Copy { tokens: 2, .. }
        ));
    }

    #[test]
    fn beams_share_all_but_the_last_context_block() {
        let w = window(8, 0, 64);
        assert_eq!(w.context_blocks(9, 1), (3, 3));
        assert_eq!(w.context_blocks(9, 4), (3, 2));
        assert_eq!(w.context_blocks(8, 4), (2, 1));
    }

    #[test]
    fn sliding_window_detaches_front_blocks_and_reallocation_invalidates_store() {
        let mut w = window(4, 0, 4);
        let prompt: Vec<i32> = (0..4).collect();
        admit(&mut w, 1, &prompt);
        // 4 tokens + 4 generated: at 8 tokens the first block (tokens 0..4) left the window.
        for n in 5..=8 {
            w.add_token(1, n, true, BlockRetention::default(), 0);
        }
        assert_eq!(w.front_blocks_removed(1), 1);
        assert!(w.is_valid_for_store(1));
        let detached = w.block_ids(1, 0).unwrap()[0];
        assert!(w.queues().is_queued(detached));
        // Another sequence takes every free block, including the detached one.
        let other: Vec<i32> = (50..59).collect();
        admit(&mut w, 2, &other);
        assert_eq!(w.num_free(Level::Primary), 0);
        assert!(
            !w.is_valid_for_store(1),
            "its detached block now holds someone else's tokens"
        );
    }

    #[test]
    fn offload_moves_only_cached_blocks() {
        let mut w = window(4, 4, 64);
        let cached: Vec<i32> = (0..5).collect();
        admit(&mut w, 1, &cached);
        store_and_release(&mut w, 1, &cached);
        // Released without storing: keyed blocks that nobody can find again.
        let private: Vec<i32> = (20..29).collect();
        admit(&mut w, 2, &private);
        w.release_sequence(2, 0);
        let b: Vec<i32> = (40..56).collect();
        admit(&mut w, 3, &b);
        assert_eq!(
            w.stats().offloaded,
            1,
            "only the one cached block went to the host"
        );
        assert_eq!(w.num_free(Level::Secondary), 4);
        let plan = w.plan_admission(&src(&cached), 5, 1, usize::MAX);
        assert_eq!(
            plan.matched_tokens, 4,
            "the cached block is still reusable from the host"
        );
    }
}
