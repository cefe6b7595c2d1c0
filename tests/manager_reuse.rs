//! Scenario tests of the manager's reuse, eviction and host-tier behaviour.

mod common;

use common::window;

use kvblock::manager::{CopyBackend, KvCacheManager, ManagerConfig, Request};
use kvblock::pool::Level;

fn config(primary: usize, secondary: usize, tpb: usize) -> ManagerConfig {
    ManagerConfig {
        windows: vec![window(1024, primary, secondary)],
        tokens_per_block: tpb,
        max_sequence_length: 1024,
        manual_clock: true,
        ..ManagerConfig::default()
    }
}

fn tokens(range: std::ops::Range<i32>) -> Vec<i32> {
    range.collect()
}

#[test]
fn full_blocks_are_reused_and_last_token_never_is() {
    let mut m = KvCacheManager::new(config(16, 0, 4)).unwrap();
    let a = m.add_sequence(&Request::new(1, tokens(0..9))).unwrap();
    assert_eq!(a.prepopulated_prompt_len, 0);
    assert_eq!(a.stats.missed_blocks, 3);
    common::prefill_done(&mut m, 1);
    m.remove_sequence(1, true).unwrap();
    m.check_invariants().unwrap();
    // Same prompt: 8 reusable tokens (2 full blocks); the 9th is the last token.
    let b = m.add_sequence(&Request::new(2, tokens(0..9))).unwrap();
    assert_eq!(b.prepopulated_prompt_len, 8);
    assert_eq!(b.stats.reused_blocks, 2);
    assert_eq!(b.stats.missed_blocks, 1);
    m.check_invariants().unwrap();
    // Exactly two blocks long: only 7 reusable tokens (one full block + 3 of a partial copy).
    let c = m.add_sequence(&Request::new(3, tokens(0..8))).unwrap();
    assert_eq!(c.prepopulated_prompt_len, 7);
    m.check_invariants().unwrap();
}

#[test]
fn partial_reuse_takes_over_unused_leaf_and_copies_shared_block() {
    let mut m = KvCacheManager::new(config(16, 0, 4)).unwrap();
    m.add_sequence(&Request::new(1, tokens(0..7))).unwrap();
    common::prefill_done(&mut m, 1);
    m.remove_sequence(1, true).unwrap();
    // Tree now: [0..4] -> [4,5] (partial). Request shares 0..6 then diverges.
    let mut t = tokens(0..6);
    t.extend([100, 101, 102]);
    let b = m.add_sequence(&Request::new(2, t.clone())).unwrap();
    assert_eq!(b.prepopulated_prompt_len, 6);
    let ids_b = m.cache_block_ids(2, 1024, 0).unwrap();
    m.check_invariants().unwrap();
    // The leaf [4,5] was unused: taken over, so request 3 with the same prompt copies instead.
    let c = m.add_sequence(&Request::new(3, t)).unwrap();
    assert_eq!(c.prepopulated_prompt_len, 4);
    let ids_c = m.cache_block_ids(3, 1024, 0).unwrap();
    assert_eq!(ids_b[0], ids_c[0]);
    assert_ne!(ids_b[1], ids_c[1]);
    m.check_invariants().unwrap();
}

#[test]
fn offload_on_eviction_and_onboard_on_reuse() {
    let mut m = KvCacheManager::new(config(4, 4, 4)).unwrap();
    m.add_sequence(&Request::new(1, tokens(0..13))).unwrap();
    common::prefill_done(&mut m, 1);
    m.remove_sequence(1, true).unwrap();
    // A different prompt takes all 4 primary blocks: cached blocks move to the host.
    m.add_sequence(&Request::new(2, tokens(100..116))).unwrap();
    m.check_invariants().unwrap();
    let s = m.stats();
    assert_eq!(
        s.offloaded_blocks, 3,
        "the fourth block held only the last token: no key"
    );
    m.remove_sequence(2, false).unwrap();
    let a = m.add_sequence(&Request::new(3, tokens(0..13))).unwrap();
    assert_eq!(a.prepopulated_prompt_len, 12);
    assert_eq!(m.stats().onboarded_blocks, 3);
    for b in m.cache_block_ids(3, 1024, 0).unwrap() {
        assert_eq!(m.block_info(1024, b).unwrap().level, Level::Primary);
    }
    m.check_invariants().unwrap();
}

