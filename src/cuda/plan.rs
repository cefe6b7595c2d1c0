//! Turning a window's row copies into kernel descriptors and launches, without touching CUDA.
//!
//! The copies of one operation arrive in submission order and a later copy may read a row an
//! earlier one wrote (offload a block, then onboard another into the freed row). Inside one
//! kernel launch copies run in no particular order, so the copies are cut into *waves*: a copy
//! that reads a row written earlier in the wave, or writes a row read or written earlier in the
//! wave, starts a new wave. Each wave is one launch on the same stream, which orders them; an
//! operation without such dependencies (the common case) is one launch.

use std::collections::HashSet;
use std::ops::Range;

use crate::pool::{BlockLayout, MemRow, PoolShape};
use crate::transfer::copy_runs;
use crate::transfer::RowCopy;

/// One copy as the kernel reads it; the layout of `kvb_copy_descriptor` in
/// `kernels/block_copy.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyDescriptor {
    pub src: u64,
    pub dst: u64,
    pub chunk_bytes: u64,
    pub chunk_stride: u64,
    pub num_chunks: u32,
    /// Bit 0: every address and size is a multiple of 16 bytes (the kernel's vector path).
    pub flags: u32,
}

/// Flag bit: the copy can move 16-byte vectors.
pub const VECTOR_ALIGNED: u32 = 1;

/// Bytes one CTA slice moves per pass (256 threads × 4 loads × 16 bytes).
pub const SLICE_BYTES: u64 = 16 * 1024;

/// Device-visible base address of the pool of each level (index = `Level as usize`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolAddresses(pub [u64; 2]);

/// The descriptors of one operation and the waves that cut them into launches.
#[derive(Debug, Default)]
pub struct CopyPlan {
    pub descriptors: Vec<CopyDescriptor>,
    pub waves: Vec<Range<usize>>,
    /// Largest copy of the plan in bytes (sizes the CTAs per copy).
    pub max_copy_bytes: u64,
    written: HashSet<u64>,
    read: HashSet<u64>,
}

fn row_key(row: MemRow) -> u64 {
    (u64::from(row.level as u8) << 32) | u64::from(row.index)
}

impl CopyPlan {
    /// Rebuilds the plan for `copies` (reusing the buffers of the last plan): one descriptor
    /// per copy and pool of `layout` (`pools[p]` holds pool p's addresses). Copies with the
    /// same source and destination, and copies of empty rows, are dropped.
    pub fn build(&mut self, copies: &[RowCopy], layout: &BlockLayout, pools: &[PoolAddresses]) {
        self.descriptors.clear();
        self.waves.clear();
        self.written.clear();
        self.read.clear();
        self.max_copy_bytes = 0;
        if layout.row_bytes() == 0 {
            return;
        }
        let mut wave_start = 0;
        for c in copies {
            if c.src == c.dst {
                continue;
            }
            let (src, dst) = (row_key(c.src), row_key(c.dst));
            let conflicts = self.written.contains(&src)
                || self.written.contains(&dst)
                || self.read.contains(&dst);
            if conflicts {
                self.waves.push(wave_start..self.descriptors.len());
                wave_start = self.descriptors.len();
                self.written.clear();
                self.read.clear();
            }
            self.read.insert(src);
            self.written.insert(dst);
            for (shape, &addresses) in layout.pools().iter().zip(pools) {
                if shape.geometry.row_bytes() == 0 {
                    continue;
                }
                let d = describe(c, shape, addresses);
                if d.num_chunks == 0 {
                    // A state copy leaves this pool alone: an empty descriptor would only
                    // occupy CTAs (no test can see it; the sim runs such descriptors fine).
                    continue;
                }
                self.max_copy_bytes = self
                    .max_copy_bytes
                    .max(d.chunk_bytes * u64::from(d.num_chunks));
                self.descriptors.push(d);
            }
        }
        if wave_start < self.descriptors.len() {
            self.waves.push(wave_start..self.descriptors.len());
        }
    }

    /// CTAs that cooperate on one copy: enough that each moves about `SLICE_BYTES` per pass.
    pub fn slices_per_copy(&self) -> u32 {
        self.max_copy_bytes.div_ceil(SLICE_BYTES).clamp(1, 4096) as u32
    }
}

