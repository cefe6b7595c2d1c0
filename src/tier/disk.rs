//! The disk tier of one window pool: a `FileSlots` file of fixed slots, the index of the slots
//! that hold a verified-written block (prefix digest → slot), an LRU over them, the bounded
//! queues of writes and reads on the shared I/O pool, and the tier's counters.
//!
//! A slot is published in the index only when its write completed; a slot being read is
//! claimed (its reader count) and never overwritten under the read. When every buffer of the
//! write queue is taken, a store is dropped and counted, never waited for.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::Arc;

use super::io::{lock, Completions, IoDone, IoJob, IoKind, IoOutcome, IoPool};
use super::sealed::{open_header, PrefixDigest, SealError, SlotHeader, SlotLayout};
use super::store::{probe_direct_io, AlignedBuf, FaultPlan, FileMode, FileSlots, TierKey};

const NIL: u32 = u32::MAX;

/// Counters of a tier (cumulative, except the gauges marked so).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Blocks read back, verified and placed in the host tier (disk hits).
    pub hits: u64,
    /// Reads started.
    pub reads: u64,
    pub read_bytes: u64,
    /// Writes completed and published.
    pub writes: u64,
    pub write_bytes: u64,
    /// Stores dropped because the write queue was full (or no slot was free of readers).
    pub write_drops: u64,
    /// Stores not written because the block was already on disk or being written.
    pub write_skips: u64,
    /// Stores the write policy declined (blocks not reused often enough).
    pub policy_skips: u64,
    /// Writes that failed (short write, ENOSPC, EIO...): the slot was not published.
    pub write_errors: u64,
    /// Of those, failures with ENOSPC.
    pub enospc_errors: u64,
    /// Reads that failed with an I/O error.
    pub read_errors: u64,
    /// Reads whose bytes did not verify (key, header or row checksum): dropped.
    pub verify_failures: u64,
    /// Reads verified but not placed (their parent left the host tier meanwhile, or the block
    /// was stored again by a recomputation).
    pub reads_discarded: u64,
    /// Prefetches refused because the reads in flight were at their bound.
    pub read_drops: u64,
    /// Published slots overwritten by newer blocks (disk LRU eviction).
    pub evictions: u64,
    /// Slots recovered from the file at creation (warm restart).
    pub recovered: u64,
    /// Written slots ignored at creation (another geometry, or a header that does not verify).
    pub ignored_at_restart: u64,
    /// Gauge: slots of the file.
    pub slots: u64,
    /// Gauge: slots holding a published block.
    pub slots_used: u64,
    /// Gauge: reads in flight.
    pub reads_in_flight: u64,
    /// Gauge: writes queued or in flight.
    pub writes_queued: u64,
    /// Gauge: bytes of one slot.
    pub slot_bytes: u64,
    /// Whether the file uses O_DIRECT (buffered otherwise).
    pub direct_io: bool,
}

impl TierStats {
    /// Adds the counters of `o` (gauges are summed too; `direct_io` holds if it holds for all).
    pub fn add(&mut self, o: &TierStats) {
        let direct = if self.slots == 0 {
            o.direct_io
        } else {
            self.direct_io && o.direct_io
        };
        self.hits += o.hits;
        self.reads += o.reads;
        self.read_bytes += o.read_bytes;
        self.writes += o.writes;
        self.write_bytes += o.write_bytes;
        self.write_drops += o.write_drops;
        self.write_skips += o.write_skips;
        self.policy_skips += o.policy_skips;
        self.write_errors += o.write_errors;
        self.enospc_errors += o.enospc_errors;
        self.read_errors += o.read_errors;
        self.verify_failures += o.verify_failures;
        self.reads_discarded += o.reads_discarded;
        self.read_drops += o.read_drops;
        self.evictions += o.evictions;
        self.recovered += o.recovered;
        self.ignored_at_restart += o.ignored_at_restart;
        self.slots += o.slots;
        self.slots_used += o.slots_used;
        self.reads_in_flight += o.reads_in_flight;
        self.writes_queued += o.writes_queued;
        self.slot_bytes = self.slot_bytes.max(o.slot_bytes);
        self.direct_io = direct;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    Free,
    Writing,
    /// Published; `readers` reads in flight.
    Valid {
        readers: u32,
    },
}

/// A finished read, handed to the window.
#[derive(Debug)]
pub struct ReadDone {
    pub digest: PrefixDigest,
    /// The verified header and the slot's bytes, or `None` when the read failed (counted).
    pub data: Option<(Box<SlotHeader>, AlignedBuf)>,
}

/// A change of what the tier holds, logged (when `log_changes` is on) for the window's events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotChange {
    /// A write completed: the block became readable.
    Published(PrefixDigest),
    /// A published block left the tier (its slot was evicted, or dropped after a failed read).
    Unpublished(PrefixDigest),
    /// A prepared write was given up (it failed, or was never submitted).
    Abandoned(PrefixDigest),
}

