//! The scheduler capacity lifecycle: resize, generation and context allocations and their
//! reverts, padding extension, suspend / resume with real bytes, the utilization gate, stall
//! detection, and a seeded property test of random interleavings.

mod common;

use common::window;

use common::Rng;

use kvblock::error::KvError;
use kvblock::manager::{
    ContextRevert, CopyBackend, KvCacheManager, ManagerConfig, Request, SchedulingPass,
};
use kvblock::pool::Level;

const W: usize = 1024;

fn config(primary: usize, secondary: usize, tpb: usize) -> ManagerConfig {
    ManagerConfig {
        windows: vec![window(W, primary, secondary)],
        tokens_per_block: tpb,
        max_sequence_length: W,
        manual_clock: true,
        copy_backend: CopyBackend::HostMemory,
        bytes_per_element: 1,
        ..ManagerConfig::default()
    }
}

fn tokens(range: std::ops::Range<i32>) -> Vec<i32> {
    range.collect()
}

/// Everything a caller can observe about placement and counters.
fn fingerprint(m: &KvCacheManager) -> String {
    let mut ids: Vec<u64> = (0..64).filter(|&id| m.has_sequence(id)).collect();
    ids.sort_unstable();
    let mut s = format!(
        "{:?} free {} {} seqs",
        m.stats(),
        m.window(W).unwrap().num_free(Level::Primary),
        m.window(W).unwrap().num_free(Level::Secondary)
    );
    for id in ids {
        let blocks = m.cache_block_ids(id, W, 0).unwrap();
        let levels: Vec<_> = blocks
            .iter()
            .map(|&b| m.block_info(W, b).unwrap().level)
            .collect();
        s += &format!(
            " {id}:{:?}{blocks:?}{levels:?}",
            m.sequence_lengths(id).unwrap()
        );
    }
    s
}

/// Fills every row of a sequence's blocks with `value + block index` (as an engine writes KV).
fn fill(m: &mut KvCacheManager, id: u64, value: u8) {
    let (base, row) = m.pool_pointer(W, Level::Primary).unwrap();
    for (i, b) in m.cache_block_ids(id, W, 0).unwrap().into_iter().enumerate() {
        let info = m.block_info(W, b).unwrap();
        assert_eq!(info.level, Level::Primary);
        // SAFETY: a primary row of the host pool.
        unsafe {
            std::ptr::write_bytes(
                base.add(info.memory_index as usize * row),
                value + i as u8,
                row,
            )
        };
    }
}

/// Checks that every row of the sequence's blocks holds what `fill` wrote.
fn expect_bytes(m: &mut KvCacheManager, id: u64, value: u8) {
    for (i, b) in m.cache_block_ids(id, W, 0).unwrap().into_iter().enumerate() {
        let info = m.block_info(W, b).unwrap();
        let (base, row) = m.pool_pointer(W, info.level).unwrap();
        // SAFETY: a row of the host pool of the block's level.
        let bytes =
            unsafe { std::slice::from_raw_parts(base.add(info.memory_index as usize * row), row) };
        assert!(
            bytes.iter().all(|&x| x == value + i as u8),
            "sequence {id} block {i} lost its bytes"
        );
    }
}

#[test]
fn resize_grows_and_shrinks_and_a_failed_grow_changes_nothing() {
    let mut m = KvCacheManager::new(config(8, 0, 4)).unwrap();
    m.add_sequence(&Request::new(1, tokens(0..6))).unwrap();
    let l = m.sequence_lengths(1).unwrap();
    assert_eq!(
        (l.num_tokens, l.capacity, l.history, l.committed),
        (6, 6, 0, 0)
    );
    assert!(m.resize(1, 16).unwrap());
    assert_eq!(m.cache_block_ids(1, W, 0).unwrap().len(), 4);
    assert_eq!(m.sequence_lengths(1).unwrap().capacity, 16);
    m.check_invariants().unwrap();
    // Tokens fill the reserved slots without new blocks.
    let free = m.window(W).unwrap().num_free(Level::Primary);
    for t in 0..4 {
        m.add_token(1, 100 + t).unwrap();
    }
    assert_eq!(m.window(W).unwrap().num_free(Level::Primary), free);
    let before = fingerprint(&m);
    assert!(!m.resize(1, 40).unwrap(), "10 blocks do not fit in 8");
    assert_eq!(fingerprint(&m), before);
    assert!(m.resize(1, 11).unwrap());
    assert_eq!(m.cache_block_ids(1, W, 0).unwrap().len(), 3);
    assert_eq!(m.window(W).unwrap().num_free(Level::Primary), free + 1);
    m.check_invariants().unwrap();
}

