//! Data movement between memory rows: the `CopyEngine` trait and its host-memory backend.
//!
//! The window manager collects the row copies of one operation and submits them in order; a
//! backend must execute them in submission order (a later copy may read a row an earlier one
//! wrote). `num_tokens == 0` copies whole rows; otherwise only the first `num_tokens` tokens of
//! every (layer, K|V, head) slab are copied (partial reuse).

use crate::error::{KvError, KvResult};
use crate::pool::{BlockLayout, Level, MemRow, PoolShape};

/// One row copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowCopy {
    pub src: MemRow,
    pub dst: MemRow,
    /// 0 = the whole row; [`RowCopy::STATE_ONLY`] = only the rows of recurrent-state pools;
    /// otherwise the first `num_tokens` tokens of each slab.
    pub num_tokens: u32,
}

impl RowCopy {
    /// `num_tokens` of a copy that carries a sequence's recurrent state into its next block:
    /// the recurrent-state pools' rows whole, nothing of the attention pools (whose tokens the
    /// destination block holds or will hold).
    pub const STATE_ONLY: u32 = u32::MAX;
}

/// A batch of copies that a backend could not execute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyFailure {
    /// How many copies of the batch, from its start, were executed (or enqueued) before the
    /// failure; the others moved nothing.
    pub completed: usize,
    /// What went wrong (`KvError::CopyFailed`, or `KvError::Cuda` for the CUDA backend).
    pub error: KvError,
}

/// Moves the bytes of blocks between memory rows of a window's pools.
pub trait CopyEngine: Send {
    /// Executes (or enqueues, for asynchronous backends) `copies` in order. On failure the
    /// manager rolls the call back (see `KvCacheManager::transact`) when `can_fail` said so.
    fn submit(&mut self, copies: &[RowCopy]) -> Result<(), CopyFailure>;
    /// Whether `submit` may fail: the manager then snapshots its bookkeeping before each call
    /// that may copy, so a failure can be rolled back.
    fn can_fail(&self) -> bool {
        false
    }
    /// Waits until every submitted copy is visible to the engine's compute work.
    fn sync(&mut self) {}
    /// Waits on the host until every submitted copy has finished, so that the host may read
    /// or write the rows (a synchronous backend has nothing to wait for).
    fn wait_on_host(&mut self) {}
    /// Base address of pool `pool` of the window (in `BlockLayout` order) at `level`: host
    /// memory for the host backend, the device-visible address for the CUDA backend.
    fn pool_base(&mut self, _level: Level, _pool: usize) -> Option<*mut u8> {
        None
    }
    /// A failure of an asynchronous backend (a launch that could not be enqueued). It is
    /// sticky: the backend moves no more bytes, and the manager reports it on every call.
    fn failure(&self) -> Option<&str> {
        None
    }
    /// Replaces pool `pool` of `level` with the engine's own memory (`address`, `bytes` long).
    fn register_pool(
        &mut self,
        _level: Level,
        _pool: usize,
        _address: u64,
        _bytes: usize,
    ) -> Result<(), String> {
        Err("only the CUDA backend takes pools registered by the engine".into())
    }
    /// Batched submissions executed so far (kernel launches for the CUDA backend).
    fn launches(&self) -> u64 {
        0
    }
    /// Whether `read_row` and `write_row` reach the bytes of host-tier rows (the disk tier
    /// needs it).
    fn host_rows_visible(&self) -> bool {
        false
    }
    /// Whether `read_row` reaches GPU-level (primary) rows too: host-memory pools, not GPU ones.
    fn primary_rows_visible(&self) -> bool {
        self.host_rows_visible()
    }
    /// Whether the host may read or rewrite host-tier row `row` now: no copy in flight touches
    /// it (always, for backends whose copies are done when `submit` returns).
    fn host_row_ready(&mut self, _row: MemRow) -> bool {
        true
    }
    /// Copies the bytes of a host-tier block into `out`: its row in every pool of the window,
    /// concatenated in pool order (every copy submitted before is complete by then).
    fn read_row(&mut self, _row: MemRow, _out: &mut [u8]) -> Result<(), String> {
        Err("this copy backend does not expose host rows".into())
    }
    /// Writes `data` (every pool's row, concatenated as `read_row` gives them) into a host-tier
    /// block.
    fn write_row(&mut self, _row: MemRow, _data: &[u8]) -> Result<(), String> {
        Err("this copy backend does not expose host rows".into())
    }
}

/// Bookkeeping only: no bytes exist, copies are counted and dropped.
#[derive(Debug, Default)]
pub struct NullEngine {
    pub copies_submitted: u64,
}

