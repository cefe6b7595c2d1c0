//! From pairs of rows to transfer descriptors: for every pool of the rows' window, the bytes of
//! the local row and of the peer's row, whole (identical layouts) or per (layer, K|V) head
//! slice (another tensor-parallel split), then merged where both sides are adjacent.

use super::backend::{merge_descriptors, Desc};
use super::layout::{Layout, LayoutPlan, PoolLayout};
use crate::error::{KvError, KvResult};

/// The descriptors of one transfer, before and after merging.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Descriptors {
    pub local: Vec<Desc>,
    pub remote: Vec<Desc>,
    /// Descriptors before merging adjacent ones.
    pub unmerged: usize,
    pub bytes: u64,
}

/// One row of one window here and the peer's row that corresponds to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowPair {
    pub window_size: u64,
    pub local_row: u32,
    pub remote_row: u32,
}

/// The descriptors moving each pair's rows in every pool of its window (pools in layout order,
/// rows in the order given, so runs of rows merge). `plan` must come from `layout::plan` for
/// these two layouts.
pub fn build(
    local: &Layout,
    remote: &Layout,
    plan: &LayoutPlan,
    pairs: &[RowPair],
) -> KvResult<Descriptors> {
    if let LayoutPlan::Unsupported(why) = plan {
        return Err(KvError::Unsupported(format!("layouts do not match: {why}")));
    }
    let mut loc = Vec::new();
    let mut rem = Vec::new();
    let mut bytes = 0u64;
    for (i, (lp, rp)) in local.pools.iter().zip(&remote.pools).enumerate() {
        for pair in pairs.iter().filter(|p| p.window_size == lp.window_size) {
            let l = row_start(lp, pair.local_row, "here", i)?;
            let r = row_start(rp, pair.remote_row, "at the peer", i)?;
            match *plan {
                LayoutPlan::Identical => {
                    loc.push(Desc {
                        addr: l,
                        len: lp.row_bytes,
                    });
                    rem.push(Desc {
                        addr: r,
                        len: rp.row_bytes,
                    });
                    bytes += lp.row_bytes;
                }
                LayoutPlan::HeadSliced {
                    local_first,
                    remote_first,
                    heads,
                } => {
                    let slab = lp.head_slab_bytes();
                    let len = slab * heads as u64;
                    for outer in 0..lp.num_layers as u64 * lp.kv_factor as u64 {
                        let lo = (outer * lp.num_kv_heads as u64 + local_first as u64) * slab;
                        let ro = (outer * rp.num_kv_heads as u64 + remote_first as u64) * slab;
                        loc.push(Desc { addr: l + lo, len });
                        rem.push(Desc { addr: r + ro, len });
                        bytes += len;
                    }
                }
                LayoutPlan::Unsupported(_) => unreachable!("refused above"),
            }
        }
    }
    let unmerged = loc.len();
    let (local, remote) = merge_descriptors(&loc, &rem);
    Ok(Descriptors {
        local,
        remote,
        unmerged,
        bytes,
    })
}

fn row_start(pool: &PoolLayout, row: u32, side: &str, i: usize) -> KvResult<u64> {
    pool.row_address(row).ok_or_else(|| {
        KvError::InvalidArgument(format!(
            "row {row} of pool {i} {side} is outside its {} rows",
            pool.num_rows
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disagg::layout::plan;

    fn layout(heads: u32, rank: u32, size: u32, base: u64) -> Layout {
        let p = PoolLayout {
            window_size: 64,
            index_in_window: 0,
            cache_type: 0,
            data_type: 2,
            num_layers: 2,
            kv_factor: 2,
            num_kv_heads: heads,
            size_per_head: 4,
            unit_bytes: 2,
            row_tokens: 4,
            row_bytes: 2 * 2 * heads as u64 * 32,
            num_rows: 16,
            base,
            device: -1,
        };
        Layout {
            tokens_per_block: 4,
            tp_rank: rank,
            tp_size: size,
            pools: vec![p],
        }
    }

    fn pairs(rows: &[(u32, u32)]) -> Vec<RowPair> {
        rows.iter()
            .map(|&(l, r)| RowPair {
                window_size: 64,
                local_row: l,
                remote_row: r,
            })
            .collect()
    }

    #[test]
    fn identical_rows_merge_where_both_sides_are_runs() {
        let (a, b) = (layout(2, 0, 1, 0x10000), layout(2, 0, 1, 0x90000));
        let p = plan(&a, &b);
        let d = build(&a, &b, &p, &pairs(&[(1, 5), (2, 6), (3, 7), (9, 8)])).unwrap();
        let row = 2 * 2 * 2 * 32;
        assert_eq!(d.unmerged, 4);
        assert_eq!(d.bytes, 4 * row);
        assert_eq!(
            d.local,
            vec![
                Desc {
                    addr: 0x10000 + row,
                    len: 3 * row
                },
                Desc {
                    addr: 0x10000 + 9 * row,
                    len: row
                },
            ]
        );
        assert_eq!(
            d.remote[0],
            Desc {
                addr: 0x90000 + 5 * row,
                len: 3 * row
            }
        );
        assert!(
            build(&a, &b, &p, &pairs(&[(16, 0)])).is_err(),
            "row outside the pool"
        );
    }

    #[test]
    fn head_slices_address_the_shared_heads_of_each_slab() {
        // Sender with 4 heads (tensor-parallel 1) into decode rank 1 of 2 (2 heads each).
        let (a, b) = (layout(4, 0, 1, 0), layout(2, 1, 2, 0x100000));
        let p = plan(&a, &b);
        let d = build(&a, &b, &p, &pairs(&[(0, 0)])).unwrap();
        let slab = 32u64;
        assert_eq!(d.unmerged, 4, "one per (layer, K|V)");
        assert_eq!(d.bytes, 4 * 2 * slab);
        for (outer, (l, r)) in d.local.iter().zip(&d.remote).enumerate() {
            let outer = outer as u64;
            assert_eq!(l.addr, (outer * 4 + 2) * slab);
            assert_eq!(r.addr, 0x100000 + outer * 2 * slab);
            assert_eq!((l.len, r.len), (2 * slab, 2 * slab));
        }
        let unsupported = LayoutPlan::Unsupported("x".into());
        assert!(build(&a, &b, &unsupported, &pairs(&[(0, 0)])).is_err());
    }
}
