//! The decode step: most tokens land in a block the sequence already holds and are only written
//! into its slot; the others allocate a block or slide a block out of a window. These tests pin
//! the boundaries between the two: a sliding window detaches on the token that leaves it even
//! when no block is crossed (while another window takes the same token in place), and the tokens
//! written in place are the ones a later store caches.

mod common;

use common::window;

use kvblock::manager::{KvCacheManager, ManagerConfig, Request, WindowSpec};

const TPB: usize = 8;
const MAX_LEN: usize = 64;
/// Not a multiple of the block size: the sliding window detaches inside a block.
const SLIDING: usize = 20;
const POOL: usize = 16;

fn manager(windows: Vec<WindowSpec>) -> KvCacheManager {
    KvCacheManager::new(ManagerConfig {
        windows,
        tokens_per_block: TPB,
        max_sequence_length: MAX_LEN,
        manual_clock: true,
        ..ManagerConfig::default()
    })
    .expect("manager")
}

/// Front blocks a sequence of `n` tokens has detached from a sliding window (TensorRT-LLM's
/// rule: while `n - detached * tpb >= window + tpb`, the first held block goes).
fn detached(n: usize) -> usize {
    if n >= SLIDING + TPB {
        (n - SLIDING - TPB) / TPB + 1
    } else {
        0
    }
}

#[test]
fn a_sliding_window_detaches_on_the_token_that_leaves_it_even_inside_a_block() {
    let mut m = manager(vec![window(SLIDING, POOL, 0), window(MAX_LEN, POOL, 0)]);
    m.add_sequence(&Request::new(1, (0..10).collect())).unwrap();
    let mut detach_tokens = Vec::new();
    for n in 11..=60usize {
        let (done, result) = m.add_tokens(&[1], &[1000 + n as i32], true);
        assert_eq!((done, result.is_ok()), (1, true), "token {n}");
        let listed = n.div_ceil(TPB);
        let (free_sliding, _) = m.num_free_blocks_of_window(SLIDING).unwrap();
        let (free_full, _) = m.num_free_blocks_of_window(MAX_LEN).unwrap();
        assert_eq!(
            free_sliding,
            POOL - (listed - detached(n)),
            "sliding window at {n}"
        );
        assert_eq!(free_full, POOL - listed, "full window at {n}");
        if detached(n) > detached(n - 1) {
            detach_tokens.push(n);
        }
        m.check_invariants().unwrap();
    }
    // 28, 36, ... are the last positions of their blocks: no block is crossed there, so the
    // full window takes those tokens in place while the sliding one must detach.
    assert_eq!(detach_tokens, vec![28, 36, 44, 52, 60]);
    assert!(detach_tokens.iter().all(|n| (n - 1) % TPB != 0));
}

#[test]
fn tokens_written_in_place_are_the_ones_a_later_store_caches() {
    let prompt: Vec<i32> = (0..10).collect();
    let generated: Vec<i32> = (0..30).map(|i| 500 + i).collect();
    for windows in [
        vec![window(MAX_LEN, POOL, 0)],
        vec![window(SLIDING, POOL, 0), window(MAX_LEN, POOL, 0)],
    ] {
        let mut m = manager(windows.clone());
        m.add_sequence(&Request::new(1, prompt.clone())).unwrap();
        for &t in &generated {
            let (done, result) = m.add_tokens(&[1], &[t], true);
            assert!(done == 1 && result.is_ok());
        }
        m.remove_sequence(1, true).unwrap();
        // The same 40 tokens and one more: the 39 computed ones are reused (the last token
        // written had no KV yet), the last 7 through a partial match of the fifth block.
        let mut same = prompt.clone();
        same.extend_from_slice(&generated);
        same.push(7);
        let a = m.add_sequence(&Request::new(2, same.clone())).unwrap();
        assert_eq!(a.prepopulated_prompt_len, 39, "windows {}", windows.len());
        m.remove_sequence(2, false).unwrap();
        // One generated token different: reuse stops at the block holding it (token 20 is in
        // the third block), which proves the slots hold the tokens in order.
        let mut changed = same;
        changed[20] += 1;
        let b = m.add_sequence(&Request::new(3, changed)).unwrap();
        assert!(
            b.prepopulated_prompt_len >= 16 && b.prepopulated_prompt_len < 24,
            "reused {} tokens with windows {}",
            b.prepopulated_prompt_len,
            windows.len()
        );
        m.check_invariants().unwrap();
    }
}
