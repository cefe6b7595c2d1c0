//! The window's side of the disk tier: blocks the host tier evicts are sealed and written
//! (`spill_to_disk`); a waiting request's disk-resident prefix is read back into claimed host
//! blocks (`disk_prefetch`), and finished reads are verified, chained onto their parents and
//! placed in the reuse tree as free host blocks (`disk_poll`). Only placed blocks are visible
//! to estimates and admission, so they count disk hits exactly as host hits.

use std::collections::HashMap;

use super::{KeySource, WindowBlockManager};
use crate::events::{StoredBlock, WindowEvent};
use crate::pool::{Level, MemRow};
use crate::tier::sealed::{fits, prefix_digest, seal_key};
use crate::tier::{DiskTier, PrefixDigest, SlotChange, TierStats, WritePolicy, ROOT_DIGEST};

/// Where a read's block hangs in the tree once it is placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Parent {
    /// A block of the tree (the root included), valid while its allocation epoch holds.
    Tree { block: u32, epoch: u32 },
    /// Another read, not placed yet.
    Read(PrefixDigest),
    /// The parent is gone: the read is discarded when it finishes.
    Gone,
}

#[derive(Debug)]
struct PendingRead {
    /// The claimed host block the bytes go to.
    dest: u32,
    parent: Parent,
    children: Vec<PrefixDigest>,
    done: Option<crate::tier::ReadDone>,
}

/// The disk tier of a window and its reads in flight.
#[derive(Debug)]
pub struct WindowDisk {
    pub(super) tier: DiskTier,
    policy: WritePolicy,
    reads: HashMap<PrefixDigest, PendingRead>,
    /// Times each block was reused since it was last allocated (for `WritePolicy::Reused`).
    reuse_hits: Vec<u8>,
    /// Prefix digest of blocks in the tree, computed on demand: valid while the block stays in
    /// the tree (its key and parent do not change there), forgotten when it leaves.
    digests: Vec<Option<PrefixDigest>>,
    /// With events on: the block of each write in flight (its parent's hash and itself, as in
    /// the tree when it was spilled), announced when the write completes.
    announcing: HashMap<PrefixDigest, (Option<u64>, StoredBlock)>,
    /// With events on: the tree hash of each announced block on disk, for its removal.
    announced: HashMap<PrefixDigest, u64>,
}

impl WindowDisk {
    pub fn new(tier: DiskTier, policy: WritePolicy, num_blocks: usize) -> Self {
        WindowDisk {
            tier,
            policy,
            reads: HashMap::new(),
            reuse_hits: if policy == WritePolicy::Reused {
                vec![0; num_blocks]
            } else {
                Vec::new()
            },
            digests: vec![None; num_blocks],
            announcing: HashMap::new(),
            announced: HashMap::new(),
        }
    }

    /// The block left the tree: its digest no longer holds.
    #[inline]
    pub(super) fn forget_digest(&mut self, block: u32) {
        if let Some(d) = self.digests.get_mut(block as usize) {
            *d = None;
        }
    }

