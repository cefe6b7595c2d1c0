//! The replay ring (the last N published batches) and the replay service: a thread of its own
//! that answers `[empty, start_seq]` requests on the ROUTER socket from the ring, a little at a
//! time, so that no request can hold up a live batch or queue more than its peer's share.
//!
//! Bounds (`Limits`): each peer has one replay at a time, sent incrementally from a cursor; a
//! batch is queued for a peer only while the peer's queued replay bytes stay under
//! `peer_max_bytes`, all replays' under half of `max_queued_bytes`, and everything the publisher
//! queued under `max_queued_bytes` (a lone batch larger than a limit still goes, alone); ZeroMQ's
//! send high-water mark (`REPLAY_PEER_HWM` messages) and `ZMQ_ROUTER_MANDATORY` report a full
//! peer instead of queueing. A peer that takes nothing for `slow_peer_timeout` loses its replay.
//! Requests are rate-limited per peer and in total (token buckets, one second of burst); a peer
//! asking while its replay runs, a new peer beyond `max_peers`, and malformed requests are
//! refused without an answer.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::account::{send_tracked, ByteAccount};
use super::Shared;

/// Sequence number of the end marker that closes every replay answer.
pub const END_SEQ: u64 = u64::MAX;

/// Messages ZeroMQ queues for one replay peer (the ROUTER's send high-water mark).
pub const REPLAY_PEER_HWM: i32 = 1000;

#[derive(Debug)]
pub struct ReplayRing {
    capacity: usize,
    batches: VecDeque<(u64, Arc<[u8]>)>,
}

impl ReplayRing {
    pub fn new(capacity: usize) -> Self {
        ReplayRing {
            capacity,
            batches: VecDeque::with_capacity(capacity.min(1 << 16)),
        }
    }

    /// Keeps a published batch, forgetting the oldest beyond the capacity.
    pub fn push(&mut self, seq: u64, payload: Arc<[u8]>) {
        if self.capacity == 0 {
            return;
        }
        if self.batches.len() == self.capacity {
            self.batches.pop_front();
        }
        self.batches.push_back((seq, payload));
    }

    /// The buffered batches with a sequence number at or after `start`, oldest first.
    pub fn since(&self, start: u64) -> impl Iterator<Item = &(u64, Arc<[u8]>)> {
        // Sequence numbers increase along the ring: skip the older part by binary search.
        let first = self.batches.partition_point(|(s, _)| *s < start);
        self.batches.range(first..)
    }

    /// The oldest buffered batch at or after `start` and before `end`.
    pub fn first_in(&self, start: u64, end: u64) -> Option<(u64, Arc<[u8]>)> {
        self.since(start)
            .next()
            .filter(|(s, _)| *s < end)
            .map(|(s, p)| (*s, p.clone()))
    }

    pub fn len(&self) -> usize {
        self.batches.len()
    }

    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }
}

/// What the replay service may queue and accept.
#[derive(Clone, Debug)]
pub(super) struct Limits {
    pub peer_max_bytes: usize,
    pub max_queued_bytes: usize,
    pub requests_per_second_per_peer: u32,
    pub requests_per_second: u32,
    pub max_peers: usize,
    pub slow_peer_timeout: Duration,
}

/// A token bucket: `rate` tokens a second, at most `rate` banked.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    rate: f64,
    last: Instant,
}

impl Bucket {
    fn new(rate: u32, now: Instant) -> Self {
        Bucket {
            tokens: f64::from(rate),
            rate: f64::from(rate),
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + dt * self.rate).min(self.rate);
        self.last = now;
    }

    fn take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    fn full(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.tokens >= self.rate
    }
}

/// A replay in progress: the next batch to send and the end (exclusive) fixed at the request.
#[derive(Debug)]
struct Cursor {
    next: u64,
    end: u64,
    delimited: bool,
    last_progress: Instant,
}

#[derive(Debug)]
struct Peer {
    account: Arc<ByteAccount>,
    bucket: Bucket,
    replay: Option<Cursor>,
}

/// Why a replay could not go on this round.
enum Step {
    Sent,
    Done,
    /// The peer (or the publisher) has enough queued; try again later.
    Full,
    /// The peer is gone.
    Gone,
}

/// Requests read per round, so that a flood cannot starve the replays in progress.
const REQUESTS_PER_ROUND: usize = 256;
/// Messages sent to one peer per round (round robin between peers).
const MESSAGES_PER_PEER_ROUND: usize = 64;
/// Frames of a request beyond which the rest is discarded unread.
const MAX_REQUEST_FRAMES: usize = 3;

pub(super) struct ReplayService {
    router: zmq::Socket,
    ring: Arc<Mutex<ReplayRing>>,
    topic: Vec<u8>,
    limits: Limits,
    shared: Arc<Shared>,
    peers: HashMap<Vec<u8>, Peer>,
    total: Bucket,
}

