//! The window's side of the disk tier: blocks the host tier evicts are sealed and written
//! (`spill_to_disk`); a waiting request's disk-resident prefix is read back into claimed host
//! blocks (`disk_prefetch`), and finished reads are verified, chained onto their parents and
//! placed in the reuse tree as free host blocks (`disk_poll`). Only placed blocks are visible
//! to estimates and admission, so they count disk hits exactly as host hits.

use std::collections::HashMap;

use super::lower::{Lower, LowerTier, Presence};
use super::{KeySource, LowerTiers, WindowBlockManager};
use crate::events::{StoredBlock, WindowEvent};
use crate::key::BlockKeyRef;
use crate::pool::Level;
use crate::tier::sealed::{fits, seal_key, SlotHeader};
use crate::tier::store::AlignedBuf;
use crate::tier::{DiskTier, PrefixDigest, ReadDone, SlotChange, TierStats, WritePolicy};

/// A prepared disk write: the slot and its buffer, the key already in its header.
#[derive(Debug)]
pub struct DiskWrite {
    slot: u32,
    buf: AlignedBuf,
    /// Where the row goes in the buffer.
    row: std::ops::Range<usize>,
}

/// The disk tier behind the lower-tier seam: a local file whose index says at once what it
/// holds; each read is its own job on the I/O workers, and writes go at the end of the call.
impl LowerTier for DiskTier {
    type Done = ReadDone;
    type Write = DiskWrite;
    const READS_IN_BATCHES: bool = false;
    const JOBS_AT_END_OF_CALL: bool = true;

    fn of(tiers: &mut LowerTiers) -> Option<&mut Lower<Self>> {
        tiers.disk.as_deref_mut().map(|d| &mut d.lower)
    }

    fn presence(&self, digest: &PrefixDigest) -> Presence {
        if self.contains(digest) {
            Presence::Present
        } else {
            Presence::Absent
        }
    }

    fn lookup(&mut self, _digests: &[PrefixDigest]) -> usize {
        0 // the index knows: nothing is ever Unknown
    }

    fn start_reads(&mut self, digests: &[PrefixDigest]) -> bool {
        digests.iter().all(|d| self.start_read(d))
    }

    fn harvest_reads(&mut self) -> Vec<(PrefixDigest, ReadDone)> {
        self.harvest().into_iter().map(|d| (d.digest, d)).collect()
    }

    fn block<'a>(&self, done: &'a ReadDone) -> Option<(&'a SlotHeader, &'a [u8])> {
        done.data.as_ref().map(|(h, buf)| (&**h, self.row(buf)))
    }

    fn finish(&mut self, done: ReadDone, placed: bool) {
        if let Some((_, buf)) = done.data {
            if placed {
                self.stats_mut().hits += 1;
            } else {
                self.stats_mut().reads_discarded += 1;
            }
            self.release_buffer(buf);
        }
    }

    fn harvest_before_write(&self) -> bool {
        self.write_queue_full()
    }

    fn has_write_room(&mut self) -> bool {
        DiskTier::has_write_room(self)
    }

    fn prepare_write(
        &mut self,
        parent: &PrefixDigest,
        digest: &PrefixDigest,
        key: &BlockKeyRef<'_>,
    ) -> Option<DiskWrite> {
        let layout = *self.layout();
        if !fits(&layout, key) {
            self.stats_mut().policy_skips += 1;
            return None;
        }
        let (slot, mut buf) = DiskTier::prepare_write(self, digest)?;
        seal_key(&layout, buf.as_mut_slice(), parent, key);
        let hb = layout.header_bytes();
        Some(DiskWrite {
            slot,
            buf,
            row: hb..hb + layout.row_bytes,
        })
    }

    fn rows_mut(write: &mut DiskWrite) -> &mut [u8] {
        &mut write.buf.as_mut_slice()[write.row.clone()]
    }

    fn submit_write(&mut self, write: DiskWrite) {
        DiskTier::submit_write(self, write.slot, write.buf);
    }

    fn abandon_write(&mut self, write: DiskWrite, failed: bool) {
        if failed {
            self.stats_mut().write_errors += 1;
        }
        DiskTier::abandon_write(self, write.slot, write.buf);
    }

    fn end_writes(&mut self) {
        // `JOBS_AT_END_OF_CALL`: `flush_disk_jobs` hands them over.
    }

    fn count_write_drop(&mut self) {
        self.stats_mut().write_drops += 1;
    }
}

