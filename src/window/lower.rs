//! One mechanism for the tiers below host memory (disk, remote). A lower tier is a backend
//! behind the `LowerTier` seam: it says what it holds, starts reads by prefix digest and hands
//! them back finished, and prepares, fills and sends writes. Everything else a tier does in a
//! window exists once: the prefix walk of a waiting request that starts lookups and reads
//! (`lower_read.rs`: `prefetch_lower`), the reads in flight with the parents they hang from
//! (`Reads`, here), the placing of finished reads in the reuse tree as free host blocks
//! (`poll_lower`), and the write of a chain of cached blocks with their rows copied out
//! (`lower_write.rs`: `write_lower`). A backend's window file adds only what is its own: its
//! write policy, its events, and how it answers the seam.

use std::collections::HashMap;

use super::LowerTiers;
use crate::key::BlockKeyRef;
use crate::tier::sealed::SlotHeader;
use crate::tier::PrefixDigest;

/// What a lower tier knows of a block now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Presence {
    /// It holds the block: a read can start.
    Present,
    /// It does not hold the block (or said so recently).
    Absent,
    /// A lookup of the block is in flight.
    LookingUp,
    /// Not known without a lookup (a shared store another instance writes).
    Unknown,
}

/// A tier below host memory, as a window sees it.
pub(super) trait LowerTier: Sized {
    /// A finished read: a verified block, or nothing (absent, failed or refused).
    type Done;
    /// A write being prepared: the backend's buffer (and slot) for one block.
    type Write;
    /// Whether reads start in one batch per walk (a pipelined store) rather than one by one
    /// (local I/O, where each read is independent).
    const READS_IN_BATCHES: bool;
    /// Whether the backend's jobs go to its workers once, at the end of the manager call (one
    /// lock, one wake-up): its own writes then do not hand them over early.
    const JOBS_AT_END_OF_CALL: bool = false;
    /// Most blocks of one request looked up at once.
    const MAX_LOOKUP_BLOCKS: usize = 256;

    /// The window's instance of this tier, if attached.
    fn of(tiers: &mut LowerTiers) -> Option<&mut Lower<Self>>;
    /// Whether a tier above this one holds or is writing the block (it brings it back then).
    fn held_above(_tiers: &LowerTiers, _digest: &PrefixDigest) -> bool {
        false
    }

    /// What the tier knows of `digest` now.
    fn presence(&self, digest: &PrefixDigest) -> Presence;
    /// Queues one lookup of the `Unknown` blocks of `digests`; returns the keys asked.
    fn lookup(&mut self, digests: &[PrefixDigest]) -> usize;
    /// Starts reads of `digests` (blocks present), all or none (a refusal is counted).
    fn start_reads(&mut self, digests: &[PrefixDigest]) -> bool;
    /// Takes the finished reads (and lets the backend finish its other jobs).
    fn harvest_reads(&mut self) -> Vec<(PrefixDigest, Self::Done)>;
    /// The verified header and the row bytes of a finished read (`None`: nothing to place).
    fn block<'a>(&self, done: &'a Self::Done) -> Option<(&'a SlotHeader, &'a [u8])>;
    /// Counts a finished read placed in the tree (a hit) or discarded, and gives back its
    /// buffer.
    fn finish(&mut self, done: Self::Done, placed: bool);

    /// Whether finished jobs should be harvested before a write (to free the write queue).
    fn harvest_before_write(&self) -> bool;
    /// Whether the write queue has room for one more block (a drop is counted when not),
    /// asked before the block is hashed: a full local queue then costs no hashing. A backend
    /// that decides room after its other checks (in `prepare_write`) keeps the default.
    fn has_write_room(&mut self) -> bool {
        true
    }
    /// Prepares the write of the block `digest` (the child of `parent`, with `key`), or `None`
    /// (counted) when the tier does not want it: held or being written, a key too large for a
    /// header, no buffer or slot.
    fn prepare_write(
        &mut self,
        parent: &PrefixDigest,
        digest: &PrefixDigest,
        key: &BlockKeyRef<'_>,
    ) -> Option<Self::Write>;
    /// The bytes a prepared write's row goes to (the block's rows back to back).
    fn rows_mut(write: &mut Self::Write) -> &mut [u8];
    /// Queues a prepared write whose row is filled.
    fn submit_write(&mut self, write: Self::Write);
    /// Gives back a prepared write that will not be sent; `failed`: its row could not be read
    /// (counted by the tier).
    fn abandon_write(&mut self, write: Self::Write, failed: bool);
    /// Ends a run of writes (a backend that pipelines its writes sends them now).
    fn end_writes(&mut self);
    /// Counts a write dropped because a GPU copy still writes the row.
    fn count_write_drop(&mut self);
}

/// A lower tier in a window: the backend and its reads in flight.
#[derive(Debug)]
pub struct Lower<T: LowerTier> {
    pub(super) tier: T,
    pub(super) reads: Reads<T::Done>,
}

impl<T: LowerTier> Lower<T> {
    pub(super) fn new(tier: T) -> Self {
        Lower {
            tier,
            reads: Reads::default(),
        }
    }

    /// Collects the backend's finished reads into the reads waiting for them.
    pub(super) fn collect(&mut self) {
        self.reads.collect(self.tier.harvest_reads());
    }
}

/// Where a read's block hangs in the tree once it is placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Parent {
    /// A block of the tree (the root included), valid while its allocation epoch holds.
    Tree { block: u32, epoch: u32 },
    /// Another read, not placed yet.
    Read(PrefixDigest),
    /// The parent is gone: the read is discarded when it finishes.
    Gone,
}

