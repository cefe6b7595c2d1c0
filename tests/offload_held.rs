//! The explicit offload and onboard of a block sequences hold (TensorRT-LLM's `offloadBlock` and
//! `onboardBlock` on a live sequence's block): the block moves to the host tier and back with
//! its bytes, its sequences keep it, and nothing hands a kernel its host row in between.

mod common;

use common::window;

use kvblock::error::KvError;
use kvblock::manager::{CopyBackend, KvCacheManager, ManagerConfig, Request};
use kvblock::pool::Level;

const W: usize = 64;
const TPB: usize = 4;

fn manager() -> KvCacheManager {
    manager_with_host_blocks(4)
}

fn manager_with_host_blocks(secondary: usize) -> KvCacheManager {
    KvCacheManager::new(ManagerConfig {
        windows: vec![window(W, 8, secondary)],
        tokens_per_block: TPB,
        max_sequence_length: W,
        enable_block_reuse: true,
        onboard_blocks: true,
        manual_clock: true,
        copy_backend: CopyBackend::HostMemory,
        bytes_per_element: 1,
        ..ManagerConfig::default()
    })
    .unwrap()
}

/// Runs `f` on the bytes of a block's row at the level it is on now.
fn with_row<R>(m: &mut KvCacheManager, block: u32, f: impl FnOnce(&mut [u8]) -> R) -> R {
    let info = m.block_info(W, block).unwrap();
    let (base, row_bytes) = m.pool_pointer(W, info.level).unwrap();
    // SAFETY: a row of the host-memory pool of the block's level.
    f(unsafe {
        std::slice::from_raw_parts_mut(base.add(info.memory_index as usize * row_bytes), row_bytes)
    })
}

fn fill_row(m: &mut KvCacheManager, block: u32, value: u8) {
    with_row(m, block, |r| r.fill(value));
}

fn row_holds(m: &mut KvCacheManager, block: u32, value: u8) -> bool {
    with_row(m, block, |r| r.iter().all(|&b| b == value))
}

/// Admits sequence 1 (9 tokens, 3 blocks) and offloads its block `index`; its block ids.
fn admit_and_offload(m: &mut KvCacheManager, index: usize) -> Vec<u32> {
    m.add_sequence(&Request::new(1, (0..9).collect())).unwrap();
    let ids = m.cache_block_ids(1, W, 0).unwrap();
    assert!(m.offload_block(W, ids[index]).unwrap());
    ids
}

fn offsets(m: &KvCacheManager, id: u64) -> Result<Vec<i32>, KvError> {
    let (max_blocks, pools) = m.offset_table_dimensions();
    let mut table = vec![0; pools * 2 * max_blocks];
    m.copy_block_offsets(&mut table, 1, 0, id).map(|_| table)
}

#[test]
fn a_held_block_goes_to_the_host_tier_and_back_with_its_bytes() {
    let mut m = manager();
    m.add_sequence(&Request::new(1, (0..9).collect())).unwrap();
    let ids = m.cache_block_ids(1, W, 0).unwrap();
    let before = offsets(&m, 1).unwrap();
    fill_row(&mut m, ids[1], 7);
    let free_primary = m.window(W).unwrap().num_free(Level::Primary);

    assert!(m.offload_block(W, ids[1]).unwrap());
    let info = m.block_info(W, ids[1]).unwrap();
    assert_eq!((info.level, info.ref_count), (Level::Secondary, 1));
    assert_eq!(
        m.cache_block_ids(1, W, 0).unwrap(),
        ids,
        "the sequence keeps the block"
    );
    assert!(
        row_holds(&mut m, ids[1], 7),
        "its bytes are in its host row"
    );
    // Its GPU row went back to the free pool, as TensorRT-LLM's swap gives it back.
    assert_eq!(
        m.window(W).unwrap().num_free(Level::Primary),
        free_primary + 1
    );
    m.check_invariants().unwrap();
    // A kernel must not be handed a host row: the offsets are refused, the table untouched.
    let (max_blocks, pools) = m.offset_table_dimensions();
    let mut table = vec![-5; pools * 2 * max_blocks];
    assert!(matches!(
        m.copy_block_offsets(&mut table, 1, 0, 1),
        Err(KvError::InvalidArgument(_))
    ));
    assert!(table.iter().all(|&v| v == -5));
    assert!(
        !m.offload_block(W, ids[1]).unwrap(),
        "already on the host tier"
    );

    // What the engine writes into the host row comes back with the block.
    fill_row(&mut m, ids[1], 9);
    assert!(m.onboard_block(W, ids[1]).unwrap());
    assert_eq!(m.block_info(W, ids[1]).unwrap().level, Level::Primary);
    assert!(row_holds(&mut m, ids[1], 9));
    assert_eq!(m.window(W).unwrap().num_free(Level::Primary), free_primary);
    m.check_invariants().unwrap();
    // The block's row may differ; the offsets follow it.
    let after = offsets(&m, 1).unwrap();
    assert_eq!(before.len(), after.len());
    assert!(!m.onboard_block(W, ids[1]).unwrap(), "already on the GPU");
}

#[test]
fn a_sequence_released_while_its_block_is_on_the_host_tier_frees_it_there() {
    let mut m = manager();
    let ids = admit_and_offload(&mut m, 0);
    m.remove_sequence(1, false).unwrap();
    let info = m.block_info(W, ids[0]).unwrap();
    assert_eq!(
        (info.level, info.ref_count, info.is_free),
        (Level::Secondary, 0, true)
    );
    m.check_invariants().unwrap();
    // The freed host block is an ordinary free block: onboarding it moves nothing.
    assert!(!m.onboard_block(W, ids[0]).unwrap());
}

#[test]
fn resuming_brings_an_offloaded_held_block_back() {
    let mut m = manager();
    let ids = admit_and_offload(&mut m, 2);
    m.suspend(1).unwrap();
    // Resuming brings the explicitly offloaded block back with the others.
    assert!(m.resume(1).unwrap());
    assert_eq!(m.block_info(W, ids[2]).unwrap().level, Level::Primary);
    offsets(&m, 1).unwrap();
    m.check_invariants().unwrap();
}

#[test]
fn without_a_free_host_block_a_held_block_stays() {
    let mut m = manager_with_host_blocks(0);
    m.add_sequence(&Request::new(1, (0..9).collect())).unwrap();
    let ids = m.cache_block_ids(1, W, 0).unwrap();
    assert!(!m.offload_block(W, ids[0]).unwrap());
    assert_eq!(m.block_info(W, ids[0]).unwrap().level, Level::Primary);
    offsets(&m, 1).unwrap();
}

#[test]
fn a_pinned_block_stays_on_the_gpu() {
    let mut m = manager();
    m.add_sequence(&Request::new(1, (0..9).collect())).unwrap();
    let ids = m.cache_block_ids(1, W, 0).unwrap();
    m.pin_blocks_by_id(W, &ids[..1]).unwrap();
    assert!(matches!(
        m.offload_block(W, ids[0]),
        Err(KvError::InvalidArgument(_))
    ));
    assert_eq!(m.block_info(W, ids[0]).unwrap().level, Level::Primary);
    m.unpin_blocks_by_id(W, &ids[..1]).unwrap();
    assert!(m.offload_block(W, ids[0]).unwrap());
}
