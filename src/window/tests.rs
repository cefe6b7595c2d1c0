use super::*;
use crate::retention::{BlockRetention, RetentionConfig};
use crate::transfer::NullEngine;

const TPB: usize = 4;

fn window(primary: usize, secondary: usize, window_size: usize) -> WindowBlockManager {
    let cfg = WindowConfig {
        window_size,
        num_primary: primary,
        num_secondary: secondary,
        tokens_per_block: TPB,
        max_token_num: 64.max(window_size),
        max_blocks_per_seq: 16,
        detach_slack_tokens: 0,
        enable_reuse: true,
        enable_partial_reuse: true,
        copy_on_partial_reuse: true,
        onboard_blocks: true,
        offload_min_priority: 30,
        layout: crate::pool::PoolGeometry {
            num_layers: 1,
            kv_factor: 2,
            num_kv_heads: 1,
            size_per_head: 1,
            tokens_per_block: TPB,
            bytes_per_element: 1,
        }
        .into(),
        reuse_granularity_blocks: 0,
        contiguous_runs: false,
    };
    WindowBlockManager::new(cfg, Box::new(NullEngine::default()))
}

fn src(tokens: &[i32]) -> KeySource<'_> {
    KeySource {
        token_ids: tokens,
        extra_ids: None,
        lora_task_id: None,
        cache_salt: None,
        mm_items: &[],
    }
}

fn admit(w: &mut WindowBlockManager, id: u64, tokens: &[i32]) -> AdmissionPlan {
    let s = src(tokens);
    let plan = w.plan_admission(&s, tokens.len(), 1, usize::MAX);
    w.check_plan(&plan).unwrap();
    let retention = RetentionConfig::default();
    let item = AdmitItem {
        id,
        src: s,
        input_length: tokens.len(),
        beam_width: 1,
        retention: &retention,
        plan: &plan,
    };
    w.admit_batch(&[item], 0);
    plan
}

fn store_and_release(w: &mut WindowBlockManager, id: u64, tokens: &[i32]) {
    w.store_blocks(id, &SeqKeyAttrs::default(), tokens.len() - 1, true, false);
    w.release_sequence(id, 0);
}

#[test]
fn plan_counts_primary_blocks_taken() {
    let mut w = window(8, 0, 64);
    let prompt: Vec<i32> = (0..9).collect();
    let plan = admit(&mut w, 1, &prompt);
    assert_eq!(plan.primary_blocks_needed, 3, "3 misses");
    // Reusing blocks held by a running sequence takes nothing from the free queue.
    let plan = w.plan_admission(&src(&prompt), 9, 1, usize::MAX);
    assert_eq!(plan.matched_tokens, 0, "nothing stored yet");
    store_and_release(&mut w, 1, &prompt);
    admit(&mut w, 2, &prompt);
    let plan = w.plan_admission(&src(&prompt), 9, 1, usize::MAX);
    assert_eq!(plan.matched_tokens, 8);
    assert_eq!(
        plan.primary_blocks_needed, 1,
        "two shared in-use blocks + one miss"
    );
    w.release_sequence(2, 0);
    let plan = w.plan_admission(&src(&prompt), 9, 1, usize::MAX);
    assert_eq!(
        plan.primary_blocks_needed, 3,
        "free cached blocks are claimed from the queue"
    );
}

#[test]
fn copy_of_a_free_inner_block_protects_the_source() {
    let mut w = window(8, 0, 64);
    let long: Vec<i32> = (0..13).collect();
    admit(&mut w, 1, &long);
    store_and_release(&mut w, 1, &long);
    // Diverges inside the second block, which is an inner node: copy, not take over.
    let mut other: Vec<i32> = (0..6).collect();
    other.extend([90, 91, 92]);
    let plan = w.plan_admission(&src(&other), other.len(), 1, usize::MAX);
    assert_eq!(
        plan.steps,
        vec![
            PlannedReuse::Share { block: 0 },
            PlannedReuse::Copy {
                source: 1,
                tokens: 2
            }
        ]
    );
    // share (claim 1) + copy source protection (1) + copy destination (1) + one miss.
    assert_eq!(plan.primary_blocks_needed, 4);
}

#[test]
fn cap_turns_a_full_match_into_a_partial_copy() {
    let mut w = window(8, 0, 64);
    let prompt: Vec<i32> = (0..9).collect();
    admit(&mut w, 1, &prompt);
    store_and_release(&mut w, 1, &prompt);
    let plan = w.plan_admission(&src(&prompt), 9, 1, 6);
    assert_eq!(plan.matched_tokens, 6);
    assert!(matches!(
        plan.steps[1],
        PlannedReuse::Copy { tokens: 2, .. }
    ));
}

#[test]
fn beams_share_all_but_the_last_context_block() {
    let w = window(8, 0, 64);
    assert_eq!(w.context_blocks(9, 1, true), (3, 3));
    assert_eq!(w.context_blocks(9, 4, true), (3, 2));
    assert_eq!(w.context_blocks(8, 4, true), (2, 1));
}