#[test]
fn failed_admission_changes_nothing() {
    let mut m = KvCacheManager::new(config(4, 0, 4)).unwrap();
    m.add_sequence(&Request::new(1, tokens(0..9))).unwrap();
    let before = m.stats();
    let err = m
        .add_sequence(&Request::new(2, tokens(50..59)))
        .unwrap_err();
    assert!(matches!(err, kvblock::error::KvError::OutOfBlocks { .. }));
    assert_eq!(m.stats(), before);
    assert!(!m.has_sequence(2));
    m.check_invariants().unwrap();
}

#[test]
fn host_data_survives_offload_and_onboard() {
    let mut cfg = config(2, 2, 4);
    cfg.copy_backend = CopyBackend::HostMemory;
    cfg.bytes_per_element = 1;
    let mut m = KvCacheManager::new(cfg).unwrap();
    m.add_sequence(&Request::new(1, tokens(0..5))).unwrap();
    let ids = m.cache_block_ids(1, 1024, 0).unwrap();
    let (base, row) = m.pool_pointer(1024, Level::Primary).unwrap();
    for (i, &b) in ids.iter().enumerate() {
        let mem = m.block_info(1024, b).unwrap().memory_index as usize;
        unsafe { std::ptr::write_bytes(base.add(mem * row), 10 + i as u8, row) };
    }
    common::prefill_done(&mut m, 1);
    m.remove_sequence(1, true).unwrap();
    m.add_sequence(&Request::new(2, tokens(100..108))).unwrap();
    m.remove_sequence(2, false).unwrap();
    let a = m.add_sequence(&Request::new(3, tokens(0..5))).unwrap();
    assert_eq!(a.prepopulated_prompt_len, 4);
    let b = m.cache_block_ids(3, 1024, 0).unwrap()[0];
    let info = m.block_info(1024, b).unwrap();
    assert_eq!(info.level, Level::Primary);
    let (base, row) = m.pool_pointer(1024, Level::Primary).unwrap();
    let bytes =
        unsafe { std::slice::from_raw_parts(base.add(info.memory_index as usize * row), row) };
    assert!(bytes.iter().all(|&x| x == 10));
    m.check_invariants().unwrap();
}

/// A sequence keeps its tokens only in its blocks' key slots: generated tokens (extra id 0),
/// a rewind that copies a shared block, and the tokens written after it are what gets stored.
#[test]
fn stored_keys_are_the_tokens_written_into_the_slots() {
    let mut m = KvCacheManager::new(config(32, 0, 4)).unwrap();
    let with_extra = |id: u64, t: Vec<i32>| {
        let mut r = Request::new(id, t.clone());
        r.extra_ids = Some(t.iter().map(|&x| x as u64 * 7).collect());
        r
    };
    // 6 prompt tokens, 6 generated: 12 tokens, the last not stored.
    m.add_sequence(&with_extra(1, tokens(0..6))).unwrap();
    for t in 100..106 {
        m.add_token(1, t).unwrap();
    }
    m.store_blocks_for_reuse(1, false, None, 0).unwrap();
    // A second sequence shares the three stored blocks' first two, then rewinding the first
    // into its shared second block copies it (copy on write) and writes other tokens there.
    let mut full: Vec<i32> = tokens(0..6);
    full.extend(100..106);
    let mut extra: Vec<u64> = (0..6).map(|x| x * 7).collect();
    extra.extend([0; 6]);
    let mut r2 = Request::new(2, full[..9].to_vec());
    r2.extra_ids = Some(extra[..9].to_vec());
    assert_eq!(m.add_sequence(&r2).unwrap().prepopulated_prompt_len, 8);
    m.rewind(1, 6).unwrap();
    for t in 200..206 {
        m.add_token(1, t).unwrap();
    }
    m.check_invariants().unwrap();
    common::prefill_done(&mut m, 1);
    m.remove_sequence(1, true).unwrap();
    common::prefill_done(&mut m, 2);
    m.remove_sequence(2, true).unwrap();
    m.check_invariants().unwrap();
    let mut rewritten: Vec<i32> = tokens(0..6);
    rewritten.extend(200..206);
    let mut r3 = Request::new(3, rewritten);
    r3.extra_ids = Some(extra.clone());
    assert_eq!(
        m.add_sequence(&r3).unwrap().prepopulated_prompt_len,
        11,
        "the rewritten tokens were stored, the partial last block too (the 12th is the last token)"
    );
    // Without extra ids no block matches exactly: they are part of the key (only token 0, extra
    // id 0 on both sides, matches partially).
    let mut plain: Vec<i32> = tokens(0..6);
    plain.extend(200..206);
    assert_eq!(
        m.add_sequence(&Request::new(4, plain))
            .unwrap()
            .prepopulated_prompt_len,
        1
    );
    m.check_invariants().unwrap();
}

