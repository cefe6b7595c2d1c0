//! A block of many pools for the tier tests: the layers of a model whose block has four data
//! pools (an MLA-like K-only latent, GQA layers of another shape, NVFP4 with its block-scale
//! pool, a sparse-attention indexer) and a byte pattern per (block, pool, byte) to write and
//! check through every pool's rows.
#![allow(dead_code)]

use kvblock::manager::KvCacheManager;
use kvblock::pool::Level;
use kvblock::pool_model::{CacheType, KvDataType, LayerSpec};

/// Pools of a block of `layers(..)`: four data pools and one block-scale pool.
pub const POOLS: usize = 5;

/// The model's layers, all in window `window`.
pub fn layers(window: usize) -> Vec<LayerSpec> {
    let spec = |cache_type, heads, size, data_type| LayerSpec {
        window_size: window,
        cache_type,
        num_kv_heads: heads,
        size_per_head: size,
        data_type,
    };
    vec![
        spec(CacheType::SelfKOnly, 1, 24, KvDataType::Fp8),
        spec(CacheType::SelfKv, 2, 4, KvDataType::Fp16),
        spec(CacheType::SelfKv, 1, 16, KvDataType::Nvfp4),
        spec(CacheType::IndexerK, 1, 12, KvDataType::Fp8),
    ]
}

/// The pattern byte `i` of pool `pool`'s row of the block whose first token is `token`.
pub fn pool_byte(token: i32, pool: usize, i: usize) -> u8 {
    ((token.rem_euclid(89) as usize * 7 + pool * 31 + i) % 251 + 1) as u8
}

/// Calls `f(block index, pool, row)` for the primary row of every pool of `id`'s blocks
/// (host-memory pools).
pub fn for_each_pool_row(
    m: &mut KvCacheManager,
    id: u64,
    window: usize,
    mut f: impl FnMut(usize, usize, &mut [u8]),
) {
    let blocks = m.cache_block_ids(id, window, 0).unwrap();
    let pools = m.pool_model().pools().len();
    for (bi, &b) in blocks.iter().enumerate() {
        let index = m.window_mut(window).unwrap().arena().row(b).index as usize;
        for p in 0..pools {
            let (base, row_bytes) = m.model_pool_pointer(p, Level::Primary).unwrap();
            // SAFETY: the host backend's pool `p` holds a row of `row_bytes` per block.
            let row =
                unsafe { std::slice::from_raw_parts_mut(base.add(index * row_bytes), row_bytes) };
            f(bi, p, row);
        }
    }
}

/// Writes the pattern of `tokens` into every pool's row of `id`'s blocks.
pub fn write_pattern(m: &mut KvCacheManager, id: u64, window: usize, tokens: &[i32], tpb: usize) {
    for_each_pool_row(m, id, window, |bi, pool, row| {
        for (i, byte) in row.iter_mut().enumerate() {
            *byte = pool_byte(tokens[bi * tpb], pool, i);
        }
    });
}

/// Checks the pattern of `tokens` in every pool's row of `id`'s first `blocks` blocks.
pub fn check_pattern(
    m: &mut KvCacheManager,
    id: u64,
    window: usize,
    tokens: &[i32],
    tpb: usize,
    blocks: usize,
) {
    let mut checked = 0;
    for_each_pool_row(m, id, window, |bi, pool, row| {
        if bi < blocks {
            for (i, &byte) in row.iter().enumerate() {
                let want = pool_byte(tokens[bi * tpb], pool, i);
                assert_eq!(byte, want, "block {bi}, pool {pool}, byte {i}");
            }
            checked += 1;
        }
    });
    assert_eq!(checked, blocks * POOLS, "every pool of every block");
}
