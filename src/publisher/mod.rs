//! KV events on the wire: a ZeroMQ publisher in the vLLM / Dynamo format, so that KV-aware routers
//! (Dynamo's KV router and standalone indexer, vLLM's production stack, llm-d) can follow the
//! blocks a kvblock manager holds with no code on their side.
//!
//! Wire format, per batch: a PUB message of three frames, `topic`, an 8-byte big-endian sequence
//! number and a msgpack payload `[timestamp, [events], dp_rank or nil]` (`wire`). The socket is an
//! XPUB (wire-compatible with PUB) so that the publisher can count joining subscribers. An
//! optional ROUTER socket answers `[empty, start_seq]` with the buffered batches from `start_seq`
//! on, each `[empty, topic, seq, payload]`, then an end marker `[empty, topic, 0xff..ff, ""]`
//! (`replay`).
//!
//! What is published (`filter`): one window, full blocks only, Stored and Removed (never Created
//! or Updated), one batch per flushed iteration that has events to publish. When the manager's
//! event buffer dropped events, one sequence number is skipped so that routers see a gap; no
//! AllBlocksCleared is sent for it (that would wipe blocks that still exist).
//!
//! Restarts: routers ignore batches whose sequence number is at or below the last one they
//! applied from that worker. A publisher that restarts (a new process, a new manager) should
//! either start above the old sequence (`start_sequence`) or make routers drop their view first
//! (`all_blocks_cleared_first`: the first batch is a lone AllBlocksCleared), or both.
//!
//! The publisher drains the manager's event buffer on its own thread, so the engine thread never
//! touches the network; while a publisher is attached it is the buffer's only consumer (a second
//! publisher on the same buffer is refused).
//!
//! It is a network service and bounds what any peer can make it hold or do (`PublisherConfig`):
//! replays run on a second thread from a per-peer cursor, a little at a time (`replay`); the
//! payload bytes queued in ZeroMQ are counted exactly (`account`) and capped per replay peer and
//! in total; replay requests are rate-limited per peer and in total; incoming frames are capped
//! in size on both sockets (`ZMQ_MAXMSGSIZE`: a larger one disconnects its peer); peers that stop
//! answering ZMTP heartbeats are disconnected, and a replay that makes no progress is dropped;
//! subscribers are counted per connection, not per subscription message. Endpoints are checked
//! before binding (`endpoint`: tcp and ipc only, a TCP port 1-65535 or `*`).

mod account;
mod endpoint;
mod filter;
mod replay;
mod wire;
mod worker;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::events::EventDelivery;

pub use account::ByteAccount;
pub use endpoint::SUPPORTED as SUPPORTED_ENDPOINTS;
pub use filter::{WireEvent, WireFilter};
pub use replay::{ReplayRing, END_SEQ, REPLAY_PEER_HWM};
pub use wire::{encode_batch, MEDIUM, MEDIUM_DISK};

/// `start_sequence` must stay below this (2^63), so that sequence numbers never reach the replay
/// end marker (`END_SEQ`) nor wrap, and fit the signed 64-bit integers some routers use.
pub const MAX_START_SEQUENCE: u64 = 1 << 63;

