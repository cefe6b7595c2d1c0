//! The event publisher as a network service, on loopback: hostile peers (replay clients that
//! never read, a request flood, malformed and oversized frames, a subscription flood) while the
//! engine keeps admitting, storing and removing. Memory stays bounded, a well-behaved
//! subscriber sees every batch without a gap, and the engine's calls all complete. The engine's
//! latency under that load is measured by `benches/publisher_service.rs`, not asserted here.
//!
//! Also the regressions of the handle and the settings through the C ABI: destroy twice and
//! calls after destroy, a second publisher on one manager, `start_sequence` at the end marker,
//! bad ports and transports, subscriber counting, the first version of the config struct.

mod common;

use common::hostile::{self, Hostile};
use common::window;

use std::ffi::{CStr, CString};
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvblock::ffi::handle::{handle_from_manager, kvb_manager_t};
use kvblock::ffi::manager::kvb_manager_destroy;
use kvblock::ffi::publisher::*;
use kvblock::ffi::status::{kvb_last_error_message, kvb_status_t};
use kvblock::manager::{KvCacheManager, ManagerConfig, Request};
use kvblock::publisher::{PublishError, Publisher, PublisherConfig, END_SEQ};

const TPB: usize = 16;
const WAIT: Duration = Duration::from_secs(30);

fn manager() -> KvCacheManager {
    KvCacheManager::new(ManagerConfig {
        windows: vec![window(4096, 2048, 0)],
        tokens_per_block: TPB,
        max_sequence_length: 4096,
        manual_clock: true,
        max_kv_event_entries: 1 << 16,
        ..ManagerConfig::default()
    })
    .unwrap()
}

/// One engine iteration: admit a request of `blocks` fresh blocks, compute and store it for
/// reuse, release it, flush the iteration's events.
fn iteration(m: &mut KvCacheManager, id: u64, blocks: usize) {
    let tokens: Vec<i32> = (0..(blocks * TPB) as i32)
        .map(|t| t + (id as i32 % 100_000) * 10_000)
        .collect();
    let len = tokens.len();
    m.add_sequence(&Request::new(id, tokens)).unwrap();
    // The prefill ran (storing stops at what was computed).
    m.store_context_blocks(id, len).unwrap();
    m.remove_sequence(id, true).unwrap();
    m.flush_iteration_events();
}

