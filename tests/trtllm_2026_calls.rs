//! The C calls added for TensorRT-LLM's 2026 manager surface: argument validation, failures
//! that change nothing (a buffer too small pins, commits and resets nothing), and the reuse
//! tree staying consistent when it is reset or truncated under live sequences that share
//! blocks.

use std::ptr::{null, null_mut};

use kvblock::ffi::handle::kvb_manager_t;
use kvblock::ffi::iteration_stats::kvb_iteration_stats_t;
use kvblock::ffi::manager::*;
use kvblock::ffi::reuse_tree::kvb_prefix_reuse_summary_t;
use kvblock::ffi::status::*;
use kvblock::ffi::types::*;

use kvb_status_t::*;

const TPB: usize = 4;

fn manager(reuse: bool) -> *mut kvb_manager_t {
    let windows = [kvb_window_config_t {
        window_size: 64,
        primary_blocks: 32,
        secondary_blocks: 4,
        num_layers: 1,
        num_kv_heads: 1,
        size_per_head: 4,
        auto_host_tier: false,
    }];
    // SAFETY: plain C struct, filled by config_init.
    let mut c = unsafe { std::mem::zeroed::<kvb_manager_config_t>() };
    assert_eq!(kvb_manager_config_init(&mut c), KVB_OK);
    c.windows = windows.as_ptr();
    c.num_windows = 1;
    c.max_sequence_length = 64;
    c.tokens_per_block = TPB as i32;
    c.enable_block_reuse = reuse;
    c.max_kv_event_entries = 100;
    let mut h = null_mut();
    assert_eq!(kvb_manager_create(&c, &mut h), KVB_OK);
    h
}

fn request(id: u64, tokens: &[i32]) -> kvb_request_t {
    // SAFETY: plain C struct, filled by request_init.
    let mut r = unsafe { std::mem::zeroed::<kvb_request_t>() };
    assert_eq!(kvb_request_init(&mut r), KVB_OK);
    r.request_id = id;
    r.tokens = tokens.as_ptr();
    r.num_tokens = tokens.len();
    r.input_length = tokens.len() as i32;
    r
}

/// Admits `tokens` as sequence `id`, computes its prompt and stores it.
fn admit_and_store(m: *mut kvb_manager_t, id: u64, tokens: &[i32]) {
    let r = request(id, tokens);
    assert_eq!(kvb_manager_add_sequence(m, &r, null_mut()), KVB_OK);
    assert_eq!(
        kvb_manager_store_context_blocks(m, id, tokens.len() as i32),
        KVB_OK
    );
}

fn free_blocks(m: *mut kvb_manager_t) -> i64 {
    let mut n = 0;
    assert_eq!(kvb_manager_get_num_free_blocks(m, &mut n), KVB_OK);
    n
}

fn reusable(m: *mut kvb_manager_t, tokens: &[i32]) -> i32 {
    let r = request(99, tokens);
    let mut n = 0;
    assert_eq!(
        kvb_manager_count_reusable_blocks(m, &r, 64, false, &mut n),
        KVB_OK
    );
    n
}

#[test]
fn null_and_unknown_arguments_are_errors_not_crashes() {
    let m = manager(true);
    let mut s = kvb_prefix_reuse_summary_t::default();
    assert_eq!(
        kvb_manager_analyze_prefix_reuse(m, null(), 64, &mut s),
        KVB_STATUS_NULL_POINTER
    );
    let toks: Vec<i32> = (0..9).collect();
    let r = request(1, &toks);
    assert_eq!(
        kvb_manager_analyze_prefix_reuse(m, &r, 65, &mut s),
        KVB_STATUS_INVALID_ARGUMENT
    );
    let mut n = 0usize;
    assert_eq!(
        kvb_manager_get_iteration_stats(m, null_mut(), 0, &mut n),
        KVB_STATUS_BUFFER_TOO_SMALL
    );
    assert_eq!(n, 1);
    let mut out = 0;
    assert_eq!(
        kvb_manager_get_num_front_blocks_removed(m, 7, 64, &mut out),
        KVB_STATUS_UNKNOWN_REQUEST
    );
    assert_eq!(
        kvb_manager_get_beam_width(m, 7, &mut out),
        KVB_STATUS_UNKNOWN_REQUEST
    );
    let mut rows = [0i32; 1];
    assert_eq!(
        kvb_manager_get_memory_pool_block_indices(m, 64, [1000].as_ptr(), 1, rows.as_mut_ptr()),
        KVB_STATUS_INVALID_ARGUMENT
    );
    assert_eq!(
        kvb_manager_truncate_blocks(m, null(), 3, 0, null_mut()),
        KVB_STATUS_NULL_POINTER
    );
    assert_eq!(
        kvb_manager_truncate_blocks(m, toks.as_ptr(), toks.len(), -1, null_mut()),
        KVB_STATUS_INVALID_ARGUMENT
    );
    let state = {
        let mut st = std::mem::MaybeUninit::<kvb_request_state_t>::uninit();
        assert_eq!(kvb_request_state_init(st.as_mut_ptr()), KVB_OK);
        // SAFETY: initialised by kvb_request_state_init.
        unsafe { st.assume_init() }
    };
    assert_eq!(
        kvb_manager_get_needed_blocks_one_step_cached(m, &state, null(), false, 64, &mut out),
        KVB_STATUS_NULL_POINTER
    );
    let negative = kvb_prefix_reuse_summary_t {
        reusable_blocks_allocated: -1,
        ..Default::default()
    };
    assert_eq!(
        kvb_manager_get_needed_blocks_one_step_cached(m, &state, &negative, false, 64, &mut out),
        KVB_STATUS_INVALID_ARGUMENT
    );
    assert_eq!(kvb_manager_check_invariants(m), KVB_OK);
    kvb_manager_destroy(m);
}