#[derive(Debug)]
pub(super) struct PendingRead<D> {
    /// The claimed host block the bytes go to.
    pub(super) dest: u32,
    pub(super) parent: Parent,
    /// The reads hanging from this one.
    pub(super) children: Vec<PrefixDigest>,
    pub(super) done: Option<D>,
}

/// A lower tier's reads in flight, by prefix digest.
#[derive(Debug)]
pub(super) struct Reads<D> {
    pending: HashMap<PrefixDigest, PendingRead<D>>,
}

impl<D> Default for Reads<D> {
    fn default() -> Self {
        Reads {
            pending: HashMap::new(),
        }
    }
}

impl<D> Reads<D> {
    /// Whether a read of this digest is in flight.
    pub(super) fn contains(&self, digest: &PrefixDigest) -> bool {
        self.pending.contains_key(digest)
    }

    /// Records a read started into the claimed host block `dest`, under `parent`.
    pub(super) fn insert(&mut self, digest: PrefixDigest, dest: u32, parent: Parent) {
        if let Parent::Read(p) = parent {
            if let Some(r) = self.pending.get_mut(&p) {
                r.children.push(digest);
            }
        }
        self.pending.insert(
            digest,
            PendingRead {
                dest,
                parent,
                children: Vec::new(),
                done: None,
            },
        );
    }

    /// Removes a read (finished, listed by `ready`).
    pub(super) fn remove(&mut self, digest: &PrefixDigest) -> Option<PendingRead<D>> {
        self.pending.remove(digest)
    }

    /// Hangs a read from another parent (its own was placed or is gone).
    pub(super) fn reparent(&mut self, digest: &PrefixDigest, parent: Parent) {
        if let Some(r) = self.pending.get_mut(digest) {
            r.parent = parent;
        }
    }

    /// The destinations of the reads in flight.
    pub(super) fn destinations(&self) -> impl Iterator<Item = u32> + '_ {
        self.pending.values().map(|r| r.dest)
    }

    /// Whether `block` is the destination of a read in flight.
    pub(super) fn is_claimed(&self, block: u32) -> bool {
        self.pending.values().any(|r| r.dest == block)
    }

    /// Hands finished reads to their pending entries (those of no pending read are dropped).
    fn collect(&mut self, finished: Vec<(PrefixDigest, D)>) {
        for (digest, done) in finished {
            if let Some(r) = self.pending.get_mut(&digest) {
                r.done = Some(done);
            }
        }
    }

    /// The finished reads whose parent is settled (a tree block or gone).
    pub(super) fn ready(&self) -> Vec<PrefixDigest> {
        self.pending
            .iter()
            .filter(|(_, r)| r.done.is_some() && !matches!(r.parent, Parent::Read(_)))
            .map(|(k, _)| *k)
            .collect()
    }
}

/// The prefix digest of each block of the tree, computed on demand: valid while the block stays
/// in the tree (its key and parent do not change there), forgotten when it leaves. Empty (and
/// then never used) without a lower tier.
#[derive(Clone, Debug, Default)]
pub(super) struct DigestCache {
    digests: Vec<Option<PrefixDigest>>,
}

impl DigestCache {
    /// Sizes the cache for `num_blocks` blocks (a lower tier was attached).
    pub(super) fn enable(&mut self, num_blocks: usize) {
        if self.digests.len() < num_blocks {
            self.digests.resize(num_blocks, None);
        }
    }

    /// The block left the tree: its digest no longer holds.
    #[inline]
    pub(super) fn forget(&mut self, block: u32) {
        if let Some(d) = self.digests.get_mut(block as usize) {
            *d = None;
        }
    }

    /// Forgets every digest (the tree was restored from a snapshot).
    pub(super) fn forget_all(&mut self) {
        self.digests.fill(None);
    }

    pub(super) fn get(&self, block: u32) -> Option<PrefixDigest> {
        self.digests.get(block as usize).copied().flatten()
    }

    pub(super) fn set(&mut self, block: u32, digest: PrefixDigest) {
        if let Some(d) = self.digests.get_mut(block as usize) {
            *d = Some(digest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier::ROOT_DIGEST;

    fn digest(n: u8) -> PrefixDigest {
        let mut d = ROOT_DIGEST;
        d[0] = n;
        d
    }

    #[test]
    fn a_read_is_ready_only_once_finished_and_its_parent_settled() {
        let (a, b, c) = (digest(1), digest(2), digest(3));
        let mut reads: Reads<Option<Vec<u8>>> = Reads::default();
        reads.insert(a, 10, Parent::Tree { block: 0, epoch: 0 });
        reads.insert(b, 11, Parent::Read(a));
        assert!(reads.contains(&a) && reads.contains(&b) && !reads.contains(&c));
        assert!(reads.is_claimed(11) && !reads.is_claimed(12));
        assert_eq!(reads.pending[&a].children, vec![b]);

        // The child finishes first: it waits for its parent.
        reads.collect(vec![(b, Some(vec![1])), (c, Some(vec![2]))]);
        assert!(reads.ready().is_empty());
        assert!(!reads.contains(&c), "a read nobody waits for is dropped");

        reads.collect(vec![(a, None)]);
        assert_eq!(reads.ready(), vec![a]);
    }

    #[test]
    fn the_digest_cache_is_off_until_enabled_and_forgets() {
        let mut cache = DigestCache::default();
        cache.set(3, digest(7));
        assert_eq!(cache.get(3), None);
        cache.enable(8);
        cache.set(3, digest(7));
        assert_eq!(cache.get(3), Some(digest(7)));
        cache.forget(3);
        assert_eq!(cache.get(3), None);
        cache.set(5, digest(9));
        cache.forget_all();
        assert_eq!(cache.get(5), None);
    }
}
