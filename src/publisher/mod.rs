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
//! touches the network; while a publisher is attached it is the buffer's only consumer.

mod filter;
mod replay;
mod wire;
mod worker;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::events::EventDelivery;

pub use filter::{WireEvent, WireFilter};
pub use replay::{ReplayRing, END_SEQ};
pub use wire::{encode_batch, MEDIUM};

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
}

impl PublisherConfig {
    /// vLLM's defaults: empty topic, HWM 100000, no replay (10000 steps when enabled), sequence
    /// from 0, linger 1 s.
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
        }
    }
}

/// Why a publisher could not start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PublishError {
    /// A setting is out of range.
    Config(String),
    /// ZeroMQ refused (bad endpoint, address in use, ...).
    Transport(String),
}

impl std::fmt::Display for PublishError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PublishError::Config(m) | PublishError::Transport(m) => f.write_str(m),
        }
    }
}

/// Counters of a running publisher.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PublisherStats {
    /// Batches sent on the PUB socket.
    pub batches: u64,
    /// Wire events in those batches.
    pub events: u64,
    /// Events the manager's buffer dropped before the publisher drained them.
    pub dropped_events: u64,
    /// Sequence numbers skipped to show those drops.
    pub gaps: u64,
    /// Subscriptions received (each joining subscriber sends at least one).
    pub subscriptions: u64,
    /// Replay requests answered.
    pub replay_requests: u64,
    /// The sequence number the next batch will get.
    pub next_sequence: u64,
}

#[derive(Debug, Default)]
struct Counters {
    batches: AtomicU64,
    events: AtomicU64,
    dropped_events: AtomicU64,
    gaps: AtomicU64,
    replay_requests: AtomicU64,
    next_sequence: AtomicU64,
}

/// State shared between the handle and the worker thread.
#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    counters: Counters,
    subscriptions: Mutex<u64>,
    subscribed: Condvar,
}

/// A running publisher: a thread draining one manager's events onto ZeroMQ sockets. Dropping it
/// publishes what was flushed so far, stops the thread and joins it.
#[derive(Debug)]
pub struct Publisher {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    endpoint: String,
    replay_endpoint: Option<String>,
}

impl Publisher {
    /// Binds the sockets (errors are reported here) and starts the thread.
    pub fn start(delivery: Arc<EventDelivery>, cfg: PublisherConfig) -> Result<Self, PublishError> {
        if cfg.tokens_per_block == 0 {
            return Err(PublishError::Config("tokens_per_block is 0".into()));
        }
        if cfg.send_hwm < 0 || cfg.linger_ms < 0 {
            return Err(PublishError::Config(format!(
                "send_hwm ({}) and linger_ms ({}) must not be negative",
                cfg.send_hwm, cfg.linger_ms
            )));
        }
        if cfg.replay_endpoint.is_some() && cfg.replay_buffer_steps == 0 {
            return Err(PublishError::Config(
                "replay_buffer_steps is 0 with a replay endpoint".into(),
            ));
        }
        let sockets = worker::Sockets::bind(&cfg)?;
        let endpoint = sockets.pub_endpoint.clone();
        let replay_endpoint = sockets.replay_endpoint.clone();
        let shared = Arc::new(Shared::default());
        shared
            .counters
            .next_sequence
            .store(cfg.start_sequence, Ordering::Relaxed);
        let worker = worker::Worker::new(sockets, delivery, cfg, shared.clone());
        let thread = std::thread::Builder::new()
            .name("kvb-event-pub".into())
            .spawn(move || worker.run())
            .map_err(|e| PublishError::Transport(format!("cannot start the thread: {e}")))?;
        Ok(Publisher {
            shared,
            thread: Some(thread),
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

    /// Waits until at least `n` subscriptions have arrived since start, or `timeout` passed.
    /// Returns the number received.
    pub fn wait_for_subscribers(&self, n: u64, timeout: Duration) -> u64 {
        let deadline = Instant::now().checked_add(timeout);
        let mut count = self
            .shared
            .subscriptions
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        while *count < n {
            let now = Instant::now();
            let wait = match deadline {
                Some(d) if now >= d => break,
                Some(d) => d - now,
                None => Duration::from_secs(3600),
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

    pub fn stats(&self) -> PublisherStats {
        let c = &self.shared.counters;
        PublisherStats {
            batches: c.batches.load(Ordering::Relaxed),
            events: c.events.load(Ordering::Relaxed),
            dropped_events: c.dropped_events.load(Ordering::Relaxed),
            gaps: c.gaps.load(Ordering::Relaxed),
            subscriptions: *self
                .shared
                .subscriptions
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
            replay_requests: c.replay_requests.load(Ordering::Relaxed),
            next_sequence: c.next_sequence.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            // The worker catches its own panics; a join error cannot carry anything useful.
            let _ = t.join();
        }
    }
}
