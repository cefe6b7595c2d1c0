//! Fault injection in the copy engine and in pool allocation, through the Rust API and the C
//! ABI: a failed copy submission is reported, rolled back (every block stays where its bytes
//! are, the counters are exact) and the manager keeps working; a failed pool allocation fails
//! the creation. The randomized campaign with byte verification is `soak_with_copy_faults` in
//! tests/soak.rs.

mod common;

use std::ptr::null_mut;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::fault::{FaultPlan, FaultyEngine};
use kvblock::error::KvError;
use kvblock::ffi::handle::handle_from_manager;
use kvblock::ffi::manager::*;
use kvblock::ffi::status::kvb_status_t;
use kvblock::ffi::types::*;
use kvblock::manager::{CopyBackend, KvCacheManager, ManagerConfig, Request, WindowSpec};
use kvblock::transfer::CopyEngine;

fn config(windows: usize) -> ManagerConfig {
    ManagerConfig {
        windows: (0..windows)
            .map(|i| WindowSpec {
                size_per_head: 2,
                ..common::window(64 >> i, 5, 5)
            })
            .collect(),
        tokens_per_block: 4,
        max_sequence_length: 64,
        bytes_per_element: 1,
        copy_backend: CopyBackend::HostMemory,
        ..ManagerConfig::default()
    }
}

fn faulty(plan: &Arc<FaultPlan>, windows: usize) -> KvCacheManager {
    KvCacheManager::with_engines(config(windows), &mut |spec, g| {
        Some(
            FaultyEngine::new(plan.clone(), g, spec.primary_blocks, spec.secondary_blocks)
                .map(|e| Box::new(e) as Box<dyn CopyEngine>),
        )
    })
    .unwrap()
}

/// Every block's (level, row, in tree, ref count).
fn table(m: &KvCacheManager) -> Vec<(kvblock::pool::Level, u32, bool, u32)> {
    (0..10)
        .map(|b| {
            let i = m.block_info(64, b).unwrap();
            (i.level, i.memory_index, i.in_reuse_tree, i.ref_count)
        })
        .collect()
}

/// Caches 5 blocks of `tokens` (request 1, released with store).
fn cache(m: &mut KvCacheManager, tokens: &[i32]) {
    m.add_sequence(&Request::new(1, tokens.to_vec())).unwrap();
    common::prefill_done(m, 1);
    m.remove_sequence(1, true).unwrap();
}

#[test]
fn failed_offload_during_admission_is_rolled_back_and_the_manager_keeps_working() {
    let plan = FaultPlan::new();
    let mut m = faulty(&plan, 1);
    let a: Vec<i32> = (0..17).collect();
    let b: Vec<i32> = (100..117).collect();
    cache(&mut m, &a);
    let (stats, before) = (m.stats(), table(&m));
    // Admitting b evicts a's cached blocks, which are offloaded (copied) to the host tier.
    plan.fail_next(0);
    let err = m
        .transact(|m| m.add_sequence(&Request::new(2, b.clone())))
        .unwrap_err();
    assert!(matches!(err, KvError::CopyFailed(_)), "{err}");
    assert_eq!(plan.injected.load(Ordering::Relaxed), 1);
    assert_eq!(table(&m), before, "a block moved although its copy failed");
    assert_eq!(m.stats(), stats, "counters changed by a failed call");
    assert!(!m.has_sequence(2));
    m.check_invariants().unwrap();
    // It keeps working: the same admission succeeds, and a's blocks come back from the host.
    m.transact(|m| m.add_sequence(&Request::new(2, b.clone())))
        .unwrap();
    assert!(m.stats().offloaded_blocks >= stats.offloaded_blocks + 4);
    m.remove_sequence(2, false).unwrap();
    let again = m
        .transact(|m| m.add_sequence(&Request::new(3, a.clone())))
        .unwrap();
    assert_eq!(
        again.prepopulated_prompt_len, 16,
        "a's cached blocks were kept"
    );
    assert!(m.stats().onboarded_blocks > 0);
    m.check_invariants().unwrap();
}

