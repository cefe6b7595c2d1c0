//! The window's side of the disk tier: blocks the host tier evicts are sealed and written
//! (`spill_to_disk`); a waiting request's disk-resident prefix is read back into claimed host
//! blocks (`disk_prefetch`), and finished reads are verified, chained onto their parents and
//! placed in the reuse tree as free host blocks (`disk_poll`). Only placed blocks are visible
//! to estimates and admission, so they count disk hits exactly as host hits.

use std::collections::HashMap;

use super::lower::{CopyOut, Cursor, LowerTier, Parent, Reads};
use super::{KeySource, WindowBlockManager};
use crate::events::{StoredBlock, WindowEvent};
use crate::pool::Level;
use crate::tier::sealed::{fits, seal_key, SlotHeader};
use crate::tier::{DiskTier, PrefixDigest, ReadDone, SlotChange, TierStats, WritePolicy};

/// The disk tier behind the lower-tier seam: reads come back from its I/O workers.
impl LowerTier for DiskTier {
    type Done = ReadDone;

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

    fn count_write_drop(&mut self) {
        self.stats_mut().write_drops += 1;
    }
}

/// The disk tier of a window and its reads in flight.
#[derive(Debug)]
pub struct WindowDisk {
    pub(super) tier: DiskTier,
    policy: WritePolicy,
    reads: Reads<ReadDone>,
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
            tier,
            policy,
            reads: Reads::default(),
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
        if let Some(d) = &mut self.disk {
            d.tier.flush_jobs();
        }
    }

    /// Attaches a disk tier.
    pub fn attach_disk(&mut self, mut disk: WindowDisk) {
        self.digests.enable(self.arena.len());
        if self.events.is_some() {
            disk.tier.log_changes();
        }
        self.disk = Some(Box::new(disk));
    }

    /// Turns the tier's logged changes into events: a completed write of an announced block is
    /// a `DiskStored`, an announced block leaving the tier a `DiskRemoved`.
    fn record_disk_changes(&mut self, d: &mut WindowDisk) {
        let changes = d.tier.take_changes();
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
        self.disk.is_some()
    }

    /// The disk tier's counters (zeros without one).
    pub fn disk_stats(&self) -> TierStats {
        self.disk
            .as_ref()
            .map_or_else(TierStats::default, |d| d.tier.stats())
    }

    /// The disk tier (tests: fault injection, file mode).
    pub fn disk_tier(&self) -> Option<&DiskTier> {
        self.disk.as_ref().map(|d| &d.tier)
    }

    /// Whether `block` is claimed as the destination of a disk read.
    pub(super) fn is_claimed_by_disk(&self, block: u32) -> bool {
        self.disk
            .as_ref()
            .is_some_and(|d| d.reads.is_claimed(block))
    }

    /// Notes a reuse of `block` (the `Reused` write policy counts them).
    #[inline]
    pub(super) fn note_reuse(&mut self, block: u32) {
        if let Some(d) = &mut self.disk {
            if let Some(h) = d.reuse_hits.get_mut(block as usize) {
                *h = h.saturating_add(1);
            }
        }
    }

    /// Forgets the reuses (and the digest) of a block handed out again.
    #[inline]
    pub(super) fn reset_reuse(&mut self, block: u32) {
        self.digests.forget(block);
        if let Some(d) = &mut self.disk {
            if let Some(h) = d.reuse_hits.get_mut(block as usize) {
                *h = 0;
            }
        }
    }

    /// Writes the cached content of host `block`, which is about to leave the tree, to disk
    /// when the write policy wants it and the write queue has room (otherwise the store is
    /// dropped and counted). The row is read now, before anything can overwrite it.
    pub(super) fn spill_to_disk(&mut self, block: u32) {
        let Some(mut d) = self.disk.take() else {
            return;
        };
        self.spill_with(&mut d, block);
        self.record_disk_changes(&mut d);
        self.disk = Some(d);
    }

    fn spill_with(&mut self, d: &mut WindowDisk, block: u32) {
        // Finished writes free their buffers (and publish their slots) here too, so that the
        // write queue drains even when the engine never polls.
        if d.tier.write_queue_full() {
            d.reads.collect(&mut d.tier);
        }
        if !self.tree.is_in_tree(block) || self.arena.level(block) != Level::Secondary {
            return;
        }
        if d.policy == WritePolicy::Reused && d.reuse_hits.get(block as usize) == Some(&0) {
            d.tier.stats_mut().policy_skips += 1;
            return;
        }
        if !d.tier.has_write_room() {
            return;
        }
        let layout = *d.tier.layout();
        if !fits(&layout, &self.tree.key(block)) {
            d.tier.stats_mut().policy_skips += 1;
            return;
        }
        let (parent, digest) = self.tree_digests(block);
        let Some((slot, mut buf)) = d.tier.prepare_write(&digest) else {
            return;
        };
        let hb = layout.header_bytes();
        let n = layout.row_bytes * self.host_rows(block).count();
        match self.copy_out_rows(&mut d.tier, block, &mut buf.as_mut_slice()[hb..hb + n]) {
            Ok(()) => {}
            Err(CopyOut::NotReady) => {
                d.tier.abandon_write(slot, buf);
                return;
            }
            Err(CopyOut::Failed) => {
                d.tier.stats_mut().write_errors += 1;
                d.tier.abandon_write(slot, buf);
                return;
            }
        }
        seal_key(&layout, buf.as_mut_slice(), &parent, &self.tree.key(block));
        d.tier.submit_write(slot, buf);
        if self.events.is_some() {
            d.announcing.insert(digest, self.stored_block(block));
        }
    }

    /// Walks a request's reusable prefix: the blocks in the tree, then those being read, then
    /// (with `start`) starts reads of those on disk, while host blocks can be claimed for them.
    fn walk_disk_prefix(
        &mut self,
        src: &KeySource<'_>,
        input_length: usize,
        start: bool,
    ) -> DiskPrefetch {
        let mut out = DiskPrefetch::default();
        if self.disk.is_none() {
            return out;
        }
        self.walk_lower_prefix(src, input_length, |w, cur: &mut Cursor, digest| {
            let d = w.disk.as_mut().expect("checked");
            if d.reads.contains(&digest) {
                out.in_flight += 1;
            } else if start && d.tier.contains(&digest) {
                let Some(dest) = w.claim_landing_block(cur.anchor) else {
                    return false;
                };
                let d = w.disk.as_mut().expect("checked");
                if !d.tier.start_read(&digest) {
                    w.queues.release(dest, Level::Secondary, false, 0);
                    return false;
                }
                d.reads.insert(digest, dest, cur.parent);
                out.started += 1;
            } else {
                return false;
            }
            cur.parent = Parent::Read(digest);
            true
        });
        out
    }

    /// Starts reading the disk-resident part of a waiting request's reusable prefix into the
    /// host tier (as far as host blocks can be claimed and the read bound allows). Nothing
    /// waits: the blocks become reusable in a later `disk_poll`.
    pub fn disk_prefetch(&mut self, src: &KeySource<'_>, input_length: usize) -> DiskPrefetch {
        let out = self.walk_disk_prefix(src, input_length, true);
        self.flush_disk_jobs();
        out
    }

    /// Blocks of a request's reusable prefix still being read from disk (0: ready).
    pub fn disk_blocks_in_flight(&mut self, src: &KeySource<'_>, input_length: usize) -> usize {
        self.walk_disk_prefix(src, input_length, false).in_flight
    }

    /// Collects finished disk I/O: published writes, and reads placed in the tree as free host
    /// blocks under their parents (or discarded, counted, when they failed, did not verify or
    /// lost their parent). Returns the blocks placed.
    pub fn disk_poll(&mut self, now_ms: u64) -> usize {
        let Some(mut d) = self.disk.take() else {
            return 0;
        };
        d.reads.collect(&mut d.tier);
        self.record_disk_changes(&mut d);
        let placed = self.poll_lower(&mut d.tier, &mut d.reads, now_ms);
        d.tier.flush_jobs();
        self.disk = Some(d);
        placed
    }

    /// Checks the disk tier's own bookkeeping and that every read's destination is claimed.
    pub(super) fn verify_disk(&self) -> Result<(), String> {
        let Some(d) = &self.disk else {
            return Ok(());
        };
        d.tier.verify()?;
        self.verify_reads(&d.reads, "disk read", "read")
    }
}
