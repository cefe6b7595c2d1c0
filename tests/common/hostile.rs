//! Hostile peers of the event publisher, on loopback, for `tests/publisher_service.rs` and
//! `benches/publisher_service.rs`: replay clients that never read, a request flood, malformed
//! and oversized frames on both sockets, a subscription flood from a subscriber that never
//! reads. Each runs on its own thread until stopped, bounded in messages.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Replay clients that ask for the whole ring and never read.
pub const NEVER_READERS: usize = 4;
/// Requests the flood sends at most.
pub const FLOOD_REQUESTS: usize = 200_000;
/// Size of an oversized frame (far above the publisher's `max_incoming_message_bytes`).
pub const OVERSIZED: usize = 256 << 10;

pub struct Hostile {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

fn socket(ctx: &zmq::Context, kind: zmq::SocketType, endpoint: &str) -> zmq::Socket {
    let s = ctx.socket(kind).unwrap();
    // Never read, and read little: the kernel and ZeroMQ buffers on this side stay small, so
    // what the publisher cannot send stays on the publisher's side.
    s.set_rcvhwm(1).unwrap();
    s.set_rcvbuf(4096).unwrap();
    s.set_sndhwm(0).unwrap();
    s.set_linger(0).unwrap();
    s.connect(endpoint).unwrap();
    s
}

fn request(start: u64) -> [Vec<u8>; 2] {
    [Vec::new(), start.to_be_bytes().to_vec()]
}

impl Hostile {
    /// Starts every hostile peer against a publisher's PUB and replay endpoints.
    pub fn start(pub_endpoint: &str, replay_endpoint: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let mut spawn = |f: Box<dyn FnOnce(&AtomicBool) + Send>| {
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || f(&stop)));
        };
        for _ in 0..NEVER_READERS {
            let ep = replay_endpoint.to_string();
            spawn(Box::new(move |stop| {
                let ctx = zmq::Context::new();
                let d = socket(&ctx, zmq::DEALER, &ep);
                while !stop.load(Ordering::Relaxed) {
                    let _ = d.send_multipart(request(0), zmq::DONTWAIT);
                    std::thread::sleep(Duration::from_millis(20));
                }
            }));
        }
        let ep = replay_endpoint.to_string();
        spawn(Box::new(move |stop| {
            let ctx = zmq::Context::new();
            let d = socket(&ctx, zmq::DEALER, &ep);
            for i in 0..FLOOD_REQUESTS {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let _ = d.send_multipart(request(i as u64 % 7), zmq::DONTWAIT);
                if i % 1000 == 999 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }));
        let ep = replay_endpoint.to_string();
        spawn(Box::new(move |stop| {
            let ctx = zmq::Context::new();
            let d = socket(&ctx, zmq::DEALER, &ep);
            let malformed: [&[&[u8]]; 5] = [
                &[b"x"],
                &[b"", b"abc"],
                &[b"", b"12345678", b"extra"],
                &[b"a", b"b", b"c", b"d", b"e", b"f"],
                &[b"", b""],
            ];
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let _ = d.send_multipart(malformed[i % malformed.len()], zmq::DONTWAIT);
                i += 1;
                std::thread::sleep(Duration::from_micros(200));
            }
        }));
        for ep in [replay_endpoint.to_string(), pub_endpoint.to_string()] {
            let to_pub = ep == pub_endpoint;
            spawn(Box::new(move |stop| {
                let ctx = zmq::Context::new();
                let kind = if to_pub { zmq::XSUB } else { zmq::DEALER };
                // Each oversized frame gets the connection closed; ZeroMQ reconnects.
                let s = socket(&ctx, kind, &ep);
                s.set_reconnect_ivl(10).unwrap();
                // Not a subscription (first byte 2): an XSUB would keep a subscription in its
                // own trie, 256 K levels deep, and overflow its stack freeing it.
                let big = vec![2u8; OVERSIZED];
                while !stop.load(Ordering::Relaxed) {
                    if to_pub {
                        let _ = s.send(&big[..], zmq::DONTWAIT);
                    } else {
                        let _ = s.send_multipart([&b""[..], &big[..]], zmq::DONTWAIT);
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }));
        }
        let ep = pub_endpoint.to_string();
        spawn(Box::new(move |stop| {
            // Subscribes again and again (a few prefixes), never reads what it is sent.
            let ctx = zmq::Context::new();
            let s = socket(&ctx, zmq::XSUB, &ep);
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) && i < 100_000 {
                let prefix = [1u8, b'k', b'a' + (i % 16) as u8];
                let _ = s.send(&prefix[..1 + (i % 3) as usize], zmq::DONTWAIT);
                i += 1;
                if i.is_multiple_of(100) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }));
        Hostile { stop, threads }
    }

    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            t.join().unwrap();
        }
    }
}

/// Resident set size of this process, in bytes (Linux; 0 elsewhere).
pub fn rss_bytes() -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}