/// Bounds of a tier's queues.
#[derive(Clone, Copy, Debug)]
pub struct TierLimits {
    pub max_writes_queued: usize,
    pub max_reads_in_flight: usize,
}

/// The disk tier of one window.
pub struct DiskTier {
    layout: SlotLayout,
    store: Arc<FileSlots>,
    pool: Arc<IoPool>,
    done: Completions,
    states: Vec<SlotState>,
    digests: Vec<PrefixDigest>,
    index: HashMap<PrefixDigest, u32>,
    writing: HashMap<PrefixDigest, u32>,
    free_slots: Vec<u32>,
    /// LRU of published slots: head = least recently used.
    lru_prev: Vec<u32>,
    lru_next: Vec<u32>,
    lru_head: u32,
    lru_tail: u32,
    spare: Vec<AlignedBuf>,
    limits: TierLimits,
    stats: TierStats,
    /// Jobs of the running call, handed to the workers together by `flush_jobs`.
    pending: Vec<IoJob>,
    /// Changes since the last `take_changes`, when logged (`None` = not logged).
    changes: Option<Vec<SlotChange>>,
}

impl Drop for DiskTier {
    /// Queued writes still go out (their slots become readable at the next start).
    fn drop(&mut self) {
        self.flush_jobs();
    }
}

impl std::fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier")
            .field("store", &self.store)
            .field("stats", &self.stats)
            .finish()
    }
}

impl DiskTier {
    /// Opens the tier's file `dir/name` with `num_slots` slots of `layout`; with an existing
    /// file of the same size, recovers the published slots from their headers.
    pub fn open(
        dir: &Path,
        name: &str,
        layout: SlotLayout,
        num_slots: u64,
        limits: TierLimits,
        pool: Arc<IoPool>,
    ) -> io::Result<Self> {
        Self::open_within(dir, name, layout, num_slots, limits, pool, None)
    }

    /// `open`, reserving the file's space only when the filesystem keeps `keep_free` bytes
    /// free afterwards (`FileSlots::open_within`).
    pub fn open_within(
        dir: &Path,
        name: &str,
        layout: SlotLayout,
        num_slots: u64,
        limits: TierLimits,
        pool: Arc<IoPool>,
        keep_free: Option<u64>,
    ) -> io::Result<Self> {
        let direct = probe_direct_io(dir);
        let path = dir.join(name);
        let store =
            FileSlots::open_within(&path, layout.slot_bytes(), num_slots, direct, keep_free)?;
        let n = num_slots as usize;
        let mut tier = DiskTier {
            layout,
            store: Arc::new(store),
            pool,
            done: Completions::default(),
            states: vec![SlotState::Free; n],
            digests: vec![[0; 32]; n],
            index: HashMap::new(),
            writing: HashMap::new(),
            free_slots: Vec::new(),
            lru_prev: vec![NIL; n],
            lru_next: vec![NIL; n],
            lru_head: NIL,
            lru_tail: NIL,
            spare: Vec::new(),
            limits,
            stats: TierStats {
                slots: num_slots,
                slot_bytes: layout.slot_bytes() as u64,
                direct_io: direct,
                ..TierStats::default()
            },
            pending: Vec::new(),
            changes: None,
        };
        if tier.store.mode().existed {
            tier.recover()?;
        }
        tier.free_slots = (0..n as u32)
            .rev()
            .filter(|&s| tier.states[s as usize] == SlotState::Free)
            .collect();
        Ok(tier)
    }