#[test]
fn a_buffer_too_small_pins_and_commits_nothing() {
    let m = manager(true);
    let toks: Vec<i32> = (0..13).collect();
    admit_and_store(m, 1, &toks);
    assert_eq!(kvb_manager_remove_sequence(m, 1, true), KVB_OK);
    let free = free_blocks(m);
    let r = request(2, &toks);
    let mut ids = [0i32; 2];
    let mut n = 0usize;
    assert_eq!(
        kvb_manager_find_blocks_in_reuse_tree(m, &r, 12, 64, true, ids.as_mut_ptr(), 2, &mut n),
        KVB_STATUS_BUFFER_TOO_SMALL
    );
    assert_eq!(n, 3);
    assert_eq!(free_blocks(m), free, "nothing pinned");
    let mut ids = [0i32; 3];
    assert_eq!(
        kvb_manager_find_blocks_in_reuse_tree(m, &r, 12, 64, true, ids.as_mut_ptr(), 3, &mut n),
        KVB_OK
    );
    assert_eq!(free_blocks(m), free - 3);
    assert_eq!(
        kvb_manager_unpin_blocks_by_id(m, 64, ids.as_ptr(), 3),
        KVB_OK
    );
    assert_eq!(free_blocks(m), free);

    // commit: too small a buffer stores nothing.
    let other: Vec<i32> = (100..113).collect();
    let r = request(3, &other);
    assert_eq!(kvb_manager_add_sequence(m, &r, null_mut()), KVB_OK);
    assert_eq!(kvb_manager_advance_history(m, 3, 13), KVB_OK);
    let mut hashes = [0u64; 1];
    assert_eq!(
        kvb_manager_commit_block_hashes(m, 3, 64, hashes.as_mut_ptr(), 1, &mut n),
        KVB_STATUS_BUFFER_TOO_SMALL
    );
    assert_eq!(n, 3);
    assert_eq!(reusable(m, &other), 0);
    let mut hashes = [0u64; 3];
    assert_eq!(
        kvb_manager_commit_block_hashes(m, 3, 64, hashes.as_mut_ptr(), 3, &mut n),
        KVB_OK
    );
    assert_eq!(reusable(m, &other), 3);
    assert!(hashes.iter().all(|&h| h != 0));
    assert_eq!(kvb_manager_check_invariants(m), KVB_OK);
    kvb_manager_destroy(m);
}

/// With reuse off, committing hashes commits nothing and returns none: the blocks' slots, which
/// hold the tokens a hash is made of, are never written then. (The fuzz target found it reading
/// an extra-id arena that did not exist, a caught panic that poisoned the manager.)
#[test]
fn committing_hashes_without_reuse_returns_none() {
    let m = manager(false);
    let toks: Vec<i32> = (0..13).collect();
    let extra: Vec<u64> = (0..13).map(|i| 1000 + i).collect();
    let mut r = request(1, &toks);
    r.token_extra_ids = extra.as_ptr();
    assert_eq!(kvb_manager_add_sequence(m, &r, null_mut()), KVB_OK);
    assert_eq!(kvb_manager_advance_history(m, 1, 13), KVB_OK);
    assert_eq!(kvb_manager_add_token(m, 1, 77), KVB_OK);
    let mut hashes = [7u64; 4];
    let mut n = 99usize;
    assert_eq!(
        kvb_manager_commit_block_hashes(m, 1, 64, hashes.as_mut_ptr(), 4, &mut n),
        KVB_OK
    );
    assert_eq!(n, 0);
    assert_eq!(kvb_manager_check_invariants(m), KVB_OK);
    kvb_manager_destroy(m);
}

#[test]
fn iteration_stats_restart_only_when_read() {
    let m = manager(true);
    let toks: Vec<i32> = (0..9).collect();
    admit_and_store(m, 1, &toks);
    let mut n = 0usize;
    // A refused read does not start a new interval.
    assert_eq!(
        kvb_manager_get_iteration_stats(m, null_mut(), 0, &mut n),
        KVB_STATUS_BUFFER_TOO_SMALL
    );
    let mut s = [kvb_iteration_stats_t::default()];
    assert_eq!(
        kvb_manager_get_iteration_stats(m, s.as_mut_ptr(), 1, &mut n),
        KVB_OK
    );
    assert_eq!(s[0].iter_alloc_total_blocks, 3);
    assert_eq!(s[0].primary_used_blocks, 3);
    assert_eq!(s[0].primary_peak_used_blocks, 3);
    assert_eq!(kvb_manager_remove_sequence(m, 1, true), KVB_OK);
    assert_eq!(
        kvb_manager_get_iteration_stats(m, s.as_mut_ptr(), 1, &mut n),
        KVB_OK
    );
    assert_eq!(s[0].iter_alloc_total_blocks, 0);
    assert_eq!(
        s[0].primary_peak_used_blocks, 3,
        "the peak was before the removal"
    );
    assert_eq!(s[0].primary_used_blocks, 0);
    assert_eq!(s[0].primary_evictable_blocks, 2);
    kvb_manager_destroy(m);
}

