//! The live thread: drains the manager's events, publishes one batch per iteration on the XPUB
//! socket, keeps it in the replay ring and counts subscribers. It never blocks on the network
//! (sends are non-blocking; ZeroMQ drops past the high-water mark) and never serves a replay
//! (`replay::ReplayService` does, on its own thread), so a replay cannot delay a live batch
//! beyond the moment the ring's lock is held to copy out one batch reference.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::account::send_tracked;
use super::filter::{WireEvent, WireFilter};
use super::replay::{ReplayRing, END_SEQ, REPLAY_PEER_HWM};
use super::wire::encode_batch;
use super::{endpoint, PublishError, PublisherConfig, Shared};
use crate::events::EventDelivery;

/// How long one wait for events lasts before the sockets are serviced again.
const POLL: Duration = Duration::from_millis(5);
/// Subscription messages and monitor events read per round.
const INCOMING_PER_ROUND: usize = 1024;
/// ZMTP heartbeat interval on both sockets; the timeout is the config's `slow_peer_timeout_ms`.
const HEARTBEAT_IVL_MS: i32 = 1000;

/// Bound sockets, created on the caller's thread so that errors reach it.
pub(super) struct Sockets {
    // Field order is drop order: sockets close before the context terminates.
    publish: zmq::Socket,
    monitor: zmq::Socket,
    pub replay: Option<zmq::Socket>,
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

/// Options both sockets share: incoming frame size, heartbeats, linger.
fn common_options(s: &zmq::Socket, cfg: &PublisherConfig) -> zmq::Result<()> {
    s.set_maxmsgsize(cfg.max_incoming_message_bytes)?;
    s.set_heartbeat_ivl(HEARTBEAT_IVL_MS)?;
    s.set_heartbeat_timeout(cfg.slow_peer_timeout_ms)?;
    s.set_linger(cfg.linger_ms)
}

impl Sockets {
    pub fn bind(cfg: &PublisherConfig) -> Result<Self, PublishError> {
        endpoint::check("PUB", &cfg.endpoint)?;
        if let Some(ep) = &cfg.replay_endpoint {
            endpoint::check("replay", ep)?;
        }
        let context = zmq::Context::new();
        let publish = context
            .socket(zmq::XPUB)
            .map_err(|e| transport("XPUB socket", e))?;
        publish
            .set_xpub_verbose(true)
            .and_then(|_| publish.set_sndhwm(cfg.send_hwm))
            .and_then(|_| common_options(&publish, cfg))
            .map_err(|e| transport("XPUB options", e))?;
        // Connections come and go on the monitor: subscribers are counted per connection.
        static MONITORS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let monitor_ep = format!(
            "inproc://kvb-publisher-monitor-{}",
            MONITORS.fetch_add(1, Ordering::Relaxed)
        );
        publish
            .monitor(
                &monitor_ep,
                (zmq::SocketEvent::ACCEPTED as i32) | (zmq::SocketEvent::DISCONNECTED as i32),
            )
            .map_err(|e| transport("XPUB monitor", e))?;
        let monitor = context
            .socket(zmq::PAIR)
            .map_err(|e| transport("monitor socket", e))?;
        monitor
            .set_linger(0)
            .and_then(|_| monitor.connect(&monitor_ep))
            .map_err(|e| transport("monitor connect", e))?;
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
                // A full or vanished peer is reported (EAGAIN / EHOSTUNREACH), never queued
                // for without bound or silently dropped mid-replay.
                s.set_sndhwm(REPLAY_PEER_HWM)
                    .and_then(|_| s.set_router_mandatory(true))
                    .and_then(|_| s.set_rcvhwm(REPLAY_PEER_HWM))
                    .and_then(|_| common_options(&s, cfg))
                    .map_err(|e| transport("ROUTER options", e))?;
                s.bind(ep)
                    .map_err(|e| transport(&format!("bind {ep}"), e))?;
                let bound = bound_endpoint(&s, ep);
                (Some(s), Some(bound))
            }
        };
        Ok(Sockets {
            publish,
            monitor,
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
    ring: Arc<Mutex<ReplayRing>>,
    topic: Vec<u8>,
    dp_rank: Option<i32>,
    seq: u64,
    cleared_first: bool,
    max_queued_bytes: usize,
    shared: Arc<Shared>,
    /// Open connections on the XPUB socket (file descriptors from the monitor).
    connections: HashSet<u32>,
    /// Subscribe messages received.
    subscribe_messages: u64,
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
        ring: Arc<Mutex<ReplayRing>>,
        cfg: PublisherConfig,
        shared: Arc<Shared>,
    ) -> Self {
        Worker {
            sockets,
            delivery,
            filter: WireFilter::new(cfg.window_size, cfg.tokens_per_block)
                .with_disk_events(cfg.publish_disk_events),
            ring,
            topic: cfg.topic,
            dp_rank: cfg.dp_rank,
            seq: cfg.start_sequence,
            cleared_first: cfg.all_blocks_cleared_first,
            max_queued_bytes: cfg.max_queued_bytes,
            shared,
            connections: HashSet::new(),
            subscribe_messages: 0,
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
                c.next_sequence.store(self.seq, Ordering::Release);
            }
            for it in &iterations {
                let events = self.filter.translate(it);
                if !events.is_empty() {
                    self.publish(&events);
                }
            }
            self.service_subscriptions();
            if stopping && idle {
                return;
            }
            if idle && self.delivery.is_shut_down() {
                // The manager is gone: keep counting subscribers until destroyed.
                let _ = self
                    .sockets
                    .publish
                    .poll(zmq::POLLIN, POLL.as_millis() as i64);
            }
        }
    }

