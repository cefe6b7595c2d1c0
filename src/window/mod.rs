//! `WindowBlockManager`: the blocks of one attention-window size. Allocation through
//! `get_free_block` (with offload-on-evict), admission (a read-only planning walk, then claims,
//! then onboarding, copies and allocation), store for reuse, release, sliding-window detach and
//! onboard/offload.
//!
//! Every mutating entry point checks capacity before it changes anything, so a failure leaves
//! the window exactly as it was.
//!
//! This file holds the window's state, construction, event recording and accessors; each
//! operation lives in its own file: `alloc` (free blocks, offload, onboard, copies), `plan`
//! (admission phase 1, read-only), `admit` (admission phase 2), `tokens` (add/remove tokens,
//! sliding-window detach), `store` (reuse-tree insertion and lookup), `release` (release, pins,
//! retention refresh), `scheduling` (scheduling simulation) and `verify` (invariants).

mod admit;
mod alloc;
mod disk;
mod faults;
mod lifecycle;
mod lookup;
mod lower;
mod lower_read;
mod lower_write;
mod plan;
mod recurrent;
mod release;
mod remote;
mod scheduling;
mod store;
#[cfg(test)]
mod tests;
mod tokens;
mod verify;

pub use lookup::PrefixReuse;

pub use admit::AdmitItem;
pub use disk::{DiskPrefetch, WindowDisk};
pub use faults::{CopyRecord, WindowSnapshot};
pub use lifecycle::SlotTokens;
pub use plan::{AdmissionPlan, PlannedReuse};
pub use remote::{RemotePrefetch, RemoteWritePolicy, WindowRemote};
pub use verify::SeqLengths;

use crate::events::WindowEvent;
use crate::eviction::FreeQueues;
use crate::key::{multimodal_keys_for_range, BlockKeyRef, MmKey, MultimodalItem};
use crate::pool::{BlockArena, BlockLayout, Level};
use crate::premixed::PremixedMap;
use crate::transfer::{CopyEngine, RowCopy};
use crate::tree::{ReuseTree, SlotKeyAttrs};

/// The tiers below a window's host memory, each a backend behind `lower::LowerTier`, in the
/// order a block falls through them.
#[derive(Debug, Default)]
struct LowerTiers {
    /// The disk tier below the host tier, if configured (`disk`).
    disk: Option<Box<disk::WindowDisk>>,
    /// The shared remote tier, if configured (`remote`).
    remote: Option<Box<remote::WindowRemote>>,
}

/// Static configuration of one window.
#[derive(Clone, Debug)]
pub struct WindowConfig {
    pub window_size: usize,
    pub num_primary: usize,
    pub num_secondary: usize,
    pub tokens_per_block: usize,
    /// Most tokens a sequence may hold slots for in this window: `max(window,
    /// max_sequence_length)` plus the extra KV and draft tokens.
    pub max_token_num: usize,
    /// Most blocks one beam may list (the rows of the window's offset table).
    pub max_blocks_per_seq: usize,
    /// Tokens a sliding window keeps past the window before detaching a front block (the
    /// configured draft tokens): a rewind of up to this many tokens (rejected drafts) never
    /// brings a detached block back into the window. 0 detaches as TensorRT-LLM does.
    pub detach_slack_tokens: usize,
    pub enable_reuse: bool,
    pub enable_partial_reuse: bool,
    pub copy_on_partial_reuse: bool,
    pub onboard_blocks: bool,
    pub offload_min_priority: u8,
    /// The window's pools: what one block's bytes are.
    pub layout: BlockLayout,
    /// 0: reuse to the token (partial reuse as configured). n > 0: the window holds recurrent
    /// state snapshots, one per block at its end, valid once the block is full, of which every
    /// n-th is kept: reuse takes exact full blocks only, a multiple of n of them.
    pub reuse_granularity_blocks: usize,
    /// Allocation prefers the free block owning the row after the previous allocation's, when
    /// it ranks equally for eviction and holds no cached content: requests get runs of
    /// consecutive rows (fewer transfer descriptors). Off: TensorRT-LLM's order exactly.
    pub contiguous_runs: bool,
}

impl WindowConfig {
    /// A window narrower than the maximum sequence length detaches out-of-window blocks.
    pub fn is_swa(&self, max_sequence_length: usize) -> bool {
        self.window_size < max_sequence_length
    }
}

/// Cumulative allocation counters of one window (the per-window parts of `KvCacheStats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowStats {
    pub alloc_total: u64,
    pub alloc_new: u64,
    pub reused: u64,
    pub missed: u64,
    pub offloaded: u64,
    pub onboarded: u64,
    pub evicted_from_tree: u64,
    /// Blocks of suspended sequences moved to the host tier to make room (also in `offloaded`).
    pub suspended_moved_to_host: u64,
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