/// Publisher settings.
#[derive(Clone, Debug)]
pub struct PublisherConfig {
    /// ZeroMQ endpoint the PUB socket binds, e.g. `tcp://*:5557` (`tcp://127.0.0.1:*` picks a
    /// free port: read it back with `Publisher::endpoint`).
    pub endpoint: String,
    /// First frame of every message (vLLM's default is empty).
    pub topic: Vec<u8>,
    /// Data-parallel rank carried by every batch (`None` = nil).
    pub dp_rank: Option<i32>,
    /// Send high-water mark in messages per subscriber (0 = unlimited); past it ZeroMQ drops.
    pub send_hwm: i32,
    /// Endpoint the replay ROUTER socket binds; `None` = no replay.
    pub replay_endpoint: Option<String>,
    /// Batches kept for replay.
    pub replay_buffer_steps: usize,
    /// Sequence number of the first batch.
    pub start_sequence: u64,
    /// Publish a lone AllBlocksCleared as the first batch.
    pub all_blocks_cleared_first: bool,
    /// The one window published.
    pub window_size: usize,
    /// `block_size` of Stored events; shorter blocks are not published.
    pub tokens_per_block: usize,
    /// How long destroy waits for queued messages to leave (ZeroMQ linger).
    pub linger_ms: i32,
    /// Payload bytes queued in ZeroMQ on both sockets together. A live batch that does not fit
    /// is not sent (subscribers see a gap and can replay it); replays may use at most half.
    pub max_queued_bytes: usize,
    /// Replay payload bytes queued for one peer: its replay waits until ZeroMQ has sent some.
    pub replay_peer_max_bytes: usize,
    /// Replay requests accepted per second from one peer (burst: one second's worth).
    pub replay_requests_per_second_per_peer: u32,
    /// Replay requests accepted per second from all peers together.
    pub replay_requests_per_second: u32,
    /// Replay peers tracked at once (a new peer beyond it is refused).
    pub max_replay_peers: usize,
    /// Largest incoming frame on either socket (`ZMQ_MAXMSGSIZE`); a larger one disconnects
    /// its peer.
    pub max_incoming_message_bytes: i64,
    /// A replay that can send nothing for this long is dropped; a peer that answers no ZMTP
    /// heartbeat for this long is disconnected.
    pub slow_peer_timeout_ms: i32,
    /// Also publish the disk tier's events with `medium` "DISK" (see `wire::MEDIUM_DISK`); off
    /// by default, since a router that ignores `medium` would take them for GPU blocks.
    pub publish_disk_events: bool,
}

/// Defaults of the service limits (`PublisherConfig::new`).
pub mod defaults {
    /// 64 MiB.
    pub const MAX_QUEUED_BYTES: usize = 64 << 20;
    /// 4 MiB.
    pub const REPLAY_PEER_MAX_BYTES: usize = 4 << 20;
    pub const REPLAY_REQUESTS_PER_SECOND_PER_PEER: u32 = 10;
    pub const REPLAY_REQUESTS_PER_SECOND: u32 = 100;
    pub const MAX_REPLAY_PEERS: usize = 64;
    pub const MAX_INCOMING_MESSAGE_BYTES: i64 = 256;
    pub const SLOW_PEER_TIMEOUT_MS: i32 = 10_000;
}

impl PublisherConfig {
    /// vLLM's defaults: empty topic, HWM 100000, no replay (10000 steps when enabled), sequence
    /// from 0, linger 1 s; the service limits of `defaults`.
    pub fn new(endpoint: &str, window_size: usize, tokens_per_block: usize) -> Self {
        PublisherConfig {
            endpoint: endpoint.to_string(),
            topic: Vec::new(),
            dp_rank: None,
            send_hwm: 100_000,
            replay_endpoint: None,
            replay_buffer_steps: 10_000,
            start_sequence: 0,
            all_blocks_cleared_first: false,
            window_size,
            tokens_per_block,
            linger_ms: 1000,
            max_queued_bytes: defaults::MAX_QUEUED_BYTES,
            replay_peer_max_bytes: defaults::REPLAY_PEER_MAX_BYTES,
            replay_requests_per_second_per_peer: defaults::REPLAY_REQUESTS_PER_SECOND_PER_PEER,
            replay_requests_per_second: defaults::REPLAY_REQUESTS_PER_SECOND,
            max_replay_peers: defaults::MAX_REPLAY_PEERS,
            max_incoming_message_bytes: defaults::MAX_INCOMING_MESSAGE_BYTES,
            slow_peer_timeout_ms: defaults::SLOW_PEER_TIMEOUT_MS,
            publish_disk_events: false,
        }
    }

