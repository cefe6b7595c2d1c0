//! Batched admission: the scheduler's estimate equals what `add_sequence_batch` delivers, for
//! random manager states and batches, with and without the host tier, under offload pressure; and
//! the bug that batched admission fixes (sequential admission delivering less reuse than estimated;
//! TensorRT-LLM PRs #12878/#12892 → #13029) is reproduced and shown fixed by the batch call.

mod common;

use common::window;

use common::Rng;
use kvblock::error::KvError;
use kvblock::manager::{KvCacheManager, ManagerConfig, Request, WindowSpec};
use kvblock::pool::Level;

fn config(windows: Vec<WindowSpec>, partial: bool) -> ManagerConfig {
    ManagerConfig {
        windows,
        tokens_per_block: 4,
        max_sequence_length: 96,
        enable_partial_reuse: partial,
        manual_clock: true,
        ..ManagerConfig::default()
    }
}

fn random_prompt(rng: &mut Rng) -> Vec<i32> {
    let prefix = rng.below_u(3) as i32;
    let shared = rng.below_u(30) as i32;
    let mut t: Vec<i32> = (0..shared).map(|i| prefix * 1000 + i).collect();
    for _ in 0..1 + rng.below_u(10) {
        t.push(5000 + rng.below_u(4) as i32);
    }
    t
}

fn random_request(rng: &mut Rng, id: u64) -> Request {
    let mut r = Request::new(id, random_prompt(rng));
    match rng.below_u(8) {
        0 => r.lora_task_id = Some(rng.below_u(2)),
        1 => r.cache_salt = Some(7),
        _ => {}
    }
    r
}

fn free_primary(m: &KvCacheManager) -> usize {
    m.num_free_blocks()
}

fn check_estimates_hold(cfg: ManagerConfig, seed: u64, rounds: usize) {
    let mut m = KvCacheManager::new(cfg).unwrap();
    let mut rng = Rng(seed);
    let mut live: Vec<u64> = Vec::new();
    let mut next_id = 0u64;
    let mut admitted_batches = 0;
    let mut refused_batches = 0;
    for round in 0..rounds {
        // Evolve the state: finish some sequences (stored), generate on others.
        for _ in 0..rng.below_u(4) {
            if live.is_empty() {
                break;
            }
            let i = rng.below_u(live.len() as u64) as usize;
            let id = live.swap_remove(i);
            m.remove_sequence(id, rng.below_u(5) != 0).unwrap();
        }
        for &id in &live {
            if rng.below_u(3) == 0 {
                let _ = m.add_token(id, 7);
            }
        }
        let n = 1 + rng.below_u(6) as usize;
        let batch: Vec<Request> = (0..n)
            .map(|k| {
                // Repeat an earlier request of the batch now and then: same prefix, new id.
                if k > 0 && rng.below_u(4) == 0 {
                    let mut r = random_request(&mut rng, next_id + k as u64);
                    r.token_ids = (0..20).collect();
                    r.input_length = 20;
                    r
                } else {
                    random_request(&mut rng, next_id + k as u64)
                }
            })
            .collect();
        next_id += n as u64;
        let estimates = m.estimate_batch(&batch).unwrap();
        let before_stats = m.stats();
        let before_free = free_primary(&m);
        let longest_prefix = rng.below_u(2) == 0;
        match m.add_sequence_batch(&batch, longest_prefix) {
            Ok(admitted) => {
                admitted_batches += 1;
                let fitting = estimates.iter().take_while(|e| e.fits).count();
                assert_eq!(
                    admitted.len(),
                    fitting,
                    "seed {seed} round {round}: admitted count"
                );
                let mut consumed = 0;
                for (a, e) in admitted.iter().zip(&estimates) {
                    assert_eq!(
                        a.prepopulated_prompt_len, e.reusable_tokens,
                        "seed {seed} round {round}: reuse"
                    );
                    assert_eq!(
                        a.stats.alloc_total_blocks as usize, e.allocated_blocks,
                        "seed {seed} round {round}: allocations"
                    );
                    assert_eq!(a.stats.reused_blocks as usize, e.reused_blocks);
                    assert_eq!(a.stats.missed_blocks as usize, e.missed_blocks);
                    consumed += e.free_blocks_consumed;
                }
                assert_eq!(
                    before_free - free_primary(&m),
                    consumed,
                    "seed {seed} round {round}: free blocks consumed"
                );
                live.extend(batch[..admitted.len()].iter().map(|r| r.id));
            }
            Err(KvError::OutOfBlocks { .. }) => {
                refused_batches += 1;
                assert!(!longest_prefix);
                assert!(
                    estimates.iter().any(|e| !e.fits),
                    "refused although estimated to fit"
                );
                assert_eq!(m.stats(), before_stats, "a refused batch changes nothing");
                assert!(batch.iter().all(|r| !m.has_sequence(r.id)));
            }
            Err(e) => panic!("seed {seed} round {round}: {e}"),
        }
        m.check_invariants()
            .unwrap_or_else(|e| panic!("seed {seed} round {round}: {e}"));
    }
    assert!(
        admitted_batches > rounds / 4 && refused_batches > 0,
        "both outcomes exercised"
    );
}