impl CopyEngine for NullEngine {
    fn submit(&mut self, copies: &[RowCopy]) -> Result<(), CopyFailure> {
        self.copies_submitted += copies.len() as u64;
        Ok(())
    }

    /// No bytes exist: rows read as zeros and writes are dropped (bookkeeping only).
    fn host_rows_visible(&self) -> bool {
        true
    }

    fn read_row(&mut self, _row: MemRow, out: &mut [u8]) -> Result<(), String> {
        out.fill(0);
        Ok(())
    }

    fn write_row(&mut self, _row: MemRow, _data: &[u8]) -> Result<(), String> {
        Ok(())
    }
}

/// Pools held as host byte buffers; copies are `memcpy`s. Used by tests to check that data really
/// moves, and by host-only deployments. A window may have several pools (`BlockLayout`): a
/// block's bytes are its row in each of them.
#[derive(Debug)]
pub struct HostMemoryEngine {
    layout: BlockLayout,
    /// `[level][pool]`: the rows of every pool of the window at each level.
    pools: [Vec<Vec<u8>>; 2],
}

/// A zeroed byte buffer of `bytes`, or `KvError::OutOfMemory` (instead of aborting the host
/// process) when the allocator refuses.
pub fn try_zeroed_buffer(bytes: usize, what: &str) -> KvResult<Vec<u8>> {
    if bytes == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(bytes)
        .map_err(|_| KvError::OutOfMemory(format!("{what}: {bytes} bytes is too large")))?;
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(KvError::OutOfMemory(format!(
            "{what}: {bytes} bytes could not be allocated"
        )));
    }
    // SAFETY: `ptr` was allocated by the global allocator with the layout of `[u8; bytes]`,
    // and all `bytes` bytes are initialised (zeroed).
    Ok(unsafe { Vec::from_raw_parts(ptr, bytes, bytes) })
}

/// Byte ranges (offset in the row, length) that a copy of `num_tokens` tokens moves in a row of
/// `shape`: the whole row, or the first `num_tokens` tokens of every (layer, K|V, head) slab.
pub(crate) fn copy_runs(shape: &PoolShape, num_tokens: u32) -> (usize, usize, usize) {
    let g = &shape.geometry;
    let row_bytes = g.row_bytes();
    if num_tokens == RowCopy::STATE_ONLY {
        return if shape.recurrent_state {
            (row_bytes, row_bytes, 1)
        } else {
            (0, 0, 0)
        };
    }
    if num_tokens == 0 || num_tokens as usize >= g.tokens_per_block || !shape.partial_copies {
        (row_bytes, row_bytes, 1)
    } else {
        (
            num_tokens as usize * g.token_bytes(),
            g.head_slab_bytes(),
            g.slabs_per_row(),
        )
    }
}

impl HostMemoryEngine {
    /// Host pools of `num_primary` and `num_secondary` rows; panics when they cannot be
    /// allocated (tests). The manager uses `try_new`.
    pub fn new(layout: impl Into<BlockLayout>, num_primary: usize, num_secondary: usize) -> Self {
        Self::try_new(layout, num_primary, num_secondary).expect("host pools")
    }

    /// Host pools of `num_primary` and `num_secondary` rows of every pool of `layout`;
    /// `KvError::OutOfMemory` when their size overflows or the allocator refuses.
    pub fn try_new(
        layout: impl Into<BlockLayout>,
        num_primary: usize,
        num_secondary: usize,
    ) -> KvResult<Self> {
        let layout = layout.into();
        let mut pools = [Vec::new(), Vec::new()];
        for (level, rows) in [num_primary, num_secondary].into_iter().enumerate() {
            for shape in layout.pools() {
                let bytes = shape
                    .geometry
                    .checked_row_bytes()
                    .and_then(|r| r.checked_mul(rows))
                    .ok_or_else(|| KvError::OutOfMemory("the pool size overflows".into()))?;
                let what = if level == 0 {
                    "primary pool"
                } else {
                    "secondary pool"
                };
                pools[level].push(try_zeroed_buffer(bytes, what)?);
            }
        }
        Ok(HostMemoryEngine { layout, pools })
    }

    pub fn layout(&self) -> &BlockLayout {
        &self.layout
    }

    /// Bytes of a block's row in the first pool (the only one of a uniform window).
    pub fn row_bytes(&self) -> usize {
        self.layout.first().map_or(0, |g| g.row_bytes())
    }

    /// The row of the first pool (the only one of a uniform window).
    pub fn row(&self, row: MemRow) -> &[u8] {
        self.pool_row(0, row)
    }

    pub fn row_mut(&mut self, row: MemRow) -> &mut [u8] {
        self.pool_row_mut(0, row)
    }