/// The key attributes of a running sequence (its tokens are in its blocks' slots).
#[derive(Clone, Copy, Debug, Default)]
pub struct SeqKeyAttrs<'a> {
    pub slot: SlotKeyAttrs,
    pub mm_items: &'a [MultimodalItem],
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
    /// The slot count the window was last slid to by `slide_to_slots` (0: never): the next
    /// token the engine computes is at position `slid_to - 1`, so the detached blocks lie before
    /// its window even while the known tokens lag the slots.
    slid_to: usize,
    /// A block was detached before all its tokens were known (`slide_to_slots` ran ahead of the
    /// tokens): its slots never get them, so the sequence must not store in this window.
    lost_tokens: bool,
    /// The sequence takes part in reuse (the window's reuse is on and its request did not opt
    /// out); false: it is never stored (its slots still hold its tokens, as the lifecycle
    /// keeps them for every sequence of a window with reuse).
    reuse: bool,
    /// When the sequence was suspended (a tick of `suspend_clock`), `None` while active. The
    /// blocks of a suspended sequence may move to the host tier; the oldest suspension moves
    /// first.
    suspended_at: Option<u64>,
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
    /// Claims of the admission batch being planned (see `BatchClaims`).
    claims: plan::BatchClaims,
    pending_copies: Vec<RowCopy>,
    stats: WindowStats,
    scheduling_free: usize,
    mm_scratch: Vec<MmKey>,
    /// Raw events of the running operation; `None` when events are off (costs nothing then).
    events: Option<Vec<WindowEvent>>,
    /// Rows written and the failure of the copy submissions of the running call (`faults`).
    copy_log: faults::CopyLog,
    /// Ticks once per suspension, to order suspended sequences (oldest moves to host first).
    suspend_clock: u64,
    /// Sequences with `suspended_at` set: admission asks on every call, so it is kept, not
    /// counted.
    num_suspended: usize,
    /// The tiers below host memory, if configured (`lower`).
    lower: LowerTiers,
    /// Prefix digests of tree blocks, for the lower tiers (`lower`).
    digests: lower::DigestCache,
    /// The primary row of the latest allocation (`contiguous_runs`).
    last_alloc_row: Option<u32>,
    /// Blocks of active sequences an explicit `offload_block` moved to the host tier
    /// (TensorRT-LLM's offload of a held block); pruned when they come back or are freed.
    held_on_host: Vec<u32>,
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
        // The low-water marks start at the full pools.
        queues.take_free_low_water(Level::Primary);
        queues.take_free_low_water(Level::Secondary);
        WindowBlockManager {
            tree: ReuseTree::new(n, cfg.tokens_per_block),
            alloc_epoch: vec![0; n],
            claims: plan::BatchClaims::default(),
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
            copy_log: faults::CopyLog::default(),
            suspend_clock: 0,
            num_suspended: 0,
            lower: LowerTiers::default(),
            digests: lower::DigestCache::default(),
            last_alloc_row: None,
            held_on_host: Vec::new(),
        }
    }

    /// Starts recording events (see `take_events`).
    pub fn enable_events(&mut self) {
        self.tree.track_hashes();
        self.events.get_or_insert_with(Vec::new);
        if let Some(d) = &mut self.lower.disk {
            d.lower.tier.log_changes();
        }
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

    /// Turns the contiguous-run allocation preference on or off (it only orders future
    /// allocations).
    pub fn set_contiguous_runs(&mut self, on: bool) {
        self.cfg.contiguous_runs = on;
        self.last_alloc_row = None;
    }

    /// Waits on the host until every copy this window's backend was given has finished.
    pub fn wait_for_copies_on_host(&mut self) {
        self.engine.wait_on_host();
    }

    pub fn window_size(&self) -> usize {
        self.cfg.window_size
    }

    pub fn stats(&self) -> WindowStats {
        self.stats
    }

    /// Takes `total` allocations (`new` of them of blocks that held no content) out of the
    /// statistics: an allocation the scheduler reverted is not counted.
    pub fn uncount_allocations(&mut self, total: u64, new: u64) {
        self.stats.alloc_total = self.stats.alloc_total.saturating_sub(total);
        self.stats.alloc_new = self.stats.alloc_new.saturating_sub(new);
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
    /// else (storing the sequence would then insert foreign content under its keys), or was
    /// detached before its tokens were known (`slide_to_slots`: its slots miss them).
    pub fn is_valid_for_store(&self, id: u64) -> bool {
        self.seqs.get(&id).is_some_and(|s| {
            s.reuse
                && !s.lost_tokens
                && s.detached_epochs
                    .iter()
                    .zip(&s.beams[0])
                    .all(|(&epoch, &b)| self.alloc_epoch[b as usize] == epoch)
        })
    }

    pub fn priority(&self, block: u32) -> u8 {
        self.queues.priority(block)
    }
}