#[test]
fn estimates_equal_delivery_with_host_tier() {
    for seed in 0..4 {
        check_estimates_hold(config(vec![window(96, 40, 24)], true), seed, 1500);
    }
}

#[test]
fn estimates_equal_delivery_without_host_tier() {
    for seed in 10..13 {
        check_estimates_hold(config(vec![window(96, 36, 0)], true), seed, 1500);
    }
}

#[test]
fn estimates_equal_delivery_without_partial_reuse() {
    for seed in 20..23 {
        check_estimates_hold(config(vec![window(96, 36, 16)], false), seed, 1500);
    }
}

#[test]
fn estimates_equal_delivery_with_variable_windows() {
    for seed in 30..33 {
        check_estimates_hold(
            config(vec![window(16, 48, 16), window(96, 40, 16)], true),
            seed,
            1500,
        );
    }
}

/// A state where request B's cached prefix sits at the front of the free queue (next to evict)
/// and request A needs new blocks: admitted one by one, A's allocations evict what B was
/// estimated to reuse; admitted as a batch, B's blocks are claimed first.
fn seed_state() -> KvCacheManager {
    let mut m = KvCacheManager::new(config(vec![window(96, 8, 0)], true)).unwrap();
    // A running sequence takes blocks 0..5; B's prefix (blocks 5, 6 cached, 7 without a key)
    // is then stored and released, so its blocks are the first free ones (LRU front).
    m.add_sequence(&Request::new(101, (500..520).collect()))
        .unwrap();
    m.add_sequence(&Request::new(100, (0..9).collect()))
        .unwrap();
    common::prefill_done(&mut m, 100);
    m.remove_sequence(100, true).unwrap();
    m.remove_sequence(101, false).unwrap();
    m
}

#[test]
fn sequential_admission_loses_estimated_reuse_and_the_batch_does_not() {
    let a = Request::new(1, (900..912).collect());
    let b = Request::new(2, (0..9).collect());

    let mut sequential = seed_state();
    let estimated_b = sequential.estimate_batch(std::slice::from_ref(&b)).unwrap()[0];
    assert_eq!(
        estimated_b.reusable_tokens, 8,
        "B alone reuses its two cached blocks"
    );
    sequential.add_sequence(&a).unwrap();
    let got_b = sequential.add_sequence(&b).unwrap();
    assert!(
        got_b.prepopulated_prompt_len < estimated_b.reusable_tokens,
        "the bug: A's allocations evicted B's cached blocks ({} < {})",
        got_b.prepopulated_prompt_len,
        estimated_b.reusable_tokens
    );

    let mut batched = seed_state();
    let estimates = batched.estimate_batch(&[a.clone(), b.clone()]).unwrap();
    let admitted = batched.add_sequence_batch(&[a, b], false).unwrap();
    assert_eq!(admitted[1].prepopulated_prompt_len, 8);
    assert_eq!(estimates[1].reusable_tokens, 8);
    batched.check_invariants().unwrap();
}

#[test]
fn sequential_onboarding_evicts_host_blocks_and_the_batch_does_not() {
    // Host variant: A's own host blocks must be onboarded; the onboarding allocations offload
    // primary blocks into the host tier, overwriting B's host blocks when admitted one by one.
    let build = || {
        let mut m = KvCacheManager::new(config(vec![window(96, 6, 4)], true)).unwrap();
        // B's prefix, then A's prefix, both cached; then pressure moves both to the host.
        m.add_sequence(&Request::new(100, (0..9).collect()))
            .unwrap();
        common::prefill_done(&mut m, 100);
        m.remove_sequence(100, true).unwrap();
        m.add_sequence(&Request::new(101, (900..909).collect()))
            .unwrap();
        common::prefill_done(&mut m, 101);
        m.remove_sequence(101, true).unwrap();
        m.add_sequence(&Request::new(102, (500..524).collect()))
            .unwrap();
        common::prefill_done(&mut m, 102);
        m.remove_sequence(102, true).unwrap();
        m
    };
    let a = Request::new(1, (900..909).collect());
    let b = Request::new(2, (0..9).collect());

    let mut sequential = build();
    let host_b = sequential.estimate_batch(std::slice::from_ref(&b)).unwrap()[0];
    assert_eq!(host_b.reusable_tokens, 8);
    assert!(
        sequential.cache_block_ids(0, 96, 0).is_err(),
        "no sequence 0"
    );
    sequential.add_sequence(&a).unwrap();
    let got_b = sequential.add_sequence(&b).unwrap();
    assert!(
        got_b.prepopulated_prompt_len < 8,
        "onboarding A overwrote B's host blocks"
    );

    let mut batched = build();
    let estimates = batched.estimate_batch(&[a.clone(), b.clone()]).unwrap();
    let admitted = batched.add_sequence_batch(&[a, b], false).unwrap();
    assert_eq!(estimates[1].reusable_tokens, 8);
    assert_eq!(admitted[1].prepopulated_prompt_len, 8);
    for id in [1, 2] {
        for blk in batched.cache_block_ids(id, 96, 0).unwrap() {
            assert_eq!(batched.block_info(96, blk).unwrap().level, Level::Primary);
        }
    }
    batched.check_invariants().unwrap();
}

