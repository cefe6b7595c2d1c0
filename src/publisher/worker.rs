//! The publisher thread: drains the manager's events, publishes one batch per iteration, counts
//! subscriptions and answers replay requests. It never blocks on the network (sends are
//! non-blocking; ZeroMQ drops past the high-water mark).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::filter::{WireEvent, WireFilter};
use super::replay::{ReplayRing, END_SEQ};
use super::wire::encode_batch;
use super::{PublishError, PublisherConfig, Shared};
use crate::events::EventDelivery;

/// How long one wait for events lasts before the sockets are serviced again.
const POLL: Duration = Duration::from_millis(5);

/// Bound sockets, created on the caller's thread so that errors reach it.
pub(super) struct Sockets {
    // Field order is drop order: sockets close before the context terminates.
    publish: zmq::Socket,
    replay: Option<zmq::Socket>,
    _context: zmq::Context,
    pub pub_endpoint: String,
    pub replay_endpoint: Option<String>,
}

fn transport(what: &str, e: zmq::Error) -> PublishError {
    PublishError::Transport(format!("{what}: {e}"))
}

fn bound_endpoint(s: &zmq::Socket, fallback: &str) -> String {
    match s.get_last_endpoint() {
        Ok(Ok(e)) => e,
        _ => fallback.to_string(),
    }
}

impl Sockets {
    pub fn bind(cfg: &PublisherConfig) -> Result<Self, PublishError> {
        let context = zmq::Context::new();
        let publish = context
            .socket(zmq::XPUB)
            .map_err(|e| transport("XPUB socket", e))?;
        publish
            .set_xpub_verbose(true)
            .and_then(|_| publish.set_sndhwm(cfg.send_hwm))
            .and_then(|_| publish.set_linger(cfg.linger_ms))
            .map_err(|e| transport("XPUB options", e))?;
        publish
            .bind(&cfg.endpoint)
            .map_err(|e| transport(&format!("bind {}", cfg.endpoint), e))?;
        let pub_endpoint = bound_endpoint(&publish, &cfg.endpoint);
        let (replay, replay_endpoint) = match &cfg.replay_endpoint {
            None => (None, None),
            Some(ep) => {
                let s = context
                    .socket(zmq::ROUTER)
                    .map_err(|e| transport("ROUTER socket", e))?;
                // A replay answer may be the whole ring: never cut it at a high-water mark.
                s.set_sndhwm(0)
                    .and_then(|_| s.set_linger(cfg.linger_ms))
                    .map_err(|e| transport("ROUTER options", e))?;
                s.bind(ep)
                    .map_err(|e| transport(&format!("bind {ep}"), e))?;
                let bound = bound_endpoint(&s, ep);
                (Some(s), Some(bound))
            }
        };
        Ok(Sockets {
            publish,
            replay,
            _context: context,
            pub_endpoint,
            replay_endpoint,
        })
    }
}

pub(super) struct Worker {
    sockets: Sockets,
    delivery: Arc<EventDelivery>,
    filter: WireFilter,
    ring: ReplayRing,
    topic: Vec<u8>,
    dp_rank: Option<i32>,
    seq: u64,
    cleared_first: bool,
    shared: Arc<Shared>,
}