    /// Checks the settings that need no socket.
    fn check(&self) -> Result<(), PublishError> {
        let bad = |m: String| Err(PublishError::Config(m));
        if self.tokens_per_block == 0 {
            return bad("tokens_per_block is 0".into());
        }
        if self.send_hwm < 0 || self.linger_ms < 0 {
            return bad(format!(
                "send_hwm ({}) and linger_ms ({}) must not be negative",
                self.send_hwm, self.linger_ms
            ));
        }
        if self.replay_endpoint.is_some() && self.replay_buffer_steps == 0 {
            return bad("replay_buffer_steps is 0 with a replay endpoint".into());
        }
        if self.start_sequence >= MAX_START_SEQUENCE {
            return bad(format!(
                "start_sequence {:#x} is refused: it must be below 2^63, so that sequence \
                 numbers never reach the replay end marker {END_SEQ:#x} nor wrap",
                self.start_sequence
            ));
        }
        if self.max_queued_bytes == 0 || self.replay_peer_max_bytes == 0 {
            return bad(format!(
                "max_queued_bytes ({}) and replay_peer_max_bytes ({}) must be positive",
                self.max_queued_bytes, self.replay_peer_max_bytes
            ));
        }
        if self.replay_requests_per_second_per_peer == 0
            || self.replay_requests_per_second == 0
            || self.max_replay_peers == 0
        {
            return bad(format!(
                "replay_requests_per_second_per_peer ({}), replay_requests_per_second ({}) and \
                 max_replay_peers ({}) must be positive",
                self.replay_requests_per_second_per_peer,
                self.replay_requests_per_second,
                self.max_replay_peers
            ));
        }
        // A replay request is at most 9 bytes a frame; a subscription is the topic and a byte
        // (ZMTP 3.1's SUBSCRIBE command: 10 bytes of name).
        let least = (self.topic.len() as i64).saturating_add(16).max(16);
        if self.max_incoming_message_bytes < least {
            return bad(format!(
                "max_incoming_message_bytes ({}) must be at least {least} (16 and the topic's \
                 length + 16)",
                self.max_incoming_message_bytes
            ));
        }
        if self.slow_peer_timeout_ms <= 0 {
            return bad(format!(
                "slow_peer_timeout_ms ({}) must be positive",
                self.slow_peer_timeout_ms
            ));
        }
        Ok(())
    }
}

/// Why a publisher could not start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PublishError {
    /// A setting is out of range.
    Config(String),
    /// The endpoint is refused (malformed, bad port, unsupported transport) or ZeroMQ refused
    /// (address in use, ...).
    Transport(String),
    /// The manager's events already go to another publisher.
    Busy(String),
}

impl std::fmt::Display for PublishError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PublishError::Config(m) | PublishError::Transport(m) | PublishError::Busy(m) => {
                f.write_str(m)
            }
        }
    }
}

/// Counters of a running publisher.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PublisherStats {
    /// Batches published (sent, or kept for replay when `live_batches_unsent`).
    pub batches: u64,
    /// Wire events in those batches.
    pub events: u64,
    /// Events the manager's buffer dropped before the publisher drained them.
    pub dropped_events: u64,
    /// Sequence numbers skipped to show those drops.
    pub gaps: u64,
    /// Subscribers connected now: open connections on the PUB socket, never more than the
    /// subscribe messages received (a peer repeating subscriptions counts once).
    pub subscribers: u64,
    /// Subscription messages received (subscribe and unsubscribe, repeats included).
    pub subscription_messages: u64,
    /// Replay requests accepted.
    pub replay_requests: u64,
    /// Replay requests refused: over a rate, from a peer whose replay runs, or from a new peer
    /// beyond `max_replay_peers`.
    pub replay_requests_refused: u64,
    /// Requests that were not `[empty, 8-byte start]` or `[8-byte start]`.
    pub malformed_requests: u64,
    /// Replays sent to the end marker.
    pub replays_completed: u64,
    /// Replays in progress.
    pub active_replays: u64,
    /// Replays dropped because their peer took nothing for `slow_peer_timeout_ms`.
    pub slow_peers_dropped: u64,
    /// Replays ended because their peer disconnected.
    pub replay_peers_gone: u64,
    /// Live batches not sent because `max_queued_bytes` was reached (they stay in the ring).
    pub live_batches_unsent: u64,
    /// Payload bytes queued in ZeroMQ now (both sockets).
    pub queued_bytes: u64,
    /// The most payload bytes ever queued at once.
    pub queued_bytes_peak: u64,
    /// Of `queued_bytes`, those of replays.
    pub replay_queued_bytes: u64,
    /// The sequence number the next batch will get.
    pub next_sequence: u64,
}

