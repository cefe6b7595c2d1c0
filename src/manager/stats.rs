//! Whole-manager statistics and free-block counts.

use super::{Admission, KvCacheManager, RequestStats};
use crate::error::KvResult;
use crate::pool::Level;

/// Whole-manager statistics, the fields of TensorRT-LLM's `KvCacheStats` and a few more
/// (`max_num_blocks` counts host blocks too, as in TensorRT-LLM).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KvCacheStats {
    pub max_num_blocks: u64,
    pub free_num_blocks: u64,
    pub used_num_blocks: u64,
    pub tokens_per_block: u64,
    pub alloc_total_blocks: u64,
    pub alloc_new_blocks: u64,
    pub reused_blocks: u64,
    pub missed_blocks: u64,
    pub cache_hit_rate: f64,
    pub num_primary_blocks: u64,
    pub num_secondary_blocks: u64,
    pub free_secondary_blocks: u64,
    pub offloaded_blocks: u64,
    pub onboarded_blocks: u64,
    /// Blocks that left a reuse tree (evicted, detached with an evicted ancestor, taken over).
    pub evicted_blocks: u64,
    pub allocated_bytes: u64,
}

impl KvCacheManager {
    pub fn stats(&self) -> KvCacheStats {
        let mut s = KvCacheStats {
            tokens_per_block: self.cfg.tokens_per_block as u64,
            ..KvCacheStats::default()
        };
        for w in &self.windows {
            let c = w.config();
            let ws = w.stats();
            s.max_num_blocks += (c.num_primary + c.num_secondary) as u64;
            s.num_primary_blocks += c.num_primary as u64;
            s.num_secondary_blocks += c.num_secondary as u64;
            s.free_num_blocks += w.num_free(Level::Primary) as u64;
            s.free_secondary_blocks += w.num_free(Level::Secondary) as u64;
            s.alloc_total_blocks += ws.alloc_total;
            s.alloc_new_blocks += ws.alloc_new;
            s.reused_blocks += ws.reused;
            s.missed_blocks += ws.missed;
            s.offloaded_blocks += ws.offloaded;
            s.onboarded_blocks += ws.onboarded;
            s.evicted_blocks += ws.evicted_from_tree;
            s.allocated_bytes += (c.layout.row_bytes() * c.num_primary) as u64;
        }
        s.used_num_blocks = s.max_num_blocks.saturating_sub(s.free_num_blocks);
        s.cache_hit_rate = RequestStats {
            reused_blocks: s.reused_blocks,
            missed_blocks: s.missed_blocks,
            ..RequestStats::default()
        }
        .hit_rate();
        s
    }

    /// Free primary blocks summed over windows.
    pub fn num_free_blocks(&self) -> usize {
        self.windows
            .iter()
            .map(|w| w.num_free(Level::Primary))
            .sum()
    }

    /// `(primary, secondary)` free blocks of one window.
    pub fn num_free_blocks_of_window(&self, window_size: usize) -> KvResult<(usize, usize)> {
        let w = self.window(window_size)?;
        Ok((w.num_free(Level::Primary), w.num_free(Level::Secondary)))
    }

    /// The admission result of a sequence (prepopulated length and per-request counters).
    pub fn admission(&self, id: u64) -> KvResult<Admission> {
        Ok(self.sequence(id)?.admission)
    }
}