/// A pool of `primary` blocks (4 tokens each, bytes in host memory) whose block of tokens
/// `0..4` is cached, free, and not a leaf: two stored prompts continue it differently. Returns
/// the manager and that block.
fn cached_non_leaf(primary: usize) -> (KvCacheManager, u32) {
    let mut m = KvCacheManager::new(ManagerConfig {
        copy_backend: kvblock::manager::CopyBackend::HostMemory,
        bytes_per_element: 1,
        ..config(vec![window(96, primary, 0)], true)
    })
    .unwrap();
    for (id, tail) in [(1u64, [4, 5, 6, 7]), (2, [10, 11, 12, 13])] {
        let mut t = vec![0, 1, 2, 3];
        t.extend(tail);
        t.push(99);
        m.add_sequence(&Request::new(id, t)).unwrap();
        common::prefill_done(&mut m, id);
        m.remove_sequence(id, true).unwrap();
    }
    assert_eq!(free_primary(&m), primary);
    let probe = Request::new(9, vec![0, 1, 2, 3, 4]);
    let shared = m.add_sequence(&probe).unwrap();
    assert_eq!(shared.prepopulated_prompt_len, 4);
    let block = m.cache_block_ids(9, 96, 0).unwrap()[0];
    m.remove_sequence(9, false).unwrap();
    (m, block)
}

/// Block `block`'s row (K then V, 4 one-byte tokens each), to read or write.
fn row(m: &mut KvCacheManager, block: u32) -> &'static mut [u8] {
    let info = m.block_info(96, block).unwrap();
    let (base, row_bytes) = m.pool_pointer(96, info.level).unwrap();
    // SAFETY: a row of the host-memory pool of the block's level, used before the manager
    // changes again.
    unsafe {
        std::slice::from_raw_parts_mut(base.add(info.memory_index as usize * row_bytes), row_bytes)
    }
}

#[test]
fn a_copy_source_is_free_again_once_its_copy_is_queued() {
    // 8 blocks, all free: a 32-token prompt that matches 2 tokens of the cached non-leaf block
    // copies them into a block of its own and needs 8 blocks in all, the source among them.
    let (mut m, source) = cached_non_leaf(8);
    row(&mut m, source).copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
    let mut t = vec![0, 1];
    t.extend(50..80);
    let req = Request::new(3, t);
    let estimate = m.estimate_batch(std::slice::from_ref(&req)).unwrap();
    assert!(estimate[0].fits, "{estimate:?}");
    assert_eq!(estimate[0].reusable_tokens, 2);
    let a = m.add_sequence(&req).unwrap();
    assert_eq!(a.prepopulated_prompt_len, 2);
    assert_eq!(a.stats.alloc_total_blocks, 8);
    assert_eq!(free_primary(&m), 0);
    let ids = m.cache_block_ids(3, 96, 0).unwrap();
    assert!(
        ids[1..].contains(&source),
        "the source is one of the fresh blocks: {ids:?}"
    );
    // The copy read the source's first two tokens of K and of V before it was handed out.
    let copied = row(&mut m, ids[0]);
    assert_eq!([copied[0], copied[1], copied[4], copied[5]], [1, 2, 5, 6]);
    m.check_invariants().unwrap();
    m.remove_sequence(3, false).unwrap();
    assert_eq!(free_primary(&m), 8);
    m.check_invariants().unwrap();
}

#[test]
fn a_later_request_of_the_batch_may_take_a_source_once_its_copy_is_queued() {
    let (mut m, _) = cached_non_leaf(8);
    // A copies 2 tokens of the cached block and takes one block more; B takes 6 fresh blocks:
    // 8 in all only if B may take the source after A's copy.
    let a = Request::new(3, vec![0, 1, 50, 51, 52]);
    let b = Request::new(4, (100..124).collect());
    let estimates = m.estimate_batch(&[a.clone(), b.clone()]).unwrap();
    assert!(estimates.iter().all(|e| e.fits), "{estimates:?}");
    let admitted = m.add_sequence_batch(&[a.clone(), b], false).unwrap();
    assert_eq!(admitted[0].prepopulated_prompt_len, 2);
    assert_eq!(free_primary(&m), 0);
    m.check_invariants().unwrap();
    for id in [3, 4] {
        m.remove_sequence(id, false).unwrap();
    }
    // One block more than the pool holds: refused, nothing changed.
    let (mut m, _) = cached_non_leaf(8);
    let before = m.stats();
    let c = Request::new(4, (100..128).collect());
    assert!(matches!(
        m.add_sequence_batch(&[a, c], false),
        Err(KvError::OutOfBlocks { .. })
    ));
    assert_eq!(m.stats(), before);
    assert_eq!(free_primary(&m), 8);
    m.check_invariants().unwrap();
}