#[test]
fn without_reuse_beams_share_a_last_block_the_prompt_fills() {
    let w = window(8, 0, 64);
    assert_eq!(w.context_blocks(8, 4, false), (2, 2));
    assert_eq!(w.context_blocks(9, 4, false), (3, 2));
    assert_eq!(w.context_blocks(9, 1, false), (3, 3));
}

#[test]
fn sliding_window_detaches_front_blocks_and_reallocation_invalidates_store() {
    let mut w = window(4, 0, 4);
    let prompt: Vec<i32> = (0..4).collect();
    admit(&mut w, 1, &prompt);
    // 4 tokens + 4 generated: at 8 tokens the first block (tokens 0..4) left the window.
    for n in 5..=8 {
        w.add_token(1, n, n as i32, None, true, 0, BlockRetention::default(), 0);
    }
    assert_eq!(w.front_blocks_removed(1), 1);
    assert!(w.is_valid_for_store(1));
    let detached = w.block_ids(1, 0).unwrap()[0];
    assert!(w.queues().is_queued(detached));
    // Another sequence takes every free block, including the detached one.
    let other: Vec<i32> = (50..59).collect();
    admit(&mut w, 2, &other);
    assert_eq!(w.num_free(Level::Primary), 0);
    assert!(
        !w.is_valid_for_store(1),
        "its detached block now holds someone else's tokens"
    );
}

#[test]
fn offload_moves_only_cached_blocks() {
    let mut w = window(4, 4, 64);
    let cached: Vec<i32> = (0..5).collect();
    admit(&mut w, 1, &cached);
    store_and_release(&mut w, 1, &cached);
    // Released without storing: keyed blocks that nobody can find again.
    let private: Vec<i32> = (20..29).collect();
    admit(&mut w, 2, &private);
    w.release_sequence(2, 0);
    let b: Vec<i32> = (40..56).collect();
    admit(&mut w, 3, &b);
    assert_eq!(
        w.stats().offloaded,
        1,
        "only the one cached block went to the host"
    );
    assert_eq!(w.num_free(Level::Secondary), 4);
    let plan = w.plan_admission(&src(&cached), 5, 1, usize::MAX);
    assert_eq!(
        plan.matched_tokens, 4,
        "the cached block is still reusable from the host"
    );
}

/// A window of recurrent-state snapshots kept every `granularity` blocks.
fn snapshot_window(granularity: usize) -> WindowBlockManager {
    let mut cfg = window(16, 0, 64).config().clone();
    cfg.reuse_granularity_blocks = granularity;
    WindowBlockManager::new(cfg, Box::new(NullEngine::default()))
}

#[test]
fn snapshot_windows_reuse_exact_full_blocks_in_multiples_of_the_interval() {
    let long: Vec<i32> = (0..14).collect(); // 3 full blocks + 2 tokens
    for (granularity, whole, diverging, capped) in [(1, 12, 4, 4), (2, 8, 0, 0), (3, 12, 0, 0)] {
        let mut w = snapshot_window(granularity);
        admit(&mut w, 1, &long);
        store_and_release(&mut w, 1, &long);
        let plan = w.plan_admission(&src(&long), long.len(), 1, usize::MAX);
        assert_eq!(plan.matched_tokens, whole, "granularity {granularity}");
        assert!(plan
            .steps
            .iter()
            .all(|s| matches!(s, PlannedReuse::Share { .. })));
        // Diverging inside the second block: no partial copy, the first block only.
        let mut other: Vec<i32> = (0..6).collect();
        other.extend([90, 91, 92]);
        let plan = w.plan_admission(&src(&other), other.len(), 1, usize::MAX);
        assert_eq!(plan.matched_tokens, diverging, "granularity {granularity}");
        // A cap inside a block ends the reuse at the block before.
        let plan = w.plan_admission(&src(&long), long.len(), 1, 7);
        assert_eq!(plan.matched_tokens, capped, "granularity {granularity}");
    }
}

#[test]
fn sliding_to_slots_detaches_by_slots_and_marks_blocks_slid_out_before_their_tokens() {
    let mut w = window(16, 0, 8);
    let prompt: Vec<i32> = (0..11).collect();
    admit(&mut w, 1, &prompt);
    let free = w.num_free(Level::Primary);
    // Not a sliding window: nothing leaves.
    assert_eq!(w.slide_to_slots(1, 12, 11, false, 0), 0);
    // 12 slots: the first block (tokens 0..4, all known) leaves the window of position 11.
    assert_eq!(w.slide_to_slots(1, 12, 11, true, 0), 1);
    assert_eq!(w.front_blocks_removed(1), 1);
    assert_eq!(w.num_free(Level::Primary), free + 1);
    assert!(w.is_valid_for_store(1));
    // Slots far ahead of the 11 known tokens: positions 0..16 leave the window of position 23,
    // the third block before its last token is known and the fourth before any, so the
    // sequence no longer stores in this window.
    w.grow(1, 24, BlockRetention::default(), 0);
    assert_eq!(w.slide_to_slots(1, 24, 11, true, 0), 3);
    assert_eq!(w.front_blocks_removed(1), 4);
    assert!(!w.is_valid_for_store(1));
    // Sliding again to the same slots is a no-op.
    assert_eq!(w.slide_to_slots(1, 24, 11, true, 0), 0);
}