impl ReplayService {
    pub fn new(
        router: zmq::Socket,
        ring: Arc<Mutex<ReplayRing>>,
        topic: Vec<u8>,
        limits: Limits,
        shared: Arc<Shared>,
    ) -> Self {
        let total = Bucket::new(limits.requests_per_second, Instant::now());
        ReplayService {
            router,
            ring,
            topic,
            limits,
            shared,
            peers: HashMap::new(),
            total,
        }
    }

    pub fn run(mut self) {
        // A bug must not take the engine's process down: stop answering instead.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run_loop()));
    }

    fn run_loop(&mut self) {
        while !self.shared.stop.load(Ordering::Acquire) {
            let active = self.pump();
            let wait = if active { 1 } else { 20 };
            let _ = self.router.poll(zmq::POLLIN, wait);
            self.read_requests();
            self.forget_idle_and_slow_peers();
            let c = &self.shared.counters;
            c.active_replays.store(
                self.peers.values().filter(|p| p.replay.is_some()).count() as u64,
                Ordering::Relaxed,
            );
        }
    }

    /// Reads one request, frame by frame (at most `MAX_REQUEST_FRAMES` kept; `None` inside
    /// when the request had more, which makes it malformed).
    fn recv_request(&mut self) -> Option<Option<Vec<Vec<u8>>>> {
        let first = self.router.recv_bytes(zmq::DONTWAIT).ok()?;
        let mut frames = Some(vec![first]);
        while self.router.get_rcvmore().unwrap_or(false) {
            let Ok(f) = self.router.recv_bytes(zmq::DONTWAIT) else {
                break;
            };
            // Too many frames: read the message away, keep nothing of it.
            frames = frames
                .filter(|v| v.len() < MAX_REQUEST_FRAMES)
                .map(|mut v| {
                    v.push(f);
                    v
                });
        }
        Some(frames)
    }

