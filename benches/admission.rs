//! Batched admission against one-by-one admission: 64 requests sharing a 2,048-token system
//! prompt plus 512 unique tokens each, 32 tokens per block, half of the shared blocks on the
//! host tier (so admission onboards them).

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kvblock::manager::{KvCacheManager, ManagerConfig, Request, WindowSpec};

const TPB: usize = 32;
const REQUESTS: usize = 64;
const SYSTEM_TOKENS: usize = 2048;
const UNIQUE_TOKENS: usize = 512;
const WINDOW: usize = 8192;

fn system_prompt() -> Vec<i32> {
    (0..SYSTEM_TOKENS as i32).collect()
}

fn requests() -> Vec<Request> {
    (0..REQUESTS)
        .map(|r| {
            let mut t = system_prompt();
            t.extend((0..UNIQUE_TOKENS).map(|i| 100_000 + (r * UNIQUE_TOKENS + i) as i32));
            Request::new(1000 + r as u64, t)
        })
        .collect()
}

/// The system prompt cached, half of its blocks offloaded to the host tier.
fn state() -> KvCacheManager {
    let cfg = ManagerConfig {
        windows: vec![WindowSpec {
            window_size: WINDOW,
            primary_blocks: 4096,
            secondary_blocks: 1024,
            num_layers: 1,
            num_kv_heads: 1,
            size_per_head: 1,
            auto_host_tier: false,
        }],
        tokens_per_block: TPB,
        max_sequence_length: WINDOW,
        ..ManagerConfig::default()
    };
    let mut m = KvCacheManager::new(cfg).unwrap();
    let mut seed = system_prompt();
    seed.push(7);
    m.add_sequence(&Request::new(1, seed)).unwrap();
    // Its prefill computed, as an engine's is before the sequence is stored for reuse.
    let l = m.sequence_lengths(1).unwrap();
    m.advance_history(1, l.num_tokens).unwrap();
    let ids = m.cache_block_ids(1, WINDOW, 0).unwrap();
    m.remove_sequence(1, true).unwrap();
    for &b in ids.iter().take(SYSTEM_TOKENS / TPB / 2) {
        assert!(m.offload_block(WINDOW, b).unwrap());
    }
    m
}

fn bench(c: &mut Criterion) {
    let reqs = requests();
    let blocks = (REQUESTS * (SYSTEM_TOKENS + UNIQUE_TOKENS) / TPB) as u64;
    let mut group = c.benchmark_group("admission_64x2560");
    group.throughput(Throughput::Elements(blocks));
    group.bench_function("add_sequence_batch", |b| {
        b.iter_batched(
            state,
            |mut m| {
                let admitted = m.add_sequence_batch(&reqs, false).unwrap();
                assert_eq!(admitted[0].prepopulated_prompt_len, SYSTEM_TOKENS);
                m
            },
            BatchSize::PerIteration,
        )
    });
    group.bench_function("add_sequence_x64", |b| {
        b.iter_batched(
            state,
            |mut m| {
                for r in &reqs {
                    m.add_sequence(r).unwrap();
                }
                m
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
