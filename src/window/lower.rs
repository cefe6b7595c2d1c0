//! One mechanism for the tiers below host memory (disk, remote). A lower tier is a backend
//! behind the `LowerTier` seam: it hands back finished reads by prefix digest, says where a
//! read's row bytes are, and counts what the window did with them. Everything else a tier's
//! read path does exists once, here: the prefix-digest walk of a waiting request
//! (`walk_lower_prefix`, the tier deciding per block past the tree), the reads in flight with
//! the parents they hang from (`Reads`), the placing of finished reads in the reuse tree as
//! free host blocks (`poll_lower`), the check that their destinations are claimed, and the
//! copy of a host row out for a write (`copy_out_rows`). A backend's window file adds only
//! what is its own: when it writes, how it looks blocks up, its events.

use std::collections::HashMap;

use super::{KeySource, WindowBlockManager};
use crate::pool::{Level, MemRow};
use crate::tier::sealed::{prefix_digest, SlotHeader};
use crate::tier::{PrefixDigest, ROOT_DIGEST};

/// A tier below host memory, as the window's read path sees it.
pub(super) trait LowerTier {
    /// A finished read: a verified block, or nothing (absent, failed or refused).
    type Done;
    /// Takes the finished reads (and lets the backend finish its other jobs).
    fn harvest_reads(&mut self) -> Vec<(PrefixDigest, Self::Done)>;
    /// The verified header and the row bytes of a finished read (`None`: nothing to place).
    fn block<'a>(&self, done: &'a Self::Done) -> Option<(&'a SlotHeader, &'a [u8])>;
    /// Counts a finished read placed in the tree (a hit) or discarded, and gives back its
    /// buffer.
    fn finish(&mut self, done: Self::Done, placed: bool);
    /// Counts a write dropped because a GPU copy still writes the row.
    fn count_write_drop(&mut self);
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
struct PendingRead<D> {
    /// The claimed host block the bytes go to.
    dest: u32,
    parent: Parent,
    children: Vec<PrefixDigest>,
    done: Option<D>,
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

    /// Whether `block` is the destination of a read in flight.
    pub(super) fn is_claimed(&self, block: u32) -> bool {
        self.pending.values().any(|r| r.dest == block)
    }

    /// Collects the backend's finished reads into their pending entries (those of no pending
    /// read are dropped).
    pub(super) fn collect<T: LowerTier<Done = D>>(&mut self, tier: &mut T) {
        for (digest, done) in tier.harvest_reads() {
            if let Some(r) = self.pending.get_mut(&digest) {
                r.done = Some(done);
            }
        }
    }

    /// The finished reads whose parent is settled (a tree block or gone).
    fn ready(&self) -> Vec<PrefixDigest> {
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

    fn get(&self, block: u32) -> Option<PrefixDigest> {
        self.digests.get(block as usize).copied().flatten()
    }

    fn set(&mut self, block: u32, digest: PrefixDigest) {
        if let Some(d) = self.digests.get_mut(block as usize) {
            *d = Some(digest);
        }
    }
}

/// Where a prefix walk stands: the parent of the next block and the tree block the chain of
/// reads hangs from.
#[derive(Clone, Copy, Debug)]
pub(super) struct Cursor {
    pub parent: Parent,
    pub anchor: u32,
}

/// Why a row could not be copied out for a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CopyOut {
    /// A GPU copy still writes the row (CUDA backend): the write falls behind (counted).
    NotReady,
    /// The engine failed to read the row.
    Failed,
}

impl WindowBlockManager {
    /// The host rows holding a block's bytes, in order. A block's row spans one row per pool of
    /// its window (one pool per window today).
    pub(super) fn host_rows(&self, block: u32) -> impl Iterator<Item = MemRow> {
        std::iter::once(self.arena.row(block))
    }