    fn publish(&mut self, events: &[WireEvent]) {
        if self.seq == END_SEQ {
            // Unreachable with a start_sequence below 2^63 (checked at start): never send the
            // end marker's number as a batch, never wrap.
            return;
        }
        let payload: Arc<[u8]> = encode_batch(now_seconds(), events, self.dp_rank).into();
        let seq = self.seq.to_be_bytes();
        let c = &self.shared.counters;
        let total = &self.shared.total_bytes;
        if total.fits(payload.len(), self.max_queued_bytes) {
            // XPUB never blocks: past the high-water mark ZeroMQ drops the message for that
            // subscriber, which then sees a gap in the sequence and can ask for a replay.
            let s = &mut self.sockets.publish;
            let more = zmq::SNDMORE | zmq::DONTWAIT;
            if s.send(&self.topic[..], more).is_ok() && s.send(&seq[..], more).is_ok() {
                let accounts = [total, &self.shared.live_bytes];
                let _ = send_tracked(s, &payload, &accounts, zmq::DONTWAIT);
            }
        } else {
            // Slow subscribers hold the queue full: this batch is not sent (subscribers see a
            // gap and can replay it).
            c.live_batches_unsent.fetch_add(1, Ordering::Relaxed);
        }
        self.ring
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.seq, payload);
        self.seq += 1;
        c.events.fetch_add(events.len() as u64, Ordering::Relaxed);
        c.next_sequence.store(self.seq, Ordering::Release);
        // Last, releasing the rest: a `stats()` that counts this batch sees its sequence number
        // and events too.
        c.batches.fetch_add(1, Ordering::Release);
    }

    /// Counts subscribers: open connections (from the monitor), never more than the subscribe
    /// messages received, so that a peer repeating subscriptions counts once.
    fn service_subscriptions(&mut self) {
        let mut changed = false;
        for _ in 0..INCOMING_PER_ROUND {
            let Ok(msg) = self.sockets.publish.recv_bytes(zmq::DONTWAIT) else {
                break;
            };
            if msg.first() == Some(&1) {
                self.subscribe_messages += 1;
                changed = true;
            }
            self.shared
                .counters
                .subscription_messages
                .fetch_add(1, Ordering::Relaxed);
        }
        for _ in 0..INCOMING_PER_ROUND {
            let Ok(event) = self.sockets.monitor.recv_bytes(zmq::DONTWAIT) else {
                break;
            };
            // [u16 event, u32 value] then a frame with the endpoint.
            while self.sockets.monitor.get_rcvmore().unwrap_or(false) {
                let _ = self.sockets.monitor.recv_bytes(zmq::DONTWAIT);
            }
            if event.len() < 6 {
                continue;
            }
            let kind = u16::from_ne_bytes([event[0], event[1]]);
            let fd = u32::from_ne_bytes([event[2], event[3], event[4], event[5]]);
            if kind == zmq::SocketEvent::ACCEPTED as u16 {
                self.connections.insert(fd);
            } else if kind == zmq::SocketEvent::DISCONNECTED as u16 {
                self.connections.remove(&fd);
            }
            changed = true;
        }
        if changed {
            let n = (self.connections.len() as u64).min(self.subscribe_messages);
            *self
                .shared
                .subscribers
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = n;
            self.shared.subscribed.notify_all();
        }
    }
}