#[test]
fn a_failure_after_completed_copies_is_rolled_back_too() {
    let plan = FaultPlan::new();
    let mut m = faulty(&plan, 1);
    let a: Vec<i32> = (0..17).collect();
    cache(&mut m, &a);
    let b: Vec<i32> = (100..117).collect();
    m.add_sequence(&Request::new(2, b.clone())).unwrap();
    common::prefill_done(&mut m, 2);
    m.remove_sequence(2, true).unwrap();
    let (before, rows) = (m.stats(), table(&m));
    // Re-admitting a onboards its host blocks and offloads b's: two copies of the failing
    // submission complete before it fails.
    plan.fail_next(2);
    let err = m
        .transact(|m| m.add_sequence(&Request::new(3, a.clone())))
        .unwrap_err();
    assert!(matches!(err, KvError::CopyFailed(_)));
    assert_eq!(plan.completed_in_failures.load(Ordering::Relaxed), 2);
    m.check_invariants().unwrap();
    // The rows those copies wrote belonged to blocks outside the tree here, so nothing else
    // changes (tests/soak.rs checks the bytes when they belong to cached blocks).
    assert_eq!(table(&m), rows, "a block moved although the call failed");
    assert_eq!(m.stats(), before);
    let again = m
        .transact(|m| m.add_sequence(&Request::new(3, a.clone())))
        .unwrap();
    assert_eq!(again.prepopulated_prompt_len, 16);
    m.check_invariants().unwrap();
}

#[test]
fn failed_copy_through_the_c_abi_returns_copy_failed_and_does_not_poison() {
    let plan = FaultPlan::new();
    let mut m = faulty(&plan, 2);
    let a: Vec<i32> = (0..17).collect();
    cache(&mut m, &a);
    let h = handle_from_manager(m);
    let b: Vec<i32> = (100..117).collect();
    // SAFETY: plain C struct, filled by request_init.
    let mut r = unsafe { std::mem::zeroed::<kvb_request_t>() };
    assert_eq!(kvb_request_init(&mut r), kvb_status_t::KVB_OK);
    r.request_id = 2;
    r.tokens = b.as_ptr();
    r.num_tokens = b.len();
    r.input_length = b.len() as i32;
    // SAFETY: plain C struct.
    let mut stats = unsafe { std::mem::zeroed::<kvb_kv_cache_stats_t>() };
    assert_eq!(
        kvb_manager_get_kv_cache_stats(h, &mut stats),
        kvb_status_t::KVB_OK
    );
    plan.fail_next(0);
    assert_eq!(
        kvb_manager_add_sequence(h, &r, null_mut()),
        kvb_status_t::KVB_STATUS_COPY_FAILED
    );
    // SAFETY: plain C struct.
    let mut after = unsafe { std::mem::zeroed::<kvb_kv_cache_stats_t>() };
    assert_eq!(
        kvb_manager_get_kv_cache_stats(h, &mut after),
        kvb_status_t::KVB_OK
    );
    assert_eq!(
        (
            after.free_num_blocks,
            after.offloaded_blocks,
            after.alloc_total_blocks
        ),
        (
            stats.free_num_blocks,
            stats.offloaded_blocks,
            stats.alloc_total_blocks
        )
    );
    assert_eq!(kvb_manager_check_invariants(h), kvb_status_t::KVB_OK);
    assert_eq!(
        kvb_manager_add_sequence(h, &r, null_mut()),
        kvb_status_t::KVB_OK
    );
    assert_eq!(kvb_manager_destroy(h), kvb_status_t::KVB_OK);
}