#[test]
fn a_shrink_never_drops_computed_committed_or_reused_tokens() {
    let mut m = KvCacheManager::new(config(16, 0, 4)).unwrap();
    m.add_sequence(&Request::new(1, tokens(0..9))).unwrap();
    common::prefill_done(&mut m, 1);
    m.remove_sequence(1, true).unwrap();
    // Reuses 8 tokens (two blocks).
    let a = m.add_sequence(&Request::new(2, tokens(0..12))).unwrap();
    assert_eq!(a.prepopulated_prompt_len, 8);
    let before = fingerprint(&m);
    let err = m.resize(2, 7).unwrap_err();
    assert!(matches!(err, KvError::InvalidArgument(_)), "{err}");
    assert!(err.to_string().contains("reused"), "{err}");
    assert_eq!(fingerprint(&m), before);
    m.store_context_blocks(2, 11).unwrap();
    let l = m.sequence_lengths(2).unwrap();
    assert_eq!((l.history, l.committed), (11, 8));
    assert!(m.resize(2, 10).is_err(), "history is 11");
    assert!(m.resize(2, 11).unwrap());
    m.check_invariants().unwrap();
}

#[test]
fn generation_allocation_reserves_slots_and_its_revert_is_symmetric() {
    let mut m = KvCacheManager::new(config(16, 0, 4)).unwrap();
    m.add_sequence(&Request::new(1, tokens(0..8))).unwrap();
    m.store_context_blocks(1, 8).unwrap();
    assert!(m.allocate_generation(1, 3).unwrap());
    assert_eq!(m.sequence_lengths(1).unwrap().capacity, 12);
    assert_eq!(m.cache_block_ids(1, W, 0).unwrap().len(), 3);
    // The padding of a CUDA graph joins the allocation...
    assert!(m.extend_capacity_for_tokens(1, 2).unwrap());
    assert_eq!(m.sequence_lengths(1).unwrap().capacity, 14);
    // ...and the revert undoes both, using what was recorded.
    assert!(m.revert_allocate_generation(1).unwrap());
    assert_eq!(m.sequence_lengths(1).unwrap().capacity, 8);
    assert_eq!(m.cache_block_ids(1, W, 0).unwrap().len(), 2);
    assert!(
        !m.revert_allocate_generation(1).unwrap(),
        "nothing left to revert"
    );
    // Tokens added into the reserved slots cannot be reverted away.
    assert!(m.allocate_generation(1, 0).unwrap());
    m.add_token(1, 50).unwrap();
    assert!(m.allocate_generation(1, 1).unwrap());
    m.add_token(1, 51).unwrap();
    let err = m.revert_allocate_generation(1);
    assert!(err.is_ok_and(|r| !r), "add_token consumed the allocation");
    assert!(m.allocate_generation(1, 1).unwrap());
    m.check_invariants().unwrap();
}

#[test]
fn reverting_a_context_allocation_suspends_or_releases() {
    let mut m = KvCacheManager::new(config(16, 8, 4)).unwrap();
    // Nothing reused: the admission grew capacity from 0 to 10; no chunk computed yet.
    m.add_sequence(&Request::new(1, tokens(0..10))).unwrap();
    let free = m.window(W).unwrap().num_free(Level::Primary);
    assert_eq!(
        m.revert_allocate_context(1).unwrap(),
        ContextRevert::ShrunkAndSuspended
    );
    let l = m.sequence_lengths(1).unwrap();
    assert!(l.suspended);
    assert_eq!((l.num_tokens, l.capacity), (10, 0));
    assert_eq!(m.window(W).unwrap().num_free(Level::Primary), free + 3);
    m.check_invariants().unwrap();
    // A second revert has nothing left to undo: it says so and changes nothing.
    let before = fingerprint(&m);
    assert_eq!(
        m.revert_allocate_context(1).unwrap(),
        ContextRevert::NothingToRevert
    );
    assert_eq!(fingerprint(&m), before);
    assert!(m.sequence_lengths(1).unwrap().suspended);
    // Resume, allocate the first chunk again, compute and store it: the prompt's tokens were
    // kept, so what is stored is the prompt.
    assert!(m.resume(1).unwrap());
    assert!(m.allocate_context(1, 4).unwrap());
    assert_eq!(m.sequence_lengths(1).unwrap().capacity, 4);
    m.advance_history(1, 4).unwrap();
    assert!(m.allocate_context(1, 6).unwrap());
    assert_eq!(m.sequence_lengths(1).unwrap().capacity, 10);
    m.store_context_blocks(1, 9).unwrap();
    m.check_invariants().unwrap();
    m.remove_sequence(1, true).unwrap();
    let a = m.add_sequence(&Request::new(2, tokens(0..10))).unwrap();
    assert_eq!(
        a.prepopulated_prompt_len, 9,
        "the restored prompt tokens were stored"
    );
    // Prefill computed past the old capacity (0): released, computed blocks kept for reuse.
    m.remove_sequence(2, false).unwrap();
    let b = m.add_sequence(&Request::new(3, tokens(20..33))).unwrap();
    assert_eq!(b.prepopulated_prompt_len, 0);
    m.store_context_blocks(3, 8).unwrap();
    assert_eq!(
        m.revert_allocate_context(3).unwrap(),
        ContextRevert::Released
    );
    assert!(!m.has_sequence(3));
    let c = m.add_sequence(&Request::new(4, tokens(20..33))).unwrap();
    assert_eq!(c.prepopulated_prompt_len, 8);
    // No growth recorded: nothing to revert.
    m.resize(4, 13).unwrap();
    assert_eq!(
        m.revert_allocate_context(4).unwrap(),
        ContextRevert::NothingToRevert
    );
    m.check_invariants().unwrap();
}

