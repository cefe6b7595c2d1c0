//! Per-iteration statistics (TensorRT-LLM `getIterationStats` / `KvCacheIterationStats`): per
//! window, the counters' growth since the previous call, the peak occupancy in between, the
//! gauges of cached free blocks, and the bytes moved between tiers.

use super::KvCacheManager;
use crate::pool::Level;
use crate::window::WindowStats;

/// One window's statistics since the previous `take_iteration_stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IterationStats {
    pub window_size: usize,
    pub primary_max_blocks: u64,
    pub primary_free_blocks: u64,
    pub primary_used_blocks: u64,
    /// The most primary blocks in use at any moment since the previous call.
    pub primary_peak_used_blocks: u64,
    /// Free primary blocks that still hold cached KV (eviction would destroy it).
    pub primary_evictable_blocks: u64,
    pub secondary_max_blocks: u64,
    pub secondary_free_blocks: u64,
    pub secondary_evictable_blocks: u64,
    pub iter_alloc_total_blocks: u64,
    pub iter_alloc_new_blocks: u64,
    pub iter_reused_blocks: u64,
    pub iter_missed_blocks: u64,
    /// `iter_reused / (iter_reused + iter_missed)`, 0 without either.
    pub iter_cache_hit_rate: f64,
    pub iter_onboard_blocks: u64,
    pub iter_onboard_bytes: u64,
    pub iter_offload_blocks: u64,
    pub iter_offload_bytes: u64,
    /// Blocks that left the reuse tree (evicted, truncated, reset).
    pub iter_evicted_blocks: u64,
}

/// `now - before` per counter.
fn delta(now: &WindowStats, before: &WindowStats) -> WindowStats {
    WindowStats {
        alloc_total: now.alloc_total.saturating_sub(before.alloc_total),
        alloc_new: now.alloc_new.saturating_sub(before.alloc_new),
        reused: now.reused.saturating_sub(before.reused),
        missed: now.missed.saturating_sub(before.missed),
        offloaded: now.offloaded.saturating_sub(before.offloaded),
        onboarded: now.onboarded.saturating_sub(before.onboarded),
        evicted_from_tree: now
            .evicted_from_tree
            .saturating_sub(before.evicted_from_tree),
        suspended_moved_to_host: now
            .suspended_moved_to_host
            .saturating_sub(before.suspended_moved_to_host),
    }
}

impl KvCacheManager {
    /// Each window's statistics since the previous call (since creation for the first), in
    /// ascending window order; restarts the interval. Walks every block once for the
    /// evictable gauges, so call it once per iteration, not per request.
    pub fn take_iteration_stats(&mut self) -> Vec<IterationStats> {
        if self.iteration_baseline.len() != self.windows.len() {
            self.iteration_baseline = vec![WindowStats::default(); self.windows.len()];
        }
        let mut out = Vec::with_capacity(self.windows.len());
        for (w, base) in self.windows.iter_mut().zip(&mut self.iteration_baseline) {
            let now = w.stats();
            let d = delta(&now, base);
            *base = now;
            let c = w.config();
            let (primary, secondary) = (c.num_primary as u64, c.num_secondary as u64);
            let free = w.num_free(Level::Primary) as u64;
            let low_water = w.take_free_low_water(Level::Primary) as u64;
            w.take_free_low_water(Level::Secondary);
            let row = w.row_bytes() as u64;
            let looked_up = d.reused + d.missed;
            out.push(IterationStats {
                window_size: w.window_size(),
                primary_max_blocks: primary,
                primary_free_blocks: free,
                primary_used_blocks: primary - free,
                primary_peak_used_blocks: primary - low_water.min(free),
                primary_evictable_blocks: w.num_evictable_cached(Level::Primary) as u64,
                secondary_max_blocks: secondary,
                secondary_free_blocks: w.num_free(Level::Secondary) as u64,
                secondary_evictable_blocks: w.num_evictable_cached(Level::Secondary) as u64,
                iter_alloc_total_blocks: d.alloc_total,
                iter_alloc_new_blocks: d.alloc_new,
                iter_reused_blocks: d.reused,
                iter_missed_blocks: d.missed,
                iter_cache_hit_rate: if looked_up == 0 {
                    0.0
                } else {
                    d.reused as f64 / looked_up as f64
                },
                iter_onboard_blocks: d.onboarded,
                iter_onboard_bytes: d.onboarded * row,
                iter_offload_blocks: d.offloaded,
                iter_offload_bytes: d.offloaded * row,
                iter_evicted_blocks: d.evicted_from_tree,
            });
        }
        out
    }
}
