//! Results the C ABI writes back: per-request statistics, admissions, batch estimates, manager
//! statistics and block snapshots.

use crate::manager::{Admission, BlockInfo, KvCacheStats, RequestStats};

/// Per-request allocation counters of an admission, summed over windows.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvb_request_stats_t {
    /// Blocks taken from the free queue: misses, per-beam blocks, partial-reuse copy destinations
    /// and blocks onboarded from the host tier.
    pub alloc_total_blocks: u64,
    /// Of `alloc_total_blocks`, those that held no cached content.
    pub alloc_new_blocks: u64,
    /// Prompt blocks found in the reuse tree (full or partial match, onboarded ones included).
    pub reused_blocks: u64,
    /// Prompt blocks not found in the reuse tree (computed anew; counted once for all beams).
    pub missed_blocks: u64,
    /// reused / (reused + missed); 0 when nothing was reused.
    pub cache_hit_rate: f64,
}

/// Result of an admission.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvb_admission_t {
    /// Prompt tokens already in the cache: the engine computes from this position on.
    pub prepopulated_prompt_len: i32,
    /// The request's allocation counters, summed over windows.
    pub stats: kvb_request_stats_t,
}

/// The estimate for one request of a candidate batch (`kvb_manager_estimate_batch`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvb_batch_estimate_t {
    /// Prompt tokens admission will reuse (its prepopulated length).
    pub reusable_tokens: i32,
    /// Blocks admission will allocate, over windows (the request's `alloc_total_blocks`).
    pub allocated_blocks: i32,
    /// Free primary blocks admission will consume, over windows.
    pub free_blocks_consumed: i32,
    /// Prompt blocks admission will reuse, over windows (the request's `reused_blocks`).
    pub reused_blocks: i32,
    /// Prompt blocks admission will miss, over windows (the request's `missed_blocks`).
    pub missed_blocks: i32,
    /// Whether this request and every one before it fit in the free blocks.
    pub fits: bool,
}

impl From<crate::manager::BatchEstimate> for kvb_batch_estimate_t {
    fn from(e: crate::manager::BatchEstimate) -> Self {
        kvb_batch_estimate_t {
            reusable_tokens: e.reusable_tokens as i32,
            allocated_blocks: e.allocated_blocks as i32,
            free_blocks_consumed: e.free_blocks_consumed as i32,
            reused_blocks: e.reused_blocks as i32,
            missed_blocks: e.missed_blocks as i32,
            fits: e.fits,
        }
    }
}

/// Whole-manager statistics (TensorRT-LLM `KvCacheStats`; `max_num_blocks` includes host blocks,
/// as there).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvb_kv_cache_stats_t {
    /// Primary and secondary blocks, over windows.
    pub max_num_blocks: u64,
    /// Free primary blocks.
    pub free_num_blocks: u64,
    /// `max_num_blocks - free_num_blocks` (host blocks count as used, as in TensorRT-LLM).
    pub used_num_blocks: u64,
    /// Tokens per block (the config's `tokens_per_block`).
    pub tokens_per_block: u64,
    /// Cumulative `kvb_request_stats_t::alloc_total_blocks` over admissions and windows, plus
    /// blocks allocated while generating.
    pub alloc_total_blocks: u64,
    /// Of `alloc_total_blocks`, those that held no cached content.
    pub alloc_new_blocks: u64,
    /// Cumulative prompt blocks reused from the reuse tree.
    pub reused_blocks: u64,
    /// Cumulative prompt blocks not found in the reuse tree.
    pub missed_blocks: u64,
    /// `reused_blocks / (reused_blocks + missed_blocks)`; 0 when nothing was reused.
    pub cache_hit_rate: f64,
    /// Primary (GPU) blocks, over windows.
    pub num_primary_blocks: u64,
    /// Secondary (host) blocks, over windows.
    pub num_secondary_blocks: u64,
    /// Free secondary blocks, over windows.
    pub free_secondary_blocks: u64,
    /// Cumulative blocks offloaded from primary to secondary memory.
    pub offloaded_blocks: u64,
    /// Cumulative blocks onboarded from secondary to primary memory.
    pub onboarded_blocks: u64,
    /// Blocks that left a reuse tree: evicted, detached with an evicted ancestor, or taken over
    /// after a partial match (as many as the hashes of Removed events).
    pub evicted_blocks: u64,
    /// Bytes of the primary pools.
    pub allocated_bytes: u64,
}

/// Snapshot of one block.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvb_block_info_t {
    /// A `kvb_cache_level_t` value.
    pub cache_level: i32,
    /// Row index inside the pools of that level.
    pub memory_index: i32,
    /// References: one per beam of each sequence holding the block, plus its pins.
    pub ref_count: i32,
    /// Retention priority, 0..=100 (35 = default).
    pub priority: i32,
    /// Holds reusable content in the reuse tree.
    pub in_reuse_tree: bool,
    /// Has no child in the reuse tree (also true outside the tree).
    pub is_leaf: bool,
    /// In a free queue (evictable).
    pub is_free: bool,
    /// Tokens of the block's key (0 if it never held a key).
    pub num_tokens: i32,
    /// TensorRT-LLM block hash (valid when in the tree).
    pub hash: u64,
    /// Tree parent block id; -1 = the root; -2 = not in the tree.
    pub parent: i64,
}

impl From<RequestStats> for kvb_request_stats_t {
    fn from(s: RequestStats) -> Self {
        kvb_request_stats_t {
            alloc_total_blocks: s.alloc_total_blocks,
            alloc_new_blocks: s.alloc_new_blocks,
            reused_blocks: s.reused_blocks,
            missed_blocks: s.missed_blocks,
            cache_hit_rate: s.hit_rate(),
        }
    }
}

impl From<Admission> for kvb_admission_t {
    fn from(a: Admission) -> Self {
        kvb_admission_t {
            prepopulated_prompt_len: a.prepopulated_prompt_len as i32,
            stats: a.stats.into(),
        }
    }
}

impl From<KvCacheStats> for kvb_kv_cache_stats_t {
    fn from(s: KvCacheStats) -> Self {
        kvb_kv_cache_stats_t {
            max_num_blocks: s.max_num_blocks,
            free_num_blocks: s.free_num_blocks,
            used_num_blocks: s.used_num_blocks,
            tokens_per_block: s.tokens_per_block,
            alloc_total_blocks: s.alloc_total_blocks,
            alloc_new_blocks: s.alloc_new_blocks,
            reused_blocks: s.reused_blocks,
            missed_blocks: s.missed_blocks,
            cache_hit_rate: s.cache_hit_rate,
            num_primary_blocks: s.num_primary_blocks,
            num_secondary_blocks: s.num_secondary_blocks,
            free_secondary_blocks: s.free_secondary_blocks,
            offloaded_blocks: s.offloaded_blocks,
            onboarded_blocks: s.onboarded_blocks,
            evicted_blocks: s.evicted_blocks,
            allocated_bytes: s.allocated_bytes,
        }
    }
}

impl From<BlockInfo> for kvb_block_info_t {
    fn from(b: BlockInfo) -> Self {
        kvb_block_info_t {
            cache_level: b.level as i32,
            memory_index: b.memory_index as i32,
            ref_count: b.ref_count as i32,
            priority: i32::from(b.priority),
            in_reuse_tree: b.in_reuse_tree,
            is_leaf: b.is_leaf,
            is_free: b.is_free,
            num_tokens: b.num_tokens as i32,
            hash: b.hash,
            parent: b.parent.unwrap_or(-2),
        }
    }
}