fn last_error() -> String {
    // SAFETY: NUL-terminated, valid until the next call on this thread.
    unsafe { CStr::from_ptr(kvb_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

fn seq_of(frame: &[u8]) -> u64 {
    u64::from_be_bytes(frame.try_into().expect("8-byte sequence"))
}

#[test]
fn hostile_peers_leave_memory_bounded_and_a_good_subscriber_gap_free() {
    const ITERATIONS: u64 = 3000;
    const MAX_QUEUED: usize = 8 << 20;
    const PEER_MAX: usize = 256 << 10;
    let mut m = manager();
    let mut cfg = PublisherConfig::new("tcp://127.0.0.1:*", 4096, TPB);
    cfg.replay_endpoint = Some("tcp://127.0.0.1:*".into());
    cfg.replay_buffer_steps = 4000;
    cfg.send_hwm = 1000;
    cfg.max_queued_bytes = MAX_QUEUED;
    cfg.replay_peer_max_bytes = PEER_MAX;
    cfg.slow_peer_timeout_ms = 2000;
    let p = Publisher::start(m.event_delivery(), cfg).unwrap();
    let pub_ep = p.endpoint().to_string();
    let replay_ep = p.replay_endpoint().unwrap().to_string();

    // The well-behaved subscriber reads every batch on its own thread.
    let ctx = zmq::Context::new();
    let sub = ctx.socket(zmq::SUB).unwrap();
    sub.set_rcvtimeo(WAIT.as_millis() as i32).unwrap();
    sub.set_rcvhwm(0).unwrap();
    sub.set_subscribe(b"").unwrap();
    sub.connect(&pub_ep).unwrap();
    assert!(p.wait_for_subscribers(1, WAIT) >= 1);

    // Fill the ring so that every replay has much to send, then let the hostile peers in.
    for id in 0..500 {
        iteration(&mut m, id, 8);
    }
    let rss_before = hostile::rss_bytes();
    let peak_rss = Arc::new(AtomicU64::new(rss_before));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak, on) = (peak_rss.clone(), sampling.clone());
        std::thread::spawn(move || {
            while on.load(Ordering::Relaxed) {
                peak.fetch_max(hostile::rss_bytes(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let reader = std::thread::spawn(move || {
        let mut seqs = Vec::new();
        while seqs.last() != Some(&(ITERATIONS - 1)) {
            let f = sub.recv_multipart(0).expect("a live batch");
            assert_eq!(f.len(), 3);
            seqs.push(seq_of(&f[1]));
        }
        seqs
    });
    let evil = Hostile::start(&pub_ep, &replay_ep);
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    for id in 500..ITERATIONS {
        iteration(&mut m, id, 8);
        if id % 50 == 0 {
            // Let the peers work: an iteration is far shorter than a real engine's.
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let engine_time = started.elapsed();
    let seqs = reader.join().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let s = p.stats();
    evil.stop();
    sampling.store(false, Ordering::Relaxed);
    sampler.join().unwrap();
    let grown = peak_rss.load(Ordering::Relaxed).saturating_sub(rss_before);
    println!(
        "engine: {} iterations in {engine_time:?}; RSS {} MiB before, peak growth {} MiB; {s:#?}",
        ITERATIONS - 500,
        rss_before >> 20,
        grown >> 20
    );

    // No gap for the subscriber that reads.
    assert_eq!(seqs, (0..ITERATIONS).collect::<Vec<_>>());
    assert_eq!(s.batches, ITERATIONS);
    assert_eq!(s.live_batches_unsent, 0);
    // What ZeroMQ held stayed under the limits (a batch here is far below them).
    assert!(s.queued_bytes_peak <= MAX_QUEUED as u64, "{s:?}");
    assert!(
        s.replay_queued_bytes <= (MAX_QUEUED / 2) as u64,
        "replays use at most half: {s:?}"
    );
    // The hostile peers were met with the limits.
    assert!(
        s.replay_requests_refused > 0,
        "the flood was refused: {s:?}"
    );
    assert!(
        s.malformed_requests > 0,
        "malformed requests were seen: {s:?}"
    );
    assert!(
        s.replay_requests < 1000,
        "requests accepted at the rate limits, not the flood's rate: {s:?}"
    );
    assert!(
        s.subscribers <= 4,
        "the subscription flood counts once, not per message: {s:?}"
    );
    assert!(s.subscription_messages > 100, "{s:?}");
    // Memory: before the bounds, the never-reading clients and the flood queued the whole
    // ring once per request (gigabytes).
    // Under AddressSanitizer (scripts/sanitize.sh sets ASAN_OPTIONS) freed memory sits in its
    // quarantine (256 MiB by default) and shadow memory grows with it: the resident set says
    // little there, and the exact bound is the queued-bytes peak checked above.
    let allowance: u64 = if std::env::var_os("ASAN_OPTIONS").is_some() {
        (128 + 512) << 20
    } else {
        128 << 20
    };
    assert!(
        grown < allowance,
        "resident memory grew by {} MiB under the hostile peers",
        grown >> 20
    );
    drop(p);
}

#[test]
fn a_slow_replay_peer_is_capped_and_then_dropped() {
    let mut m = manager();
    let mut cfg = PublisherConfig::new("tcp://127.0.0.1:*", 4096, TPB);
    cfg.replay_endpoint = Some("tcp://127.0.0.1:*".into());
    cfg.replay_buffer_steps = 2000;
    cfg.replay_peer_max_bytes = 64 << 10;
    cfg.slow_peer_timeout_ms = 300;
    let p = Publisher::start(m.event_delivery(), cfg).unwrap();
    // About 10 MB in the ring: more than the kernel's socket buffers can absorb.
    for id in 0..2000 {
        iteration(&mut m, id, 64);
    }
    let deadline = Instant::now() + WAIT;
    while p.stats().batches < 2000 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    }
    let ctx = zmq::Context::new();
    let d = ctx.socket(zmq::DEALER).unwrap();
    d.set_rcvhwm(1).unwrap();
    d.set_rcvbuf(4096).unwrap();
    d.connect(p.replay_endpoint().unwrap()).unwrap();
    d.send_multipart([&b""[..], &0u64.to_be_bytes()[..]], 0)
        .unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let s = p.stats();
        assert!(
            s.replay_queued_bytes <= 64 << 10 || s.replay_queued_bytes < 8 << 10,
            "{s:?}"
        );
        if s.slow_peers_dropped == 1 {
            assert_eq!(s.replays_completed, 0, "{s:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slow peer was dropped: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_reading_replay_client_gets_the_whole_ring_in_pieces() {
    let mut m = manager();
    let mut cfg = PublisherConfig::new("tcp://127.0.0.1:*", 4096, TPB);
    cfg.replay_endpoint = Some("tcp://127.0.0.1:*".into());
    cfg.replay_buffer_steps = 2000;
    // Far less than the ring: the answer must go out as the client reads.
    cfg.replay_peer_max_bytes = 16 << 10;
    let p = Publisher::start(m.event_delivery(), cfg).unwrap();
    for id in 0..1500 {
        iteration(&mut m, id, 4);
    }
    let deadline = Instant::now() + WAIT;
    while p.stats().batches < 1500 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    }
    let ctx = zmq::Context::new();
    let d = ctx.socket(zmq::DEALER).unwrap();
    d.set_rcvtimeo(WAIT.as_millis() as i32).unwrap();
    d.connect(p.replay_endpoint().unwrap()).unwrap();
    d.send_multipart([&b""[..], &100u64.to_be_bytes()[..]], 0)
        .unwrap();
    let mut seqs = Vec::new();
    loop {
        let f = d.recv_multipart(0).expect("replay answer");
        let seq = seq_of(&f[2]);
        if seq == END_SEQ {
            break;
        }
        seqs.push(seq);
    }
    assert_eq!(seqs, (100..1500).collect::<Vec<_>>());
    let s = p.stats();
    assert_eq!((s.replay_requests, s.replays_completed), (1, 1));
}

// ---- the C ABI: handle lifecycle and settings ------------------------------------------------

struct CManager(*mut kvb_manager_t);

impl CManager {
    fn new() -> Self {
        CManager(handle_from_manager(manager()))
    }
}

impl Drop for CManager {
    fn drop(&mut self) {
        kvb_manager_destroy(self.0);
    }
}

fn c_config(endpoint: &CStr) -> kvb_event_publisher_config_t {
    // SAFETY: plain data, filled by the init function.
    let mut c = unsafe { std::mem::zeroed::<kvb_event_publisher_config_t>() };
    assert_eq!(
        kvb_event_publisher_config_init(&mut c),
        kvb_status_t::KVB_OK
    );
    c.endpoint = endpoint.as_ptr();
    c
}

fn create(
    m: &CManager,
    c: &kvb_event_publisher_config_t,
) -> (kvb_status_t, *mut kvb_event_publisher_t) {
    let mut p = null_mut();
    let st = kvb_event_publisher_create(m.0, c, &mut p);
    assert_eq!(st == kvb_status_t::KVB_OK, !p.is_null(), "{st:?}");
    (st, p)
}

fn loopback() -> CString {
    CString::new("tcp://127.0.0.1:*").unwrap()
}

#[test]
fn destroying_a_publisher_twice_or_calling_it_after_destroy_returns_destroyed() {
    let m = CManager::new();
    let ep = loopback();
    let (st, p) = create(&m, &c_config(&ep));
    assert_eq!(st, kvb_status_t::KVB_OK, "{}", last_error());
    assert_eq!(kvb_event_publisher_destroy(p), kvb_status_t::KVB_OK);
    assert_eq!(
        kvb_event_publisher_destroy(p),
        kvb_status_t::KVB_STATUS_DESTROYED
    );
    assert!(last_error().contains("destroyed"));
    let mut stats = kvb_event_publisher_stats_t::default();
    assert_eq!(
        kvb_event_publisher_get_stats(p, &mut stats),
        kvb_status_t::KVB_STATUS_DESTROYED
    );
    let mut n = 0u64;
    assert_eq!(
        kvb_event_publisher_wait_for_subscribers(p, 1, 0, &mut n),
        kvb_status_t::KVB_STATUS_DESTROYED
    );
    let mut buf = [0 as std::ffi::c_char; 64];
    let mut len = 0usize;
    assert_eq!(
        kvb_event_publisher_get_endpoint(p, false, buf.as_mut_ptr(), buf.len(), &mut len),
        kvb_status_t::KVB_STATUS_DESTROYED
    );
    let mut service = kvb_event_publisher_service_stats_t {
        struct_size: std::mem::size_of::<kvb_event_publisher_service_stats_t>() as u32,
        ..Default::default()
    };
    assert_eq!(
        kvb_event_publisher_get_service_stats(p, &mut service),
        kvb_status_t::KVB_STATUS_DESTROYED
    );
}

#[test]
fn destroy_wakes_a_call_waiting_for_subscribers() {
    let m = CManager::new();
    let ep = loopback();
    let (_, p) = create(&m, &c_config(&ep));
    let addr = p as usize;
    let waiter = std::thread::spawn(move || {
        let mut n = 7u64;
        let st = kvb_event_publisher_wait_for_subscribers(
            addr as *const kvb_event_publisher_t,
            1,
            -1,
            &mut n,
        );
        (st, n)
    });
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(kvb_event_publisher_destroy(p), kvb_status_t::KVB_OK);
    assert_eq!(waiter.join().unwrap(), (kvb_status_t::KVB_OK, 0));
}

#[test]
fn a_second_publisher_on_one_manager_is_refused() {
    let m = CManager::new();
    let ep = loopback();
    let (st, first) = create(&m, &c_config(&ep));
    assert_eq!(st, kvb_status_t::KVB_OK);
    let (st, second) = create(&m, &c_config(&ep));
    assert_eq!(st, kvb_status_t::KVB_STATUS_UNSUPPORTED);
    assert!(second.is_null());
    assert!(
        last_error().contains("already has an event publisher"),
        "{}",
        last_error()
    );
    // The first one is untouched; once destroyed, the manager may get a new one.
    let mut s = kvb_event_publisher_stats_t::default();
    assert_eq!(
        kvb_event_publisher_get_stats(first, &mut s),
        kvb_status_t::KVB_OK
    );
    assert_eq!(kvb_event_publisher_destroy(first), kvb_status_t::KVB_OK);
    let (st, third) = create(&m, &c_config(&ep));
    assert_eq!(st, kvb_status_t::KVB_OK, "{}", last_error());
    assert_eq!(kvb_event_publisher_destroy(third), kvb_status_t::KVB_OK);

    // The Rust API refuses the same way.
    let m = manager();
    let cfg = PublisherConfig::new("tcp://127.0.0.1:*", 4096, TPB);
    let p = Publisher::start(m.event_delivery(), cfg.clone()).unwrap();
    assert!(matches!(
        Publisher::start(m.event_delivery(), cfg.clone()),
        Err(PublishError::Busy(_))
    ));
    // A refused start leaves the claim with the first publisher; a failed start releases it.
    drop(p);
    let mut bad = cfg.clone();
    bad.endpoint = "tcp://127.0.0.1:0".into();
    assert!(Publisher::start(m.event_delivery(), bad).is_err());
    Publisher::start(m.event_delivery(), cfg).unwrap();
}

#[test]
fn start_sequences_at_the_end_marker_or_that_would_wrap_are_refused() {
    let m = CManager::new();
    let ep = loopback();
    for bad in [END_SEQ, END_SEQ - 1, 1 << 63] {
        let mut c = c_config(&ep);
        c.start_sequence = bad;
        let (st, _) = create(&m, &c);
        assert_eq!(st, kvb_status_t::KVB_STATUS_INVALID_ARGUMENT, "{bad:#x}");
        assert!(last_error().contains("start_sequence"), "{}", last_error());
    }
    let mut c = c_config(&ep);
    c.start_sequence = (1 << 63) - 1;
    let (st, p) = create(&m, &c);
    assert_eq!(st, kvb_status_t::KVB_OK, "{}", last_error());
    kvb_event_publisher_destroy(p);
}

#[test]
fn bad_ports_and_unsupported_transports_are_refused_before_binding() {
    let m = CManager::new();
    for ep in [
        "tcp://127.0.0.1:65536",
        "tcp://127.0.0.1:70000",
        "tcp://127.0.0.1:abc",
        "tcp://127.0.0.1:-5",
        "tcp://127.0.0.1:0",
        "tcp://127.0.0.1",
        "inproc://kvb",
        "udp://127.0.0.1:5557",
        "pgm://lo;239.0.0.1:5557",
    ] {
        let e = CString::new(ep).unwrap();
        let (st, _) = create(&m, &c_config(&e));
        assert_eq!(st, kvb_status_t::KVB_STATUS_TRANSPORT, "{ep}");
        let msg = last_error();
        assert!(msg.contains(ep) && msg.contains("supported"), "{ep}: {msg}");
        // The same check guards the replay endpoint.
        let good = loopback();
        let mut c = c_config(&good);
        c.replay_endpoint = e.as_ptr();
        let (st, _) = create(&m, &c);
        assert_eq!(st, kvb_status_t::KVB_STATUS_TRANSPORT, "replay {ep}");
    }
    let ipc = CString::new(format!(
        "ipc://@kvblock-publisher-test-{}",
        std::process::id()
    ))
    .unwrap();
    let (st, p) = create(&m, &c_config(&ipc));
    assert_eq!(st, kvb_status_t::KVB_OK, "{}", last_error());
    kvb_event_publisher_destroy(p);
}

#[test]
fn out_of_range_limits_are_invalid_arguments() {
    let m = CManager::new();
    let ep = loopback();
    let cases: [fn(&mut kvb_event_publisher_config_t); 7] = [
        |c| c.max_queued_bytes = 0,
        |c| c.replay_peer_max_bytes = 0,
        |c| c.replay_requests_per_second_per_peer = 0,
        |c| c.replay_requests_per_second = -1,
        |c| c.max_replay_peers = 0,
        |c| c.max_incoming_message_bytes = 8,
        |c| c.slow_peer_timeout_ms = 0,
    ];
    for set in cases {
        let mut c = c_config(&ep);
        set(&mut c);
        let (st, _) = create(&m, &c);
        assert_eq!(st, kvb_status_t::KVB_STATUS_INVALID_ARGUMENT, "{c:?}");
    }
}

#[test]
fn a_caller_of_the_first_config_version_gets_the_default_limits() {
    let m = CManager::new();
    let ep = loopback();
    let full = c_config(&ep);
    // The first version ended with `linger_ms`: only that prefix is readable.
    let v1 = std::mem::offset_of!(kvb_event_publisher_config_t, max_queued_bytes);
    let mut bytes = vec![0u8; v1];
    // SAFETY: copying the prefix of a plain-data struct.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (&full as *const kvb_event_publisher_config_t).cast::<u8>(),
            bytes.as_mut_ptr(),
            v1,
        )
    };
    bytes[..4].copy_from_slice(&(v1 as u32).to_ne_bytes());
    // Aligned copy of exactly v1 bytes (the struct's alignment is 8).
    let mut words = vec![0u64; v1.div_ceil(8)];
    // SAFETY: `words` holds at least v1 bytes.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), words.as_mut_ptr().cast(), v1) };
    let mut p = null_mut();
    let st = kvb_event_publisher_create(m.0, words.as_ptr().cast(), &mut p);
    assert_eq!(st, kvb_status_t::KVB_OK, "{}", last_error());
    kvb_event_publisher_destroy(p);
    // Any other size is refused.
    let mut c = c_config(&ep);
    c.struct_size = v1 as u32 + 8;
    assert_eq!(create(&m, &c).0, kvb_status_t::KVB_STATUS_STRUCT_SIZE);
}

#[test]
fn repeated_subscriptions_count_one_subscriber() {
    let m = CManager::new();
    let ep = loopback();
    let (_, p) = create(&m, &c_config(&ep));
    let mut buf = [0 as std::ffi::c_char; 128];
    let mut len = 0usize;
    assert_eq!(
        kvb_event_publisher_get_endpoint(p, false, buf.as_mut_ptr(), buf.len(), &mut len),
        kvb_status_t::KVB_OK
    );
    // SAFETY: NUL-terminated by the call.
    let endpoint = unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_str()
        .unwrap()
        .to_string();
    let ctx = zmq::Context::new();
    let x = ctx.socket(zmq::XSUB).unwrap();
    x.connect(&endpoint).unwrap();
    for _ in 0..200 {
        x.send(&[1u8][..], 0).unwrap();
    }
    let mut service = kvb_event_publisher_service_stats_t {
        struct_size: std::mem::size_of::<kvb_event_publisher_service_stats_t>() as u32,
        ..Default::default()
    };
    let deadline = Instant::now() + WAIT;
    loop {
        assert_eq!(
            kvb_event_publisher_get_service_stats(p, &mut service),
            kvb_status_t::KVB_OK
        );
        if service.subscription_messages >= 200 {
            break;
        }
        assert!(Instant::now() < deadline, "{service:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut n = 0u64;
    assert_eq!(
        kvb_event_publisher_wait_for_subscribers(p, 2, 200, &mut n),
        kvb_status_t::KVB_OK
    );
    assert_eq!(
        n, 1,
        "200 subscription messages from one connection: one subscriber"
    );
    // A second connection is a second subscriber.
    let sub = ctx.socket(zmq::SUB).unwrap();
    sub.set_subscribe(b"").unwrap();
    sub.connect(&endpoint).unwrap();
    assert_eq!(
        kvb_event_publisher_wait_for_subscribers(p, 2, WAIT.as_millis() as i64, &mut n),
        kvb_status_t::KVB_OK
    );
    assert_eq!(n, 2);
    let mut s = kvb_event_publisher_stats_t::default();
    assert_eq!(
        kvb_event_publisher_get_stats(p, &mut s),
        kvb_status_t::KVB_OK
    );
    assert_eq!(s.subscriptions, 2);
    // A wrong struct_size is refused, a null handle too.
    service.struct_size = 4;
    assert_eq!(
        kvb_event_publisher_get_service_stats(p, &mut service),
        kvb_status_t::KVB_STATUS_STRUCT_SIZE
    );
    service.struct_size = std::mem::size_of::<kvb_event_publisher_service_stats_t>() as u32;
    assert_eq!(
        kvb_event_publisher_get_service_stats(null(), &mut service),
        kvb_status_t::KVB_STATUS_NULL_POINTER
    );
    kvb_event_publisher_destroy(p);
}