#[test]
fn failed_pool_allocation_fails_the_creation() {
    let plan = FaultPlan::new();
    let mut made = 0;
    let err = KvCacheManager::with_engines(config(2), &mut |spec, g| {
        made += 1;
        Some(if made == 2 {
            Err(KvError::OutOfMemory(
                "injected pool allocation failure".into(),
            ))
        } else {
            FaultyEngine::new(plan.clone(), g, spec.primary_blocks, spec.secondary_blocks)
                .map(|e| Box::new(e) as Box<dyn CopyEngine>)
        })
    })
    .unwrap_err();
    assert!(matches!(err, KvError::OutOfMemory(_)), "{err}");
    assert_eq!(made, 2);
}

/// Fills every row of a sequence's blocks with `value + block index`.
fn fill_rows(m: &mut KvCacheManager, id: u64, value: u8) {
    for (i, b) in m
        .cache_block_ids(id, 64, 0)
        .unwrap()
        .into_iter()
        .enumerate()
    {
        let info = m.block_info(64, b).unwrap();
        let (base, row) = m.pool_pointer(64, info.level).unwrap();
        // SAFETY: a row of the host pool of the block's level.
        unsafe {
            std::ptr::write_bytes(
                base.add(info.memory_index as usize * row),
                value + i as u8,
                row,
            )
        };
    }
}

/// Whether every row of a sequence's blocks holds what `fill_rows(value)` wrote.
fn rows_hold(m: &mut KvCacheManager, id: u64, value: u8) -> bool {
    m.cache_block_ids(id, 64, 0)
        .unwrap()
        .into_iter()
        .enumerate()
        .all(|(i, b)| {
            let info = m.block_info(64, b).unwrap();
            let (base, row) = m.pool_pointer(64, info.level).unwrap();
            // SAFETY: a row of the host pool of the block's level.
            let bytes = unsafe {
                std::slice::from_raw_parts(base.add(info.memory_index as usize * row), row)
            };
            bytes.iter().all(|&x| x == value + i as u8)
        })
}

/// Resuming A (on the host tier) moves suspended B's blocks down and onboards A's blocks into
/// the GPU rows B gave up. When that submission fails part way, the rollback gives every block
/// its old row back; B's rows were already overwritten with A's bytes, so the rollback copies
/// B's bytes back from the host rows they had moved to. Whatever the failure point, both
/// sequences keep their bytes, and the retried resume works.
#[test]
fn a_rolled_back_resume_gives_suspended_sequences_their_bytes_back() {
    for completed in 0..4 {
        let plan = FaultPlan::new();
        let mut m = faulty(&plan, 1);
        m.add_sequence(&Request::new(1, (0..8).collect())).unwrap();
        fill_rows(&mut m, 1, 10);
        m.suspend(1).unwrap();
        m.add_sequence(&Request::new(2, (100..112).collect()))
            .unwrap();
        fill_rows(&mut m, 2, 50);
        // C takes A's two GPU rows: A's blocks move to the host tier.
        m.add_sequence(&Request::new(3, (200..208).collect()))
            .unwrap();
        m.remove_sequence(3, false).unwrap();
        m.suspend(2).unwrap();
        m.add_sequence(&Request::new(4, (300..308).collect()))
            .unwrap();
        assert!(rows_hold(&mut m, 1, 10) && rows_hold(&mut m, 2, 50));
        let (stats, before) = (m.stats(), table(&m));
        plan.fail_next(completed);
        let err = m.transact(|m| m.resume(1)).unwrap_err();
        assert!(matches!(err, KvError::CopyFailed(_)), "{err}");
        assert_eq!(
            table(&m),
            before,
            "after {completed} copies: blocks moved back"
        );
        assert_eq!(m.stats().onboarded_blocks, stats.onboarded_blocks);
        m.check_invariants().unwrap();
        assert!(
            rows_hold(&mut m, 2, 50),
            "after {completed} copies: B lost its bytes"
        );
        assert!(
            rows_hold(&mut m, 1, 10),
            "after {completed} copies: A lost its bytes"
        );
        assert!(m.transact(|m| m.resume(1)).unwrap());
        assert!(rows_hold(&mut m, 1, 10) && rows_hold(&mut m, 2, 50));
        m.check_invariants().unwrap();
    }
}
