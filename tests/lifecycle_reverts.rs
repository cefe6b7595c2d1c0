//! The scheduler's reverts (seed 001, TensorRT-LLM V2): what a revert may touch, what it reports,
//! that giving capacity back never needs a free block, that reverted allocations leave the
//! statistics, and that capacity sums near `usize::MAX` are refused. Each test failed before its
//! fix (issue 21).

mod common;

use common::window;

use kvblock::error::KvError;
use kvblock::manager::{ContextRevert, CopyBackend, KvCacheManager, ManagerConfig, Request};
use kvblock::pool::Level;

const W: usize = 1024;
const TPB: usize = 4;

fn manager(primary: usize) -> KvCacheManager {
    KvCacheManager::new(ManagerConfig {
        windows: vec![window(W, primary, 0)],
        tokens_per_block: TPB,
        max_sequence_length: W,
        manual_clock: true,
        copy_backend: CopyBackend::HostMemory,
        bytes_per_element: 1,
        ..ManagerConfig::default()
    })
    .unwrap()
}

fn tokens(range: std::ops::Range<i32>) -> Vec<i32> {
    range.collect()
}

/// What a revert must leave alone: lengths, blocks and the free pool.
fn state(m: &KvCacheManager, id: u64) -> String {
    format!(
        "{:?} {:?} free {}",
        m.sequence_lengths(id),
        m.cache_block_ids(id, W, 0),
        m.window(W).unwrap().num_free(Level::Primary)
    )
}

#[test]
fn a_context_allocation_that_does_not_grow_leaves_nothing_to_revert() {
    let mut m = manager(16);
    // Admission grew the capacity from 0 to 12 (a record), and its first chunk ran.
    m.add_sequence(&Request::new(1, tokens(0..12))).unwrap();
    m.advance_history(1, 4).unwrap();
    // This iteration's allocation for the next chunk fits the capacity: no growth.
    assert!(m.allocate_context(1, 4).unwrap());
    let before = state(&m, 1);
    // The scheduler defers the request: nothing to revert, nothing touched.
    assert_eq!(
        m.revert_allocate_context(1).unwrap(),
        ContextRevert::NothingToRevert
    );
    assert_eq!(state(&m, 1), before);
    assert!(!m.is_suspended(1).unwrap());
    // A failed allocation forgets a stale record as well.
    let mut m = manager(4);
    m.add_sequence(&Request::new(1, tokens(0..8))).unwrap();
    m.advance_history(1, 8).unwrap();
    assert!(
        !m.allocate_context(1, 100).unwrap(),
        "no room for 27 blocks"
    );
    assert_eq!(
        m.revert_allocate_context(1).unwrap(),
        ContextRevert::NothingToRevert
    );
    m.check_invariants().unwrap();
}

#[test]
fn reverting_the_context_of_a_generating_sequence_is_a_no_op() {
    let mut m = manager(16);
    m.add_sequence(&Request::new(1, tokens(0..10))).unwrap();
    m.store_context_blocks(1, 10).unwrap();
    m.add_token(1, 500).unwrap();
    m.add_token(1, 501).unwrap();
    let before = state(&m, 1);
    assert_eq!(
        m.revert_allocate_context(1).unwrap(),
        ContextRevert::NothingToRevert
    );
    assert!(m.has_sequence(1), "the generating request is kept");
    assert_eq!(state(&m, 1), before);
    assert_eq!(m.sequence_lengths(1).unwrap().num_tokens, 12);
    m.check_invariants().unwrap();
}

/// A full pool whose last block is shared with the reuse tree's pin: the sequence's capacity
/// ends inside it, and no block is free.
fn full_pool_with_a_shared_last_block() -> KvCacheManager {
    let mut m = manager(2);
    m.add_sequence(&Request::new(1, tokens(0..6))).unwrap();
    // Five tokens computed: still in prefill.
    m.advance_history(1, 5).unwrap();
    // Pins both blocks (the second as a partial leaf): each now has two references.
    let pinned = m.store_blocks_for_reuse(1, true, None, 2).unwrap();
    assert_eq!(pinned.len(), 2);
    assert_eq!(m.num_free_blocks(), 0);
    m
}

