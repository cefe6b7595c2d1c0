//! The data path read the way an engine reads it: KV is written only where kvblock says it must
//! be computed (positions from the history on), at the place the offset table points to, and
//! attention reads every in-window position back through the offset table. A position must hold
//! the KV of its own token: never bytes nobody wrote, never another request's.
//!
//! Each test here failed before its fix (issue 21): storing a request preempted in the middle of
//! its chunked prefill cached prompt blocks never computed, and a rewind on a sliding window left
//! a front block detached (free, rewritten by another request) although it was back in the
//! window.

mod common;

use common::window;

use kvblock::error::KvError;
use kvblock::manager::{CopyBackend, KvCacheManager, ManagerConfig, Request, WindowSpec};
use kvblock::pool::Level;

const TPB: usize = 4;
const MAX_LEN: usize = 64;

fn manager(windows: Vec<WindowSpec>, max_draft_tokens: usize) -> KvCacheManager {
    KvCacheManager::new(ManagerConfig {
        windows,
        tokens_per_block: TPB,
        max_sequence_length: MAX_LEN,
        max_draft_tokens,
        manual_clock: true,
        copy_backend: CopyBackend::HostMemory,
        bytes_per_element: 1,
        ..ManagerConfig::default()
    })
    .expect("manager")
}

/// The KV byte a token's K and V hold (never 0, the value of a pool nobody wrote).
fn kv_of(token: i32) -> u8 {
    (token.rem_euclid(251) + 1) as u8
}

/// An engine over a window's host pool: one layer, one head, one element per token, so the
/// offset table entry `e` of a block addresses `e * TPB` bytes into the pool (`[K|V][token]`).
struct Probe {
    window: usize,
    /// The window's pool in the offset table (windows ascending).
    pool: usize,
}

impl Probe {
    /// The pool address of position `pos` of sequence `id`, K (`field` 0) or V (1), found
    /// through the sequence's offset table row in this window.
    fn address(&self, m: &mut KvCacheManager, id: u64, pos: usize, field: usize) -> *mut u8 {
        let (max_blocks, pools) = m.offset_table_dimensions();
        let mut table = vec![0i32; pools * 2 * max_blocks];
        m.copy_block_offsets(&mut table, 1, 0, id).expect("offsets");
        let pool = self.pool;
        let entry = table[(pool * 2 + field) * max_blocks + pos / TPB];
        assert_ne!(
            entry,
            kvblock::manager::NO_BLOCK_OFFSET,
            "position {pos} has a block"
        );
        let (base, row) = m.pool_pointer(self.window, Level::Primary).unwrap();
        assert_eq!(row, 2 * TPB);
        // SAFETY: the entry addresses a row of the pool; the position is within its block.
        unsafe { base.add(entry as usize * TPB + pos % TPB) }
    }

    /// `(position, field, address)` of both fields of every position in `range` of `id`.
    fn slots(
        &self,
        m: &mut KvCacheManager,
        id: u64,
        range: std::ops::Range<usize>,
    ) -> Vec<(usize, usize, *mut u8)> {
        range
            .flat_map(|pos| [(pos, 0), (pos, 1)])
            .map(|(pos, field)| (pos, field, self.address(m, id, pos, field)))
            .collect()
    }

    /// Computes (writes) the KV of positions `range` of `id`, whose tokens are `tokens`.
    fn compute(
        &self,
        m: &mut KvCacheManager,
        id: u64,
        tokens: &[i32],
        range: std::ops::Range<usize>,
    ) {
        for (pos, _, at) in self.slots(m, id, range) {
            // SAFETY: a byte of the host pool (see `address`).
            unsafe { *at = kv_of(tokens[pos]) };
        }
    }

    /// Reads positions `range` of `id` as attention does and checks each holds its token's KV.
    fn attend(
        &self,
        m: &mut KvCacheManager,
        id: u64,
        tokens: &[i32],
        range: std::ops::Range<usize>,
    ) {
        for (pos, field, at) in self.slots(m, id, range) {
            // SAFETY: as in `compute`.
            let got = unsafe { *at };
            assert_eq!(
                got,
                kv_of(tokens[pos]),
                "window {}: request {id} reads position {pos} (field {field}) and finds KV \
                 that is not its token's",
                self.window
            );
        }
    }
}

/// One full window of 16 blocks, and the probe over its pool.
fn one_window() -> (KvCacheManager, Probe) {
    let probe = Probe {
        window: MAX_LEN,
        pool: 0,
    };
    (manager(vec![window(MAX_LEN, 16, 0)], 0), probe)
}

