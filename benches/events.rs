//! KV cache events: enqueue (absorb a window's raw events with per-window removal batching),
//! flush, deliver and drain, at a mix like a serving iteration's: for each of two windows,
//! Stored chains of 4 blocks × 32 tokens, single-block evictions and offload updates.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kvblock::events::{EventDelivery, EventQueue, StoredBlock, WindowEvent};
use kvblock::pool::Level;

const WINDOWS: [usize; 2] = [4096, 131072];
const STORES_PER_WINDOW: usize = 8;
const BLOCKS_PER_STORE: usize = 4;
const EVICTIONS_PER_WINDOW: usize = 32;
const UPDATES_PER_WINDOW: usize = 8;

fn iteration_events(window: usize) -> Vec<WindowEvent> {
    let mut out = Vec::new();
    let mut h = window as u64 * 1_000_003;
    for s in 0..STORES_PER_WINDOW {
        for _ in 0..EVICTIONS_PER_WINDOW / STORES_PER_WINDOW {
            h += 1;
            out.push(WindowEvent::Removed(h));
        }
        if s < UPDATES_PER_WINDOW {
            h += 1;
            out.push(WindowEvent::Updated {
                block_hash: h,
                cache_level: Some((Level::Primary, Level::Secondary)),
                priority: None,
            });
        }
        let blocks = (0..BLOCKS_PER_STORE)
            .map(|b| {
                h += 1;
                StoredBlock {
                    hash: h,
                    token_ids: (0..32).map(|t| (t * 7 + b) as i32).collect(),
                    extra_ids: None,
                    lora_task_id: None,
                    cache_level: Level::Primary,
                    priority: 35,
                    mm_keys: Vec::new(),
                    cache_salt: None,
                }
            })
            .collect();
        out.push(WindowEvent::Stored {
            parent_hash: Some(h ^ 0xff),
            blocks,
        });
    }
    out
}

fn events_per_iteration() -> u64 {
    // Per window: one Stored per store, each preceded by one committed Removed batch, plus the
    // updates.
    (WINDOWS.len() * (2 * STORES_PER_WINDOW + UPDATES_PER_WINDOW)) as u64
}

fn hashes_per_iteration() -> u64 {
    (WINDOWS.len()
        * (STORES_PER_WINDOW * BLOCKS_PER_STORE + EVICTIONS_PER_WINDOW + UPDATES_PER_WINDOW))
        as u64
}

fn bench(c: &mut Criterion) {
    let raw: Vec<(usize, Vec<WindowEvent>)> =
        WINDOWS.iter().map(|&w| (w, iteration_events(w))).collect();
    let mut group = c.benchmark_group("events");
    for (name, throughput) in [
        (
            "enqueue_flush_drain/events",
            Throughput::Elements(events_per_iteration()),
        ),
        (
            "enqueue_flush_drain/block_hashes",
            Throughput::Elements(hashes_per_iteration()),
        ),
    ] {
        group.throughput(throughput);
        let mut queue = EventQueue::new(&WINDOWS, None);
        let delivery = EventDelivery::new(1 << 16);
        group.bench_function(name, |b| {
            b.iter_batched(
                || raw.clone(),
                |iteration| {
                    for (w, events) in iteration {
                        queue.absorb(w, events);
                    }
                    delivery.push(queue.flush());
                    delivery.drain(Duration::ZERO)
                },
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
