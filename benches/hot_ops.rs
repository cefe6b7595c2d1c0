//! Hot operations of the manager at 32 tokens per block, and the floor: the least work any prefix
//! index must do for the same admission (hash each block's tokens, one hash-table probe per
//! block, one free-list pop per miss), measured in the same run so reports can state ratios.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kvblock::key::{lookup_hash, BlockKeyRef};
use kvblock::manager::{KvCacheManager, ManagerConfig, Request, WindowSpec};
use kvblock::premixed::PremixedMap;

const TPB: usize = 32;
const PROMPT: usize = 8192;
const BLOCKS: usize = PROMPT / TPB;
const WINDOW: usize = 16384;

fn manager(primary: usize, secondary: usize, events: bool) -> KvCacheManager {
    KvCacheManager::new(ManagerConfig {
        windows: vec![WindowSpec {
            window_size: WINDOW,
            primary_blocks: primary,
            secondary_blocks: secondary,
            num_layers: 1,
            num_kv_heads: 1,
            size_per_head: 1,
            auto_host_tier: false,
        }],
        tokens_per_block: TPB,
        max_sequence_length: WINDOW,
        max_kv_event_entries: if events { 1 << 20 } else { 0 },
        ..ManagerConfig::default()
    })
    .unwrap()
}

fn prompt(seed: i32) -> Vec<i32> {
    (0..PROMPT as i32 + 1)
        .map(|i| seed.wrapping_mul(1_000_003) ^ i)
        .collect()
}

/// A manager whose tree holds the first `cached_blocks` blocks of `prompt(1)`.
fn cached_state(cached_blocks: usize) -> KvCacheManager {
    let mut m = manager(4 * BLOCKS, 0, false);
    if cached_blocks > 0 {
        let mut t = prompt(1);
        t.truncate(cached_blocks * TPB + 1);
        m.add_sequence(&Request::new(1, t)).unwrap();
        computed(&mut m, 1);
        m.remove_sequence(1, true).unwrap();
    }
    m
}

/// Marks sequence `id`'s prompt computed, as an engine's prefill does: storing for reuse stops
/// at what was computed, so without it nothing would be cached.
fn computed(m: &mut KvCacheManager, id: u64) {
    let l = m.sequence_lengths(id).unwrap();
    m.advance_history(id, l.num_tokens.min(l.capacity)).unwrap();
}

fn admission(c: &mut Criterion) {
    let mut g = c.benchmark_group("admit_8192_tokens");
    g.throughput(Throughput::Elements(BLOCKS as u64));
    let req = Request::new(2, prompt(1));
    for (name, cached) in [
        ("uncached", 0),
        ("half_cached", BLOCKS / 2),
        ("fully_cached", BLOCKS),
    ] {
        // The request is handed over by value, as through the C ABI (which copies the tokens
        // once at the boundary); the clone happens in the untimed setup.
        g.bench_function(name, |b| {
            b.iter_batched(
                || (cached_state(cached), req.clone()),
                |(mut m, r)| {
                    let a = black_box(m.add_sequence_owned(r).unwrap());
                    // The bench measures what it names: that many blocks reused.
                    assert_eq!(a.stats.reused_blocks as usize, cached);
                    m
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

fn store_and_remove(c: &mut Criterion) {
    let mut g = c.benchmark_group("after_8192_tokens");
    g.throughput(Throughput::Elements(BLOCKS as u64));
    let req = Request::new(2, prompt(1));
    let admitted = || {
        let mut m = cached_state(0);
        m.add_sequence(&req).unwrap();
        computed(&mut m, 2);
        m
    };
    g.bench_function("store_context_blocks", |b| {
        b.iter_batched(
            admitted,
            |mut m| {
                m.store_context_blocks(2, PROMPT).unwrap();
                m
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("remove_sequence_with_store", |b| {
        b.iter_batched(
            admitted,
            |mut m| {
                m.remove_sequence(2, true).unwrap();
                m
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

fn decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("add_token_256_sequences");
    g.throughput(Throughput::Elements(256 * 32));
    let setup = || {
        let mut m = manager(256 * 40, 0, false);
        for id in 0..256u64 {
            m.add_sequence(&Request::new(
                id,
                (0..1000).map(|i| i + id as i32 * 7919).collect(),
            ))
            .unwrap();
        }
        m
    };
    g.bench_function("one_token_each", |b| {
        b.iter_batched(
            setup,
            |mut m| {
                for step in 0..32 {
                    for id in 0..256u64 {
                        m.add_token(id, step).unwrap();
                    }
                }
                m
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

fn offload(c: &mut Criterion) {
    // Every primary block is cached (priority 35 ≥ 30): each allocation offloads one to host.
    let mut g = c.benchmark_group("allocate_with_offload");
    g.throughput(Throughput::Elements(BLOCKS as u64));
    let setup = || {
        let mut m = manager(BLOCKS + 1, 2 * BLOCKS, false);
        m.add_sequence(&Request::new(1, prompt(1))).unwrap();
        computed(&mut m, 1);
        m.remove_sequence(1, true).unwrap();
        m
    };
    let req = Request::new(2, prompt(2));
    g.bench_function("8192_token_prompt", |b| {
        b.iter_batched(
            setup,
            |mut m| {
                m.add_sequence(&req).unwrap();
                m
            },
            BatchSize::PerIteration,
        )
    });
    // What the bench names: the allocations offloaded cached blocks.
    let mut m = setup();
    m.add_sequence(&req).unwrap();
    assert!(m.stats().offloaded_blocks > 0);
    g.finish();
}

/// The floor: hash each block's tokens (a fast 4-lane multiply hash, chained through the parent's
/// hash), probe a hash map keyed by that hash per block (no full-key comparison), pop a free list
/// per miss, insert the missed blocks.
fn floor(c: &mut Criterion) {
    let mut g = c.benchmark_group("floor_admit_8192_tokens");
    g.throughput(Throughput::Elements(BLOCKS as u64));
    let tokens = prompt(1);
    for (name, cached) in [
        ("uncached", 0),
        ("half_cached", BLOCKS / 2),
        ("fully_cached", BLOCKS),
    ] {
        let setup = || {
            let mut index: PremixedMap<u64, u32> = PremixedMap::default();
            index.reserve(4 * BLOCKS);
            let free: Vec<u32> = (0..4 * BLOCKS as u32).collect();
            let mut h = 0u64;
            for (i, block) in tokens.chunks_exact(TPB).take(cached).enumerate() {
                h = chain_hash(h, block);
                index.insert(h, i as u32);
            }
            (index, free)
        };
        g.bench_function(name, |b| {
            b.iter_batched(
                setup,
                |(mut index, mut free)| {
                    let mut h = 0u64;
                    let mut table = Vec::with_capacity(BLOCKS);
                    for block in tokens.chunks_exact(TPB).take(BLOCKS) {
                        h = chain_hash(h, block);
                        let id = match index.get(&h) {
                            Some(&id) => id,
                            None => {
                                let id = free.pop().unwrap();
                                index.insert(h, id);
                                id
                            }
                        };
                        table.push(id);
                    }
                    black_box(table);
                    (index, free)
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

fn chain_hash(parent: u64, block: &[i32]) -> u64 {
    parent.rotate_left(17) ^ lookup_hash(&BlockKeyRef::plain(block))
}

criterion_group!(benches, admission, store_and_remove, decode, offload, floor);
criterion_main!(benches);