#[test]
fn pinning_store_checks_the_callers_bound_before_changing_anything() {
    let mut m = KvCacheManager::new(config(16, 0, 4)).unwrap();
    m.add_sequence(&Request::new(1, tokens(0..10))).unwrap();
    common::prefill_done(&mut m, 1);
    // 9 stored tokens span 3 blocks: a bound of 2 fails, nothing is stored or pinned.
    let err = m.store_blocks_for_reuse(1, true, None, 2).unwrap_err();
    assert_eq!(
        err,
        kvblock::error::KvError::BufferTooSmall {
            needed: 3,
            given: 2
        }
    );
    assert!(m.reuse_tree_snapshot(1024).unwrap().is_empty());
    m.check_invariants().unwrap();
    // Without pinning the bound does not apply; with room for 3 ids, 3 blocks are pinned.
    assert!(m
        .store_blocks_for_reuse(1, false, None, 0)
        .unwrap()
        .is_empty());
    let pinned = m.store_blocks_for_reuse(1, true, None, 3).unwrap();
    assert_eq!(pinned.len(), 3);
    m.check_invariants().unwrap();
}

/// A request that opts out of reuse (TensorRT-LLM's per-call `isEnableBlockReuse = false`).
fn opted_out(id: u64, t: Vec<i32>) -> Request {
    Request {
        disable_reuse: true,
        ..Request::new(id, t)
    }
}

#[test]
fn a_request_that_opts_out_of_reuse_matches_nothing_cached() {
    let mut m = KvCacheManager::new(config(16, 0, 4)).unwrap();
    m.add_sequence(&Request::new(1, tokens(0..9))).unwrap();
    common::prefill_done(&mut m, 1);
    m.remove_sequence(1, true).unwrap();
    let free = m.num_free_blocks();
    let a = m.add_sequence(&opted_out(2, tokens(0..9))).unwrap();
    assert_eq!(a.prepopulated_prompt_len, 0);
    assert_eq!(a.stats.reused_blocks, 0);
    assert_eq!(a.stats.missed_blocks, 3);
    // Three blocks of its own: none of the cached ones is shared.
    let ids = m.cache_block_ids(2, 1024, 0).unwrap();
    assert_eq!(m.num_free_blocks(), free - 3);
    m.check_invariants().unwrap();
    // The cached prefix is still there for a request that takes part.
    let b = m.add_sequence(&Request::new(3, tokens(0..9))).unwrap();
    assert_eq!(b.prepopulated_prompt_len, 8);
    let shared = m.cache_block_ids(3, 1024, 0).unwrap();
    assert!(shared[..2].iter().all(|id| !ids.contains(id)));
    m.check_invariants().unwrap();
}

