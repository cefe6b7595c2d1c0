//! Contiguous runs: the allocation policy that prefers consecutive rows, and how many runs a
//! request's rows form (each run is one descriptor per pool when the peer's rows are a run too).

use crate::disagg::count_runs;
use crate::error::KvResult;
use crate::manager::KvCacheManager;

/// The rows of one window of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowRunStats {
    pub window_size: usize,
    /// GPU-level blocks of beam 0 the sequence holds (front-detached ones not counted).
    pub blocks: usize,
    /// Maximal runs of consecutive rows among them, in token order.
    pub runs: usize,
}

impl KvCacheManager {
    /// Turns the contiguous-run allocation preference on or off for every window
    /// (`ManagerConfig::contiguous_runs`); it orders future allocations only.
    pub fn set_contiguous_runs(&mut self, on: bool) {
        self.cfg.contiguous_runs = on;
        for w in &mut self.windows {
            w.set_contiguous_runs(on);
        }
    }

    /// The runs of consecutive rows of sequence `id`'s beam 0, per window (a receiving
    /// sequence included).
    pub fn row_runs(&self, id: u64) -> KvResult<Vec<RowRunStats>> {
        if !self.sequences.contains_key(&id) {
            return Err(crate::error::KvError::UnknownRequest(id));
        }
        Ok(self
            .windows
            .iter()
            .map(|w| {
                let blocks = w.block_ids(id, 0).unwrap_or(&[]);
                let held = blocks.get(w.front_blocks_removed(id)..).unwrap_or(&[]);
                let rows: Vec<u32> = held
                    .iter()
                    .filter(|&&b| w.arena().is_primary(b))
                    .map(|&b| w.arena().row(b).index)
                    .collect();
                RowRunStats {
                    window_size: w.window_size(),
                    blocks: rows.len(),
                    runs: count_runs(&rows),
                }
            })
            .collect())
    }
}