    /// `row` in pool `pool` of the window.
    pub fn pool_row(&self, pool: usize, row: MemRow) -> &[u8] {
        let n = self.layout.pools()[pool].geometry.row_bytes();
        let start = row.index as usize * n;
        &self.pools[row.level as usize][pool][start..start + n]
    }

    pub fn pool_row_mut(&mut self, pool: usize, row: MemRow) -> &mut [u8] {
        let n = self.layout.pools()[pool].geometry.row_bytes();
        let start = row.index as usize * n;
        &mut self.pools[row.level as usize][pool][start..start + n]
    }

    /// All bytes of the block in `row`: its row in every pool of the window, in pool order.
    /// The one place that enumerates them (tiers that store a block's bytes use it).
    pub fn block_rows(&self, row: MemRow) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.layout.pools().len()).map(move |p| self.pool_row(p, row))
    }

    /// `block_rows`, writable.
    pub fn block_rows_mut(&mut self, row: MemRow) -> impl Iterator<Item = &mut [u8]> + '_ {
        let start_of = |p: usize| {
            let n = self.layout.pools()[p].geometry.row_bytes();
            (row.index as usize * n, n)
        };
        let spans: Vec<(usize, usize)> = (0..self.layout.pools().len()).map(start_of).collect();
        self.pools[row.level as usize]
            .iter_mut()
            .zip(spans)
            .map(|(pool, (start, n))| &mut pool[start..start + n])
    }

    fn copy_one(&mut self, c: &RowCopy) {
        if c.src == c.dst {
            return;
        }
        for (p, shape) in self.layout.pools().iter().enumerate() {
            let (len, stride, runs) = copy_runs(shape, c.num_tokens);
            let row_bytes = shape.geometry.row_bytes();
            if row_bytes == 0 {
                continue;
            }
            let src_start = c.src.index as usize * row_bytes;
            let dst_start = c.dst.index as usize * row_bytes;
            if c.src.level == c.dst.level {
                let pool = &mut self.pools[c.src.level as usize][p];
                for r in 0..runs {
                    let off = r * stride;
                    pool.copy_within(src_start + off..src_start + off + len, dst_start + off);
                }
            } else {
                let [primary, secondary] = &mut self.pools;
                let (src_pool, dst_pool) = if c.src.level == Level::Primary {
                    (&primary[p], &mut secondary[p])
                } else {
                    (&secondary[p], &mut primary[p])
                };
                for r in 0..runs {
                    let off = r * stride;
                    dst_pool[dst_start + off..dst_start + off + len]
                        .copy_from_slice(&src_pool[src_start + off..src_start + off + len]);
                }
            }
        }
    }
}

impl CopyEngine for HostMemoryEngine {
    fn submit(&mut self, copies: &[RowCopy]) -> Result<(), CopyFailure> {
        for c in copies {
            self.copy_one(c);
        }
        Ok(())
    }

    fn host_rows_visible(&self) -> bool {
        true
    }

