//! Batched admission when several requests of one batch match the same free cached leaf: the
//! request that matches it whole shares it and the others copy their tokens from it; when none
//! does, the last request that matches it takes it over and the earlier ones copy (TensorRT-LLM's
//! rule for `addSequenceBatch`). The scheduler's estimate of such a batch still equals what the
//! batch delivers, and the cache is consistent afterwards.

mod common;

use common::window;
use kvblock::manager::{KvCacheManager, ManagerConfig, Request};

const TPB: usize = 4;
const WINDOW: usize = 32;

fn manager(primary: usize, secondary: usize) -> KvCacheManager {
    KvCacheManager::new(ManagerConfig {
        windows: vec![window(WINDOW, primary, secondary)],
        tokens_per_block: TPB,
        max_sequence_length: WINDOW,
        enable_partial_reuse: true,
        manual_clock: true,
        ..ManagerConfig::default()
    })
    .unwrap()
}

/// Admits `tokens` as sequence `id`, computes its prompt and releases it into the cache.
fn seed(m: &mut KvCacheManager, id: u64, tokens: Vec<i32>) -> Vec<u32> {
    m.add_sequence(&Request::new(id, tokens)).unwrap();
    common::prefill_done(m, id);
    let blocks = m.cache_block_ids(id, WINDOW, 0).unwrap();
    m.remove_sequence(id, true).unwrap();
    blocks
}

/// Admits the batch, checking that the estimate made just before equals the delivery; returns
/// each request's reused tokens and second block.
fn admit(m: &mut KvCacheManager, batch: &[Request]) -> Vec<(usize, u32)> {
    let estimates = m.estimate_batch(batch).unwrap();
    let admitted = m.add_sequence_batch(batch, false).unwrap();
    m.check_invariants().unwrap();
    batch
        .iter()
        .zip(&admitted)
        .zip(&estimates)
        .map(|((r, a), e)| {
            assert_eq!(
                a.prepopulated_prompt_len, e.reusable_tokens,
                "request {}: estimated reuse delivered",
                r.id
            );
            let blocks = m.cache_block_ids(r.id, WINDOW, 0).unwrap();
            (a.prepopulated_prompt_len, blocks[1])
        })
        .collect()
}

/// Admits requests 1, 2 and 3, each matching the cached `[0 1 2 3] [4 ...]` through token 4 and
/// then differing; checks that each reuses 4 + 1 tokens.
fn admit_three_partial_matchers(m: &mut KvCacheManager) -> Vec<(usize, u32)> {
    let batch: Vec<Request> = [10, 20, 30]
        .iter()
        .enumerate()
        .map(|(i, &t)| Request::new(i as u64 + 1, vec![0, 1, 2, 3, 4, t]))
        .collect();
    let got = admit(m, &batch);
    for &(reused, _) in &got {
        assert_eq!(reused, TPB + 1, "every request reuses 4 + 1 tokens");
    }
    got
}

fn finish(m: &mut KvCacheManager, ids: impl IntoIterator<Item = u64>) {
    for id in ids {
        common::prefill_done(m, id);
        m.remove_sequence(id, true).unwrap();
    }
    m.check_invariants().unwrap();
}

#[test]
fn the_last_of_several_partial_matchers_takes_the_leaf_over_and_the_others_copy() {
    let mut m = manager(16, 0);
    // Cached: [0 1 2 3] [4 5] (the last prompt token is never cached).
    let leaf = seed(&mut m, 0, vec![0, 1, 2, 3, 4, 5, 6])[1];
    let got = admit_three_partial_matchers(&mut m);
    assert_eq!(
        got[2].1, leaf,
        "the last partial matcher owns the cached leaf"
    );
    assert_ne!(
        got[0].1, leaf,
        "the first copied its token into a block of its own"
    );
    assert_ne!(got[1].1, leaf, "so did the second");
    assert_ne!(got[0].1, got[1].1);
    finish(&mut m, 1..=3);
}

