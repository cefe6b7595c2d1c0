//! Stall detection for schedulers that suspend and resume: a scheduling pass in which generation
//! requests exist but nothing is scheduled and no block moves between the GPU and the host tier
//! makes no progress; after a configured number of such passes in a row the scheduler is told
//! why, instead of spinning.
//!
//! A suspension counts once its blocks move (it freed GPU rows), not when it is requested:
//! without a host tier, suspending frees nothing, and a scheduler that suspends and resumes the
//! same requests pass after pass would otherwise look busy forever.

use super::KvCacheManager;
use crate::error::{KvError, KvResult};
use crate::pool::Level;

/// What the scheduler did in one pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedulingPass {
    /// Generation requests that wanted to run this pass.
    pub num_generation_requests: usize,
    /// Requests (context or generation) the pass scheduled.
    pub num_scheduled: usize,
}

/// Counts consecutive passes without progress.
#[derive(Clone, Debug, Default)]
pub(super) struct StallDetector {
    stalled_passes: u32,
    /// Blocks moved between the tiers (suspended blocks down, any block up) by the end of the
    /// last pass, over windows.
    moved_at_last_pass: u64,
}

impl KvCacheManager {
    /// Ends a scheduling pass. A pass with generation requests in which nothing was scheduled
    /// and no block moved between the tiers is stalled; after
    /// `stall_pass_threshold` stalled passes in a row this fails with `Stalled`, naming the
    /// cause and the remedy (and keeps failing until a pass makes progress).
    pub fn end_scheduling_pass(&mut self, pass: SchedulingPass) -> KvResult<()> {
        let moved: u64 = self
            .windows
            .iter()
            .map(|w| {
                let s = w.stats();
                s.suspended_moved_to_host + s.onboarded
            })
            .sum();
        let progress = moved != self.stall.moved_at_last_pass
            || pass.num_scheduled > 0
            || pass.num_generation_requests == 0;
        self.stall.moved_at_last_pass = moved;
        if progress {
            self.stall.stalled_passes = 0;
            return Ok(());
        }
        self.stall.stalled_passes = self.stall.stalled_passes.saturating_add(1);
        if self.stall.stalled_passes < self.cfg.stall_pass_threshold {
            return Ok(());
        }
        Err(KvError::Stalled(self.stall_cause(pass)))
    }

    /// Why nothing can run: the window whose GPU pool is exhausted and what holds it.
    fn stall_cause(&self, pass: SchedulingPass) -> String {
        let passes = self.stall.stalled_passes;
        let suspended = self.sequences.values().filter(|s| s.life.suspended).count();
        let head = format!(
            "{passes} scheduling passes in a row with {} generation requests scheduled nothing \
             ({suspended} of {} sequences suspended)",
            pass.num_generation_requests,
            self.sequences.len()
        );
        let full = self
            .windows
            .iter()
            .max_by(|a, b| a.utilization().total_cmp(&b.utilization()))
            .expect("a manager has windows");
        let w = full.window_size();
        let primary = full.config().num_primary;
        let free = full.num_free(Level::Primary);
        if !full.host_tier_usable() {
            return format!(
                "{head}: window {w} has no host tier, so suspended sequences keep their GPU \
                 blocks ({free} of {primary} free) and nothing can resume; give window {w} a host \
                 tier (secondary_blocks, or auto_host_tier) or preempt requests (release them and \
                 recompute later)"
            );
        }
        let host_free = full.num_free(Level::Secondary);
        let host = full.config().num_secondary;
        if host_free == 0 {
            return format!(
                "{head}: the host tier of window {w} is too small: all {host} host blocks hold \
                 suspended sequences' blocks and {free} of {primary} GPU blocks are free; enlarge \
                 secondary_blocks of window {w} or preempt requests"
            );
        }
        format!(
            "{head}: window {w} has {free} of {primary} GPU blocks free and {host_free} of {host} \
             host blocks free, yet no request fits: a request needs more blocks than the GPU pool \
             can give; raise primary_blocks of window {w} or shorten max_sequence_length"
        )
    }
}