#[derive(Debug, Default)]
struct Counters {
    batches: AtomicU64,
    events: AtomicU64,
    dropped_events: AtomicU64,
    gaps: AtomicU64,
    subscription_messages: AtomicU64,
    replay_requests: AtomicU64,
    replay_requests_refused: AtomicU64,
    malformed_requests: AtomicU64,
    replays_completed: AtomicU64,
    active_replays: AtomicU64,
    slow_peers_dropped: AtomicU64,
    replay_peers_gone: AtomicU64,
    live_batches_unsent: AtomicU64,
    next_sequence: AtomicU64,
}

/// State shared between the handle and the threads.
#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    counters: Counters,
    subscribers: Mutex<u64>,
    subscribed: Condvar,
    /// Payload bytes queued in ZeroMQ: everything, live batches, replays.
    total_bytes: Arc<ByteAccount>,
    live_bytes: Arc<ByteAccount>,
    replay_bytes: Arc<ByteAccount>,
}

/// A running publisher: a thread draining one manager's events onto a ZeroMQ PUB socket, and
/// one answering replay requests. `shutdown` (or dropping it) publishes what was flushed so far,
/// stops the threads and joins them.
#[derive(Debug)]
pub struct Publisher {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    delivery: Arc<EventDelivery>,
    endpoint: String,
    replay_endpoint: Option<String>,
}

impl Publisher {
    /// Checks the settings, claims the manager's events (`PublishError::Busy` when another
    /// publisher has them), binds the sockets (errors are reported here) and starts the threads.
    pub fn start(delivery: Arc<EventDelivery>, cfg: PublisherConfig) -> Result<Self, PublishError> {
        cfg.check()?;
        if !delivery.claim_publisher() {
            return Err(PublishError::Busy(
                "the manager already has an event publisher (two would split one event stream, \
                 each gap-free, so routers could not see the loss): destroy it first"
                    .into(),
            ));
        }
        Self::start_claimed(delivery.clone(), cfg).inspect_err(|_| delivery.release_publisher())
    }

