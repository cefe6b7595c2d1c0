//! `max_blocks_per_seq` (the rows of an offset table) counts the extra KV tokens and the draft
//! tokens a sequence may hold past its maximum length: a sequence grown to its limit with the
//! largest draft still fits its table.

mod common;

use common::window;

use kvblock::error::KvError;
use kvblock::manager::{CopyBackend, KvCacheManager, ManagerConfig, Request, NO_BLOCK_OFFSET};

const TPB: usize = 8;
const MAX_LEN: usize = 30;
const EXTRA: usize = 2;
const DRAFT: usize = 5;
/// A full-attention window wider than the maximum length, and a sliding one.
const WINDOWS: [usize; 2] = [16, 40];

fn config(extra: usize, draft: usize) -> ManagerConfig {
    ManagerConfig {
        windows: WINDOWS.iter().map(|&w| window(w, 16, 0)).collect(),
        tokens_per_block: TPB,
        max_sequence_length: MAX_LEN,
        num_extra_kv_tokens: extra,
        max_draft_tokens: draft,
        copy_backend: CopyBackend::HostMemory,
        bytes_per_element: 1,
        manual_clock: true,
        ..ManagerConfig::default()
    }
}

/// Admits a 29-token prompt and generates up to the maximum length (30 tokens).
fn sequence_at_max_length(m: &mut KvCacheManager) {
    m.add_sequence(&Request::new(1, (0..29).collect())).unwrap();
    m.add_token(1, 1000).unwrap();
    assert!(matches!(
        m.add_token(1, 1001),
        Err(KvError::SequenceTooLong { .. })
    ));
}

/// The sequence's offset-table row per pool: how many entries hold a block.
fn offsets_written(m: &KvCacheManager) -> Vec<usize> {
    let (max_blocks, pools) = m.offset_table_dimensions();
    let mut table = vec![0i32; pools * 2 * max_blocks];
    m.copy_block_offsets(&mut table, 1, 0, 1).unwrap();
    table
        .chunks(2 * max_blocks)
        .map(|pool| {
            pool[..max_blocks]
                .iter()
                .filter(|&&o| o != NO_BLOCK_OFFSET)
                .count()
        })
        .collect()
}

#[test]
fn max_blocks_per_seq_counts_extra_kv_and_draft_tokens() {
    // ceil((min(30, window limit) + 2 + 5) / 8) = ceil(37 / 8) = 5 in both windows; without
    // the extra and draft tokens ceil(30 / 8) = 4.
    let m = KvCacheManager::new(config(EXTRA, DRAFT)).unwrap();
    for w in WINDOWS {
        assert_eq!(m.max_blocks_per_seq(w).unwrap(), 5, "window {w}");
    }
    assert_eq!(m.offset_table_dimensions(), (5, 2));
    assert_eq!(m.max_kv_tokens(), 37);
    let plain = KvCacheManager::new(config(0, 0)).unwrap();
    assert_eq!(plain.max_blocks_per_seq(40).unwrap(), 4);
    assert_eq!(plain.max_kv_tokens(), MAX_LEN);
    assert!(plain.max_blocks_per_seq(17).is_err());
}

#[test]
fn sequence_at_its_limit_with_the_largest_draft_fits_its_offset_table() {
    let mut m = KvCacheManager::new(config(EXTRA, DRAFT)).unwrap();
    sequence_at_max_length(&mut m);
    // The step's draft: 30 + 1 + 5 = 36 tokens of slots, 5 blocks.
    assert!(m.allocate_generation(1, DRAFT).unwrap());
    assert_eq!(m.sequence_lengths(1).unwrap().capacity, 36);
    for w in WINDOWS {
        assert_eq!(m.cache_block_ids(1, w, 0).unwrap().len(), 5, "window {w}");
    }
    assert_eq!(offsets_written(&m), vec![5, 5]);
    m.check_invariants().unwrap();

    // Padding up to the limit (30 + 2 + 5 = 37) still fits; one token more is refused.
    assert!(m.extend_capacity_for_tokens(1, 1).unwrap());
    assert_eq!(m.sequence_lengths(1).unwrap().capacity, 37);
    assert!(matches!(
        m.extend_capacity_for_tokens(1, 1),
        Err(KvError::SequenceTooLong {
            length: 38,
            max: 37
        })
    ));
    assert!(matches!(
        m.resize(1, 38),
        Err(KvError::SequenceTooLong {
            length: 38,
            max: 37
        })
    ));
    assert_eq!(offsets_written(&m), vec![5, 5]);
    m.check_invariants().unwrap();

    // A draft longer than configured is capped at the limit instead of outgrowing the table.
    assert!(m.revert_allocate_generation(1).unwrap());
    assert!(m.allocate_generation(1, 3 * DRAFT).unwrap());
    assert_eq!(m.sequence_lengths(1).unwrap().capacity, 37);
    assert_eq!(offsets_written(&m), vec![5, 5]);
    m.check_invariants().unwrap();
}

#[test]
fn without_extra_or_draft_tokens_the_capacity_stops_at_the_maximum_length() {
    let mut m = KvCacheManager::new(config(0, 0)).unwrap();
    sequence_at_max_length(&mut m);
    assert!(m.allocate_generation(1, DRAFT).unwrap());
    assert_eq!(m.sequence_lengths(1).unwrap().capacity, MAX_LEN);
    assert_eq!(offsets_written(&m), vec![4, 4]);
    m.check_invariants().unwrap();
}

#[test]
fn an_overflowing_token_limit_is_an_invalid_config() {
    let mut cfg = config(usize::MAX, 1);
    assert!(matches!(
        KvCacheManager::new(cfg.clone()),
        Err(KvError::InvalidConfig(_))
    ));
    cfg.num_extra_kv_tokens = 0;
    cfg.max_draft_tokens = usize::MAX - MAX_LEN + 1;
    assert!(matches!(
        KvCacheManager::new(cfg),
        Err(KvError::InvalidConfig(_))
    ));
}
