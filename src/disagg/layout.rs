//! The layout handshake: what each engine tells its peer about its pools before KV moves, and
//! the plan that says whether rows move as they are, as head slices (another tensor-parallel
//! size), or not at all (and why).

use super::wire::{Reader, Writer};
use crate::error::KvResult;

const MAGIC: &[u8; 4] = b"KVBL";
/// Version of the encoding; a peer with another version is refused by name.
pub const LAYOUT_VERSION: u32 = 1;
/// More pools than any model has: bounds what a hostile peer can make the reader allocate.
const MAX_POOLS: usize = 4096;
const POOL_RECORD_BYTES: usize = 8 * 4 + 4 * 9;

/// One pool (at the GPU level) of one window: its geometry and where its rows are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolLayout {
    pub window_size: u64,
    pub index_in_window: u32,
    /// `CacheType` as its number.
    pub cache_type: u32,
    /// `KvDataType` as its number.
    pub data_type: u32,
    pub num_layers: u32,
    pub kv_factor: u32,
    pub num_kv_heads: u32,
    pub size_per_head: u32,
    /// Bytes per stored element unit of the geometry.
    pub unit_bytes: u32,
    /// Token slots per row (1 for a recurrent-state pool).
    pub row_tokens: u32,
    pub row_bytes: u64,
    pub num_rows: u64,
    /// Address of row 0 in the owning process.
    pub base: u64,
    /// The GPU holding the pool, or -1 for host memory.
    pub device: i32,
}

impl PoolLayout {
    /// Bytes of one (layer, K|V, head) slab of a row.
    pub fn head_slab_bytes(&self) -> u64 {
        self.row_tokens as u64 * self.size_per_head as u64 * self.unit_bytes as u64
    }

    fn slab_count(&self) -> Option<u64> {
        (self.num_layers as u64)
            .checked_mul(self.kv_factor as u64)?
            .checked_mul(self.num_kv_heads as u64)
    }

    /// The bytes of one row at `row`, checked against the pool's extent.
    pub fn row_address(&self, row: u32) -> Option<u64> {
        if row as u64 >= self.num_rows {
            return None;
        }
        self.base.checked_add(row as u64 * self.row_bytes)
    }
}

/// Everything a peer needs to address this engine's pools.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub tokens_per_block: u32,
    /// Tensor-parallel rank and size of this engine's manager (heads are split by rank).
    pub tp_rank: u32,
    pub tp_size: u32,
    /// Every pool of every window, windows ascending, pools in window order.
    pub pools: Vec<PoolLayout>,
}

impl Layout {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new(MAGIC, LAYOUT_VERSION);
        w.u32(self.tokens_per_block);
        w.u32(self.tp_rank);
        w.u32(self.tp_size);
        w.u32(self.pools.len() as u32);
        for p in &self.pools {
            w.u64(p.window_size);
            w.u64(p.row_bytes);
            w.u64(p.num_rows);
            w.u64(p.base);
            for v in [
                p.index_in_window,
                p.cache_type,
                p.data_type,
                p.num_layers,
                p.kv_factor,
                p.num_kv_heads,
                p.size_per_head,
                p.unit_bytes,
                p.row_tokens,
            ] {
                w.u32(v);
            }
        }
        for p in &self.pools {
            w.i32(p.device);
        }
        w.finish()
    }

    /// Reads a peer's layout, refusing anything inconsistent: a row size that is not the
    /// product of the geometry, a pool whose extent overflows, a rank outside the size.
    pub fn decode(bytes: &[u8]) -> KvResult<Layout> {
        let mut r = Reader::new(bytes, MAGIC, LAYOUT_VERSION, "peer layout")?;
        let tokens_per_block = r.u32()?;
        let tp_rank = r.u32()?;
        let tp_size = r.u32()?;
        let n = r.count(POOL_RECORD_BYTES + 4, MAX_POOLS)?;
        let mut pools = Vec::with_capacity(n);
        for _ in 0..n {
            let (window_size, row_bytes, num_rows, base) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
            let mut f = [0u32; 9];
            for v in &mut f {
                *v = r.u32()?;
            }
            pools.push(PoolLayout {
                window_size,
                index_in_window: f[0],
                cache_type: f[1],
                data_type: f[2],
                num_layers: f[3],
                kv_factor: f[4],
                num_kv_heads: f[5],
                size_per_head: f[6],
                unit_bytes: f[7],
                row_tokens: f[8],
                row_bytes,
                num_rows,
                base,
                device: 0,
            });
        }
        for p in &mut pools {
            p.device = r.i32()?;
        }
        let layout = Layout {
            tokens_per_block,
            tp_rank,
            tp_size,
            pools,
        };
        if tokens_per_block == 0 || tp_size == 0 || tp_rank >= tp_size {
            return Err(r.error(&format!(
                "tokens per block {tokens_per_block}, tensor-parallel rank {tp_rank} of {tp_size}"
            )));
        }
        for (i, p) in layout.pools.iter().enumerate() {
            let slabs = p.slab_count();
            let row = slabs.and_then(|s| s.checked_mul(p.head_slab_bytes()));
            let end = p
                .num_rows
                .checked_mul(p.row_bytes)
                .and_then(|b| b.checked_add(p.base));
            if row != Some(p.row_bytes) || end.is_none() || p.device < -1 {
                return Err(r.error(&format!(
                    "pool {i}: row of {} bytes does not match its geometry, or its extent \
                     overflows",
                    p.row_bytes
                )));
            }
        }
        r.end()?;
        Ok(layout)
    }
}