fn now_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Worker {
    pub fn new(
        sockets: Sockets,
        delivery: Arc<EventDelivery>,
        cfg: PublisherConfig,
        shared: Arc<Shared>,
    ) -> Self {
        Worker {
            sockets,
            delivery,
            filter: WireFilter::new(cfg.window_size, cfg.tokens_per_block),
            ring: ReplayRing::new(if cfg.replay_endpoint.is_some() {
                cfg.replay_buffer_steps
            } else {
                0
            }),
            topic: cfg.topic,
            dp_rank: cfg.dp_rank,
            seq: cfg.start_sequence,
            cleared_first: cfg.all_blocks_cleared_first,
            shared,
        }
    }

    pub fn run(mut self) {
        // A bug must not take the engine's process down: stop publishing instead.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run_loop()));
    }

    fn run_loop(&mut self) {
        if self.cleared_first {
            self.publish(&[WireEvent::AllBlocksCleared]);
        }
        loop {
            // Read the flag before draining, so events flushed before destroy are all sent.
            let stopping = self.shared.stop.load(Ordering::Acquire);
            let wait = if stopping || self.delivery.is_shut_down() {
                Duration::ZERO
            } else {
                POLL
            };
            let (iterations, dropped) = self.delivery.drain_iterations(wait);
            let idle = iterations.is_empty() && dropped == 0;
            if dropped > 0 {
                self.seq += 1;
                let c = &self.shared.counters;
                c.gaps.fetch_add(1, Ordering::Relaxed);
                c.dropped_events.fetch_add(dropped, Ordering::Relaxed);
                c.next_sequence.store(self.seq, Ordering::Relaxed);
            }
            for it in &iterations {
                let events = self.filter.translate(it);
                if !events.is_empty() {
                    self.publish(&events);
                }
            }
            self.service_subscriptions();
            self.service_replay();
            if stopping && idle {
                return;
            }
            if idle && self.delivery.is_shut_down() {
                // The manager is gone: keep answering replays until destroyed.
                let _ = self
                    .sockets
                    .publish
                    .poll(zmq::POLLIN, POLL.as_millis() as i64);
            }
        }
    }

    fn publish(&mut self, events: &[WireEvent]) {
        let payload = encode_batch(now_seconds(), events, self.dp_rank);
        let seq = self.seq.to_be_bytes();
        // XPUB never blocks: past the high-water mark ZeroMQ drops the message for that
        // subscriber, which then sees a gap in the sequence and can ask for a replay.
        let _ = self
            .sockets
            .publish
            .send_multipart([&self.topic[..], &seq[..], &payload[..]], zmq::DONTWAIT);
        self.ring.push(self.seq, payload);
        self.seq += 1;
        let c = &self.shared.counters;
        c.batches.fetch_add(1, Ordering::Relaxed);
        c.events.fetch_add(events.len() as u64, Ordering::Relaxed);
        c.next_sequence.store(self.seq, Ordering::Relaxed);
    }

    /// Counts subscribe messages (first byte 1) that reached the XPUB socket.
    fn service_subscriptions(&mut self) {
        let mut joined = 0;
        while let Ok(msg) = self.sockets.publish.recv_bytes(zmq::DONTWAIT) {
            if msg.first() == Some(&1) {
                joined += 1;
            }
        }
        if joined > 0 {
            *self
                .shared
                .subscriptions
                .lock()
                .unwrap_or_else(|p| p.into_inner()) += joined;
            self.shared.subscribed.notify_all();
        }
    }

    /// Answers `[identity, (empty,) start_seq]` requests from the ring, then the end marker.
    fn service_replay(&mut self) {
        let Some(router) = &self.sockets.replay else {
            return;
        };
        while let Ok(frames) = router.recv_multipart(zmq::DONTWAIT) {
            let (identity, delimited, start) = match frames.as_slice() {
                [id, empty, start] if empty.is_empty() => (id, true, start),
                [id, start] => (id, false, start),
                _ => continue,
            };
            let Ok(start) = <[u8; 8]>::try_from(start.as_slice()) else {
                continue;
            };
            let start = u64::from_be_bytes(start);
            self.shared
                .counters
                .replay_requests
                .fetch_add(1, Ordering::Relaxed);
            let head: &[&[u8]] = if delimited {
                &[identity, &[], &self.topic]
            } else {
                &[identity, &self.topic]
            };
            for (seq, payload) in self.ring.since(start) {
                let seq = seq.to_be_bytes();
                let mut frames = head.to_vec();
                frames.extend([&seq[..], &payload[..]]);
                let _ = router.send_multipart(frames, zmq::DONTWAIT);
            }
            let end = END_SEQ.to_be_bytes();
            let mut frames = head.to_vec();
            frames.extend([&end[..], &[][..]]);
            let _ = router.send_multipart(frames, zmq::DONTWAIT);
        }
    }
}
