//! The read side of the lower tiers, once for every backend: the prefix walk of a waiting
//! request that looks up and starts reads of the blocks past the tree (`prefetch_lower`), and
//! the placing of finished reads in the reuse tree as free host blocks, parents before
//! children (`poll_lower`). Only placed blocks are visible to estimates and admission, so a
//! lower-tier hit counts exactly as a host hit.

use super::lower::{Lower, LowerTier, Parent, Presence};
use super::{KeySource, WindowBlockManager};
use crate::pool::Level;
use crate::tier::sealed::prefix_digest;
use crate::tier::{PrefixDigest, ROOT_DIGEST};

/// Where a prefix walk stands: the parent of the next block and the tree block the chain of
/// reads hangs from.
#[derive(Clone, Copy, Debug)]
struct Cursor {
    parent: Parent,
    anchor: u32,
}

/// What a prefetch (or a readiness walk) found of one request's prefix past the tree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct LowerPrefetch {
    /// Blocks whose lookup was queued now.
    pub looked_up: usize,
    /// Reads started now.
    pub started: usize,
    /// Blocks already being read (started by an earlier prefetch).
    pub in_flight: usize,
    /// Blocks whose lookup (queued earlier) has not answered.
    pub waiting: usize,
}

impl WindowBlockManager {
    /// Walks a request's reusable prefix past the tree and past the reads in flight; with
    /// `start`, queues one lookup of the blocks the tier does not know and starts reads of the
    /// leading blocks it holds, into claimed host blocks (as far as they can be claimed).
    /// Reads start one by one or, for a backend that batches them, in one batch at the end.
    pub(super) fn prefetch_lower<T: LowerTier>(
        &mut self,
        src: &KeySource<'_>,
        input_length: usize,
        start: bool,
    ) -> LowerPrefetch {
        let mut out = LowerPrefetch::default();
        if T::of(&mut self.lower).is_none() {
            return out;
        }
        let mut to_read: Vec<(PrefixDigest, u32, Parent)> = Vec::new();
        let mut to_look: Vec<PrefixDigest> = Vec::new();
        self.walk_lower_prefix(src, input_length, |w, cur, digest| {
            if T::held_above(&w.lower, &digest) {
                return false;
            }
            let l = T::of(&mut w.lower).expect("checked");
            if l.reads.contains(&digest) {
                out.in_flight += 1;
                cur.parent = Parent::Read(digest);
                return true;
            }
            match l.tier.presence(&digest) {
                Presence::Present if start && to_look.is_empty() => {
                    let Some(dest) = w.claim_landing_block(cur.anchor) else {
                        return false;
                    };
                    if T::READS_IN_BATCHES {
                        to_read.push((digest, dest, cur.parent));
                    } else {
                        let l = T::of(&mut w.lower).expect("checked");
                        if !l.tier.start_reads(&[digest]) {
                            w.queues.release(dest, Level::Secondary, false, 0);
                            return false;
                        }
                        l.reads.insert(digest, dest, cur.parent);
                        out.started += 1;
                    }
                    cur.parent = Parent::Read(digest);
                    true
                }
                Presence::LookingUp => {
                    out.waiting += 1;
                    false
                }
                Presence::Unknown | Presence::Present if start => {
                    // The rest of the prefix, in one lookup.
                    to_look.push(digest);
                    to_look.len() < T::MAX_LOOKUP_BLOCKS
                }
                _ => false,
            }
        });
        let l = T::of(&mut self.lower).expect("checked");
        if !to_look.is_empty() {
            out.looked_up = l.tier.lookup(&to_look);
        }
        if !to_read.is_empty() {
            let digests: Vec<PrefixDigest> = to_read.iter().map(|r| r.0).collect();
            if l.tier.start_reads(&digests) {
                for (digest, dest, parent) in to_read {
                    l.reads.insert(digest, dest, parent);
                    out.started += 1;
                }
            } else {
                for (_, dest, _) in to_read {
                    self.queues.release(dest, Level::Secondary, false, 0);
                }
            }
        }
        out
    }

    /// Walks a request's reusable prefix: the blocks in the tree (their digests remembered, so
    /// that a long cached prefix is hashed once), then each block past the tree, handed to
    /// `past_tree` with the cursor; the walk goes on while it returns true (it moves the
    /// cursor's parent when it does).
    fn walk_lower_prefix(
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

    /// Places the collected reads whose parent is settled, parents before children, as free
    /// host blocks under their parents (or discards them, counted, when they failed, did not
    /// verify or lost their parent). `l` is out of the window meanwhile. Returns the blocks
    /// placed.
    pub(super) fn poll_lower<T: LowerTier>(&mut self, l: &mut Lower<T>, now_ms: u64) -> usize {
        let mut placed = 0;
        loop {
            let ready = l.reads.ready();
            if ready.is_empty() {
                break;
            }
            for digest in ready {
                let r = l.reads.remove(&digest).expect("listed");
                let done = r.done.expect("done");
                let landed = self.place_read(&l.tier, r.dest, r.parent, &done);
                l.tier.finish(done, landed);
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
                    l.reads.reparent(&c, next);
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
    pub(super) fn verify_reads<T: LowerTier>(
        &self,
        l: &Lower<T>,
        what: &str,
        noun: &str,
    ) -> Result<(), String> {
        for dest in l.reads.destinations() {
            if self.queues.is_queued(dest) || self.arena.ref_count(dest) > 0 {
                return Err(format!(
                    "{what} destination {dest} is not claimed for the {noun}"
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