#[test]
fn a_request_preempted_mid_prefill_stores_only_what_its_chunks_computed() {
    let (mut m, probe) = one_window();
    let prompt: Vec<i32> = (100..112).collect();
    m.add_sequence(&Request::new(1, prompt.clone())).unwrap();
    // The first chunk (4 tokens) is computed and stored; the request is then preempted.
    probe.compute(&mut m, 1, &prompt, 0..4);
    m.store_context_blocks(1, 4).unwrap();
    m.remove_sequence(1, true).unwrap();
    m.check_invariants().unwrap();

    let again = m.add_sequence(&Request::new(2, prompt.clone())).unwrap();
    assert_eq!(
        again.prepopulated_prompt_len, 4,
        "only the computed chunk is reusable"
    );
    probe.attend(&mut m, 2, &prompt, 0..again.prepopulated_prompt_len);
    // A request admitted and removed before any chunk ran stores nothing new either.
    let other: Vec<i32> = (500..512).collect();
    m.add_sequence(&Request::new(3, other.clone())).unwrap();
    m.remove_sequence(3, true).unwrap();
    let fresh = m.add_sequence(&Request::new(4, other)).unwrap();
    assert_eq!(fresh.prepopulated_prompt_len, 0);
    m.check_invariants().unwrap();
}

#[test]
fn store_blocks_for_reuse_stops_at_the_history_too() {
    let (mut m, probe) = one_window();
    let prompt: Vec<i32> = (200..213).collect();
    m.add_sequence(&Request::new(1, prompt.clone())).unwrap();
    probe.compute(&mut m, 1, &prompt, 0..8);
    m.advance_history(1, 8).unwrap();
    // Pinning needs room for the computed blocks' ids only (2, not the 3 that 12 tokens span).
    let pinned = m.store_blocks_for_reuse(1, true, None, 2).unwrap();
    assert_eq!(pinned.len(), 2);
    let snapshot = m.reuse_tree_snapshot(MAX_LEN).unwrap();
    assert_eq!(snapshot.len(), 2, "two computed blocks cached, no more");
    m.remove_sequence(1, false).unwrap();
    let again = m.add_sequence(&Request::new(2, prompt.clone())).unwrap();
    assert_eq!(again.prepopulated_prompt_len, 8);
    probe.attend(&mut m, 2, &prompt, 0..8);
}

/// Admits request 1 with a 6-token prompt whose KV is computed and stored; returns its tokens.
fn admit_computed_prompt(m: &mut KvCacheManager, probe: &Probe) -> Vec<i32> {
    let tokens: Vec<i32> = (0..6).collect();
    m.add_sequence(&Request::new(1, tokens.clone())).unwrap();
    probe.compute(m, 1, &tokens, 0..tokens.len());
    m.store_context_blocks(1, tokens.len()).unwrap();
    tokens
}

/// Another request takes every free block of the sliding window and writes its own KV there.
fn intrude(m: &mut KvCacheManager, probe: &Probe, sliding: usize, intruder: &mut u64) {
    let free = m.num_free_blocks_of_window(sliding).unwrap().0;
    if free > 0 {
        let theirs: Vec<i32> = (0..(free * TPB) as i32).map(|t| 7000 + t).collect();
        m.add_sequence(&Request::new(*intruder, theirs.clone()))
            .unwrap();
        probe.compute(m, *intruder, &theirs, 0..theirs.len());
        m.remove_sequence(*intruder, false).unwrap();
        *intruder += 1;
    }
}

/// Speculative decoding on a sliding window: each step adds the accepted token and `drafts`
/// draft tokens (computing their KV), then rejects `rejected` of them (a rewind); meanwhile
/// another request takes every free block and writes its own KV there. Every position inside
/// the window must still hold the sequence's own KV at every step.
fn speculate_on_a_sliding_window(
    m: &mut KvCacheManager,
    sliding: usize,
    drafts: usize,
    rejected: usize,
) -> Result<(), KvError> {
    let probe = Probe {
        window: sliding,
        pool: 0,
    };
    let mut tokens = admit_computed_prompt(m, &probe);
    let mut next_token = 1000;
    let mut intruder = 2;
    while tokens.len() + drafts + 1 < MAX_LEN {
        for _ in 0..=drafts {
            m.add_token(1, next_token)?;
            tokens.push(next_token);
            next_token += 1;
            probe.compute(m, 1, &tokens, tokens.len() - 1..tokens.len());
        }
        m.rewind(1, rejected)?;
        tokens.truncate(tokens.len() - rejected);
        m.check_invariants().unwrap();
        intrude(m, &probe, sliding, &mut intruder);
        // The next token's attention: positions `len - window ..= len - 1` (the last one's KV
        // is computed, the token after it reads them all).
        let start = tokens.len().saturating_sub(sliding);
        probe.attend(m, 1, &tokens, start..tokens.len());
    }
    Ok(())
}