#[test]
fn a_request_that_opts_out_of_reuse_is_never_stored() {
    let mut m = KvCacheManager::new(config(16, 0, 4)).unwrap();
    m.add_sequence(&opted_out(1, tokens(0..13))).unwrap();
    common::prefill_done(&mut m, 1);
    m.store_context_blocks(1, 13).unwrap();
    assert!(m
        .store_blocks_for_reuse(1, true, None, 8)
        .unwrap()
        .is_empty());
    m.remove_sequence(1, true).unwrap();
    m.check_invariants().unwrap();
    let later = m.add_sequence(&Request::new(2, tokens(0..13))).unwrap();
    assert_eq!(later.prepopulated_prompt_len, 0);
    assert_eq!(later.stats.reused_blocks, 0);
    m.check_invariants().unwrap();
}

#[test]
fn beams_of_an_opted_out_request_share_the_last_block_its_prompt_fills() {
    let cfg = ManagerConfig {
        max_beam_width: 4,
        ..config(16, 0, 4)
    };
    let mut m = KvCacheManager::new(cfg).unwrap();
    // 8 tokens fill two blocks: without reuse all four beams share both.
    let r = Request {
        beam_width: 4,
        ..opted_out(1, tokens(0..8))
    };
    let a = m.add_sequence(&r).unwrap();
    assert_eq!(a.stats.alloc_total_blocks, 2);
    let beam0 = m.cache_block_ids(1, 1024, 0).unwrap();
    for beam in 1..4 {
        assert_eq!(m.cache_block_ids(1, 1024, beam).unwrap(), beam0);
    }
    m.check_invariants().unwrap();
    // The first slot past the shared blocks takes a block per beam.
    assert!(m.add_slot(1).unwrap());
    let grown: Vec<u32> = (0..4)
        .map(|beam| m.cache_block_ids(1, 1024, beam).unwrap()[2])
        .collect();
    assert_eq!(
        grown.iter().collect::<std::collections::HashSet<_>>().len(),
        4
    );
    m.check_invariants().unwrap();
    // With reuse each beam owns its last block (2 - 1 shared + 4).
    let r = Request {
        beam_width: 4,
        ..Request::new(2, tokens(100..108))
    };
    let b = m.add_sequence(&r).unwrap();
    assert_eq!(b.stats.alloc_total_blocks, 5);
    // A prompt that does not fill its last block gives each beam its own, opted out or not.
    let r = Request {
        beam_width: 4,
        ..opted_out(3, tokens(200..207))
    };
    let c = m.add_sequence(&r).unwrap();
    assert_eq!(c.stats.alloc_total_blocks, 5);
    m.check_invariants().unwrap();
    for id in [1, 2, 3] {
        m.remove_sequence(id, false).unwrap();
    }
    assert_eq!(m.num_free_blocks(), 16);
    m.check_invariants().unwrap();
}

#[test]
fn the_estimates_of_an_opted_out_request_count_no_reuse() {
    use kvblock::manager::{RequestPhase, RequestState};
    let mut m = KvCacheManager::new(config(16, 0, 4)).unwrap();
    // Sequence 1 holds a 13-token prompt whose three full blocks are stored.
    m.add_sequence(&Request::new(1, tokens(0..13))).unwrap();
    common::prefill_done(&mut m, 1);
    m.store_context_blocks(1, 13).unwrap();
    let state = RequestState {
        request_id: 2,
        phase: RequestPhase::ContextInit,
        prompt_len: 13,
        beam_width: 1,
        context_chunk_size: 13,
        num_draft_tokens: 0,
        max_new_tokens: 4,
        num_generated_tokens: 0,
    };
    let plain = Request::new(2, tokens(0..13));
    let out = opted_out(2, tokens(0..13));
    let needed = |m: &mut KvCacheManager, r: &Request| {
        m.needed_blocks_one_step(&state, Some(r), false, 1024)
            .unwrap()
    };
    assert_eq!(needed(&mut m, &plain), 1);
    assert_eq!(needed(&mut m, &out), 4);
    // Both would fit (11 blocks free): only the request that takes part reuses.
    let estimates = m
        .estimate_batch(&[plain, opted_out(3, tokens(0..13))])
        .unwrap();
    assert_eq!(estimates[0].reusable_tokens, 12);
    assert_eq!(estimates[1].reusable_tokens, 0);
    assert_eq!(estimates[1].allocated_blocks, 4);
}
