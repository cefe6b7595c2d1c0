//! Engine-call latency with a publisher attached, with and without hostile peers (replay clients
//! that never read, a request flood, malformed and oversized frames, a subscription flood; see
//! `tests/common/hostile.rs`), on loopback. One engine call here is one iteration: admit a
//! request of 8 fresh blocks, store it for reuse, release it, flush the iteration's events.
//! Prints the median, p90 and p99 per iteration. `tests/publisher_service.rs` asserts the
//! bounds; this only measures.
//!
//!   cargo bench --bench publisher_service

#[path = "../tests/common/hostile.rs"]
mod hostile;

use std::time::{Duration, Instant};

use kvblock::manager::{KvCacheManager, ManagerConfig, Request, WindowSpec};
use kvblock::publisher::{Publisher, PublisherConfig};

const TPB: usize = 16;
const ITERATIONS: u64 = 20_000;

fn manager() -> KvCacheManager {
    KvCacheManager::new(ManagerConfig {
        windows: vec![WindowSpec {
            window_size: 4096,
            primary_blocks: 2048,
            secondary_blocks: 0,
            num_layers: 1,
            num_kv_heads: 1,
            size_per_head: 1,
            auto_host_tier: false,
        }],
        tokens_per_block: TPB,
        max_sequence_length: 4096,
        manual_clock: true,
        max_kv_event_entries: 1 << 16,
        ..ManagerConfig::default()
    })
    .unwrap()
}

fn iteration(m: &mut KvCacheManager, id: u64) {
    let tokens: Vec<i32> = (0..(8 * TPB) as i32)
        .map(|t| t + (id as i32 % 100_000) * 10_000)
        .collect();
    let len = tokens.len();
    m.add_sequence(&Request::new(id, tokens)).unwrap();
    // The prefill ran (storing stops at what was computed).
    m.store_context_blocks(id, len).unwrap();
    m.remove_sequence(id, true).unwrap();
    m.flush_iteration_events();
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

/// Runs the engine with a publisher and a reading subscriber; `hostile` adds the hostile peers.
fn run(hostile: bool) -> (Vec<Duration>, kvblock::publisher::PublisherStats, u64) {
    let mut m = manager();
    let mut cfg = PublisherConfig::new("tcp://127.0.0.1:*", 4096, TPB);
    cfg.replay_endpoint = Some("tcp://127.0.0.1:*".into());
    let p = Publisher::start(m.event_delivery(), cfg).unwrap();
    let ctx = zmq::Context::new();
    let sub = ctx.socket(zmq::SUB).unwrap();
    sub.set_subscribe(b"").unwrap();
    sub.set_rcvhwm(0).unwrap();
    sub.set_rcvtimeo(30_000).unwrap();
    sub.connect(p.endpoint()).unwrap();
    p.wait_for_subscribers(1, Duration::from_secs(30));
    let reader = std::thread::spawn(move || {
        let mut n = 0u64;
        while n < ITERATIONS {
            if sub.recv_multipart(0).is_err() {
                break;
            }
            n += 1;
        }
        n
    });
    // Warm up and fill the ring.
    for id in 0..2000 {
        iteration(&mut m, id);
    }
    let evil = hostile.then(|| {
        let e = hostile::Hostile::start(p.endpoint(), p.replay_endpoint().unwrap());
        std::thread::sleep(Duration::from_millis(200));
        e
    });
    let rss_before = hostile::rss_bytes();
    let mut times = Vec::with_capacity(ITERATIONS as usize);
    for id in 2000..ITERATIONS {
        let t = Instant::now();
        iteration(&mut m, id);
        times.push(t.elapsed());
        if id % 100 == 0 {
            // A real engine iteration is milliseconds long: leave the peers time to work.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let received = reader.join().unwrap();
    let grown = hostile::rss_bytes().saturating_sub(rss_before);
    let stats = p.stats();
    if let Some(e) = evil {
        e.stop();
    }
    assert_eq!(received, ITERATIONS, "the subscriber got every batch");
    (times, stats, grown)
}

fn main() {
    // `cargo test --benches` runs bench binaries with --bench absent: stay quick there.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    for hostile in [false, true] {
        let (mut times, s, grown) = run(hostile);
        times.sort();
        println!(
            "publisher_service/{}: engine iteration median {:.2} us, p90 {:.2} us, p99 {:.2} us \
             ({} iterations); queued peak {} KiB, replay requests accepted {} refused {} \
             malformed {}, live unsent {}, RSS growth {} MiB",
            if hostile { "hostile" } else { "quiet" },
            percentile(&times, 0.5).as_secs_f64() * 1e6,
            percentile(&times, 0.9).as_secs_f64() * 1e6,
            percentile(&times, 0.99).as_secs_f64() * 1e6,
            times.len(),
            s.queued_bytes_peak >> 10,
            s.replay_requests,
            s.replay_requests_refused,
            s.malformed_requests,
            s.live_batches_unsent,
            grown >> 20,
        );
    }
}