#[test]
fn a_request_that_matches_the_leaf_whole_shares_it_and_the_partial_matchers_copy() {
    let mut m = manager(16, 0);
    // Cached: [0 1 2 3] [4 5 6 7], the second block full.
    let leaf = seed(&mut m, 0, (0..9).collect())[1];
    let batch = vec![
        Request::new(1, vec![0, 1, 2, 3, 4, 5, 6, 10]),
        Request::new(2, (0..9).collect()),
        Request::new(3, vec![0, 1, 2, 3, 4, 5, 6, 30]),
    ];
    let got = admit(&mut m, &batch);
    assert_eq!(got[0], (TPB + 3, got[0].1));
    assert_eq!(
        got[1],
        (2 * TPB, leaf),
        "the whole match shares the cached leaf"
    );
    assert_eq!(got[2].0, TPB + 3);
    assert_ne!(got[0].1, leaf, "a partial matcher copies");
    assert_ne!(got[2].1, leaf, "so does the one after the whole match");
    assert_ne!(got[0].1, got[2].1);
    // The shared leaf is still cached under its tokens: a later request finds it whole.
    finish(&mut m, 1..=3);
    let again = m
        .estimate_batch(&[Request::new(9, (0..9).collect())])
        .unwrap();
    assert_eq!(again[0].reusable_tokens, 2 * TPB);
}

#[test]
fn a_lone_partial_matcher_still_takes_the_leaf_over() {
    let mut m = manager(16, 0);
    let leaf = seed(&mut m, 0, vec![0, 1, 2, 3, 4, 5, 6])[1];
    let got = admit(&mut m, &[Request::new(1, vec![0, 1, 2, 3, 4, 10])]);
    assert_eq!(got[0], (TPB + 1, leaf), "no rival: no copy");
    finish(&mut m, [1]);
}

#[test]
fn a_batch_whose_later_rival_does_not_fit_still_admits_a_consistent_prefix() {
    // The earlier request was planned to copy because a later one takes the leaf over; when only
    // the first fits, its copy is still a valid admission and the leaf stays cached.
    let mut m = manager(4, 0);
    let leaf = seed(&mut m, 0, vec![0, 1, 2, 3, 4, 5, 6])[1];
    let long: Vec<i32> = [0, 1, 2, 3, 4].into_iter().chain(100..120).collect();
    let batch = vec![
        Request::new(1, vec![0, 1, 2, 3, 4, 10]),
        Request::new(2, long),
    ];
    let admitted = m.add_sequence_batch(&batch, true).unwrap();
    assert_eq!(
        admitted.len(),
        1,
        "the second request needs more blocks than exist"
    );
    assert_eq!(admitted[0].prepopulated_prompt_len, TPB + 1);
    m.check_invariants().unwrap();
    let blocks = m.cache_block_ids(1, WINDOW, 0).unwrap();
    assert_ne!(blocks[1], leaf, "planned as a copy");
    finish(&mut m, [1]);
}

#[test]
fn a_leaf_in_the_host_tier_goes_to_the_first_partial_matcher_and_the_others_copy() {
    // A host-resident leaf is not contested: had a later request taken it over, the earlier
    // ones' copies would read its host row while the same launch onboards it. The first partial
    // matcher takes it (onboarding it); the later ones copy its tokens after that.
    let mut m = manager(16, 16);
    let leaf = seed(&mut m, 0, vec![0, 1, 2, 3, 4, 5, 6])[1];
    assert!(
        m.offload_block(WINDOW, leaf).unwrap(),
        "the leaf moves to the host tier"
    );
    let got = admit_three_partial_matchers(&mut m);
    assert_eq!(
        got[0].1, leaf,
        "the first partial matcher onboards the leaf"
    );
    assert!(got[1].1 != leaf && got[2].1 != leaf && got[1].1 != got[2].1);
    finish(&mut m, 1..=3);
}