#[test]
fn rejected_drafts_on_a_sliding_window_never_leave_attention_reading_a_freed_block() {
    const SLIDING: usize = 10;
    // A sliding window keeps the configured draft tokens' worth of blocks before detaching: the
    // rewinds of rejected drafts never bring a detached block back.
    for (drafts, rejected) in [(3, 3), (3, 2), (2, 1), (1, 1)] {
        let mut m = manager(vec![window(SLIDING, 10, 0), window(MAX_LEN, 32, 0)], drafts);
        speculate_on_a_sliding_window(&mut m, SLIDING, drafts, rejected)
            .unwrap_or_else(|e| panic!("{drafts} drafts, {rejected} rejected: {e}"));
        assert!(
            m.window(SLIDING).unwrap().front_blocks_removed(1) > 0,
            "the window slid"
        );
    }
}

#[test]
fn a_rewind_past_the_kept_blocks_is_refused_and_changes_nothing() {
    const SLIDING: usize = 10;
    // No draft tokens configured: a rewind that would bring a detached block back is refused.
    let mut m = manager(vec![window(SLIDING, 10, 0), window(MAX_LEN, 32, 0)], 0);
    let err = speculate_on_a_sliding_window(&mut m, SLIDING, 2, 2).unwrap_err();
    assert!(matches!(err, KvError::Unsupported(_)), "{err}");
    assert!(err.to_string().contains("detached"), "{err}");
    let before = m.cache_block_ids(1, SLIDING, 0).unwrap();
    let lengths = m.sequence_lengths(1).unwrap();
    assert!(m.rewind(1, 2).is_err());
    assert_eq!(m.cache_block_ids(1, SLIDING, 0).unwrap(), before);
    assert_eq!(m.sequence_lengths(1).unwrap(), lengths);
    m.check_invariants().unwrap();
}

/// A step of one token and `drafts` drafts per iteration (`refresh_blocks` between steps) on a
/// manager configured for no drafts: after the step, another request takes every free block and
/// writes its own KV there, and then the step's first token attends its window.
fn draft_steps_in_iterations(m: &mut KvCacheManager, sliding: usize, drafts: usize) {
    let probe = Probe {
        window: sliding,
        pool: 0,
    };
    let mut tokens = admit_computed_prompt(m, &probe);
    let mut next_token = 1000;
    let mut intruder = 2;
    while tokens.len() + drafts + 1 < MAX_LEN {
        m.refresh_blocks();
        let first = tokens.len();
        for _ in 0..=drafts {
            m.add_token(1, next_token).unwrap();
            tokens.push(next_token);
            next_token += 1;
            probe.compute(m, 1, &tokens, tokens.len() - 1..tokens.len());
        }
        m.check_invariants().unwrap();
        intrude(m, &probe, sliding, &mut intruder);
        // The step's first token (position `first`) attends `first + 1 - sliding ..= first`.
        probe.attend(
            m,
            1,
            &tokens,
            (first + 1).saturating_sub(sliding)..first + 1,
        );
        // Rejecting every draft of the step never reaches a detached block.
        m.rewind(1, drafts).unwrap();
        tokens.truncate(tokens.len() - drafts);
        m.check_invariants().unwrap();
    }
}

#[test]
fn a_steps_drafts_never_free_a_block_its_first_token_attends() {
    const SLIDING: usize = 10;
    // No draft tokens configured: the iteration tells the manager how many tokens a step
    // added, and the window keeps every block the step's first token attends.
    for drafts in [1, 2, 3, 5] {
        let mut m = manager(vec![window(SLIDING, 12, 0), window(MAX_LEN, 32, 0)], 0);
        draft_steps_in_iterations(&mut m, SLIDING, drafts);
        assert!(
            m.window(SLIDING).unwrap().front_blocks_removed(1) > 0,
            "{drafts} drafts: the window slid"
        );
    }
}

#[test]
fn without_iterations_each_token_is_a_step_and_the_window_slides_per_token() {
    const SLIDING: usize = 8;
    // An engine that never calls refresh_blocks slides the window token by token, as before.
    let mut m = manager(vec![window(SLIDING, 12, 0), window(MAX_LEN, 32, 0)], 0);
    let prompt: Vec<i32> = (0..6).collect();
    m.add_sequence(&Request::new(1, prompt)).unwrap();
    m.store_context_blocks(1, 6).unwrap();
    for t in 0..14 {
        m.add_token(1, 100 + t).unwrap();
    }
    // 20 tokens, window 8: blocks wholly before token 12 (0..12, three blocks) are detached.
    assert_eq!(m.window(SLIDING).unwrap().front_blocks_removed(1), 3);
    m.check_invariants().unwrap();
}
