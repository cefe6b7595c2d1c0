//! C entry point of the per-iteration statistics (TensorRT-LLM `getIterationStats`).

use super::handle::{copy_out, kvb_manager_t, require_out, with_manager, write_out};
use super::status::kvb_status_t;
use crate::error::KvError;
use crate::manager::IterationStats;

/// One window's statistics since the previous `kvb_manager_get_iteration_stats` (TensorRT-LLM
/// `KvCacheIterationStats`). Gauges are read at the call; `iter_*` fields are the growth of the
/// cumulative counters of `kvb_kv_cache_stats_t` over the interval.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvb_iteration_stats_t {
    /// The window these statistics are about.
    pub window_size: i32,
    /// Primary (GPU) blocks of the window.
    pub primary_max_blocks: u64,
    /// Free primary blocks now.
    pub primary_free_blocks: u64,
    /// Primary blocks in use now.
    pub primary_used_blocks: u64,
    /// The most primary blocks in use at any moment of the interval (a block claimed only
    /// inside one call, such as the host row of an offload, counts).
    pub primary_peak_used_blocks: u64,
    /// Free primary blocks that still hold cached KV: what eviction would destroy.
    pub primary_evictable_blocks: u64,
    /// Secondary (host) blocks of the window.
    pub secondary_max_blocks: u64,
    /// Free secondary blocks now.
    pub secondary_free_blocks: u64,
    /// Free host blocks that still hold cached KV.
    pub secondary_evictable_blocks: u64,
    /// Blocks taken from the free queues in the interval.
    pub iter_alloc_total_blocks: u64,
    /// Of those, blocks that held no cached content.
    pub iter_alloc_new_blocks: u64,
    /// Prompt blocks admission found in the reuse tree in the interval.
    pub iter_reused_blocks: u64,
    /// Prompt blocks admission did not find in the interval.
    pub iter_missed_blocks: u64,
    /// `iter_reused / (iter_reused + iter_missed)`; 0 when both are 0.
    pub iter_cache_hit_rate: f64,
    /// Blocks copied from the host tier to the GPU in the interval.
    pub iter_onboard_blocks: u64,
    /// Onboarded blocks times the window's row bytes (every layer of a block).
    pub iter_onboard_bytes: u64,
    /// Blocks copied from the GPU to the host tier in the interval.
    pub iter_offload_blocks: u64,
    /// Offloaded blocks times the window's row bytes.
    pub iter_offload_bytes: u64,
    /// Blocks that left the reuse tree (evicted, truncated, reset).
    pub iter_evicted_blocks: u64,
}

impl From<IterationStats> for kvb_iteration_stats_t {
    fn from(s: IterationStats) -> Self {
        kvb_iteration_stats_t {
            window_size: s.window_size as i32,
            primary_max_blocks: s.primary_max_blocks,
            primary_free_blocks: s.primary_free_blocks,
            primary_used_blocks: s.primary_used_blocks,
            primary_peak_used_blocks: s.primary_peak_used_blocks,
            primary_evictable_blocks: s.primary_evictable_blocks,
            secondary_max_blocks: s.secondary_max_blocks,
            secondary_free_blocks: s.secondary_free_blocks,
            secondary_evictable_blocks: s.secondary_evictable_blocks,
            iter_alloc_total_blocks: s.iter_alloc_total_blocks,
            iter_alloc_new_blocks: s.iter_alloc_new_blocks,
            iter_reused_blocks: s.iter_reused_blocks,
            iter_missed_blocks: s.iter_missed_blocks,
            iter_cache_hit_rate: s.iter_cache_hit_rate,
            iter_onboard_blocks: s.iter_onboard_blocks,
            iter_onboard_bytes: s.iter_onboard_bytes,
            iter_offload_blocks: s.iter_offload_blocks,
            iter_offload_bytes: s.iter_offload_bytes,
            iter_evicted_blocks: s.iter_evicted_blocks,
        }
    }
}

/// Writes each window's statistics since the previous call (since creation for the first) to
/// `out` (`capacity` entries, one per window in ascending window order; `*out_count` = the
/// number of windows) and starts the next interval (TensorRT-LLM `getIterationStats`: call it
/// once per iteration). With fewer entries than windows it fails with
/// `KVB_STATUS_BUFFER_TOO_SMALL` (`*out_count` = the windows) and the interval goes on. Walks
/// every block once for the evictable gauges.
#[no_mangle]
pub extern "C" fn kvb_manager_get_iteration_stats(
    manager: *mut kvb_manager_t,
    out: *mut kvb_iteration_stats_t,
    capacity: usize,
    out_count: *mut usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out_count, "out_count")?;
        let windows = m.window_sizes().len();
        if windows > capacity {
            write_out(out_count, windows, "out_count")?;
            return Err(KvError::BufferTooSmall {
                needed: windows,
                given: capacity,
            }
            .into());
        }
        require_out(out, "out")?;
        let stats: Vec<kvb_iteration_stats_t> = m
            .take_iteration_stats()
            .into_iter()
            .map(Into::into)
            .collect();
        copy_out(&stats, out, capacity, out_count)
    })
}
