//! KV cache events in TensorRT-LLM's format (Created / Stored / Removed / Updated), batched per
//! window and delivered through a bounded buffer that a second thread drains.
//!
//! Three stages. (1) Windows record raw events while an operation runs; the manager moves them,
//! in order, into the `EventQueue` of the current iteration. Removals only accumulate in a
//! per-window pending list; a Stored event of window W first commits W's pending removals (so a
//! consumer sees a block leave before a block with the same content is stored again), Updated
//! events do not commit anything. (2) `flush` commits every window's pending removals and hands
//! the iteration's events to (3) the `EventDelivery` buffer, which keeps at most `capacity`
//! events (the oldest are dropped and counted) and wakes a waiting drainer. Event ids are assigned
//! at commit, so they increase strictly in delivery order.
//!
//! The disk tier below the host tier has events of its own (`DiskStored` / `DiskRemoved`): a
//! block announced when its write completed (it became readable), with the hash and parent hash
//! it had in the tree, and removed when its slot is evicted or dropped. They commit in order
//! like Stored events: a block moving from the host tier to disk is seen leaving the tree
//! (Removed) before it is seen on disk. Slots recovered at a restart are not announced (their
//! tree hashes are unknown), nor is their removal.
//!
//! Removed-event policy: every block that leaves a reuse tree is reported, whatever the reason:
//! evicted for reallocation, detached with an evicted ancestor (its whole subtree is reported),
//! or taken over privately after a partial match. A consumer applying the events therefore holds
//! exactly the blocks of the manager's trees.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::key::MmKey;
use crate::pool::Level;

/// One block of a Stored event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredBlock {
    pub hash: u64,
    pub token_ids: Vec<i32>,
    /// Per-token extra ids, when the request used them.
    pub extra_ids: Option<Vec<u64>>,
    pub lora_task_id: Option<u64>,
    pub cache_level: Level,
    pub priority: u8,
    pub mm_keys: Vec<MmKey>,
    pub cache_salt: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventData {
    /// A window was created with this many blocks per cache level.
    Created {
        num_blocks_per_cache_level: [usize; 2],
    },
    /// A chain of blocks entered the tree; `parent_hash` is the first block's parent (`None` =
    /// the root). Block i's parent is block i-1.
    Stored {
        parent_hash: Option<u64>,
        blocks: Vec<StoredBlock>,
    },
    /// Blocks left the tree.
    Removed { block_hashes: Vec<u64> },
    /// A block in the tree changed cache level and/or priority (old, new).
    Updated {
        block_hash: u64,
        cache_level: Option<(Level, Level)>,
        priority: Option<(u8, u8)>,
    },
    /// Blocks became readable on the disk tier (one per completed write). `parent_hash` is the
    /// first block's parent in its prefix chain, wherever that parent lives; `cache_level` of
    /// the blocks is the host level they were written from.
    DiskStored {
        parent_hash: Option<u64>,
        blocks: Vec<StoredBlock>,
    },
    /// Blocks left the disk tier (their slots were evicted or dropped).
    DiskRemoved { block_hashes: Vec<u64> },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvCacheEvent {
    pub event_id: u64,
    pub window_size: usize,
    pub attention_dp_rank: Option<i32>,
    pub data: EventData,
}

/// What a window records while an operation runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WindowEvent {
    Stored {
        parent_hash: Option<u64>,
        blocks: Vec<StoredBlock>,
    },
    Removed(u64),
    Updated {
        block_hash: u64,
        cache_level: Option<(Level, Level)>,
        priority: Option<(u8, u8)>,
    },
    DiskStored {
        parent_hash: Option<u64>,
        block: StoredBlock,
    },
    DiskRemoved(u64),
}

/// The iteration's events, with removals pending per window.
#[derive(Clone, Debug)]
pub struct EventQueue {
    attention_dp_rank: Option<i32>,
    next_id: u64,
    /// (window size, pending removed hashes), ascending window size.
    pending_removed: Vec<(usize, Vec<u64>)>,
    iteration: Vec<KvCacheEvent>,
}

impl EventQueue {
    pub fn new(window_sizes: &[usize], attention_dp_rank: Option<i32>) -> Self {
        EventQueue {
            attention_dp_rank,
            next_id: 0,
            pending_removed: window_sizes.iter().map(|&w| (w, Vec::new())).collect(),
            iteration: Vec::new(),
        }
    }

    fn commit(&mut self, window_size: usize, data: EventData) {
        self.iteration.push(KvCacheEvent {
            event_id: self.next_id,
            window_size,
            attention_dp_rank: self.attention_dp_rank,
            data,
        });
        self.next_id += 1;
    }

    fn commit_removed(&mut self, slot: usize) {
        let (window, hashes) = &mut self.pending_removed[slot];
        if hashes.is_empty() {
            return;
        }
        let window = *window;
        let block_hashes = std::mem::take(hashes);
        self.commit(window, EventData::Removed { block_hashes });
    }

