//! `add_slot`: a slot reserved without its token id (TensorRT-LLM's `addToken(requestId)`)
//! slides a sliding window by the slots, freeing the blocks that left it, and a block detached
//! before its tokens were known never gets its key published.

mod common;

use common::window;

use kvblock::error::KvError;
use kvblock::manager::{CopyBackend, KvCacheManager, ManagerConfig, Request};
use kvblock::pool::Level;

const W: usize = 8;
const TPB: usize = 4;

fn manager(primary: usize) -> KvCacheManager {
    KvCacheManager::new(ManagerConfig {
        windows: vec![window(W, primary, 0)],
        tokens_per_block: TPB,
        max_sequence_length: 128,
        enable_block_reuse: true,
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

fn free(m: &KvCacheManager) -> usize {
    m.window(W).unwrap().num_free(Level::Primary)
}

fn front(m: &KvCacheManager, id: u64) -> usize {
    m.num_front_blocks_removed(id, W).unwrap()
}

#[test]
fn a_slot_slides_the_window_by_the_slots_as_tensorrt_llm_does() {
    let mut m = manager(8);
    m.add_sequence(&Request::new(1, tokens(0..11))).unwrap();
    assert_eq!(free(&m), 5);
    // 12 slots: 12 - 0 >= window + tpb, so the first block (positions 0..4) leaves the window
    // of position 11; the slot fits the third block, so nothing is allocated.
    assert!(m.add_slot(1).unwrap());
    assert_eq!(front(&m, 1), 1);
    assert_eq!(free(&m), 6);
    let l = m.sequence_lengths(1).unwrap();
    assert_eq!((l.num_tokens, l.capacity), (11, 12));
    m.check_invariants().unwrap();
    // 13 slots: a block boundary allocates, 13 - 4 < 12 detaches nothing.
    assert!(m.add_slot(1).unwrap());
    assert_eq!(front(&m, 1), 1);
    assert_eq!(free(&m), 5);
    // 16 slots: 16 - 4 >= 12 detaches the second block.
    for _ in 0..3 {
        assert!(m.add_slot(1).unwrap());
    }
    assert_eq!(front(&m, 1), 2);
    assert_eq!(free(&m), 6);
    m.check_invariants().unwrap();
    // The token ids arrive into the reserved slots; the window is not slid again.
    for t in 11..16 {
        m.add_token(1, 100 + t).unwrap();
    }
    assert_eq!(front(&m, 1), 2);
    assert_eq!(m.sequence_lengths(1).unwrap().num_tokens, 16);
    m.check_invariants().unwrap();
    m.remove_sequence(1, false).unwrap();
    assert_eq!(free(&m), 8);
}

#[test]
fn a_detached_block_frees_room_for_the_new_slot_first() {
    // Three blocks, all held: the new slot at position 12 needs a fourth block, which only the
    // block leaving the window can give (TensorRT-LLM detaches before allocating).
    let mut m = manager(3);
    m.add_sequence(&Request::new(1, tokens(0..12))).unwrap();
    assert_eq!(free(&m), 0);
    assert!(m.add_slot(1).unwrap());
    assert_eq!(front(&m, 1), 1);
    assert_eq!(free(&m), 0);
    assert_eq!(m.cache_block_ids(1, W, 0).unwrap().len(), 4);
    m.check_invariants().unwrap();
}

#[test]
fn a_slot_without_a_free_block_changes_nothing() {
    let mut m = manager(2);
    m.add_sequence(&Request::new(1, tokens(0..8))).unwrap();
    let before = (m.sequence_lengths(1).unwrap(), front(&m, 1), free(&m));
    assert!(!m.add_slot(1).unwrap());
    assert_eq!(
        (m.sequence_lengths(1).unwrap(), front(&m, 1), free(&m)),
        before
    );
    m.check_invariants().unwrap();
}

#[test]
fn blocks_detached_before_their_tokens_arrive_are_never_stored() {
    let mut m = manager(16);
    let prompt = tokens(0..4);
    m.add_sequence(&Request::new(1, prompt.clone())).unwrap();
    common::prefill_done(&mut m, 1);
    // Slots run 16 ahead of the known tokens: the first block leaves the window with its
    // tokens known, the second and third (positions 4..12) while none of theirs is.
    for _ in 0..16 {
        assert!(m.add_slot(1).unwrap());
    }
    assert_eq!(front(&m, 1), 3);
    m.check_invariants().unwrap();
    let generated = tokens(4..20);
    for &t in &generated {
        m.add_token(1, t).unwrap();
    }
    m.advance_history(1, 19).unwrap();
    m.check_invariants().unwrap();
    m.remove_sequence(1, true).unwrap();
    // Nothing was published under the sequence's tokens: the slots of the second block never
    // got them (a key cut from them would be wrong).
    let mut all = prompt.clone();
    all.extend(&generated);
    let probe = Request::new(2, all);
    assert_eq!(m.count_reusable_blocks(&probe, W, false).unwrap(), 0);
    m.check_invariants().unwrap();
}

#[test]
fn blocks_detached_with_known_tokens_stay_storable() {
    let mut m = manager(16);
    let prompt = tokens(0..11);
    m.add_sequence(&Request::new(1, prompt.clone())).unwrap();
    common::prefill_done(&mut m, 1);
    // The first block leaves the window with all its tokens known.
    assert!(m.add_slot(1).unwrap());
    assert!(m.add_slot(1).unwrap());
    assert_eq!(front(&m, 1), 1);
    m.add_token(1, 11).unwrap();
    m.add_token(1, 12).unwrap();
    m.advance_history(1, 12).unwrap();
    m.remove_sequence(1, true).unwrap();
    let probe = Request::new(2, tokens(0..13));
    assert_eq!(m.count_reusable_blocks(&probe, W, false).unwrap(), 3);
    m.check_invariants().unwrap();
}

#[test]
fn a_shrink_never_brings_a_slid_out_block_back_into_the_window() {
    let mut m = manager(8);
    m.add_sequence(&Request::new(1, tokens(0..11))).unwrap();
    assert!(m.add_slot(1).unwrap());
    assert_eq!(front(&m, 1), 1);
    // Back to 11 slots: position 10's window reaches back to position 3, in the detached block.
    assert!(matches!(m.resize(1, 11), Err(KvError::Unsupported(_))));
    assert_eq!(m.sequence_lengths(1).unwrap().capacity, 12);
    m.check_invariants().unwrap();
}

/// A full-attention manager for beam search: one window of 64 tokens.
fn beam_manager(primary: usize) -> KvCacheManager {
    KvCacheManager::new(ManagerConfig {
        windows: vec![window(64, primary, 0)],
        tokens_per_block: TPB,
        max_sequence_length: 64,
        max_beam_width: 2,
        enable_block_reuse: true,
        manual_clock: true,
        ..ManagerConfig::default()
    })
    .unwrap()
}

#[test]
fn with_beam_search_a_slot_at_a_block_boundary_takes_a_block_for_every_beam() {
    let mut m = beam_manager(8);
    let mut r = Request::new(1, tokens(0..6));
    r.beam_width = 2;
    m.add_sequence(&r).unwrap();
    let free = |m: &KvCacheManager| m.window(64).unwrap().num_free(Level::Primary);
    // One shared full block, then a last block per beam.
    assert_eq!(free(&m), 5);
    assert!(m.add_slot(1).unwrap());
    assert!(m.add_slot(1).unwrap());
    assert_eq!(free(&m), 5, "slots 7 and 8 fit the beams' last blocks");
    assert!(m.add_slot(1).unwrap());
    assert_eq!(free(&m), 3, "slot 9 crosses a boundary: one block per beam");
    let beam0 = m.cache_block_ids(1, 64, 0).unwrap();
    let beam1 = m.cache_block_ids(1, 64, 1).unwrap();
    assert_eq!(beam0.len(), 3);
    assert_eq!(beam0[0], beam1[0], "the prompt's full block is shared");
    assert!(beam0[1] != beam1[1] && beam0[2] != beam1[2]);
    m.check_invariants().unwrap();
    // Four more boundaries' worth: 8 blocks in all would be 3 + 2 * 3; only 3 are free.
    for _ in 0..3 {
        assert!(m.add_slot(1).unwrap());
    }
    assert!(m.add_slot(1).unwrap());
    assert_eq!(free(&m), 1);
    let l = m.sequence_lengths(1).unwrap();
    for _ in 0..3 {
        assert!(m.add_slot(1).unwrap());
    }
    assert!(
        !m.add_slot(1).unwrap(),
        "two beams need two blocks, one is free"
    );
    assert_eq!(free(&m), 1, "a refused slot changes nothing");
    assert_eq!(m.sequence_lengths(1).unwrap().capacity, l.capacity + 3);
    // The other capacity operations stay beam width 1.
    assert!(matches!(m.resize(1, 6), Err(KvError::Unsupported(_))));
    m.remove_sequence(1, false).unwrap();
    assert_eq!(free(&m), 8);
    m.check_invariants().unwrap();
}

#[test]
fn the_one_step_estimate_counts_the_slots_reserved_before_their_tokens() {
    use kvblock::manager::{RequestPhase, RequestState};
    let mut m = manager(16);
    m.add_sequence(&Request::new(1, tokens(0..5))).unwrap();
    let state = |generated: usize| RequestState {
        request_id: 1,
        phase: RequestPhase::Generation,
        prompt_len: 5,
        beam_width: 1,
        context_chunk_size: 0,
        num_draft_tokens: 0,
        max_new_tokens: 100,
        num_generated_tokens: generated,
    };
    // 5 tokens in 2 blocks: the sixth slot fits the second block.
    assert_eq!(
        m.needed_blocks_one_step(&state(0), None, false, W).unwrap(),
        0
    );
    // Three slots reserved (8 slots, 2 full blocks), no token id known yet: the ninth slot
    // starts a block. Counting the 5 known tokens instead would say none.
    for _ in 0..3 {
        assert!(m.add_slot(1).unwrap());
    }
    assert_eq!(m.sequence_lengths(1).unwrap().num_tokens, 5);
    assert_eq!(
        m.needed_blocks_one_step(&state(3), None, false, W).unwrap(),
        1
    );
    // Two steps ahead: slots 9 and 10, still one block.
    assert_eq!(
        m.needed_blocks_one_step(&state(3), None, true, W).unwrap(),
        1
    );
}