    /// Scans the headers of an existing file: published slots of this geometry whose header
    /// verifies are indexed, written slots of another geometry or with a bad header are counted
    /// and left free.
    fn recover(&mut self) -> io::Result<()> {
        // Small slots are read whole, many per read (a header-sized read per slot would cost a
        // request per 4 KiB); large ones by their header only.
        const CHUNK: usize = 4 << 20;
        let slot_bytes = self.layout.slot_bytes();
        let hb = super::sealed::align_up(self.layout.header_bytes());
        let per_read = if slot_bytes <= CHUNK / 16 {
            CHUNK / slot_bytes
        } else {
            1
        };
        let read_bytes = if per_read > 1 {
            per_read * slot_bytes
        } else {
            hb
        };
        let mut buf = AlignedBuf::new(read_bytes).ok_or_else(|| io::Error::other("no memory"))?;
        let n = self.states.len();
        let mut first = 0;
        while first < n {
            let count = per_read.min(n - first);
            let len = if per_read > 1 { count * slot_bytes } else { hb };
            self.store
                .read_prefix(first as u64, &mut buf.as_mut_slice()[..len])?;
            for i in 0..count {
                let slot = (first + i) as u32;
                let at = if per_read > 1 { i * slot_bytes } else { 0 };
                match open_header(&self.layout, &buf.as_slice()[at..at + hb.min(len - at)]) {
                    Ok(h) if !self.index.contains_key(&h.digest) => {
                        self.publish(slot, h.digest);
                        self.stats.recovered += 1;
                    }
                    Ok(_) | Err(SealError::NotASlot) => {}
                    Err(_) => self.stats.ignored_at_restart += 1,
                }
            }
            first += count;
        }
        Ok(())
    }

    pub fn layout(&self) -> &SlotLayout {
        &self.layout
    }

    pub fn mode(&self) -> FileMode {
        self.store.mode()
    }

    pub fn faults(&self) -> &Arc<FaultPlan> {
        self.store.faults()
    }

    pub fn stats(&self) -> TierStats {
        let mut s = self.stats;
        s.slots_used = self.index.len() as u64;
        s
    }

    pub fn stats_mut(&mut self) -> &mut TierStats {
        &mut self.stats
    }

    /// Whether a published slot holds the block with this prefix digest.
    pub fn contains(&self, digest: &PrefixDigest) -> bool {
        self.index.contains_key(digest)
    }

    /// Whether a write of this digest is queued or running.
    pub fn is_writing(&self, digest: &PrefixDigest) -> bool {
        self.writing.contains_key(digest)
    }

    fn lru_unlink(&mut self, s: u32) {
        let (p, n) = (self.lru_prev[s as usize], self.lru_next[s as usize]);
        if p == NIL {
            self.lru_head = n;
        } else {
            self.lru_next[p as usize] = n;
        }
        if n == NIL {
            self.lru_tail = p;
        } else {
            self.lru_prev[n as usize] = p;
        }
        self.lru_prev[s as usize] = NIL;
        self.lru_next[s as usize] = NIL;
    }

    fn lru_push_back(&mut self, s: u32) {
        self.lru_prev[s as usize] = self.lru_tail;
        self.lru_next[s as usize] = NIL;
        if self.lru_tail == NIL {
            self.lru_head = s;
        } else {
            self.lru_next[self.lru_tail as usize] = s;
        }
        self.lru_tail = s;
    }

    /// Starts logging the changes of what the tier holds (see `take_changes`). Slots recovered
    /// at opening are not logged.
    pub fn log_changes(&mut self) {
        self.changes.get_or_insert_with(Vec::new);
    }

