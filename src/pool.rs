//! The block arena of one window: for every block, the memory row it owns (level and row index)
//! and its reference counts. Rows move between levels only by swapping two blocks' rows.

use crate::premixed::PremixedMap;

/// Cache level of a memory row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    /// GPU memory (or whatever the engine's kernels address).
    Primary = 0,
    /// Host memory, the offload tier.
    Secondary = 1,
}

/// A memory row: the row index inside the pools of one level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemRow {
    pub level: Level,
    pub index: u32,
}

/// Geometry of a window's pool: one row per block holds `[layers][kv][heads][tpb][head]`
/// elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolGeometry {
    pub num_layers: usize,
    pub kv_factor: usize,
    pub num_kv_heads: usize,
    pub size_per_head: usize,
    pub tokens_per_block: usize,
    pub bytes_per_element: usize,
}

impl PoolGeometry {
    /// Bytes of one token's slice of one head.
    pub fn token_bytes(&self) -> usize {
        self.size_per_head * self.bytes_per_element
    }

    /// Bytes of one (layer, K|V, head) slab of a row: `tpb` tokens.
    pub fn head_slab_bytes(&self) -> usize {
        self.tokens_per_block * self.token_bytes()
    }

    /// Bytes of a whole row (one block, all layers of the window).
    pub fn row_bytes(&self) -> usize {
        self.num_layers * self.kv_factor * self.num_kv_heads * self.head_slab_bytes()
    }

    /// `row_bytes`, or `None` when it, or any partial product the other sizes compute
    /// (`token_bytes`, `head_slab_bytes`, `slabs_per_row`), overflows `usize`. Each is checked in
    /// the order those functions multiply: with a zero size the row is empty, yet a partial
    /// product of the others can still overflow.
    pub fn checked_row_bytes(&self) -> Option<usize> {
        let token = self.size_per_head.checked_mul(self.bytes_per_element)?;
        let slab = self.tokens_per_block.checked_mul(token)?;
        let slabs = self
            .num_layers
            .checked_mul(self.kv_factor)?
            .checked_mul(self.num_kv_heads)?;
        slabs.checked_mul(slab)
    }

    /// Number of (layer, K|V, head) slabs in a row.
    pub fn slabs_per_row(&self) -> usize {
        self.num_layers * self.kv_factor * self.num_kv_heads
    }
}

/// One pool of a window as the copy engines see it: its geometry, and whether a partial copy
/// may move only the first tokens of each slab (packed FP4 data and block scales are
/// interleaved, so their blocks always move whole, as in TensorRT-LLM), and whether it holds
/// recurrent state (no token dimension: a state copy moves only such pools).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolShape {
    pub geometry: PoolGeometry,
    pub partial_copies: bool,
    pub recurrent_state: bool,
}

/// The pools of one window. A block owns the same row index in every pool of its window, so
/// moving a block moves that row of each pool: the pools together are the block's bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockLayout {
    pools: Vec<PoolShape>,
}

impl BlockLayout {
    pub fn new(pools: Vec<PoolShape>) -> Self {
        BlockLayout { pools }
    }

    pub fn pools(&self) -> &[PoolShape] {
        &self.pools
    }

    /// The first pool's geometry (the only one of a uniform window).
    pub fn first(&self) -> Option<&PoolGeometry> {
        self.pools.first().map(|p| &p.geometry)
    }

    /// Bytes of one block over all pools.
    pub fn row_bytes(&self) -> usize {
        self.pools.iter().map(|p| p.geometry.row_bytes()).sum()
    }

    /// `row_bytes`, or `None` when any pool's sizes or their sum overflow.
    pub fn checked_row_bytes(&self) -> Option<usize> {
        self.pools.iter().try_fold(0usize, |sum, p| {
            sum.checked_add(p.geometry.checked_row_bytes()?)
        })
    }
}

impl From<PoolGeometry> for BlockLayout {
    /// A window of one pool whose blocks may be partially copied.
    fn from(geometry: PoolGeometry) -> Self {
        BlockLayout::new(vec![PoolShape {
            geometry,
            partial_copies: true,
            recurrent_state: false,
        }])
    }
}

impl From<&BlockLayout> for BlockLayout {
    fn from(layout: &BlockLayout) -> Self {
        layout.clone()
    }
}

/// A `MemRow` in 4 bytes: the level in the top bit, the row index below.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PackedRow(u32);