#[test]
fn suspended_blocks_move_to_the_host_lazily_and_resume_with_their_bytes() {
    let mut m = KvCacheManager::new(config(6, 6, 4)).unwrap();
    m.add_sequence(&Request::new(1, tokens(0..12))).unwrap();
    fill(&mut m, 1, 40);
    m.suspend(1).unwrap();
    // Nothing moves at suspend time.
    assert_eq!(m.stats().offloaded_blocks, 0);
    assert!(m
        .cache_block_ids(1, W, 0)
        .unwrap()
        .iter()
        .all(|&b| m.block_info(W, b).unwrap().level == Level::Primary));
    assert_eq!(
        m.add_token(1, 5).unwrap_err(),
        KvError::SequenceSuspended(1)
    );
    let mut table = vec![0; 64];
    assert_eq!(
        m.copy_block_offsets(&mut table, 1, 0, 1).unwrap_err(),
        KvError::SequenceSuspended(1)
    );
    // A 20-token request needs 5 blocks; 3 are free: two suspended blocks go to the host. The
    // estimate counts them as available, and admission delivers it.
    let too_big = Request::new(9, tokens(200..232));
    let estimate = m
        .estimate_batch(&[Request::new(2, tokens(100..120)), too_big])
        .unwrap();
    assert!(estimate[0].fits, "3 free + 3 movable blocks cover 5");
    assert!(!estimate[1].fits, "8 more blocks do not fit in 6");
    assert_eq!(m.stats().offloaded_blocks, 0, "estimating moves nothing");
    m.add_sequence(&Request::new(2, tokens(100..120))).unwrap();
    let levels: Vec<Level> = m
        .cache_block_ids(1, W, 0)
        .unwrap()
        .iter()
        .map(|&b| m.block_info(W, b).unwrap().level)
        .collect();
    assert_eq!(
        levels.iter().filter(|&&l| l == Level::Secondary).count(),
        2,
        "{levels:?}"
    );
    fill(&mut m, 2, 80);
    m.check_invariants().unwrap();
    expect_bytes(&mut m, 1, 40);
    // Utilization: 5 of 6 GPU blocks held by the active sequence, 1 movable suspended block.
    assert!((m.gpu_utilization() - 5.0 / 6.0).abs() < 1e-9);
    // Resuming needs two GPU blocks; the pool has none free and only one movable: refused,
    // with no side effects.
    let before = fingerprint(&m);
    assert!(!m.resume(1).unwrap());
    assert_eq!(fingerprint(&m), before);
    m.remove_sequence(2, false).unwrap();
    assert!(m.resume(1).unwrap());
    expect_bytes(&mut m, 1, 40);
    m.add_token(1, 7).unwrap();
    m.check_invariants().unwrap();
}

#[test]
fn resume_is_refused_above_the_utilization_threshold() {
    let mut cfg = config(10, 10, 4);
    cfg.max_utilization_for_resume = 0.5;
    let mut m = KvCacheManager::new(cfg).unwrap();
    m.add_sequence(&Request::new(1, tokens(0..8))).unwrap();
    m.suspend(1).unwrap();
    m.add_sequence(&Request::new(2, tokens(50..74))).unwrap();
    // 6 of 10 blocks held by an active sequence: 0.6 > 0.5.
    let before = fingerprint(&m);
    assert!(!m.resume(1).unwrap());
    assert_eq!(fingerprint(&m), before);
    m.remove_sequence(2, true).unwrap();
    assert!(m.resume(1).unwrap());
    assert!(!m.sequence_lengths(1).unwrap().suspended);
}