/// The descriptor of one row copy in one pool: a whole row is one run; a partial copy takes the
/// first `num_tokens` tokens of every (layer, K|V, head) slab (pools that allow it).
pub fn describe(c: &RowCopy, shape: &PoolShape, pools: PoolAddresses) -> CopyDescriptor {
    let row_bytes = shape.geometry.row_bytes() as u64;
    let address = |row: MemRow| pools.0[row.level as usize] + u64::from(row.index) * row_bytes;
    let (chunk_bytes, chunk_stride, num_chunks) = copy_runs(shape, c.num_tokens);
    let (chunk_bytes, chunk_stride) = (chunk_bytes as u64, chunk_stride as u64);
    let (src, dst) = (address(c.src), address(c.dst));
    let aligned = (src | dst | chunk_bytes | chunk_stride) % 16 == 0;
    CopyDescriptor {
        src,
        dst,
        chunk_bytes,
        chunk_stride,
        num_chunks: num_chunks as u32,
        flags: if aligned { VECTOR_ALIGNED } else { 0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{Level, PoolGeometry};

    fn geometry() -> PoolGeometry {
        PoolGeometry {
            num_layers: 2,
            kv_factor: 2,
            num_kv_heads: 2,
            size_per_head: 8,
            tokens_per_block: 4,
            bytes_per_element: 2,
        }
    }

    fn whole(geometry: PoolGeometry) -> PoolShape {
        PoolShape {
            geometry,
            partial_copies: true,
            recurrent_state: false,
        }
    }

    fn row(level: Level, index: u32) -> MemRow {
        MemRow { level, index }
    }

    fn copy(src: MemRow, dst: MemRow, num_tokens: u32) -> RowCopy {
        RowCopy {
            src,
            dst,
            num_tokens,
        }
    }

    const POOLS: PoolAddresses = PoolAddresses([0x1000_0000, 0x7000_0000]);

    /// The kernel reads `kvb_copy_descriptor` with this layout (also asserted by the C++
    /// emulation test that runs the kernel source on the CPU).
    #[test]
    fn descriptor_layout_matches_the_kernel() {
        assert_eq!(std::mem::size_of::<CopyDescriptor>(), 40);
        assert_eq!(std::mem::offset_of!(CopyDescriptor, chunk_stride), 24);
        assert_eq!(std::mem::offset_of!(CopyDescriptor, num_chunks), 32);
        assert_eq!(std::mem::offset_of!(CopyDescriptor, flags), 36);
    }

    #[test]
    fn whole_row_is_one_run_at_the_row_address() {
        let g = geometry();
        let d = describe(
            &copy(row(Level::Secondary, 3), row(Level::Primary, 5), 0),
            &whole(g),
            POOLS,
        );
        let row_bytes = g.row_bytes() as u64; // 2 layers × K|V × 2 heads × 4 tokens × 8 × 2 bytes
        assert_eq!(row_bytes, 512);
        assert_eq!(d.src, 0x7000_0000 + 3 * row_bytes);
        assert_eq!(d.dst, 0x1000_0000 + 5 * row_bytes);
        assert_eq!((d.num_chunks, d.chunk_bytes), (1, row_bytes));
        assert_eq!(d.flags, VECTOR_ALIGNED);
    }

    #[test]
    fn partial_copy_takes_the_first_tokens_of_every_slab() {
        let g = geometry();
        let d = describe(
            &copy(row(Level::Primary, 0), row(Level::Primary, 1), 3),
            &whole(g),
            POOLS,
        );
        assert_eq!(d.num_chunks as usize, g.slabs_per_row()); // 8 slabs
        assert_eq!(d.chunk_bytes, 3 * 16); // 3 tokens × 8 elements × 2 bytes
        assert_eq!(d.chunk_stride, 4 * 16);
        assert_eq!(d.flags, VECTOR_ALIGNED);
        // A partial copy of a whole block's worth of tokens is a whole-row copy.
        let full = describe(
            &copy(row(Level::Primary, 0), row(Level::Primary, 1), 4),
            &whole(g),
            POOLS,
        );
        assert_eq!(full.num_chunks, 1);
    }

    #[test]
    fn unaligned_sizes_take_the_byte_path() {
        let mut g = geometry();
        g.num_layers = 1;
        g.num_kv_heads = 1;
        g.size_per_head = 3;
        g.bytes_per_element = 1; // 24-byte rows
        let d = describe(
            &copy(row(Level::Primary, 1), row(Level::Secondary, 0), 0),
            &whole(g),
            POOLS,
        );
        assert_eq!(d.flags, 0);
    }

    #[test]
    fn independent_copies_are_one_wave() {
        let mut plan = CopyPlan::default();
        let copies = [
            copy(row(Level::Secondary, 0), row(Level::Primary, 0), 0),
            copy(row(Level::Secondary, 1), row(Level::Primary, 1), 0),
            copy(row(Level::Primary, 2), row(Level::Secondary, 2), 0),
        ];
        plan.build(&copies, &geometry().into(), &[POOLS]);
        assert_eq!(plan.descriptors.len(), 3);
        assert_eq!(plan.waves, vec![0..3]);
        assert_eq!(plan.slices_per_copy(), 1);
    }

    #[test]
    fn a_copy_into_a_row_read_earlier_starts_a_new_wave() {
        // Offload primary row 4, then onboard into it: the onboard must not overtake the read.
        let mut plan = CopyPlan::default();
        let copies = [
            copy(row(Level::Primary, 4), row(Level::Secondary, 0), 0),
            copy(row(Level::Secondary, 7), row(Level::Primary, 4), 0),
            copy(row(Level::Secondary, 8), row(Level::Primary, 5), 0),
        ];
        plan.build(&copies, &geometry().into(), &[POOLS]);
        assert_eq!(plan.waves, vec![0..1, 1..3]);
    }

    #[test]
    fn reading_a_row_written_earlier_or_writing_it_twice_starts_a_new_wave() {
        let mut plan = CopyPlan::default();
        let copies = [
            copy(row(Level::Secondary, 0), row(Level::Primary, 0), 0),
            copy(row(Level::Primary, 0), row(Level::Primary, 1), 2), // reads what the first wrote
            copy(row(Level::Secondary, 3), row(Level::Primary, 1), 0), // rewrites row 1
        ];
        plan.build(&copies, &geometry().into(), &[POOLS]);
        assert_eq!(plan.waves, vec![0..1, 1..2, 2..3]);
    }

    #[test]
    fn self_copies_are_dropped_and_plans_reuse_their_buffers() {
        let mut plan = CopyPlan::default();
        let same = copy(row(Level::Primary, 2), row(Level::Primary, 2), 0);
        plan.build(&[same], &geometry().into(), &[POOLS]);
        assert!(plan.descriptors.is_empty() && plan.waves.is_empty());
        plan.build(
            &[copy(row(Level::Primary, 2), row(Level::Primary, 3), 0)],
            &geometry().into(),
            &[POOLS],
        );
        assert_eq!(plan.waves, vec![0..1]);
    }

    #[test]
    fn large_rows_are_split_across_ctas() {
        let mut g = geometry();
        g.num_layers = 64;
        g.num_kv_heads = 32; // 64 layers × K|V × 32 heads × 4 tokens × 8 × 2 bytes = 256 KiB
        let mut plan = CopyPlan::default();
        plan.build(
            &[copy(row(Level::Secondary, 0), row(Level::Primary, 0), 0)],
            &g.into(),
            &[POOLS],
        );
        assert_eq!(plan.max_copy_bytes, 256 * 1024);
        assert_eq!(plan.slices_per_copy(), 16);
    }

    #[test]
    fn every_pool_of_a_block_gets_a_descriptor() {
        // A K-only pool (partial copies allowed) and an NVFP4-like pool that moves whole.
        let k_only = PoolGeometry {
            kv_factor: 1,
            ..geometry()
        };
        let packed = PoolShape {
            geometry: geometry(),
            partial_copies: false,
            recurrent_state: false,
        };
        let layout = BlockLayout::new(vec![whole(k_only), packed]);
        let other = PoolAddresses([0x2000_0000, 0x8000_0000]);
        let mut plan = CopyPlan::default();
        plan.build(
            &[copy(row(Level::Primary, 1), row(Level::Primary, 2), 3)],
            &layout,
            &[POOLS, other],
        );
        assert_eq!(plan.descriptors.len(), 2);
        assert_eq!(plan.waves, vec![0..2]);
        let (a, b) = (plan.descriptors[0], plan.descriptors[1]);
        assert_eq!(a.src, 0x1000_0000 + k_only.row_bytes() as u64);
        assert_eq!(
            (a.num_chunks as usize, a.chunk_bytes),
            (k_only.slabs_per_row(), 48)
        );
        assert_eq!(b.dst, 0x2000_0000 + 2 * geometry().row_bytes() as u64);
        assert_eq!(
            (b.num_chunks, b.chunk_bytes),
            (1, geometry().row_bytes() as u64)
        );
    }
}