    fn read_requests(&mut self) {
        for _ in 0..REQUESTS_PER_ROUND {
            let Some(frames) = self.recv_request() else {
                return;
            };
            let shared = self.shared.clone();
            let c = &shared.counters;
            let parsed = match frames.as_deref().unwrap_or_default() {
                [id, empty, start] if empty.is_empty() => Some((id, true, start)),
                [id, start] => Some((id, false, start)),
                _ => None,
            }
            .and_then(|(id, delimited, start)| {
                let start = u64::from_be_bytes(<[u8; 8]>::try_from(start.as_slice()).ok()?);
                Some((id.clone(), delimited, start))
            });
            let Some((id, delimited, start)) = parsed else {
                c.malformed_requests.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            if self.accept(id, delimited, start) {
                c.replay_requests.fetch_add(1, Ordering::Relaxed);
            } else {
                c.replay_requests_refused.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Starts a replay for `id` unless a limit refuses it.
    fn accept(&mut self, id: Vec<u8>, delimited: bool, start: u64) -> bool {
        let now = Instant::now();
        if !self.peers.contains_key(&id) {
            if self.peers.len() >= self.limits.max_peers {
                self.forget_idle_and_slow_peers();
            }
            if self.peers.len() >= self.limits.max_peers {
                return false;
            }
            self.peers.insert(
                id.clone(),
                Peer {
                    account: Arc::new(ByteAccount::default()),
                    bucket: Bucket::new(self.limits.requests_per_second_per_peer, now),
                    replay: None,
                },
            );
        }
        let peer = self.peers.get_mut(&id).expect("inserted above");
        // The peer's own bucket first, so that one flooding peer spends only its own share of
        // the total.
        if peer.replay.is_some() || !peer.bucket.take(now) || !self.total.take(now) {
            return false;
        }
        let end = self.shared.counters.next_sequence.load(Ordering::Acquire);
        peer.replay = Some(Cursor {
            next: start,
            end,
            delimited,
            last_progress: now,
        });
        true
    }

    /// Sends what the limits allow of every replay in progress. Returns whether any remains.
    fn pump(&mut self) -> bool {
        let mut active = false;
        let now = Instant::now();
        let mut gone = Vec::new();
        let ids: Vec<Vec<u8>> = self
            .peers
            .iter()
            .filter(|(_, p)| p.replay.is_some())
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            for _ in 0..MESSAGES_PER_PEER_ROUND {
                match self.step(&id, now) {
                    Step::Sent => continue,
                    Step::Full => {
                        active = true;
                        break;
                    }
                    Step::Done => {
                        if let Some(p) = self.peers.get_mut(&id) {
                            p.replay = None;
                        }
                        self.shared
                            .counters
                            .replays_completed
                            .fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    Step::Gone => {
                        gone.push(id.clone());
                        break;
                    }
                }
            }
            if self.peers.get(&id).is_some_and(|p| p.replay.is_some()) {
                active = true;
            }
        }
        for id in gone {
            if let Some(p) = self.peers.get_mut(&id) {
                p.replay = None;
            }
            self.shared
                .counters
                .replay_peers_gone
                .fetch_add(1, Ordering::Relaxed);
        }
        active
    }

    /// Sends the next message of `id`'s replay, if the limits let it.
    fn step(&mut self, id: &[u8], now: Instant) -> Step {
        let Some(peer) = self.peers.get_mut(id) else {
            return Step::Gone;
        };
        let Some(cursor) = peer.replay.as_mut() else {
            return Step::Done;
        };
        let next = self
            .ring
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .first_in(cursor.next, cursor.end);
        let shared = &self.shared;
        if let Some((_, payload)) = &next {
            let len = payload.len();
            let half = self.limits.max_queued_bytes / 2;
            if !peer.account.fits(len, self.limits.peer_max_bytes)
                || !shared.replay_bytes.fits(len, half)
                || !shared.total_bytes.fits(len, self.limits.max_queued_bytes)
            {
                return Step::Full;
            }
        }
        // The identity frame first: ROUTER_MANDATORY reports a full or vanished peer here,
        // before anything of the message is queued.
        match self
            .router
            .send(id, zmq::SNDMORE | zmq::DONTWAIT)
            .map_err(|e| e == zmq::Error::EAGAIN)
        {
            Ok(()) => {}
            Err(true) => return Step::Full,
            Err(false) => return Step::Gone,
        }
        let more = zmq::SNDMORE | zmq::DONTWAIT;
        let mut ok = true;
        if cursor.delimited {
            ok &= self.router.send(&[][..], more).is_ok();
        }
        ok &= self.router.send(&self.topic[..], more).is_ok();
        let step = match next {
            Some((seq, payload)) => {
                ok &= self.router.send(&seq.to_be_bytes()[..], more).is_ok();
                ok &= send_tracked(
                    &mut self.router,
                    &payload,
                    &[&peer.account, &shared.replay_bytes, &shared.total_bytes],
                    zmq::DONTWAIT,
                )
                .is_ok();
                cursor.next = seq + 1;
                Step::Sent
            }
            None => {
                ok &= self.router.send(&END_SEQ.to_be_bytes()[..], more).is_ok();
                ok &= self.router.send(&[][..], zmq::DONTWAIT).is_ok();
                Step::Done
            }
        };
        cursor.last_progress = now;
        if ok {
            step
        } else {
            // The peer left in the middle of the message.
            Step::Gone
        }
    }

    /// Ends the replays of peers that took nothing for the timeout, and forgets peers with
    /// nothing in progress, nothing queued and a full bucket.
    fn forget_idle_and_slow_peers(&mut self) {
        let now = Instant::now();
        let timeout = self.limits.slow_peer_timeout;
        let mut dropped = 0;
        self.peers.retain(|_, p| {
            if p.replay
                .as_ref()
                .is_some_and(|c| now.saturating_duration_since(c.last_progress) > timeout)
            {
                p.replay = None;
                dropped += 1;
            }
            p.replay.is_some() || p.account.get() > 0 || !p.bucket.full(now)
        });
        if dropped > 0 {
            self.shared
                .counters
                .slow_peers_dropped
                .fetch_add(dropped, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(b: u8) -> Arc<[u8]> {
        vec![b].into()
    }

    #[test]
    fn keeps_the_last_batches_and_serves_from_a_start() {
        let mut r = ReplayRing::new(3);
        for seq in [0, 1, 3, 4] {
            r.push(seq, payload(seq as u8));
        }
        assert_eq!(r.len(), 3);
        let seqs = |start| r.since(start).map(|(s, _)| *s).collect::<Vec<_>>();
        assert_eq!(seqs(0), vec![1, 3, 4]);
        assert_eq!(seqs(2), vec![3, 4]);
        assert_eq!(seqs(4), vec![4]);
        assert!(seqs(5).is_empty());
        assert_eq!(r.first_in(2, 5).map(|b| b.0), Some(3));
        assert_eq!(r.first_in(2, 3), None, "the end is exclusive");
    }

    #[test]
    fn zero_capacity_keeps_nothing() {
        let mut r = ReplayRing::new(0);
        r.push(0, payload(1));
        assert_eq!(r.since(0).count(), 0);
    }

    #[test]
    fn buckets_allow_a_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(3, t0);
        assert!(b.take(t0) && b.take(t0) && b.take(t0));
        assert!(!b.take(t0));
        assert!(b.take(t0 + Duration::from_millis(400)));
        assert!(!b.full(t0 + Duration::from_millis(400)));
        assert!(b.full(t0 + Duration::from_secs(2)));
    }
}