/// The engine loop of a max-utilization scheduler on a pool too small for its requests: with
/// no host tier, suspended sequences keep their GPU blocks and the scheduler stalls, which
/// `end_scheduling_pass` reports; with a host tier the same work finishes.
fn drive(mut m: KvCacheManager, passes: usize) -> Result<usize, KvError> {
    for id in 0..4u64 {
        m.add_sequence(&Request::new(
            id,
            tokens(id as i32 * 100..id as i32 * 100 + 8),
        ))
        .unwrap();
    }
    let mut active: Vec<u64> = (0..4).collect();
    let mut suspended: Vec<u64> = Vec::new();
    let mut finished = 0;
    for _ in 0..passes {
        let mut scheduled = 0;
        // Resume in order of suspension.
        while let Some(&id) = suspended.first() {
            if !m.resume(id)? {
                break;
            }
            suspended.remove(0);
            active.push(id);
        }
        let mut i = 0;
        while i < active.len() {
            let id = active[i];
            if m.allocate_generation(id, 0)? {
                m.add_token(id, 1)?;
                scheduled += 1;
                i += 1;
                if m.num_tokens(id)? >= 24 {
                    m.remove_sequence(id, true)?;
                    active.remove(i - 1);
                    i -= 1;
                    finished += 1;
                }
            } else {
                // Last in, first out: suspend the newest other sequence, else this one.
                let victim = *active.last().unwrap();
                m.suspend(victim)?;
                active.pop();
                suspended.push(victim);
            }
        }
        m.end_scheduling_pass(SchedulingPass {
            num_generation_requests: active.len() + suspended.len(),
            num_scheduled: scheduled,
        })?;
        m.check_invariants()?;
        if active.is_empty() && suspended.is_empty() {
            return Ok(finished);
        }
    }
    Ok(finished)
}

#[test]
fn a_scheduler_without_host_tier_stalls_and_is_told_why() {
    let mut cfg = config(12, 0, 4);
    cfg.stall_pass_threshold = 5;
    let err = drive(KvCacheManager::new(cfg).unwrap(), 200).unwrap_err();
    let KvError::Stalled(message) = err else {
        panic!("expected a stall, got {err}");
    };
    assert!(message.contains("no host tier"), "{message}");
    assert!(message.contains("secondary_blocks"), "{message}");
}

#[test]
fn a_scheduler_with_a_host_tier_finishes() {
    let mut cfg = config(12, 24, 4);
    cfg.stall_pass_threshold = 5;
    assert_eq!(drive(KvCacheManager::new(cfg).unwrap(), 500).unwrap(), 4);
}

#[test]
fn a_host_tier_too_small_is_named() {
    let mut cfg = config(12, 1, 4);
    cfg.stall_pass_threshold = 5;
    let err = drive(KvCacheManager::new(cfg).unwrap(), 200).unwrap_err();
    let KvError::Stalled(message) = err else {
        panic!("expected a stall, got {err}");
    };
    assert!(message.contains("too small"), "{message}");
}

/// Random interleavings of admission, tokens, resize, generation / context allocations and
/// their reverts, padding, suspend, resume, store and release: invariants hold after every
/// step, a failed or refused call changes nothing, and every block's bytes survive suspension,
/// host moves and resumption.
#[test]
fn random_lifecycle_interleavings_keep_invariants_and_bytes() {
    let mut moved = 0;
    for seed in [1u64, 2, 3, 0xfeed, 0xbeef] {
        moved += run_random(seed, 1500);
    }
    assert!(
        moved > 0,
        "the interleavings moved no suspended block to the host tier"
    );
}

/// The bytes of each block row of a sequence, wherever the rows are.
fn rows_of(m: &mut KvCacheManager, id: u64) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for b in m.cache_block_ids(id, W, 0).unwrap() {
        let info = m.block_info(W, b).unwrap();
        let (base, row) = m.pool_pointer(W, info.level).unwrap();
        // SAFETY: a row of the host pool of the block's level.
        out.push(unsafe {
            std::slice::from_raw_parts(base.add(info.memory_index as usize * row), row).to_vec()
        });
    }
    out
}