    /// The changes logged since the last call, in order.
    pub fn take_changes(&mut self) -> Vec<SlotChange> {
        self.changes
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    fn log(&mut self, change: SlotChange) {
        if let Some(c) = &mut self.changes {
            c.push(change);
        }
    }

    fn publish(&mut self, slot: u32, digest: PrefixDigest) {
        self.states[slot as usize] = SlotState::Valid { readers: 0 };
        self.digests[slot as usize] = digest;
        self.index.insert(digest, slot);
        self.lru_push_back(slot);
    }

    /// Unpublishes a slot (its block is gone from the tier).
    fn unpublish(&mut self, slot: u32) {
        let d = self.digests[slot as usize];
        self.index.remove(&d);
        self.lru_unlink(slot);
        self.log(SlotChange::Unpublished(d));
    }

    fn take_buffer(&mut self, in_use: usize, cap: usize) -> Option<AlignedBuf> {
        if in_use >= cap {
            return None;
        }
        self.spare
            .pop()
            .or_else(|| AlignedBuf::new(self.layout.slot_bytes()))
    }

    fn recycle(&mut self, buf: AlignedBuf) {
        let cap = self.limits.max_writes_queued + self.limits.max_reads_in_flight;
        if self.spare.len() < cap {
            self.spare.push(buf);
        }
    }

    /// A slot and a buffer for storing the block `digest`, or `None` (counted) when it is
    /// already on disk or being written, or the write queue is full, or every slot is being
    /// written or read. The caller fills the buffer and calls `submit_write` or
    /// `abandon_write`.
    pub fn prepare_write(&mut self, digest: &PrefixDigest) -> Option<(u32, AlignedBuf)> {
        if let Some(&s) = self.index.get(digest) {
            // Recently wanted again: keep it longer.
            self.lru_unlink(s);
            self.lru_push_back(s);
            self.stats.write_skips += 1;
            return None;
        }
        if self.writing.contains_key(digest) {
            self.stats.write_skips += 1;
            return None;
        }
        let Some(buf) = self.take_buffer(
            self.stats.writes_queued as usize,
            self.limits.max_writes_queued,
        ) else {
            self.stats.write_drops += 1;
            return None;
        };
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                // The least recently used published slot that nobody reads.
                let mut s = self.lru_head;
                while s != NIL && self.states[s as usize] != (SlotState::Valid { readers: 0 }) {
                    s = self.lru_next[s as usize];
                }
                if s == NIL {
                    self.recycle(buf);
                    self.stats.write_drops += 1;
                    return None;
                }
                self.unpublish(s);
                self.stats.evictions += 1;
                s
            }
        };
        self.states[slot as usize] = SlotState::Writing;
        self.digests[slot as usize] = *digest;
        self.writing.insert(*digest, slot);
        self.stats.writes_queued += 1;
        Some((slot, buf))
    }

    /// Queues the write of a prepared slot whose key was written by `seal_key`: the worker
    /// checksums it, then writes it.
    pub fn submit_write(&mut self, slot: u32, buf: AlignedBuf) {
        let key = TierKey {
            digest: self.digests[slot as usize],
            slot: slot as u64,
        };
        self.pending.push(IoJob {
            store: self.store.clone(),
            key,
            buf,
            kind: IoKind::Write {
                seal: Some(self.layout),
            },
            done: self.done.clone(),
        });
    }

    /// Gives back a prepared slot that will not be written.
    pub fn abandon_write(&mut self, slot: u32, buf: AlignedBuf) {
        let d = self.digests[slot as usize];
        self.writing.remove(&d);
        self.log(SlotChange::Abandoned(d));
        self.states[slot as usize] = SlotState::Free;
        self.free_slots.push(slot);
        self.stats.writes_queued -= 1;
        self.recycle(buf);
    }

    /// Starts reading the published block `digest`; false (counted when the bound refused it)
    /// when it is not on disk or the reads in flight are at their bound.
    pub fn start_read(&mut self, digest: &PrefixDigest) -> bool {
        let Some(&slot) = self.index.get(digest) else {
            return false;
        };
        let Some(buf) = self.take_buffer(
            self.stats.reads_in_flight as usize,
            self.limits.max_reads_in_flight,
        ) else {
            self.stats.read_drops += 1;
            return false;
        };
        if let SlotState::Valid { readers } = &mut self.states[slot as usize] {
            *readers += 1;
        }
        self.lru_unlink(slot);
        self.lru_push_back(slot);
        self.stats.reads += 1;
        self.stats.reads_in_flight += 1;
        self.pending.push(IoJob {
            store: self.store.clone(),
            key: TierKey {
                digest: *digest,
                slot: slot as u64,
            },
            buf,
            kind: IoKind::Read {
                layout: self.layout,
            },
            done: self.done.clone(),
        });
        true
    }

    /// Hands the jobs queued by this call to the I/O workers (one lock, one wake-up).
    pub fn flush_jobs(&mut self) {
        if !self.pending.is_empty() {
            self.pool.submit_all(self.pending.drain(..));
        }
    }

    /// Whether the write queue is full (nothing counted).
    pub fn write_queue_full(&self) -> bool {
        self.stats.writes_queued as usize >= self.limits.max_writes_queued
    }

    /// Counts a store dropped before it was prepared, when the write queue is full: the caller
    /// then skips the work of sealing it. Returns whether there is room.
    pub fn has_write_room(&mut self) -> bool {
        if (self.stats.writes_queued as usize) < self.limits.max_writes_queued {
            return true;
        }
        self.stats.write_drops += 1;
        false
    }

    /// Whether any write or read is queued or running.
    pub fn busy(&self) -> bool {
        self.stats.reads_in_flight > 0 || self.stats.writes_queued > 0
    }

    /// Collects the finished jobs: completed writes are published, failed ones freed (and
    /// counted); finished reads are returned (a read that failed or did not verify is counted,
    /// its slot dropped, and returned without data).
    pub fn harvest(&mut self) -> Vec<ReadDone> {
        self.flush_jobs();
        let finished: Vec<IoDone> = std::mem::take(&mut *lock(&self.done));
        let mut reads = Vec::new();
        for IoDone { key, buf, outcome } in finished {
            let slot = key.slot as u32;
            match outcome {
                IoOutcome::Written => {
                    self.writing.remove(&key.digest);
                    self.stats.writes_queued -= 1;
                    self.stats.writes += 1;
                    self.stats.write_bytes += self.layout.slot_bytes() as u64;
                    self.publish(slot, key.digest);
                    self.log(SlotChange::Published(key.digest));
                    self.recycle(buf);
                }
                IoOutcome::WriteFailed(errno) => {
                    self.stats.write_errors += 1;
                    if errno == libc::ENOSPC {
                        self.stats.enospc_errors += 1;
                    }
                    self.abandon_write(slot, buf);
                }
                IoOutcome::Read(header) => {
                    self.end_read(slot, false);
                    self.stats.read_bytes += self.layout.slot_bytes() as u64;
                    reads.push(ReadDone {
                        digest: key.digest,
                        data: Some((header, buf)),
                    });
                }
                IoOutcome::ReadFailed(_) | IoOutcome::Refused(_) => {
                    if matches!(outcome, IoOutcome::ReadFailed(_)) {
                        self.stats.read_errors += 1;
                    } else {
                        self.stats.verify_failures += 1;
                    }
                    self.end_read(slot, true);
                    self.recycle(buf);
                    reads.push(ReadDone {
                        digest: key.digest,
                        data: None,
                    });
                }
            }
        }
        reads
    }

    /// A read of `slot` ended; a failed one drops the slot (its bytes cannot be trusted) once
    /// no other read uses it.
    fn end_read(&mut self, slot: u32, failed: bool) {
        self.stats.reads_in_flight -= 1;
        let listed = self.is_listed(slot);
        let SlotState::Valid { readers } = &mut self.states[slot as usize] else {
            return;
        };
        *readers -= 1;
        let left = *readers;
        if failed && listed {
            self.unpublish(slot);
        }
        if left == 0 && !self.is_listed(slot) {
            self.states[slot as usize] = SlotState::Free;
            self.free_slots.push(slot);
        }
    }

    fn is_listed(&self, slot: u32) -> bool {
        self.index.get(&self.digests[slot as usize]) == Some(&slot)
    }

    /// The row bytes of a finished read's buffer.
    pub fn row<'b>(&self, buf: &'b AlignedBuf) -> &'b [u8] {
        let hb = self.layout.header_bytes();
        &buf.as_slice()[hb..hb + self.layout.row_bytes]
    }

    /// Returns a finished read's buffer for reuse.
    pub fn release_buffer(&mut self, buf: AlignedBuf) {
        self.recycle(buf);
    }

    /// Checks the slot states against the index, the LRU and the free list.
    pub fn verify(&self) -> Result<(), String> {
        let mut listed = 0;
        let mut s = self.lru_head;
        while s != NIL {
            listed += 1;
            if !self.is_listed(s) {
                return Err(format!("disk slot {s} is in the LRU but not published"));
            }
            s = self.lru_next[s as usize];
        }
        if listed != self.index.len() {
            return Err("disk LRU and index disagree".into());
        }
        let free = self
            .states
            .iter()
            .filter(|s| **s == SlotState::Free)
            .count();
        if free != self.free_slots.len() {
            return Err(format!(
                "{free} free disk slots but {} listed free",
                self.free_slots.len()
            ));
        }
        let writing = self
            .states
            .iter()
            .filter(|s| **s == SlotState::Writing)
            .count();
        if writing != self.writing.len() || writing as u64 != self.stats.writes_queued {
            return Err("disk writes in flight miscounted".into());
        }
        Ok(())
    }
}
