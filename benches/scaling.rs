//! Scaling of the hot paths (docs/performance.md, Scaling): the cost of one decode step per running
//! sequence from 64 to 1,024 sequences, and the cost of an admission per prompt block from 1,000-
//! to 131,072-token prompts and from 30,000 to 1,200,000 pool blocks. Each admission is the
//! replay's: add the sequence, store its prompt blocks, release it with store, so the tree fills
//! with cached blocks and later admissions evict them (the steady state of a long run).
//!
//!     cargo bench --bench scaling

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use kvblock::manager::{KvCacheManager, ManagerConfig, Request, WindowSpec};

const TPB: usize = 32;
const MAX_SEQ: usize = 1 << 18;

fn manager(primary: usize) -> KvCacheManager {
    KvCacheManager::new(ManagerConfig {
        windows: vec![WindowSpec {
            window_size: MAX_SEQ,
            primary_blocks: primary,
            secondary_blocks: 0,
            num_layers: 1,
            num_kv_heads: 1,
            size_per_head: 1,
            auto_host_tier: false,
        }],
        tokens_per_block: TPB,
        max_sequence_length: MAX_SEQ,
        ..ManagerConfig::default()
    })
    .expect("manager")
}

/// A prompt no other call uses (`serial` makes it unique).
fn prompt(serial: u64, len: usize) -> Vec<i32> {
    (0..len)
        .map(|i| ((serial.wrapping_mul(0x9e37_79b9) as usize + i * 7919) % 32000) as i32)
        .collect()
}

fn decode_step(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode_step_per_sequence");
    g.measurement_time(Duration::from_secs(2));
    g.warm_up_time(Duration::from_millis(500));
    for running in [64usize, 256, 1024] {
        g.throughput(Throughput::Elements(running as u64));
        g.bench_with_input(BenchmarkId::from_parameter(running), &running, |b, &n| {
            let mut m = manager(n * 64);
            let ids: Vec<u64> = (0..n as u64).collect();
            for &id in &ids {
                m.add_sequence(&Request::new(id, prompt(id, 100))).unwrap();
            }
            let tokens = vec![7i32; n];
            let mut steps = 0usize;
            b.iter(|| {
                // Keep the sequences short: every 1,024 steps they start over.
                steps += 1;
                if steps.is_multiple_of(1024) {
                    for &id in &ids {
                        m.remove_sequence(id, false).unwrap();
                        m.add_sequence(&Request::new(id, prompt(id, 100))).unwrap();
                    }
                }
                black_box(m.add_tokens(&ids, &tokens, true).0)
            });
        });
    }
    g.finish();
}

fn admit(m: &mut KvCacheManager, id: u64, tokens: Vec<i32>) {
    let n = tokens.len();
    m.add_sequence_ref(&Request::new(id, tokens).as_ref())
        .unwrap();
    m.store_context_blocks(id, n).unwrap();
    m.remove_sequence(id, true).unwrap();
}

/// Measures `admit` of fresh `len`-token prompts on a pool of `blocks`, filled with cached
/// blocks first so that every admission evicts.
fn bench_admissions(b: &mut criterion::Bencher<'_>, blocks: usize, len: usize) {
    let mut m = manager(blocks);
    let mut serial = 0u64;
    while serial * (len.div_ceil(TPB) as u64) < blocks as u64 {
        admit(&mut m, serial, prompt(serial, len));
        serial += 1;
    }
    b.iter_batched(
        || {
            serial += 1;
            (serial, prompt(serial, len))
        },
        |(id, tokens)| admit(&mut m, id, tokens),
        BatchSize::LargeInput,
    );
}

fn admission_by_prompt(c: &mut Criterion) {
    let mut g = c.benchmark_group("admission_per_block_by_prompt_30000_blocks");
    g.measurement_time(Duration::from_secs(3));
    g.warm_up_time(Duration::from_millis(500));
    g.sample_size(20);
    for len in [1_000usize, 8_192, 131_072] {
        g.throughput(Throughput::Elements(len.div_ceil(TPB) as u64));
        g.bench_with_input(BenchmarkId::from_parameter(len), &len, |b, &len| {
            bench_admissions(b, 30_000, len)
        });
    }
    g.finish();
}

fn admission_by_pool(c: &mut Criterion) {
    let mut g = c.benchmark_group("admission_per_block_by_pool_8192_tokens");
    g.measurement_time(Duration::from_secs(3));
    g.warm_up_time(Duration::from_millis(500));
    g.sample_size(20);
    let len: usize = 8_192;
    for blocks in [30_000usize, 300_000, 1_200_000] {
        g.throughput(Throughput::Elements(len.div_ceil(TPB) as u64));
        g.bench_with_input(
            BenchmarkId::from_parameter(blocks),
            &blocks,
            |b, &blocks| bench_admissions(b, blocks, len),
        );
    }
    g.finish();
}

criterion_group!(benches, decode_step, admission_by_prompt, admission_by_pool);
criterion_main!(benches);