#[test]
fn giving_capacity_back_never_needs_a_free_block() {
    // revert_allocate_generation: the step's slot fits the last block, so no block was taken,
    // and none is free.
    let mut m = full_pool_with_a_shared_last_block();
    assert!(m.allocate_generation(1, 0).unwrap());
    assert_eq!(m.sequence_lengths(1).unwrap().capacity, 7);
    assert!(m.revert_allocate_generation(1).unwrap());
    assert_eq!(m.sequence_lengths(1).unwrap().capacity, 6);
    m.check_invariants().unwrap();

    // A shrinking resize, then a grow back: the same tokens return to the same slots.
    let mut m = full_pool_with_a_shared_last_block();
    let blocks = m.cache_block_ids(1, W, 0).unwrap();
    assert!(m.resize(1, 7).unwrap());
    assert!(m.resize(1, 6).unwrap());
    assert_eq!(m.cache_block_ids(1, W, 0).unwrap(), blocks);
    m.check_invariants().unwrap();

    // revert_allocate_context: the next chunk's allocation grew the capacity inside the shared
    // block; the deferred request gives it back.
    let mut m = full_pool_with_a_shared_last_block();
    assert!(m.allocate_context(1, 2).unwrap());
    assert_eq!(m.sequence_lengths(1).unwrap().capacity, 7);
    assert_eq!(
        m.revert_allocate_context(1).unwrap(),
        ContextRevert::ShrunkAndSuspended
    );
    assert_eq!(m.sequence_lengths(1).unwrap().capacity, 6);
    m.check_invariants().unwrap();
}

#[test]
fn reverted_allocations_leave_the_statistics() {
    let mut m = manager(16);
    m.add_sequence(&Request::new(1, tokens(0..8))).unwrap();
    m.store_context_blocks(1, 8).unwrap();
    let before = m.stats();
    assert!(m.allocate_generation(1, 2).unwrap());
    let grown = m.stats();
    assert_eq!(grown.alloc_total_blocks, before.alloc_total_blocks + 1);
    assert_eq!(grown.alloc_new_blocks, before.alloc_new_blocks + 1);
    assert!(m.extend_capacity_for_tokens(1, 4).unwrap());
    assert_eq!(m.stats().alloc_total_blocks, before.alloc_total_blocks + 2);
    assert!(m.revert_allocate_generation(1).unwrap());
    let after = m.stats();
    assert_eq!(after.alloc_total_blocks, before.alloc_total_blocks);
    assert_eq!(after.alloc_new_blocks, before.alloc_new_blocks);

    // A context allocation (admission's too) reverted: its blocks are uncounted.
    let mut m = manager(16);
    let empty = m.stats();
    m.add_sequence(&Request::new(1, tokens(0..8))).unwrap();
    assert_eq!(m.stats().alloc_total_blocks, empty.alloc_total_blocks + 2);
    assert_eq!(
        m.revert_allocate_context(1).unwrap(),
        ContextRevert::ShrunkAndSuspended
    );
    assert_eq!(m.stats().alloc_total_blocks, empty.alloc_total_blocks);
    assert_eq!(m.stats().alloc_new_blocks, empty.alloc_new_blocks);
    assert!(m.resume(1).unwrap());
    assert!(m.allocate_context(1, 8).unwrap());
    assert_eq!(m.stats().alloc_total_blocks, empty.alloc_total_blocks + 2);
    m.check_invariants().unwrap();
}

#[test]
fn capacity_sums_that_overflow_are_sequence_too_long_and_change_nothing() {
    let mut m = manager(16);
    m.add_sequence(&Request::new(1, tokens(0..8))).unwrap();
    m.store_context_blocks(1, 8).unwrap();
    let before = state(&m, 1);
    let stats = m.stats();
    for n in [usize::MAX, usize::MAX - 1, usize::MAX - 8] {
        let too_long = |r: Result<bool, KvError>| matches!(r, Err(KvError::SequenceTooLong { .. }));
        assert!(
            too_long(m.allocate_generation(1, n)),
            "allocate_generation({n})"
        );
        assert!(too_long(m.allocate_context(1, n)), "allocate_context({n})");
        assert!(
            too_long(m.extend_capacity_for_tokens(1, n)),
            "extend_capacity_for_tokens({n})"
        );
        assert_eq!(state(&m, 1), before);
        assert_eq!(m.stats(), stats);
    }
    m.check_invariants().unwrap();
}