/// The disk tier of a window and its reads in flight.
#[derive(Debug)]
pub struct WindowDisk {
    pub(super) lower: Lower<DiskTier>,
    policy: WritePolicy,
    /// Times each block was reused since it was last allocated (for `WritePolicy::Reused`).
    reuse_hits: Vec<u8>,
    /// With events on: the block of each write in flight (its parent's hash and itself, as in
    /// the tree when it was spilled), announced when the write completes.
    announcing: HashMap<PrefixDigest, (Option<u64>, StoredBlock)>,
    /// With events on: the tree hash of each announced block on disk, for its removal.
    announced: HashMap<PrefixDigest, u64>,
}

impl WindowDisk {
    /// A window's disk tier, writing under `policy`, for a window of `num_blocks` blocks.
    pub fn new(tier: DiskTier, policy: WritePolicy, num_blocks: usize) -> Self {
        WindowDisk {
            lower: Lower::new(tier),
            policy,
            reuse_hits: if policy == WritePolicy::Reused {
                vec![0; num_blocks]
            } else {
                Vec::new()
            },
            announcing: HashMap::new(),
            announced: HashMap::new(),
        }
    }
}

/// What a prefetch did for one request in one window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskPrefetch {
    /// Reads started now.
    pub started: usize,
    /// Prefix blocks already being read (by an earlier prefetch).
    pub in_flight: usize,
}

impl std::ops::AddAssign for DiskPrefetch {
    fn add_assign(&mut self, o: DiskPrefetch) {
        self.started += o.started;
        self.in_flight += o.in_flight;
    }
}

impl WindowBlockManager {
    /// Hands the disk jobs of the running call to the I/O workers.
    #[inline]
    pub(super) fn flush_disk_jobs(&mut self) {
        if let Some(d) = &mut self.lower.disk {
            d.lower.tier.flush_jobs();
        }
    }

    /// Attaches a disk tier.
    pub fn attach_disk(&mut self, mut disk: WindowDisk) {
        self.digests.enable(self.arena.len());
        if self.events.is_some() {
            disk.lower.tier.log_changes();
        }
        self.lower.disk = Some(Box::new(disk));
    }

    /// Turns the tier's logged changes into events: a completed write of an announced block is
    /// a `DiskStored`, an announced block leaving the tier a `DiskRemoved`.
    fn record_disk_changes(&mut self) {
        let Some(d) = self.lower.disk.as_deref_mut() else {
            return;
        };
        let changes = d.lower.tier.take_changes();
        let Some(events) = &mut self.events else {
            return;
        };
        for change in changes {
            match change {
                SlotChange::Published(digest) => {
                    if let Some((parent_hash, block)) = d.announcing.remove(&digest) {
                        d.announced.insert(digest, block.hash);
                        events.push(WindowEvent::DiskStored { parent_hash, block });
                    }
                }
                SlotChange::Unpublished(digest) => {
                    if let Some(hash) = d.announced.remove(&digest) {
                        events.push(WindowEvent::DiskRemoved(hash));
                    }
                }
                SlotChange::Abandoned(digest) => {
                    d.announcing.remove(&digest);
                }
            }
        }
    }

    /// The block as a Stored event describes it, with its parent's hash (`None` = the root).
    fn stored_block(&self, block: u32) -> (Option<u64>, StoredBlock) {
        let parent = self.tree.parent(block).expect("in the tree");
        let parent_hash = (parent != self.tree.root()).then(|| self.tree.hash(parent));
        let key = self.tree.key(block);
        let b = StoredBlock {
            hash: self.tree.hash(block),
            token_ids: key.token_ids.to_vec(),
            extra_ids: key.extra_ids.map(|e| e.to_vec()),
            lora_task_id: key.lora_task_id,
            cache_level: self.arena.level(block),
            priority: self.queues.priority(block),
            mm_keys: key.extra_keys.to_vec(),
            cache_salt: key.cache_salt,
        };
        (parent_hash, b)
    }

    /// Whether a disk tier is attached.
    pub fn has_disk(&self) -> bool {
        self.lower.disk.is_some()
    }

