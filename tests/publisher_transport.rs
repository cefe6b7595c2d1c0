//! The wire publisher over real ZeroMQ sockets on loopback: frames, sequence numbers, a gap when
//! the manager's buffer drops events, replay from the ring with its end marker, destroy
//! publishing what was flushed. (Payload schema: `scripts/events_wire_test.py`.)

mod common;

use common::window;

use std::time::Duration;

use kvblock::manager::{KvCacheManager, ManagerConfig, Request};
use kvblock::publisher::{Publisher, PublisherConfig, END_SEQ};

const TPB: usize = 4;
const WAIT: Duration = Duration::from_secs(30);

fn manager(event_capacity: usize) -> KvCacheManager {
    KvCacheManager::new(ManagerConfig {
        windows: vec![window(64, 16, 0)],
        tokens_per_block: TPB,
        max_sequence_length: 64,
        manual_clock: true,
        max_kv_event_entries: event_capacity,
        ..ManagerConfig::default()
    })
    .unwrap()
}

/// One iteration that stores `blocks` full blocks (plus a partial one) and flushes.
fn store_request(m: &mut KvCacheManager, id: u64, blocks: usize) {
    let tokens: Vec<i32> = (0..(blocks * TPB + 1) as i32)
        .map(|t| t + 1000 * id as i32)
        .collect();
    m.add_sequence(&Request::new(id, tokens)).unwrap();
    common::prefill_done(m, id);
    m.remove_sequence(id, true).unwrap();
    m.flush_iteration_events();
}

fn config(m: &KvCacheManager, replay: bool) -> PublisherConfig {
    let mut cfg = PublisherConfig::new("tcp://127.0.0.1:*", 64, m.tokens_per_block());
    cfg.topic = b"kv".to_vec();
    if replay {
        cfg.replay_endpoint = Some("tcp://127.0.0.1:*".into());
    }
    cfg
}

fn subscriber(ctx: &zmq::Context, p: &Publisher) -> zmq::Socket {
    let s = ctx.socket(zmq::SUB).unwrap();
    s.set_rcvtimeo(WAIT.as_millis() as i32).unwrap();
    s.set_subscribe(b"").unwrap();
    s.connect(p.endpoint()).unwrap();
    assert!(p.wait_for_subscribers(1, WAIT) >= 1, "subscriber joined");
    s
}

fn seq_of(frame: &[u8]) -> u64 {
    u64::from_be_bytes(frame.try_into().expect("8-byte sequence"))
}

/// Sends a replay request and collects the answer up to the end marker: (seq, payload).
fn replay(ctx: &zmq::Context, p: &Publisher, start: u64) -> Vec<(u64, Vec<u8>)> {
    let d = ctx.socket(zmq::DEALER).unwrap();
    d.set_rcvtimeo(WAIT.as_millis() as i32).unwrap();
    d.connect(p.replay_endpoint().unwrap()).unwrap();
    d.send_multipart([&b""[..], &start.to_be_bytes()[..]], 0)
        .unwrap();
    let mut out = Vec::new();
    loop {
        let f = d.recv_multipart(0).expect("replay answer");
        assert_eq!(f.len(), 4, "[empty, topic, seq, payload]");
        assert!(f[0].is_empty());
        assert_eq!(f[1], b"kv");
        let seq = seq_of(&f[2]);
        if seq == END_SEQ {
            assert!(f[3].is_empty(), "end marker has an empty payload");
            return out;
        }
        out.push((seq, f[3].clone()));
    }
}

fn wait_for_batches(p: &Publisher, n: u64) {
    let deadline = std::time::Instant::now() + WAIT;
    while p.stats().batches < n {
        assert!(
            std::time::Instant::now() < deadline,
            "{n} batches published"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn live_frames_carry_topic_and_consecutive_sequence_numbers() {
    let ctx = zmq::Context::new();
    let mut m = manager(1024);
    let mut cfg = config(&m, false);
    cfg.start_sequence = 7;
    let p = Publisher::start(m.event_delivery(), cfg).unwrap();
    let sub = subscriber(&ctx, &p);
    for id in 0..3 {
        store_request(&mut m, id, 2);
    }
    for want in 7..10 {
        let f = sub.recv_multipart(0).expect("a batch");
        assert_eq!(f.len(), 3);
        assert_eq!(f[0], b"kv");
        assert_eq!(seq_of(&f[1]), want);
        assert_eq!(f[2][0], 0x93, "payload is a 3-element msgpack array");
    }
    // The publisher counts a batch after sending it: the subscriber can see the third frame first.
    wait_for_batches(&p, 3);
    let s = p.stats();
    assert_eq!((s.batches, s.gaps, s.next_sequence), (3, 0, 10));
}

#[test]
fn all_blocks_cleared_comes_first_when_asked() {
    let ctx = zmq::Context::new();
    let m = manager(1024);
    let mut cfg = config(&m, true);
    cfg.all_blocks_cleared_first = true;
    let p = Publisher::start(m.event_delivery(), cfg).unwrap();
    wait_for_batches(&p, 1);
    let batches = replay(&ctx, &p, 0);
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].0, 0);
    let text = String::from_utf8_lossy(&batches[0].1);
    assert!(text.contains("AllBlocksCleared"));
}

#[test]
fn dropped_events_skip_a_sequence_number_and_replay_serves_the_ring() {
    let ctx = zmq::Context::new();
    // Capacity 3: the Created event and four iterations of one Stored event each; the Created
    // event and the first iteration are dropped.
    let mut m = manager(3);
    for id in 0..4 {
        store_request(&mut m, id, 1);
    }
    let p = Publisher::start(m.event_delivery(), config(&m, true)).unwrap();
    wait_for_batches(&p, 3);
    let s = p.stats();
    assert_eq!((s.gaps, s.dropped_events, s.next_sequence), (1, 2, 4));
    let seqs: Vec<u64> = replay(&ctx, &p, 0).iter().map(|b| b.0).collect();
    assert_eq!(seqs, vec![1, 2, 3], "sequence 0 is the gap");
    let seqs: Vec<u64> = replay(&ctx, &p, 3).iter().map(|b| b.0).collect();
    assert_eq!(seqs, vec![3]);
    assert!(replay(&ctx, &p, 4).is_empty(), "only the end marker");
    assert_eq!(p.stats().replay_requests, 3);
}

#[test]
fn destroy_publishes_what_was_flushed_before_it() {
    let ctx = zmq::Context::new();
    let mut m = manager(1024);
    let p = Publisher::start(m.event_delivery(), config(&m, false)).unwrap();
    let sub = subscriber(&ctx, &p);
    for id in 0..20 {
        store_request(&mut m, id, 1);
    }
    drop(p);
    let seqs: Vec<u64> = (0..20)
        .map(|_| seq_of(&sub.recv_multipart(0).expect("a batch")[1]))
        .collect();
    assert_eq!(seqs, (0..20).collect::<Vec<_>>());
}

#[test]
fn a_publisher_outlives_its_manager() {
    let mut m = manager(1024);
    let p = Publisher::start(m.event_delivery(), config(&m, true)).unwrap();
    store_request(&mut m, 0, 1);
    drop(m);
    wait_for_batches(&p, 1);
    drop(p);
}

#[test]
fn bind_errors_are_reported_at_start() {
    let m = manager(16);
    let mut cfg = config(&m, false);
    cfg.endpoint = "not-an-endpoint".into();
    let err = Publisher::start(m.event_delivery(), cfg).unwrap_err();
    assert!(err.to_string().contains("not-an-endpoint"), "{err}");
}