    /// The block's bytes in every pool of the window, concatenated in pool order.
    fn read_row(&mut self, row: MemRow, out: &mut [u8]) -> Result<(), String> {
        let mut at = 0;
        for part in self.block_rows(row) {
            out[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        Ok(())
    }

    /// Writes `data` (every pool's row, concatenated as `read_row` gives them) into a block.
    fn write_row(&mut self, row: MemRow, data: &[u8]) -> Result<(), String> {
        let mut at = 0;
        for part in self.block_rows_mut(row) {
            let n = part.len();
            part.copy_from_slice(&data[at..at + n]);
            at += n;
        }
        Ok(())
    }

    fn pool_base(&mut self, level: Level, pool: usize) -> Option<*mut u8> {
        let pool = self.pools[level as usize].get_mut(pool)?;
        if pool.is_empty() {
            None
        } else {
            Some(pool.as_mut_ptr())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::PoolGeometry;

    fn geometry() -> PoolGeometry {
        PoolGeometry {
            num_layers: 2,
            kv_factor: 2,
            num_kv_heads: 1,
            size_per_head: 1,
            tokens_per_block: 4,
            bytes_per_element: 1,
        }
    }

    fn row(level: Level, index: u32) -> MemRow {
        MemRow { level, index }
    }

    #[test]
    fn whole_row_copies_cross_levels() {
        let mut e = HostMemoryEngine::new(geometry(), 2, 1);
        e.row_mut(row(Level::Primary, 1))
            .copy_from_slice(&[1u8; 16]);
        let _ = e.submit(&[RowCopy {
            src: row(Level::Primary, 1),
            dst: row(Level::Secondary, 0),
            num_tokens: 0,
        }]);
        assert_eq!(e.row(row(Level::Secondary, 0)), &[1u8; 16]);
        assert_eq!(e.row(row(Level::Primary, 0)), &[0u8; 16]);
    }

    #[test]
    fn partial_copy_takes_first_tokens_of_every_slab() {
        let mut e = HostMemoryEngine::new(geometry(), 2, 0);
        let src: Vec<u8> = (1..=16).collect();
        e.row_mut(row(Level::Primary, 0)).copy_from_slice(&src);
        let _ = e.submit(&[RowCopy {
            src: row(Level::Primary, 0),
            dst: row(Level::Primary, 1),
            num_tokens: 3,
        }]);
        assert_eq!(
            e.row(row(Level::Primary, 1)),
            &[1, 2, 3, 0, 5, 6, 7, 0, 9, 10, 11, 0, 13, 14, 15, 0]
        );
    }

    #[test]
    fn copies_run_in_submission_order() {
        let mut e = HostMemoryEngine::new(geometry(), 1, 1);
        e.row_mut(row(Level::Primary, 0)).fill(7);
        let _ = e.submit(&[
            RowCopy {
                src: row(Level::Primary, 0),
                dst: row(Level::Secondary, 0),
                num_tokens: 0,
            },
            RowCopy {
                src: row(Level::Secondary, 0),
                dst: row(Level::Primary, 0),
                num_tokens: 0,
            },
        ]);
        assert_eq!(e.row(row(Level::Secondary, 0)), &[7u8; 16]);
    }

    #[test]
    fn every_pool_of_a_block_moves_together() {
        // A K-only pool (partial copies) beside a pool whose blocks always move whole.
        let k_only = PoolGeometry {
            num_layers: 1,
            kv_factor: 1,
            ..geometry()
        };
        let layout = BlockLayout::new(vec![
            PoolShape {
                geometry: k_only,
                partial_copies: true,
                recurrent_state: false,
            },
            PoolShape {
                geometry: geometry(),
                partial_copies: false,
                recurrent_state: false,
            },
        ]);
        let mut e = HostMemoryEngine::new(&layout, 2, 1);
        for (p, r) in e.block_rows_mut(row(Level::Primary, 0)).enumerate() {
            for (i, b) in r.iter_mut().enumerate() {
                *b = (10 * p + i + 1) as u8;
            }
        }
        let _ = e.submit(&[
            RowCopy {
                src: row(Level::Primary, 0),
                dst: row(Level::Secondary, 0),
                num_tokens: 0,
            },
            RowCopy {
                src: row(Level::Secondary, 0),
                dst: row(Level::Primary, 1),
                num_tokens: 2,
            },
        ]);
        let offloaded: Vec<Vec<u8>> = e
            .block_rows(row(Level::Secondary, 0))
            .map(<[u8]>::to_vec)
            .collect();
        let original: Vec<Vec<u8>> = e
            .block_rows(row(Level::Primary, 0))
            .map(<[u8]>::to_vec)
            .collect();
        assert_eq!(offloaded, original);
        // Partial: the first 2 of 4 tokens of the K-only pool, the whole row of the other.
        assert_eq!(e.pool_row(0, row(Level::Primary, 1)), &[1, 2, 0, 0]);
        assert_eq!(e.pool_row(1, row(Level::Primary, 1)), &original[1][..]);
    }

    #[test]
    fn a_state_copy_moves_only_recurrent_state_pools() {
        let state = PoolGeometry {
            num_layers: 1,
            kv_factor: 1,
            tokens_per_block: 1,
            ..geometry()
        };
        let layout = BlockLayout::new(vec![
            PoolShape {
                geometry: geometry(),
                partial_copies: true,
                recurrent_state: false,
            },
            PoolShape {
                geometry: state,
                partial_copies: false,
                recurrent_state: true,
            },
        ]);
        let mut e = HostMemoryEngine::new(&layout, 2, 0);
        for (p, r) in e.block_rows_mut(row(Level::Primary, 0)).enumerate() {
            r.fill(10 + p as u8);
        }
        for (p, r) in e.block_rows_mut(row(Level::Primary, 1)).enumerate() {
            r.fill(20 + p as u8);
        }
        let _ = e.submit(&[RowCopy {
            src: row(Level::Primary, 0),
            dst: row(Level::Primary, 1),
            num_tokens: RowCopy::STATE_ONLY,
        }]);
        assert!(e
            .pool_row(0, row(Level::Primary, 1))
            .iter()
            .all(|&b| b == 20));
        assert!(e
            .pool_row(1, row(Level::Primary, 1))
            .iter()
            .all(|&b| b == 11));
        assert!(e
            .pool_row(1, row(Level::Primary, 0))
            .iter()
            .all(|&b| b == 11));
    }
}
