//! Regressions found by the random runs, as fixed scenarios.

use kvblock::manager::{CopyBackend, KvCacheManager, ManagerConfig, Request};
use kvblock::pool::Level;

use crate::common::{self, window};
use crate::model::TPB;

// ---- Regressions found by the random runs --------------------------------------------------
//
// A sliding window detaches a sequence's out-of-window front blocks while the sequence keeps
// them listed; storing the sequence later inserts those blocks under its tokens. That is only
// correct while nobody replaced their content, which the manager tracks per block (TensorRT-LLM
// `KVCacheManagerSWAInvalidateReuseTest`: taking a detached block invalidates the owner's
// store-for-reuse). Allocation did; explicit offload and partial-reuse takeover did not.

/// Windows 8 (sliding) and 32, 4 tokens per block, host pools of 8-byte rows
/// ([K slots 0..4][V slots 0..4], one byte per token slot).
fn swa_host_manager(secondary: usize) -> KvCacheManager {
    let spec = |w| window(w, 8, secondary);
    KvCacheManager::new(ManagerConfig {
        windows: vec![spec(8), spec(32)],
        tokens_per_block: TPB,
        max_sequence_length: 32,
        bytes_per_element: 1,
        copy_backend: CopyBackend::HostMemory,
        manual_clock: true,
        ..ManagerConfig::default()
    })
    .unwrap()
}

/// Writes `value` into the K and V slots `slots` of a block's primary row.
fn fill_slots(
    m: &mut KvCacheManager,
    w: usize,
    block: u32,
    slots: std::ops::Range<usize>,
    value: u8,
) {
    let info = m.block_info(w, block).unwrap();
    assert_eq!(info.level, Level::Primary);
    let (base, row_bytes) = m.pool_pointer(w, Level::Primary).unwrap();
    assert_eq!(row_bytes, 2 * TPB);
    // SAFETY: a primary row of the host pool.
    let row = unsafe {
        std::slice::from_raw_parts_mut(base.add(info.memory_index as usize * row_bytes), row_bytes)
    };
    for s in slots {
        row[s] = value;
        row[TPB + s] = value;
    }
}

/// The K and V bytes of slot `slot` of a block's primary row.
fn slot_bytes(m: &mut KvCacheManager, w: usize, block: u32, slot: usize) -> (u8, u8) {
    let info = m.block_info(w, block).unwrap();
    assert_eq!(info.level, Level::Primary);
    let (base, row_bytes) = m.pool_pointer(w, Level::Primary).unwrap();
    // SAFETY: a primary row of the host pool.
    let row = unsafe {
        std::slice::from_raw_parts(base.add(info.memory_index as usize * row_bytes), row_bytes)
    };
    (row[slot], row[TPB + slot])
}

/// Checks that every reused position of sequence `id` holds `value` in every window.
fn expect_reused_bytes(m: &mut KvCacheManager, id: u64, value: u8) {
    let prepop = m.admission(id).unwrap().prepopulated_prompt_len;
    for w in m.window_sizes() {
        let ids = m.cache_block_ids(id, w, 0).unwrap();
        for p in 0..prepop {
            let got = slot_bytes(m, w, ids[p / TPB], p % TPB);
            assert_eq!(got, (value, value), "window {w} position {p}");
        }
    }
}

/// Offloading a block into the host row of a detached (free, host-resident) block replaces that
/// block's content: its owner must no longer store it, or the tree would hand out foreign KV.
/// Found by `random_operations_variable_sliding_window`.
#[test]
fn explicit_offload_into_a_detached_block_invalidates_the_owner_store() {
    let mut m = swa_host_manager(1);
    m.add_sequence(&Request::new(1, (10..18).collect()))
        .unwrap();
    for w in [8, 32] {
        for b in m.cache_block_ids(1, w, 0).unwrap() {
            fill_slots(&mut m, w, b, 0..TPB, 0xaa);
        }
    }
    for t in 0..4 {
        m.add_token(1, 20 + t).unwrap();
    }
    // 12 tokens: window 8 detached the first block.
    assert_eq!(m.window(8).unwrap().front_blocks_removed(1), 1);
    let detached = m.cache_block_ids(1, 8, 0).unwrap()[0];
    assert!(m.block_info(8, detached).unwrap().is_free);
    // The detached block moves to the host tier (content kept) ...
    assert!(m.offload_block(8, detached).unwrap());
    // ... and the next offload takes its host row (the only free host block) for another block.
    let other = (0..m.window(8).unwrap().num_blocks() as u32)
        .find(|&b| {
            let i = m.block_info(8, b).unwrap();
            i.is_free && i.level == Level::Primary
        })
        .unwrap();
    assert!(m.offload_block(8, other).unwrap());
    assert_eq!(m.block_info(8, detached).unwrap().level, Level::Primary);
    m.check_invariants().unwrap();

    // Sequence 1 lost a detached block's content: releasing it stores nothing.
    common::prefill_done(&mut m, 1);
    m.remove_sequence(1, true).unwrap();
    let mut prompt: Vec<i32> = (10..18).collect();
    prompt.push(99);
    let a = m.add_sequence(&Request::new(2, prompt)).unwrap();
    expect_reused_bytes(&mut m, 2, 0xaa);
    assert_eq!(a.prepopulated_prompt_len, 0);
    m.check_invariants().unwrap();
}