    /// The prefix digest of a block in the tree and of its parent: a walk up to the root or to
    /// the nearest ancestor whose digest is known, remembering those computed.
    pub(super) fn tree_digests(&mut self, block: u32) -> (PrefixDigest, PrefixDigest) {
        let root = self.tree.root();
        let mut chain = vec![block];
        let mut base = ROOT_DIGEST;
        let mut b = block;
        while let Some(p) = self.tree.parent(b) {
            if p == root {
                break;
            }
            if let Some(known) = self.digests.get(p) {
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
            self.digests.set(b, digest);
        }
        (parent, digest)
    }

    /// Copies the rows of host `block` into `out` (the rows in order, back to back), after the
    /// copies queued by this call (they may write the rows).
    pub(super) fn copy_out_rows<T: LowerTier>(
        &mut self,
        tier: &mut T,
        block: u32,
        out: &mut [u8],
    ) -> Result<(), CopyOut> {
        self.flush_copies();
        let rows: Vec<MemRow> = self.host_rows(block).collect();
        if !rows.iter().all(|&r| self.engine.host_row_ready(r)) {
            tier.count_write_drop();
            return Err(CopyOut::NotReady);
        }
        let n = out.len() / rows.len();
        for (row, chunk) in rows.into_iter().zip(out.chunks_mut(n)) {
            self.engine
                .read_row(row, chunk)
                .map_err(|_| CopyOut::Failed)?;
        }
        Ok(())
    }

    /// Walks a request's reusable prefix: the blocks in the tree (their digests remembered, so
    /// that a long cached prefix is hashed once), then each block past the tree, handed to
    /// `past_tree` with the cursor; the walk goes on while it returns true (it moves the
    /// cursor's parent when it does).
    pub(super) fn walk_lower_prefix(
        &mut self,
        src: &KeySource<'_>,
        input_length: usize,
        mut past_tree: impl FnMut(&mut Self, &mut Cursor, PrefixDigest) -> bool,
    ) {
        if !self.cfg.enable_reuse || input_length < 2 {
            return;
        }
        let tpb = self.cfg.tokens_per_block;
        let reusable = (input_length - 1).min(src.token_ids.len());
        let mut scratch = std::mem::take(&mut self.mm_scratch);
        let root = self.tree.root();
        let mut cur = Cursor {
            parent: Parent::Tree {
                block: root,
                epoch: 0,
            },
            anchor: root,
        };
        let mut parent_digest = ROOT_DIGEST;
        let mut bi = 0;
        while bi * tpb < reusable {
            let (s, e) = (bi * tpb, ((bi + 1) * tpb).min(reusable));
            let key = src.key(s, e, &mut scratch);
            let in_tree = match cur.parent {
                Parent::Tree { block, .. } => {
                    self.tree
                        .find_exact(block, &key, crate::key::lookup_hash(&key))
                }
                _ => None,
            };
            let digest = match in_tree.and_then(|b| self.digests.get(b)) {
                Some(known) => known,
                None => {
                    let x = prefix_digest(&parent_digest, &key);
                    if let Some(b) = in_tree {
                        self.digests.set(b, x);
                    }
                    x
                }
            };
            if let Some(b) = in_tree {
                cur = Cursor {
                    parent: Parent::Tree {
                        block: b,
                        epoch: self.epoch_of(b),
                    },
                    anchor: b,
                };
            } else if !past_tree(self, &mut cur, digest) {
                break;
            }
            parent_digest = digest;
            bi += 1;
        }
        self.mm_scratch = scratch;
    }

    /// Places the finished reads whose parent is settled, parents before children, as free host
    /// blocks under their parents (or discards them, counted, when they failed, did not verify
    /// or lost their parent). Returns the blocks placed.
    pub(super) fn poll_lower<T: LowerTier>(
        &mut self,
        tier: &mut T,
        reads: &mut Reads<T::Done>,
        now_ms: u64,
    ) -> usize {
        let mut placed = 0;
        loop {
            let ready = reads.ready();
            if ready.is_empty() {
                break;
            }
            for digest in ready {
                let r = reads.pending.remove(&digest).expect("listed");
                let done = r.done.expect("done");
                let landed = self.place_read(tier, r.dest, r.parent, &done);
                tier.finish(done, landed);
                placed += landed as usize;
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
                    if let Some(child) = reads.pending.get_mut(&c) {
                        child.parent = next;
                    }
                }
            }
        }
        placed
    }

    /// Places one finished read under its parent; false when it cannot be.
    fn place_read<T: LowerTier>(
        &mut self,
        tier: &T,
        dest: u32,
        parent: Parent,
        done: &T::Done,
    ) -> bool {
        let Some((header, row)) = tier.block(done) else {
            return false;
        };
        match parent {
            Parent::Tree { block, epoch } if self.parent_is_valid(block, epoch) => {
                let key = header.key.as_ref();
                self.tree.set_key(dest, &key);
                if !self.tree.insert(block, dest) {
                    return false;
                }
                if self.engine.write_row(self.arena.row(dest), row).is_ok() {
                    self.record_stored(&[dest]);
                    true
                } else {
                    self.evict_from_tree(dest);
                    false
                }
            }
            _ => false,
        }
    }

    /// Checks that every read's destination is claimed for it (`what` names the tier's read,
    /// `noun` the read).
    pub(super) fn verify_reads<D>(
        &self,
        reads: &Reads<D>,
        what: &str,
        noun: &str,
    ) -> Result<(), String> {
        for r in reads.pending.values() {
            if self.queues.is_queued(r.dest) || self.arena.ref_count(r.dest) > 0 {
                return Err(format!(
                    "{what} destination {} is not claimed for the {noun}",
                    r.dest
                ));
            }
        }
        Ok(())
    }

    /// Claims the next free host block as the destination of a lower-tier read, evicting its
    /// cached content (spilled to disk like any host eviction, not to the remote store). `None`
    /// when no host block is free or the candidate is `anchor` or one of its ancestors (the read
    /// would lose its parent).
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

    /// The allocation epoch of `block` (bumped each time it is handed out).
    pub(super) fn epoch_of(&self, block: u32) -> u32 {
        self.alloc_epoch.get(block as usize).copied().unwrap_or(0)
    }

    /// Whether a read's tree parent still holds: the root, or a block in the tree that was not
    /// handed out again since.
    pub(super) fn parent_is_valid(&self, block: u32, epoch: u32) -> bool {
        block == self.tree.root() || (self.tree.is_in_tree(block) && self.epoch_of(block) == epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend of finished reads handed in by the test: `Some(row)` a verified block.
    struct Fake {
        finished: Vec<(PrefixDigest, Option<Vec<u8>>)>,
    }

    impl LowerTier for Fake {
        type Done = Option<Vec<u8>>;
        fn harvest_reads(&mut self) -> Vec<(PrefixDigest, Self::Done)> {
            std::mem::take(&mut self.finished)
        }
        fn block<'a>(&self, _done: &'a Self::Done) -> Option<(&'a SlotHeader, &'a [u8])> {
            None
        }
        fn finish(&mut self, _done: Self::Done, _placed: bool) {}
        fn count_write_drop(&mut self) {}
    }

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
        let mut tier = Fake {
            finished: vec![(b, Some(vec![1])), (c, Some(vec![2]))],
        };
        reads.collect(&mut tier);
        assert!(reads.ready().is_empty());
        assert!(!reads.contains(&c), "a read nobody waits for is dropped");

        tier.finished = vec![(a, None)];
        reads.collect(&mut tier);
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