/// Returns how many suspended blocks moved to the host tier.
fn run_random(seed: u64, steps: usize) -> u64 {
    let mut rng = Rng(seed);
    let mut cfg = config(24, 12, 4);
    cfg.max_sequence_length = 64;
    let mut m = KvCacheManager::new(cfg).unwrap();
    let mut next_id = 0u64;
    let mut live: Vec<u64> = Vec::new();
    // The rows of each suspended sequence when it was suspended.
    let mut snapshots: std::collections::HashMap<u64, Vec<Vec<u8>>> = Default::default();
    for step in 0..steps {
        let op = rng.below(12);
        if live.is_empty() && op > 1 {
            continue;
        }
        let id = if live.is_empty() {
            0
        } else {
            live[rng.below(live.len())]
        };
        let before = fingerprint(&m);
        let ctx = format!("seed {seed} step {step} op {op} id {id}");
        let was_suspended = live.contains(&id) && m.is_suspended(id).unwrap();
        let result: Result<bool, KvError> = match op {
            0 | 1 => {
                let new = next_id;
                next_id += 1;
                let base = rng.below(3) as i32 * 1000;
                let len = rng.range(2, 30) as i32;
                let r = m.add_sequence(&Request::new(new, (base..base + len).collect()));
                if r.is_ok() {
                    live.push(new);
                }
                r.map(|_| true)
            }
            2 => m.add_token(id, rng.below(50) as i32).map(|_| true),
            3 => m.resize(id, rng.below(64)),
            4 => m.allocate_generation(id, rng.below(4)),
            5 => m.revert_allocate_generation(id),
            6 => m.extend_capacity_for_tokens(id, rng.below(4)),
            7 => match m.revert_allocate_context(id) {
                Ok(ContextRevert::Released) => {
                    live.retain(|&x| x != id);
                    Ok(true)
                }
                r => r.map(|r| r != ContextRevert::NothingToRevert),
            },
            8 => m.suspend(id).map(|_| true),
            9 if was_suspended => m.resume(id),
            9 => m.allocate_context(id, rng.below(8)),
            10 => {
                let l = m.sequence_lengths(id).unwrap();
                m.store_context_blocks(id, rng.below(l.capacity.min(l.num_tokens) + 1))
                    .map(|_| true)
            }
            _ => {
                live.retain(|&x| x != id);
                snapshots.remove(&id);
                m.remove_sequence(id, rng.percent(50)).map(|_| true)
            }
        };
        if let Err(e) = &result {
            assert!(
                matches!(
                    e,
                    KvError::OutOfBlocks { .. }
                        | KvError::InvalidArgument(_)
                        | KvError::SequenceSuspended(_)
                        | KvError::SequenceTooLong { .. }
                        | KvError::Unsupported(_)
                ),
                "{ctx}: unexpected error {e}"
            );
        }
        if !matches!(result, Ok(true)) {
            assert_eq!(
                fingerprint(&m),
                before,
                "{ctx}: a failed or refused call changed state"
            );
        }
        m.check_invariants()
            .unwrap_or_else(|e| panic!("{ctx}: {e}"));
        // A suspended sequence's rows keep their bytes, wherever they move, and a resumed one
        // has the bytes it had.
        let ids: Vec<u64> = snapshots.keys().copied().collect();
        for s in ids {
            if !m.has_sequence(s) {
                snapshots.remove(&s);
                continue;
            }
            assert_eq!(
                rows_of(&mut m, s),
                snapshots[&s],
                "{ctx}: sequence {s} lost bytes"
            );
            if !m.is_suspended(s).unwrap() {
                snapshots.remove(&s);
            }
        }
        // The engine writes the rows of active sequences (distinct bytes per row, so a row
        // mix-up would show); only rows no other sequence reads.
        for &a in &live {
            if m.is_suspended(a).unwrap() {
                if let std::collections::hash_map::Entry::Vacant(e) = snapshots.entry(a) {
                    e.insert(rows_of(&mut m, a));
                }
                continue;
            }
            let (base, row) = m.pool_pointer(W, Level::Primary).unwrap();
            for b in m.cache_block_ids(a, W, 0).unwrap() {
                let info = m.block_info(W, b).unwrap();
                if info.ref_count == 1 && info.level == Level::Primary {
                    let v = (step as u8).wrapping_add(b as u8);
                    // SAFETY: a primary row of the host pool.
                    unsafe {
                        std::ptr::write_bytes(base.add(info.memory_index as usize * row), v, row)
                    };
                }
            }
        }
    }
    m.window(W).unwrap().stats().suspended_moved_to_host
}