    fn slot(&self, window_size: usize) -> usize {
        self.pending_removed
            .iter()
            .position(|(w, _)| *w == window_size)
            .expect("event for a known window")
    }

    pub fn created(&mut self, window_size: usize, primary: usize, secondary: usize) {
        self.commit(
            window_size,
            EventData::Created {
                num_blocks_per_cache_level: [primary, secondary],
            },
        );
    }

    /// Applies the batching rules to a window's raw events, in order.
    pub fn absorb(&mut self, window_size: usize, events: impl IntoIterator<Item = WindowEvent>) {
        let slot = self.slot(window_size);
        for e in events {
            match e {
                WindowEvent::Removed(hash) => self.pending_removed[slot].1.push(hash),
                WindowEvent::Stored {
                    parent_hash,
                    blocks,
                } => {
                    self.commit_removed(slot);
                    self.commit(
                        window_size,
                        EventData::Stored {
                            parent_hash,
                            blocks,
                        },
                    );
                }
                WindowEvent::Updated {
                    block_hash,
                    cache_level,
                    priority,
                } => self.commit(
                    window_size,
                    EventData::Updated {
                        block_hash,
                        cache_level,
                        priority,
                    },
                ),
                WindowEvent::DiskStored { parent_hash, block } => {
                    self.commit_removed(slot);
                    self.commit(
                        window_size,
                        EventData::DiskStored {
                            parent_hash,
                            blocks: vec![block],
                        },
                    );
                }
                WindowEvent::DiskRemoved(hash) => {
                    // Consecutive disk removals of a window make one event.
                    if let Some(KvCacheEvent {
                        window_size: w,
                        data: EventData::DiskRemoved { block_hashes },
                        ..
                    }) = self.iteration.last_mut()
                    {
                        if *w == window_size {
                            block_hashes.push(hash);
                            continue;
                        }
                    }
                    self.commit(
                        window_size,
                        EventData::DiskRemoved {
                            block_hashes: vec![hash],
                        },
                    );
                }
            }
        }
    }

    /// Commits every window's pending removals and returns the iteration's events.
    pub fn flush(&mut self) -> Vec<KvCacheEvent> {
        for slot in 0..self.pending_removed.len() {
            self.commit_removed(slot);
        }
        std::mem::take(&mut self.iteration)
    }

    /// Removed hashes not yet committed.
    #[cfg(test)]
    fn num_uncommitted_removals(&self) -> usize {
        self.pending_removed.iter().map(|(_, h)| h.len()).sum()
    }
}

#[derive(Debug, Default)]
struct DeliveryState {
    events: VecDeque<KvCacheEvent>,
    /// Event id of the last event of each pushed (flushed) batch still buffered, oldest first.
    iteration_ends: VecDeque<u64>,
    dropped: u64,
    shutdown: bool,
}

/// Bounded buffer between the executor (which flushes) and a drainer thread.
#[derive(Debug)]
pub struct EventDelivery {
    capacity: usize,
    state: Mutex<DeliveryState>,
    ready: Condvar,
    /// Whether a wire publisher drains this buffer (at most one may: two would split one
    /// stream between them, each gap-free, so routers could not see the loss).
    publisher: std::sync::atomic::AtomicBool,
}

/// A drained batch: the events and how many were dropped (buffer full) since the last drain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainedEvents {
    pub events: Vec<KvCacheEvent>,
    pub dropped: u64,
}