#[test]
fn reset_and_truncate_under_live_sequences_that_share_blocks_keep_the_invariants() {
    let m = manager(true);
    let toks: Vec<i32> = (0..17).collect();
    admit_and_store(m, 1, &toks);
    // Sequence 2 reuses sequence 1's blocks: both hold them.
    let r = request(2, &toks);
    let mut a = kvb_admission_t::default();
    assert_eq!(kvb_manager_add_sequence(m, &r, &mut a), KVB_OK);
    assert_eq!(a.prepopulated_prompt_len, 16);
    let mut removed = 0usize;
    assert_eq!(
        kvb_manager_truncate_blocks(m, toks.as_ptr(), toks.len(), 6, &mut removed),
        KVB_OK
    );
    assert_eq!(removed, 2, "blocks 2 and 3 of 4 left the tree");
    assert_eq!(reusable(m, &toks), 2);
    assert_eq!(kvb_manager_check_invariants(m), KVB_OK);
    assert_eq!(kvb_manager_reset_reuse_state(m, &mut removed), KVB_OK);
    assert_eq!(removed, 2);
    assert_eq!(reusable(m, &toks), 0);
    assert_eq!(kvb_manager_check_invariants(m), KVB_OK);
    // Both sequences can still grow, store and leave; the tree is rebuilt from them.
    for id in [1u64, 2] {
        assert_eq!(kvb_manager_store_context_blocks(m, id, 17), KVB_OK);
        let mut done = false;
        assert_eq!(kvb_manager_resize(m, id, 18, &mut done), KVB_OK);
        assert!(done);
        assert_eq!(kvb_manager_add_token(m, id, 50), KVB_OK);
        assert_eq!(kvb_manager_check_invariants(m), KVB_OK);
    }
    assert_eq!(kvb_manager_remove_sequence(m, 1, true), KVB_OK);
    assert_eq!(kvb_manager_remove_sequence(m, 2, true), KVB_OK);
    assert_eq!(kvb_manager_check_invariants(m), KVB_OK);
    assert_eq!(reusable(m, &toks), 4);
    assert_eq!(free_blocks(m), 32);
    kvb_manager_destroy(m);
}

#[test]
fn cached_estimates_equal_the_walking_ones() {
    let m = manager(true);
    let toks: Vec<i32> = (0..21).collect();
    admit_and_store(m, 1, &toks);
    let r = request(2, &toks);
    let mut s = kvb_prefix_reuse_summary_t::default();
    assert_eq!(kvb_manager_analyze_prefix_reuse(m, &r, 64, &mut s), KVB_OK);
    assert_eq!(s.reusable_blocks_all, 5);
    assert_eq!(s.reusable_blocks_allocated, 5);
    assert_eq!(s.first_new_block_index, 5);
    let mut state = std::mem::MaybeUninit::<kvb_request_state_t>::uninit();
    assert_eq!(kvb_request_state_init(state.as_mut_ptr()), KVB_OK);
    // SAFETY: initialised by kvb_request_state_init.
    let mut state = unsafe { state.assume_init() };
    state.request_id = 2;
    state.prompt_len = 21;
    state.context_chunk_size = 21;
    state.max_new_tokens = 8;
    let (mut walked, mut cached) = (0, 0);
    assert_eq!(
        kvb_manager_get_needed_blocks_one_step(m, &state, &r, false, 64, &mut walked),
        KVB_OK
    );
    assert_eq!(
        kvb_manager_get_needed_blocks_one_step_cached(m, &state, &s, false, 64, &mut cached),
        KVB_OK
    );
    assert_eq!(walked, cached);
    assert_eq!(walked, 1);
    assert_eq!(
        kvb_manager_get_remaining_blocks_to_completion(m, &state, &r, 64, &mut walked),
        KVB_OK
    );
    assert_eq!(
        kvb_manager_get_remaining_blocks_to_completion_cached(m, &state, &s, 64, &mut cached),
        KVB_OK
    );
    assert_eq!(walked, cached);
    // Reuse off: nothing is reusable and there is no first new block.
    let off = manager(false);
    assert_eq!(
        kvb_manager_analyze_prefix_reuse(off, &r, 64, &mut s),
        KVB_OK
    );
    assert_eq!((s.reusable_blocks_all, s.first_new_block_index), (0, -1));
    kvb_manager_destroy(off);
    kvb_manager_destroy(m);
}