/// Taking over a detached partial leaf lets the new sequence write it: the owner must no longer
/// store it (it would insert the taker's block under the owner's tokens).
/// Found by `random_operations_variable_sliding_window` (longer runs).
#[test]
fn takeover_of_a_detached_leaf_invalidates_the_owner_store() {
    let mut m = swa_host_manager(0);
    m.add_sequence(&Request::new(1, vec![10, 11, 12])).unwrap();
    common::prefill_done(&mut m, 1);
    // Stores tokens [10, 11] as a partial leaf in both windows.
    m.store_blocks_for_reuse(1, false, None, 0).unwrap();
    for w in [8, 32] {
        let b = m.cache_block_ids(1, w, 0).unwrap()[0];
        fill_slots(&mut m, w, b, 0..TPB, 0xaa);
    }
    for t in 0..9 {
        m.add_token(1, 20 + t).unwrap();
    }
    assert_eq!(m.window(8).unwrap().front_blocks_removed(1), 1);
    let leaf = m.cache_block_ids(1, 8, 0).unwrap()[0];
    let info = m.block_info(8, leaf).unwrap();
    assert!(info.is_free && info.in_reuse_tree && info.is_leaf);

    // Request 2 shares 2 tokens: window 8 takes the unused leaf over, window 32 copies.
    let b = m
        .add_sequence(&Request::new(2, vec![10, 11, 77, 78]))
        .unwrap();
    assert_eq!(b.prepopulated_prompt_len, 2);
    assert_eq!(m.cache_block_ids(2, 8, 0).unwrap()[0], leaf);
    expect_reused_bytes(&mut m, 2, 0xaa);
    fill_slots(&mut m, 8, leaf, 2..TPB, 0xbb);

    // Sequence 1 no longer owns its detached block: releasing it stores nothing, so the block
    // request 2 writes does not enter the tree under sequence 1's tokens.
    common::prefill_done(&mut m, 1);
    m.remove_sequence(1, true).unwrap();
    assert!(!m.block_info(8, leaf).unwrap().in_reuse_tree);
    m.check_invariants().unwrap();
    let c = m
        .add_sequence(&Request::new(3, vec![10, 11, 12, 20, 21]))
        .unwrap();
    expect_reused_bytes(&mut m, 3, 0xaa);
    assert_eq!(c.prepopulated_prompt_len, 0);
    m.check_invariants().unwrap();
}

/// Regression (TensorRT-LLM keeps such a block in the tree): when a sequence rewinds into a block
/// it stored for reuse, the tokens generated afterwards are written into that block. The manager
/// takes the block out of the tree (or copies it when shared) on rewind, so a later request with
/// the old tokens reuses only the KV of the old tokens.
#[test]
fn rewinding_into_stored_blocks_keeps_cached_kv() {
    let spec = window(32, 8, 0);
    let mut m = KvCacheManager::new(ManagerConfig {
        windows: vec![spec],
        tokens_per_block: TPB,
        max_sequence_length: 32,
        bytes_per_element: 1,
        copy_backend: CopyBackend::HostMemory,
        ..ManagerConfig::default()
    })
    .unwrap();
    m.add_sequence(&Request::new(1, (0..5).collect())).unwrap();
    for t in 5..9 {
        m.add_token(1, t).unwrap();
    }
    // Tokens 0..9; fill the KV of tokens 0..8 with 0xaa and store the two full blocks.
    for b in m.cache_block_ids(1, 32, 0).unwrap() {
        fill_slots(&mut m, 32, b, 0..TPB, 0xaa);
    }
    m.store_new_block(1).unwrap();
    // Rewind to 6 tokens and generate different tokens 6 and 7 (their KV is 0xbb).
    m.rewind(1, 3).unwrap();
    m.add_token(1, 50).unwrap();
    m.add_token(1, 51).unwrap();
    let second = m.cache_block_ids(1, 32, 0).unwrap()[1];
    fill_slots(&mut m, 32, second, 2..TPB, 0xbb);
    // A request with the original tokens 0..8 must not see the KV of tokens 50, 51.
    let mut prompt: Vec<i32> = (0..8).collect();
    prompt.push(99);
    m.add_sequence(&Request::new(2, prompt)).unwrap();
    expect_reused_bytes(&mut m, 2, 0xaa);
}