const SECONDARY_BIT: u32 = 1 << 31;

impl PackedRow {
    fn new(row: MemRow) -> Self {
        debug_assert!(row.index < SECONDARY_BIT);
        PackedRow(
            row.index
                | if row.level == Level::Secondary {
                    SECONDARY_BIT
                } else {
                    0
                },
        )
    }
    fn get(self) -> MemRow {
        MemRow {
            level: if self.0 & SECONDARY_BIT != 0 {
                Level::Secondary
            } else {
                Level::Primary
            },
            index: self.0 & !SECONDARY_BIT,
        }
    }
}

/// Per-block rows and reference counts: 8 bytes per block. Pins and the scheduling
/// simulation's counts, which touch few blocks, are kept in side tables.
#[derive(Clone, Debug)]
pub struct BlockArena {
    rows: Vec<PackedRow>,
    /// The block owning each row (primary rows `0..P`, then secondary rows): the inverse of
    /// `rows`, for finding a row's neighbour (contiguous-run allocation).
    owners: Vec<u32>,
    ref_count: Vec<u32>,
    /// Pins per pinned block.
    pins: PremixedMap<u32, u32>,
    /// Scheduling references of the blocks the current simulation touched.
    scheduling_ref: PremixedMap<u32, u32>,
    num_primary: usize,
}