/// How the rows of one engine map onto a peer's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayoutPlan {
    /// Same pools and geometry: row i of a pool goes whole to the peer's row.
    Identical,
    /// Same model, another tensor-parallel split of the KV heads: each (layer, K|V) of a row
    /// moves the heads both ranks hold, `heads` of them, from head `local_first` of the sender's
    /// rows to head `remote_first` of the receiver's (one strided descriptor per slab).
    HeadSliced {
        local_first: u32,
        remote_first: u32,
        heads: u32,
    },
    /// Nothing can move between these layouts; the reason names the first difference.
    Unsupported(String),
}

/// The plan for moving rows from `local`'s pools to `remote`'s (or back: it is symmetric in
/// what it checks).
pub fn plan(local: &Layout, remote: &Layout) -> LayoutPlan {
    let no = |why: String| LayoutPlan::Unsupported(why);
    if local.tokens_per_block != remote.tokens_per_block {
        return no(format!(
            "tokens per block differ: {} here, {} at the peer",
            local.tokens_per_block, remote.tokens_per_block
        ));
    }
    if local.pools.len() != remote.pools.len() {
        return no(format!(
            "{} pools here, {} at the peer",
            local.pools.len(),
            remote.pools.len()
        ));
    }
    let mut heads: Option<(u32, u32)> = None;
    for (i, (a, b)) in local.pools.iter().zip(&remote.pools).enumerate() {
        let fields = [
            ("window size", a.window_size, b.window_size),
            ("cache type", a.cache_type as u64, b.cache_type as u64),
            ("data type", a.data_type as u64, b.data_type as u64),
            ("layers", a.num_layers as u64, b.num_layers as u64),
            ("K/V factor", a.kv_factor as u64, b.kv_factor as u64),
            ("head size", a.size_per_head as u64, b.size_per_head as u64),
            ("element bytes", a.unit_bytes as u64, b.unit_bytes as u64),
            (
                "token slots per row",
                a.row_tokens as u64,
                b.row_tokens as u64,
            ),
        ];
        if let Some((name, x, y)) = fields.iter().find(|(_, x, y)| x != y) {
            return no(format!(
                "pool {i}: {name} differs: {x} here, {y} at the peer"
            ));
        }
        let pair = (a.num_kv_heads, b.num_kv_heads);
        if *heads.get_or_insert(pair) != pair {
            return no(format!(
                "pool {i}: the head split differs from pool 0's ({} and {} heads)",
                a.num_kv_heads, b.num_kv_heads
            ));
        }
    }
    let Some((local_heads, remote_heads)) = heads else {
        return no("no pools".into());
    };
    if local_heads == remote_heads && local.tp_size == remote.tp_size {
        return LayoutPlan::Identical;
    }
    let total = |heads: u32, tp: u32| heads as u64 * tp as u64;
    if total(local_heads, local.tp_size) != total(remote_heads, remote.tp_size) {
        return no(format!(
            "{local_heads} heads × tensor-parallel {} here, {remote_heads} × {} at the peer: not \
             the same model",
            local.tp_size, remote.tp_size
        ));
    }
    // Global head ranges of the two ranks; what both hold moves.
    let lo_l = local.tp_rank as u64 * local_heads as u64;
    let lo_r = remote.tp_rank as u64 * remote_heads as u64;
    let lo = lo_l.max(lo_r);
    let hi = (lo_l + local_heads as u64).min(lo_r + remote_heads as u64);
    if lo >= hi {
        return no(format!(
            "rank {} here and rank {} at the peer hold no head in common",
            local.tp_rank, remote.tp_rank
        ));
    }
    LayoutPlan::HeadSliced {
        local_first: (lo - lo_l) as u32,
        remote_first: (lo - lo_r) as u32,
        heads: (hi - lo) as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(heads: u32) -> PoolLayout {
        PoolLayout {
            window_size: 128,
            index_in_window: 0,
            cache_type: 0,
            data_type: 2,
            num_layers: 2,
            kv_factor: 2,
            num_kv_heads: heads,
            size_per_head: 8,
            unit_bytes: 2,
            row_tokens: 4,
            row_bytes: 2 * 2 * heads as u64 * 4 * 8 * 2,
            num_rows: 10,
            base: 0x1000,
            device: -1,
        }
    }

    fn layout(heads: u32, rank: u32, size: u32) -> Layout {
        Layout {
            tokens_per_block: 4,
            tp_rank: rank,
            tp_size: size,
            pools: vec![pool(heads)],
        }
    }

    #[test]
    fn encode_decode_round_trip_and_garbage_refused() {
        let l = layout(4, 1, 2);
        let bytes = l.encode();
        assert_eq!(Layout::decode(&bytes).unwrap(), l);
        for cut in 0..bytes.len() {
            assert!(Layout::decode(&bytes[..cut]).is_err(), "truncated at {cut}");
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(Layout::decode(&extra).is_err());
        let mut bad_row = layout(4, 0, 1);
        bad_row.pools[0].row_bytes += 1;
        assert!(Layout::decode(&bad_row.encode()).is_err());
        let mut huge = bytes.clone();
        huge[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Layout::decode(&huge).is_err(), "a huge pool count");
        assert!(
            Layout::decode(&layout(4, 2, 2).encode()).is_err(),
            "rank outside size"
        );
        let mut version = bytes;
        version[4] = 9;
        let e = Layout::decode(&version).unwrap_err().to_string();
        assert!(e.contains("version 9"), "{e}");
    }

    #[test]
    fn plans_identical_head_sliced_and_unsupported() {
        assert_eq!(
            plan(&layout(4, 0, 1), &layout(4, 0, 1)),
            LayoutPlan::Identical
        );
        // Prefill with tensor-parallel 1 (8 heads) to decode rank 1 of 2 (4 heads each).
        assert_eq!(
            plan(&layout(8, 0, 1), &layout(4, 1, 2)),
            LayoutPlan::HeadSliced {
                local_first: 4,
                remote_first: 0,
                heads: 4
            }
        );
        // Prefill rank 1 of 2 into a decode with all 8 heads.
        assert_eq!(
            plan(&layout(4, 1, 2), &layout(8, 0, 1)),
            LayoutPlan::HeadSliced {
                local_first: 0,
                remote_first: 4,
                heads: 4
            }
        );
        let why = |p: LayoutPlan| match p {
            LayoutPlan::Unsupported(w) => w,
            p => panic!("{p:?}"),
        };
        assert!(why(plan(&layout(4, 0, 1), &layout(8, 0, 1))).contains("not the same model"));
        let mut other_tpb = layout(4, 0, 1);
        other_tpb.tokens_per_block = 8;
        assert!(why(plan(&layout(4, 0, 1), &other_tpb)).contains("tokens per block"));
        let mut other_type = layout(4, 0, 1);
        other_type.pools[0].data_type = 3;
        assert!(why(plan(&layout(4, 0, 1), &other_type)).contains("data type"));
        assert!(why(plan(&layout(2, 0, 4), &layout(4, 1, 2))).contains("no head in common"));
    }
}