    /// Forgets every digest (the tree was restored from a snapshot).
    pub(super) fn forget_all_digests(&mut self) {
        self.digests.fill(None);
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

/// Collects the tier's finished jobs: writes are published, reads wait in their pending entry
/// for `disk_poll` to place them.
fn collect_finished(d: &mut WindowDisk) {
    for done in d.tier.harvest() {
        if let Some(r) = d.reads.get_mut(&done.digest) {
            r.done = Some(done);
        }
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
            .is_some_and(|d| d.reads.values().any(|r| r.dest == block))
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
        if let Some(d) = &mut self.disk {
            d.forget_digest(block);
            if let Some(h) = d.reuse_hits.get_mut(block as usize) {
                *h = 0;
            }
        }
    }

    /// The host rows holding a block's bytes, in order. A block's row spans one row per pool of
    /// its window (one pool per window today).
    pub(super) fn host_rows(&self, block: u32) -> impl Iterator<Item = MemRow> {
        std::iter::once(self.arena.row(block))
    }

    /// The prefix digest of a block in the tree and of its parent: a walk up to the root or to
    /// the nearest ancestor whose digest is known, remembering those computed.
    fn tree_digests(&self, d: &mut WindowDisk, block: u32) -> (PrefixDigest, PrefixDigest) {
        let root = self.tree.root();
        let mut chain = vec![block];
        let mut base = ROOT_DIGEST;
        let mut b = block;
        while let Some(p) = self.tree.parent(b) {
            if p == root {
                break;
            }
            if let Some(known) = d.digests[p as usize] {
                base = known;
                break;
            }
            chain.push(p);
            b = p;
        }
        let mut parent = base;
        let mut digest = base;
        for &b in chain.iter().rev() {
            parent = digest;
            digest = prefix_digest(&parent, &self.tree.key(b));
            d.digests[b as usize] = Some(digest);
        }
        (parent, digest)
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
            collect_finished(d);
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
        let (parent, digest) = self.tree_digests(d, block);
        let Some((slot, mut buf)) = d.tier.prepare_write(&digest) else {
            return;
        };
        // Copies queued by this call may write the row: they go first.
        self.flush_copies();
        let rows: Vec<MemRow> = self.host_rows(block).collect();
        if !rows.iter().all(|&r| self.engine.host_row_ready(r)) {
            // A GPU copy still writes the row (CUDA backend): the store falls behind, dropped.
            d.tier.stats_mut().write_drops += 1;
            d.tier.abandon_write(slot, buf);
            return;
        }
        let hb = layout.header_bytes();
        let mut at = hb;
        let mut ok = true;
        for row in rows {
            let n = layout.row_bytes;
            if self
                .engine
                .read_row(row, &mut buf.as_mut_slice()[at..at + n])
                .is_err()
            {
                ok = false;
                break;
            }
            at += n;
        }
        if !ok {
            d.tier.stats_mut().write_errors += 1;
            d.tier.abandon_write(slot, buf);
            return;
        }
        seal_key(&layout, buf.as_mut_slice(), &parent, &self.tree.key(block));
        d.tier.submit_write(slot, buf);
        if self.events.is_some() {
            d.announcing.insert(digest, self.stored_block(block));
        }
    }

    /// Claims the next free host block as the destination of a disk read, evicting its cached
    /// content (spilled to disk like any host eviction). `None` when no host block is free or
    /// the candidate is `anchor` or one of its ancestors (the read would lose its parent).
    pub(super) fn claim_landing_block(&mut self, anchor: u32) -> Option<u32> {
        let (cand, _) = self.queues.peek(Level::Secondary)?;
        if self.tree.is_in_tree(cand) {
            if cand == anchor || self.tree.is_ancestor_within(cand, anchor, 64) != Some(false) {
                return None;
            }
            self.spill_to_disk(cand);
            self.evict_from_tree(cand);
        }
        self.queues.claim(cand);
        self.bump_epoch(cand);
        self.reset_reuse(cand);
        self.tree.disown_key(cand);
        Some(cand)
    }

    pub(super) fn epoch_of(&self, block: u32) -> u32 {
        self.alloc_epoch.get(block as usize).copied().unwrap_or(0)
    }

    pub(super) fn parent_is_valid(&self, block: u32, epoch: u32) -> bool {
        block == self.tree.root() || (self.tree.is_in_tree(block) && self.epoch_of(block) == epoch)
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
        if !self.cfg.enable_reuse || self.disk.is_none() || input_length < 2 {
            return out;
        }
        let tpb = self.cfg.tokens_per_block;
        let reusable = (input_length - 1).min(src.token_ids.len());
        let mut scratch = std::mem::take(&mut self.mm_scratch);
        let mut parent = Parent::Tree {
            block: self.tree.root(),
            epoch: 0,
        };
        // The tree block the chain of reads hangs from.
        let mut anchor = self.tree.root();
        let mut parent_digest = ROOT_DIGEST;
        let mut bi = 0;
        while bi * tpb < reusable {
            let (s, e) = (bi * tpb, ((bi + 1) * tpb).min(reusable));
            let key = src.key(s, e, &mut scratch);
            let in_tree = match parent {
                Parent::Tree { block, .. } => {
                    self.tree
                        .find_exact(block, &key, crate::key::lookup_hash(&key))
                }
                _ => None,
            };
            let d = self.disk.as_mut().expect("checked");
            // Blocks in the tree remember their digest: a long cached prefix is hashed once.
            let digest = match in_tree.and_then(|b| d.digests[b as usize]) {
                Some(known) => known,
                None => {
                    let x = prefix_digest(&parent_digest, &key);
                    if let Some(b) = in_tree {
                        d.digests[b as usize] = Some(x);
                    }
                    x
                }
            };
            if let Some(b) = in_tree {
                parent = Parent::Tree {
                    block: b,
                    epoch: self.epoch_of(b),
                };
                anchor = b;
            } else if d.reads.contains_key(&digest) {
                out.in_flight += 1;
                parent = Parent::Read(digest);
            } else if start && d.tier.contains(&digest) {
                let Some(dest) = self.claim_landing_block(anchor) else {
                    break;
                };
                let d = self.disk.as_mut().expect("checked");
                if !d.tier.start_read(&digest) {
                    self.queues.release(dest, Level::Secondary, false, 0);
                    break;
                }
                if let Parent::Read(p) = parent {
                    if let Some(r) = d.reads.get_mut(&p) {
                        r.children.push(digest);
                    }
                }
                d.reads.insert(
                    digest,
                    PendingRead {
                        dest,
                        parent,
                        children: Vec::new(),
                        done: None,
                    },
                );
                out.started += 1;
                parent = Parent::Read(digest);
            } else {
                break;
            }
            parent_digest = digest;
            bi += 1;
        }
        self.mm_scratch = scratch;
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
        collect_finished(&mut d);
        self.record_disk_changes(&mut d);
        let mut placed = 0;
        loop {
            let ready: Vec<PrefixDigest> = d
                .reads
                .iter()
                .filter(|(_, r)| r.done.is_some() && !matches!(r.parent, Parent::Read(_)))
                .map(|(k, _)| *k)
                .collect();
            if ready.is_empty() {
                break;
            }
            for digest in ready {
                let r = d.reads.remove(&digest).expect("listed");
                let landed = self.place_read(&mut d, r.dest, r.parent, r.done.expect("done"));
                if landed {
                    placed += 1;
                }
                self.queues.release(r.dest, Level::Secondary, false, now_ms);
                let next = if landed {
                    Parent::Tree {
                        block: r.dest,
                        epoch: self.epoch_of(r.dest),
                    }
                } else {
                    Parent::Gone
                };
                for c in r.children {
                    if let Some(child) = d.reads.get_mut(&c) {
                        child.parent = next;
                    }
                }
            }
        }
        d.tier.flush_jobs();
        self.disk = Some(d);
        placed
    }

    /// Places one finished read under its parent; false when it cannot be.
    fn place_read(
        &mut self,
        d: &mut WindowDisk,
        dest: u32,
        parent: Parent,
        done: crate::tier::ReadDone,
    ) -> bool {
        let Some((header, buf)) = done.data else {
            return false;
        };
        let placed = match parent {
            Parent::Tree { block, epoch } if self.parent_is_valid(block, epoch) => {
                let key = header.key.as_ref();
                self.tree.set_key(dest, &key);
                if self.tree.insert(block, dest) {
                    let row = self.arena.row(dest);
                    if self.engine.write_row(row, d.tier.row(&buf)).is_ok() {
                        self.record_stored(&[dest]);
                        true
                    } else {
                        self.evict_from_tree(dest);
                        false
                    }
                } else {
                    false
                }
            }
            _ => false,
        };
        if placed {
            d.tier.stats_mut().hits += 1;
        } else {
            d.tier.stats_mut().reads_discarded += 1;
        }
        d.tier.release_buffer(buf);
        placed
    }

    /// Checks the disk tier's own bookkeeping and that every read's destination is claimed.
    pub(super) fn verify_disk(&self) -> Result<(), String> {
        let Some(d) = &self.disk else {
            return Ok(());
        };
        d.tier.verify()?;
        for r in d.reads.values() {
            if self.queues.is_queued(r.dest) || self.arena.ref_count(r.dest) > 0 {
                return Err(format!(
                    "disk read destination {} is not claimed for the read",
                    r.dest
                ));
            }
        }
        Ok(())
    }
}