impl BlockArena {
    /// Blocks `0..P` own primary rows `0..P`; blocks `P..P+S` own secondary rows `0..S`.
    pub fn new(num_primary: usize, num_secondary: usize) -> Self {
        let rows = (0..num_primary)
            .map(|i| MemRow {
                level: Level::Primary,
                index: i as u32,
            })
            .chain((0..num_secondary).map(|i| MemRow {
                level: Level::Secondary,
                index: i as u32,
            }))
            .map(PackedRow::new)
            .collect();
        let n = num_primary + num_secondary;
        BlockArena {
            rows,
            owners: (0..n as u32).collect(),
            ref_count: vec![0; n],
            pins: PremixedMap::default(),
            scheduling_ref: PremixedMap::default(),
            num_primary,
        }
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn num_primary(&self) -> usize {
        self.num_primary
    }

    pub fn num_secondary(&self) -> usize {
        self.rows.len() - self.num_primary
    }

    pub fn row(&self, block: u32) -> MemRow {
        self.rows[block as usize].get()
    }

    pub fn level(&self, block: u32) -> Level {
        self.row(block).level
    }

    pub fn is_primary(&self, block: u32) -> bool {
        self.level(block) == Level::Primary
    }

    /// Exchanges the memory rows of two blocks (the data copy is the copy engine's business).
    pub fn swap_rows(&mut self, a: u32, b: u32) {
        self.rows.swap(a as usize, b as usize);
        let (ra, rb) = (self.slot_of(self.row(a)), self.slot_of(self.row(b)));
        self.owners[ra] = a;
        self.owners[rb] = b;
    }

    fn slot_of(&self, row: MemRow) -> usize {
        match row.level {
            Level::Primary => row.index as usize,
            Level::Secondary => self.num_primary + row.index as usize,
        }
    }

    /// The block that owns `row`, if the row exists.
    pub fn block_at(&self, row: MemRow) -> Option<u32> {
        let in_range = match row.level {
            Level::Primary => (row.index as usize) < self.num_primary,
            Level::Secondary => (row.index as usize) < self.num_secondary(),
        };
        in_range.then(|| self.owners[self.slot_of(row)])
    }

    /// Prefetches the reference count of `block` (the next allocation's victim).
    pub fn prefetch(&self, block: u32) {
        crate::prefetch::prefetch(&self.ref_count[block as usize]);
    }

    /// Prefetches what releasing `block` reads here (reference count and row).
    pub fn prefetch_for_release(&self, block: u32) {
        crate::prefetch::prefetch(&self.ref_count[block as usize]);
        crate::prefetch::prefetch(&self.rows[block as usize]);
    }

    pub fn ref_count(&self, block: u32) -> u32 {
        self.ref_count[block as usize]
    }

    pub fn add_refs(&mut self, block: u32, n: u32) {
        self.ref_count[block as usize] += n;
    }

    /// Drops one reference; returns the remaining count.
    pub fn remove_ref(&mut self, block: u32) -> u32 {
        let rc = &mut self.ref_count[block as usize];
        debug_assert!(*rc > 0, "block {block} has no reference to drop");
        *rc -= 1;
        *rc
    }

    pub fn pins(&self, block: u32) -> u32 {
        self.pins.get(&block).copied().unwrap_or(0)
    }

    pub fn pin(&mut self, block: u32) {
        *self.pins.entry(block).or_insert(0) += 1;
        self.ref_count[block as usize] += 1;
    }

    /// Drops a pin and its reference; returns the remaining reference count.
    pub fn unpin(&mut self, block: u32) -> u32 {
        let pins = self.pins.get_mut(&block).expect("block is pinned");
        *pins -= 1;
        if *pins == 0 {
            self.pins.remove(&block);
        }
        self.remove_ref(block)
    }

    /// Starts a scheduling simulation: every block's scheduling refs become its refs (lazily).
    pub fn start_scheduling(&mut self) {
        self.scheduling_ref.clear();
    }

    /// Drops one scheduling reference; returns whether the block would become free.
    pub fn scheduling_remove_ref(&mut self, block: u32) -> bool {
        let refs = self.ref_count[block as usize];
        let r = self.scheduling_ref.entry(block).or_insert(refs);
        if *r == 0 {
            return false;
        }
        *r -= 1;
        *r == 0
    }

    /// Checks that rows form a permutation: `P` primary and `S` secondary distinct rows.
    pub fn verify_rows(&self) -> Result<(), String> {
        let mut seen = [
            vec![false; self.num_primary],
            vec![false; self.num_secondary()],
        ];
        for (b, row) in self.rows.iter().map(|r| r.get()).enumerate() {
            let slot = seen[row.level as usize].get_mut(row.index as usize);
            match slot {
                Some(s) if !*s => *s = true,
                _ => {
                    return Err(format!(
                        "block {b} owns an invalid or duplicate row {row:?}"
                    ))
                }
            }
            if self.owners[self.slot_of(row)] != b as u32 {
                return Err(format!(
                    "row {row:?} of block {b} is listed under another block"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {

    /// A zero size makes an empty row, but the other sizes' partial products must still fit
    /// (the fuzz target found `num_layers = 0` with a huge head size overflowing a statistic).
    #[test]
    fn checked_row_bytes_covers_partial_products() {
        let g = PoolGeometry {
            num_layers: 0,
            kv_factor: 2,
            num_kv_heads: 1,
            size_per_head: usize::MAX / 2,
            tokens_per_block: 4,
            bytes_per_element: 1,
        };
        assert_eq!(g.checked_row_bytes(), None);
        let fine = PoolGeometry {
            num_layers: 3,
            size_per_head: 8,
            ..g
        };
        assert_eq!(fine.checked_row_bytes(), Some(fine.row_bytes()));
    }
    use super::*;

    #[test]
    fn rows_start_split_by_level_and_swap() {
        let mut a = BlockArena::new(2, 1);
        assert!(a.is_primary(1));
        assert_eq!(a.level(2), Level::Secondary);
        a.swap_rows(1, 2);
        assert_eq!(
            a.row(1),
            MemRow {
                level: Level::Secondary,
                index: 0
            }
        );
        assert!(a.is_primary(2));
        a.verify_rows().unwrap();
    }

    #[test]
    fn pins_are_references() {
        let mut a = BlockArena::new(1, 0);
        a.add_refs(0, 2);
        a.pin(0);
        assert_eq!(a.ref_count(0), 3);
        assert_eq!(a.unpin(0), 2);
        assert_eq!(a.pins(0), 0);
    }

    #[test]
    fn scheduling_refs_are_reset_per_epoch() {
        let mut a = BlockArena::new(1, 0);
        a.add_refs(0, 2);
        a.start_scheduling();
        assert!(!a.scheduling_remove_ref(0));
        assert!(a.scheduling_remove_ref(0));
        a.start_scheduling();
        assert!(
            !a.scheduling_remove_ref(0),
            "a new simulation starts from the real refs"
        );
    }

    #[test]
    fn geometry_sizes() {
        let g = PoolGeometry {
            num_layers: 2,
            kv_factor: 2,
            num_kv_heads: 3,
            size_per_head: 4,
            tokens_per_block: 8,
            bytes_per_element: 2,
        };
        assert_eq!(g.head_slab_bytes(), 64);
        assert_eq!(g.row_bytes(), 2 * 2 * 3 * 64);
    }
}