impl EventDelivery {
    pub fn new(capacity: usize) -> Self {
        EventDelivery {
            capacity,
            state: Mutex::new(DeliveryState::default()),
            ready: Condvar::new(),
            publisher: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DeliveryState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends a flushed batch, dropping the oldest events beyond the capacity.
    pub fn push(&self, batch: Vec<KvCacheEvent>) {
        if batch.is_empty() {
            return;
        }
        let mut st = self.lock();
        let last_id = batch[batch.len() - 1].event_id;
        st.events.extend(batch);
        st.iteration_ends.push_back(last_id);
        while st.events.len() > self.capacity {
            st.events.pop_front();
            st.dropped += 1;
        }
        // Forget the ends of iterations whose events were all dropped.
        let first_id = st.events.front().map(|e| e.event_id);
        while let Some(&end) = st.iteration_ends.front() {
            if first_id.is_some_and(|f| end >= f) {
                break;
            }
            st.iteration_ends.pop_front();
        }
        drop(st);
        self.ready.notify_all();
    }

    /// Takes everything delivered so far, waiting up to `timeout` for at least one event.
    /// With events off (capacity 0) nothing can arrive, so it returns at once.
    pub fn drain(&self, timeout: Duration) -> DrainedEvents {
        self.take(timeout).0
    }

    /// `drain`, also returning the buffered iteration ends (taken under the same lock).
    fn take(&self, timeout: Duration) -> (DrainedEvents, VecDeque<u64>) {
        let deadline = Instant::now().checked_add(timeout);
        let mut st = self.lock();
        while self.capacity > 0 && st.events.is_empty() && !st.shutdown {
            let now = Instant::now();
            let wait = match deadline {
                Some(d) if now >= d => break,
                Some(d) => d - now,
                None => Duration::from_secs(3600),
            };
            st = self
                .ready
                .wait_timeout(st, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let ends = std::mem::take(&mut st.iteration_ends);
        let drained = DrainedEvents {
            events: st.events.drain(..).collect(),
            dropped: std::mem::take(&mut st.dropped),
        };
        (drained, ends)
    }

    /// Like `drain`, but split into the flushed iterations the events came from (one inner
    /// vector per `push`, oldest first; an iteration whose oldest events were dropped keeps the
    /// rest). Used by the wire publisher, which sends one batch per iteration.
    pub fn drain_iterations(&self, timeout: Duration) -> (Vec<Vec<KvCacheEvent>>, u64) {
        let (drained, ends) = self.take(timeout);
        let mut out = Vec::new();
        let mut current = Vec::new();
        let mut ends = ends.into_iter().peekable();
        for e in drained.events {
            let id = e.event_id;
            current.push(e);
            while ends.next_if(|&end| end < id).is_some() {}
            if ends.next_if_eq(&id).is_some() {
                out.push(std::mem::take(&mut current));
            }
        }
        if !current.is_empty() {
            out.push(current);
        }
        (out, drained.dropped)
    }

    /// Whether `shutdown` was called (the manager is gone; nothing more will arrive).
    pub fn is_shut_down(&self) -> bool {
        self.lock().shutdown
    }

    /// Wakes every waiting drainer for good (the manager is going away).
    pub fn shutdown(&self) {
        let mut st = self.lock();
        st.shutdown = true;
        // The destroyed handle's shell keeps this buffer: free the undrained events now.
        st.events = VecDeque::new();
        st.dropped = 0;
        drop(st);
        self.ready.notify_all();
    }

    /// Marks the buffer as drained by a publisher; false (nothing changed) when one already is.
    pub fn claim_publisher(&self) -> bool {
        use std::sync::atomic::Ordering;
        self.publisher
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Ends a `claim_publisher` (the publisher stopped).
    pub fn release_publisher(&self) {
        self.publisher
            .store(false, std::sync::atomic::Ordering::Release);
    }

    /// Events delivered and not drained yet.
    pub fn num_pending(&self) -> usize {
        self.lock().events.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn removed(h: u64) -> WindowEvent {
        WindowEvent::Removed(h)
    }

    fn stored(h: u64) -> WindowEvent {
        WindowEvent::Stored {
            parent_hash: None,
            blocks: vec![StoredBlock {
                hash: h,
                token_ids: vec![1],
                extra_ids: None,
                lora_task_id: None,
                cache_level: Level::Primary,
                priority: 35,
                mm_keys: Vec::new(),
                cache_salt: None,
            }],
        }
    }

    fn kinds(events: &[KvCacheEvent]) -> Vec<(usize, &'static str)> {
        events
            .iter()
            .map(|e| {
                let k = match e.data {
                    EventData::Created { .. } => "created",
                    EventData::Stored { .. } => "stored",
                    EventData::Removed { .. } => "removed",
                    EventData::Updated { .. } => "updated",
                    EventData::DiskStored { .. } => "disk_stored",
                    EventData::DiskRemoved { .. } => "disk_removed",
                };
                (e.window_size, k)
            })
            .collect()
    }

    fn disk_stored(h: u64) -> WindowEvent {
        let WindowEvent::Stored { mut blocks, .. } = stored(h) else {
            unreachable!()
        };
        WindowEvent::DiskStored {
            parent_hash: Some(7),
            block: blocks.remove(0),
        }
    }

    #[test]
    fn a_disk_store_follows_the_tree_removal_and_disk_removals_coalesce() {
        let mut q = EventQueue::new(&[8, 16], None);
        // The host tier evicts block 1 to disk: it leaves the tree, then lands on disk.
        q.absorb(8, [removed(1), disk_stored(1)]);
        q.absorb(
            8,
            [WindowEvent::DiskRemoved(5), WindowEvent::DiskRemoved(6)],
        );
        q.absorb(16, [WindowEvent::DiskRemoved(9)]);
        q.absorb(8, [WindowEvent::DiskRemoved(1)]);
        let out = q.flush();
        assert_eq!(
            kinds(&out),
            vec![
                (8, "removed"),
                (8, "disk_stored"),
                (8, "disk_removed"),
                (16, "disk_removed"),
                (8, "disk_removed"),
            ]
        );
        assert_eq!(
            out[2].data,
            EventData::DiskRemoved {
                block_hashes: vec![5, 6]
            }
        );
        let EventData::DiskStored {
            parent_hash,
            blocks,
        } = &out[1].data
        else {
            unreachable!()
        };
        assert_eq!((*parent_hash, blocks[0].hash), (Some(7), 1));
    }

    #[test]
    fn removals_coalesce_per_window_until_flush() {
        let mut q = EventQueue::new(&[8, 16], None);
        q.absorb(16, [removed(1), removed(2)]);
        q.absorb(8, [removed(3)]);
        q.absorb(16, [removed(4)]);
        let events = q.flush();
        assert_eq!(kinds(&events), vec![(8, "removed"), (16, "removed")]);
        assert_eq!(
            events[1].data,
            EventData::Removed {
                block_hashes: vec![1, 2, 4]
            }
        );
    }

    #[test]
    fn stored_commits_only_its_own_windows_removals() {
        let mut q = EventQueue::new(&[8, 16], None);
        q.absorb(8, [removed(1)]);
        q.absorb(16, [removed(2), stored(3)]);
        assert_eq!(q.num_uncommitted_removals(), 1);
        let events = q.flush();
        assert_eq!(
            kinds(&events),
            vec![(16, "removed"), (16, "stored"), (8, "removed")]
        );
        let ids: Vec<u64> = events.iter().map(|e| e.event_id).collect();
        assert_eq!(ids, vec![0, 1, 2]);
    }

    #[test]
    fn updates_do_not_commit_removals() {
        let mut q = EventQueue::new(&[8], Some(3));
        q.absorb(
            8,
            [
                removed(1),
                WindowEvent::Updated {
                    block_hash: 5,
                    cache_level: Some((Level::Primary, Level::Secondary)),
                    priority: None,
                },
            ],
        );
        let events = q.flush();
        assert_eq!(kinds(&events), vec![(8, "updated"), (8, "removed")]);
        assert!(events.iter().all(|e| e.attention_dp_rank == Some(3)));
    }

    #[test]
    fn delivery_drops_oldest_and_counts() {
        let d = EventDelivery::new(2);
        let mut q = EventQueue::new(&[8], None);
        q.created(8, 4, 0);
        q.absorb(8, [stored(1), stored(2)]);
        d.push(q.flush());
        let out = d.drain(Duration::ZERO);
        assert_eq!(out.dropped, 1);
        assert_eq!(out.events.len(), 2);
        assert_eq!(out.events[0].event_id, 1);
        assert_eq!(d.drain(Duration::ZERO), DrainedEvents::default());
    }

    #[test]
    fn drain_iterations_splits_at_flushes_and_survives_drops() {
        let d = EventDelivery::new(3);
        let mut q = EventQueue::new(&[8], None);
        q.absorb(8, [stored(1), stored(2)]);
        d.push(q.flush()); // ids 0, 1
        q.absorb(8, [stored(3)]);
        d.push(q.flush()); // id 2
        let (iters, dropped) = d.drain_iterations(Duration::ZERO);
        let ids: Vec<Vec<u64>> = iters
            .iter()
            .map(|it| it.iter().map(|e| e.event_id).collect())
            .collect();
        assert_eq!((ids, dropped), (vec![vec![0, 1], vec![2]], 0));

        // Capacity 3: the first iteration loses one event, the rest keeps its boundaries.
        q.absorb(8, [stored(4), stored(5)]);
        d.push(q.flush()); // ids 3, 4
        q.absorb(8, [stored(6), stored(7)]);
        d.push(q.flush()); // ids 5, 6
        let (iters, dropped) = d.drain_iterations(Duration::ZERO);
        let ids: Vec<Vec<u64>> = iters
            .iter()
            .map(|it| it.iter().map(|e| e.event_id).collect())
            .collect();
        assert_eq!((ids, dropped), (vec![vec![4], vec![5, 6]], 1));
    }

    #[test]
    fn drain_returns_at_once_when_events_are_off() {
        // A liveness check: with capacity 0 the drain must not wait out its (huge) timeout.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let d = EventDelivery::new(0);
            tx.send(d.drain(Duration::MAX)).unwrap();
        });
        let out = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("drain with events off returned");
        assert_eq!(out, DrainedEvents::default());
    }

    #[test]
    fn drain_waits_for_a_flush_from_another_thread() {
        let d = std::sync::Arc::new(EventDelivery::new(8));
        let d2 = d.clone();
        let t = std::thread::spawn(move || d2.drain(Duration::from_secs(30)));
        let mut q = EventQueue::new(&[8], None);
        q.created(8, 4, 0);
        d.push(q.flush());
        let out = t.join().unwrap();
        assert_eq!(out.events.len(), 1);
    }
}