    fn start_claimed(
        delivery: Arc<EventDelivery>,
        cfg: PublisherConfig,
    ) -> Result<Self, PublishError> {
        let mut sockets = worker::Sockets::bind(&cfg)?;
        let endpoint = sockets.pub_endpoint.clone();
        let replay_endpoint = sockets.replay_endpoint.clone();
        let shared = Arc::new(Shared::default());
        shared
            .counters
            .next_sequence
            .store(cfg.start_sequence, Ordering::Relaxed);
        let ring = Arc::new(Mutex::new(ReplayRing::new(
            if cfg.replay_endpoint.is_some() {
                cfg.replay_buffer_steps
            } else {
                0
            },
        )));
        let replay = sockets.replay.take().map(|router| {
            replay::ReplayService::new(
                router,
                ring.clone(),
                cfg.topic.clone(),
                replay::Limits {
                    peer_max_bytes: cfg.replay_peer_max_bytes,
                    max_queued_bytes: cfg.max_queued_bytes,
                    requests_per_second_per_peer: cfg.replay_requests_per_second_per_peer,
                    requests_per_second: cfg.replay_requests_per_second,
                    max_peers: cfg.max_replay_peers,
                    slow_peer_timeout: Duration::from_millis(cfg.slow_peer_timeout_ms as u64),
                },
                shared.clone(),
            )
        });
        let worker = worker::Worker::new(sockets, delivery.clone(), ring, cfg, shared.clone());
        let spawn_error = |e: std::io::Error| {
            PublishError::Transport(format!("cannot start the publisher's thread: {e}"))
        };
        let mut threads = Vec::new();
        if let Some(service) = replay {
            threads.push(
                std::thread::Builder::new()
                    .name("kvb-event-replay".into())
                    .spawn(move || service.run())
                    .map_err(spawn_error)?,
            );
        }
        let live = std::thread::Builder::new()
            .name("kvb-event-pub".into())
            .spawn(move || worker.run());
        match live {
            Ok(t) => threads.push(t),
            Err(e) => {
                shared.stop.store(true, Ordering::Release);
                for t in threads {
                    let _ = t.join();
                }
                return Err(spawn_error(e));
            }
        }
        Ok(Publisher {
            shared,
            threads: Mutex::new(threads),
            delivery,
            endpoint,
            replay_endpoint,
        })
    }

    /// The PUB socket's bound endpoint (with the port resolved).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The replay socket's bound endpoint, if any.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// Waits until at least `n` subscribers are connected (`PublisherStats::subscribers`), or
    /// `timeout` passed, or the publisher is shut down. Returns the number connected.
    pub fn wait_for_subscribers(&self, n: u64, timeout: Duration) -> u64 {
        let deadline = Instant::now().checked_add(timeout);
        let mut count = self
            .shared
            .subscribers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        while *count < n && !self.shared.stop.load(Ordering::Acquire) {
            let now = Instant::now();
            let wait = match deadline {
                Some(d) if now >= d => break,
                Some(d) => (d - now).min(Duration::from_millis(100)),
                None => Duration::from_millis(100),
            };
            count = self
                .shared
                .subscribed
                .wait_timeout(count, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        *count
    }

    /// The counters so far. A snapshot that counts a batch also counts its events and its
    /// sequence number.
    pub fn stats(&self) -> PublisherStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PublisherStats {
            // Acquire, and first: the counters of every batch counted here are seen below.
            batches: c.batches.load(Ordering::Acquire),
            events: get(&c.events),
            dropped_events: get(&c.dropped_events),
            gaps: get(&c.gaps),
            subscribers: *self
                .shared
                .subscribers
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
            subscription_messages: get(&c.subscription_messages),
            replay_requests: get(&c.replay_requests),
            replay_requests_refused: get(&c.replay_requests_refused),
            malformed_requests: get(&c.malformed_requests),
            replays_completed: get(&c.replays_completed),
            active_replays: get(&c.active_replays),
            slow_peers_dropped: get(&c.slow_peers_dropped),
            replay_peers_gone: get(&c.replay_peers_gone),
            live_batches_unsent: get(&c.live_batches_unsent),
            queued_bytes: self.shared.total_bytes.get(),
            queued_bytes_peak: self.shared.total_bytes.peak(),
            replay_queued_bytes: self.shared.replay_bytes.get(),
            next_sequence: get(&c.next_sequence),
        }
    }

    /// Publishes what the manager flushed before this call, stops the threads and joins them
    /// (ZeroMQ's linger applies to what is still queued), and gives the manager's events back
    /// (another publisher may then start). Later calls do nothing.
    pub fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.subscribed.notify_all();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        if threads.is_empty() {
            return;
        }
        for t in threads {
            // The threads catch their own panics; a join error cannot carry anything useful.
            let _ = t.join();
        }
        self.delivery.release_publisher();
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.shutdown();
    }
}