    /// The disk tier's counters (zeros without one).
    pub fn disk_stats(&self) -> TierStats {
        self.lower
            .disk
            .as_ref()
            .map_or_else(TierStats::default, |d| d.lower.tier.stats())
    }

    /// The disk tier (tests: fault injection, file mode).
    pub fn disk_tier(&self) -> Option<&DiskTier> {
        self.lower.disk.as_ref().map(|d| &d.lower.tier)
    }

    /// Whether `block` is claimed as the destination of a disk read.
    pub(super) fn is_claimed_by_disk(&self, block: u32) -> bool {
        self.lower
            .disk
            .as_ref()
            .is_some_and(|d| d.lower.reads.is_claimed(block))
    }

    /// Notes a reuse of `block` (the `Reused` write policy counts them).
    #[inline]
    pub(super) fn note_reuse(&mut self, block: u32) {
        if let Some(d) = &mut self.lower.disk {
            if let Some(h) = d.reuse_hits.get_mut(block as usize) {
                *h = h.saturating_add(1);
            }
        }
    }

    /// Forgets the reuses (and the digest) of a block handed out again.
    #[inline]
    pub(super) fn reset_reuse(&mut self, block: u32) {
        self.digests.forget(block);
        if let Some(d) = &mut self.lower.disk {
            if let Some(h) = d.reuse_hits.get_mut(block as usize) {
                *h = 0;
            }
        }
    }

    /// Writes the cached content of host `block`, which is about to leave the tree, to disk
    /// when the write policy wants it and the write queue has room (otherwise the store is
    /// dropped and counted). The row is read now, before anything can overwrite it.
    pub(super) fn spill_to_disk(&mut self, block: u32) {
        let Some(d) = self.lower.disk.as_deref_mut() else {
            return;
        };
        if self.tree.is_in_tree(block) && self.arena.level(block) == Level::Secondary {
            if d.policy == WritePolicy::Reused && d.reuse_hits.get(block as usize) == Some(&0) {
                d.lower.tier.stats_mut().policy_skips += 1;
            } else {
                self.write_lower::<DiskTier>(&[block], |w, block, digest| {
                    if w.events.is_some() {
                        let announced = w.stored_block(block);
                        let d = w.lower.disk.as_deref_mut().expect("writing");
                        d.announcing.insert(digest, announced);
                    }
                });
            }
        }
        self.record_disk_changes();
    }

    /// Starts reading the disk-resident part of a waiting request's reusable prefix into the
    /// host tier (as far as host blocks can be claimed and the read bound allows). Nothing
    /// waits: the blocks become reusable in a later `disk_poll`.
    pub fn disk_prefetch(&mut self, src: &KeySource<'_>, input_length: usize) -> DiskPrefetch {
        let p = self.prefetch_lower::<DiskTier>(src, input_length, true);
        self.flush_disk_jobs();
        DiskPrefetch {
            started: p.started,
            in_flight: p.in_flight,
        }
    }

    /// Blocks of a request's reusable prefix still being read from disk (0: ready).
    pub fn disk_blocks_in_flight(&mut self, src: &KeySource<'_>, input_length: usize) -> usize {
        self.prefetch_lower::<DiskTier>(src, input_length, false)
            .in_flight
    }

    /// Collects finished disk I/O: published writes, and reads placed in the tree as free host
    /// blocks under their parents (or discarded, counted, when they failed, did not verify or
    /// lost their parent). Returns the blocks placed.
    pub fn disk_poll(&mut self, now_ms: u64) -> usize {
        let Some(mut d) = self.lower.disk.take() else {
            return 0;
        };
        d.lower.collect();
        self.lower.disk = Some(d);
        self.record_disk_changes();
        let mut d = self.lower.disk.take().expect("attached");
        let placed = self.poll_lower(&mut d.lower, now_ms);
        d.lower.tier.flush_jobs();
        self.lower.disk = Some(d);
        placed
    }

    /// Checks the disk tier's own bookkeeping and that every read's destination is claimed.
    pub(super) fn verify_disk(&self) -> Result<(), String> {
        let Some(d) = &self.lower.disk else {
            return Ok(());
        };
        d.lower.tier.verify()?;
        self.verify_reads(&d.lower, "disk read", "read")
    }
}
