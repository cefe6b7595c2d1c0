//! The window's side of the shared remote tier. Write path: blocks newly stored for reuse are
//! copied out of their rows and queued for the store (`remote_write_stored`, the `OnStore`
//! policy), or those the host tier evicts (`OnHostEvict`). Read path, the disk tier's
//! contract: a waiting request's prefix past the tree (and past what the disk holds) is looked
//! up in one pipelined batch; the blocks found are fetched in one pipelined batch into claimed
//! host blocks (`remote_prefetch`); fetched values are verified on a worker and placed in the
//! reuse tree as free host blocks by `remote_poll`. Only placed blocks count for estimates and
//! admission.

use super::lower::{CopyOut, Cursor, LowerTier, Parent, Reads};
use super::{KeySource, WindowBlockManager};
use crate::pool::Level;
use crate::remote::{FetchDone, Fetched, Known, RemoteStats, RemoteTier, StoreItem};
use crate::tier::sealed::{fits, prefix_digest, OwnedKey, SlotHeader};
use crate::tier::PrefixDigest;

/// The remote tier behind the lower-tier seam: fetches come back from its workers, verified.
impl LowerTier for RemoteTier {
    type Done = Fetched;

    fn harvest_reads(&mut self) -> Vec<(PrefixDigest, Fetched)> {
        self.harvest()
            .into_iter()
            .map(|FetchDone { digest, fetched }| (digest, fetched))
            .collect()
    }

    fn block<'a>(&self, done: &'a Fetched) -> Option<(&'a SlotHeader, &'a [u8])> {
        match done {
            Fetched::Block(header, value) => Some((&**header, self.namespace().row(value))),
            Fetched::Miss => None,
        }
    }

    fn finish(&mut self, done: Fetched, placed: bool) {
        if let Fetched::Block(..) = done {
            let s = self.stats_mut();
            if placed {
                s.hits += 1;
            } else {
                s.fetches_discarded += 1;
            }
        }
    }

    fn count_write_drop(&mut self) {
        self.stats_mut().write_drops += 1;
    }
}

/// When blocks go to the remote store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RemoteWritePolicy {
    /// When a block is stored for reuse (the default: another instance can reuse a prefix as
    /// soon as it is computed, which is what a fleet sharing system prompts needs).
    #[default]
    OnStore,
    /// When the host tier evicts a block (fewer writes: only what leaves this instance).
    OnHostEvict,
}

/// The remote tier of a window and its fetches in flight.
#[derive(Debug)]
pub struct WindowRemote {
    pub(super) tier: RemoteTier,
    policy: RemoteWritePolicy,
    reads: Reads<Fetched>,
    /// Most blocks of one request looked up at once.
    max_lookup_blocks: usize,
}

impl WindowRemote {
    /// A window's remote tier, writing under `policy`.
    pub fn new(tier: RemoteTier, policy: RemoteWritePolicy) -> Self {
        WindowRemote {
            tier,
            policy,
            reads: Reads::default(),
            max_lookup_blocks: 256,
        }
    }
}

/// What a remote prefetch did for one request in one window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemotePrefetch {
    /// Prefix blocks whose lookup was queued now.
    pub looked_up: usize,
    /// Fetches started now.
    pub started: usize,
    /// Prefix blocks being looked up or fetched (queued earlier): not ready yet.
    pub pending: usize,
}

impl std::ops::AddAssign for RemotePrefetch {
    fn add_assign(&mut self, o: RemotePrefetch) {
        self.looked_up += o.looked_up;
        self.started += o.started;
        self.pending += o.pending;
    }
}

impl WindowBlockManager {
    /// Attaches a remote tier.
    pub fn attach_remote(&mut self, remote: WindowRemote) {
        self.digests.enable(self.arena.len());
        self.remote = Some(Box::new(remote));
    }

    /// Whether a remote tier is attached.
    pub fn has_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// The remote tier's counters (zeros without one).
    pub fn remote_stats(&self) -> RemoteStats {
        self.remote
            .as_ref()
            .map_or_else(RemoteStats::default, |r| r.tier.stats())
    }

    /// Whether `block` is claimed as the destination of a remote fetch.
    pub(super) fn is_claimed_by_remote(&self, block: u32) -> bool {
        self.remote
            .as_ref()
            .is_some_and(|r| r.reads.is_claimed(block))
    }

    /// Queues the blocks just stored for reuse (consecutive, each the child of the one before)
    /// for the store, under the `OnStore` policy.
    pub(super) fn remote_write_stored(&mut self, stored: &[u32]) {
        let Some(first) = stored.first() else {
            return;
        };
        if !self
            .remote
            .as_ref()
            .is_some_and(|r| r.policy == RemoteWritePolicy::OnStore)
        {
            return;
        }
        let (mut parent, _) = self.tree_digests(*first);
        let mut items = Vec::new();
        let mut r = self.remote.take().expect("checked");
        r.reads.collect(&mut r.tier);
        for &b in stored {
            let key = self.tree.key(b);
            let digest = prefix_digest(&parent, &key);
            if let Some(item) = self.remote_item(&mut r, b, parent, digest, items.len()) {
                items.push(item);
            }
            parent = digest;
        }
        r.tier.store(items);
        self.remote = Some(r);
    }

    /// Queues a block the host tier is about to evict, under the `OnHostEvict` policy.
    pub(super) fn spill_to_remote(&mut self, block: u32) {
        let Some(mut r) = self.remote.take() else {
            return;
        };
        if r.policy == RemoteWritePolicy::OnHostEvict
            && self.tree.is_in_tree(block)
            && self.arena.level(block) == Level::Secondary
        {
            r.reads.collect(&mut r.tier);
            let (parent, digest) = self.tree_digests(block);
            if let Some(item) = self.remote_item(&mut r, block, parent, digest, 0) {
                r.tier.store(vec![item]);
            }
        }
        self.remote = Some(r);
    }

    /// The store item of `block` (its row copied now), or `None` when it is not wanted
    /// (known there, being written), its key does not fit a header, the write queue is full
    /// with the `pending` items of this call (counted) or its row cannot be read.
    fn remote_item(
        &mut self,
        r: &mut WindowRemote,
        block: u32,
        parent: PrefixDigest,
        digest: PrefixDigest,
        pending: usize,
    ) -> Option<StoreItem> {
        let key = self.tree.key(block);
        if !fits(r.tier.namespace().layout(), &key) {
            r.tier.stats_mut().policy_skips += 1;
            return None;
        }
        if !r.tier.wants(&digest) || !r.tier.has_write_room(pending) {
            return None;
        }
        let owned = OwnedKey {
            token_ids: key.token_ids.to_vec(),
            extra_ids: key.extra_ids.map(|e| e.to_vec()),
            lora_task_id: key.lora_task_id,
            cache_salt: key.cache_salt,
            extra_keys: key.extra_keys.to_vec(),
        };
        let mut value = r.tier.namespace().new_value();
        let hb = r.tier.namespace().layout().header_bytes();
        match self.copy_out_rows(&mut r.tier, block, &mut value[hb..]) {
            Ok(()) => {}
            Err(CopyOut::NotReady) => return None,
            Err(CopyOut::Failed) => {
                r.tier.stats_mut().policy_skips += 1;
                return None;
            }
        }
        Some(StoreItem {
            digest,
            parent,
            key: owned,
            value,
        })
    }

    /// Walks a request's reusable prefix past the tree; with `start`, queues one lookup of the
    /// unknown blocks and one fetch of the leading blocks known present (into claimed host
    /// blocks, as far as they can be claimed).
    fn walk_remote_prefix(
        &mut self,
        src: &KeySource<'_>,
        input_length: usize,
        start: bool,
    ) -> RemotePrefetch {
        let mut out = RemotePrefetch::default();
        let Some(r) = &self.remote else {
            return out;
        };
        let max_look = r.max_lookup_blocks;
        let mut to_fetch: Vec<(PrefixDigest, u32, Parent)> = Vec::new();
        let mut to_look: Vec<PrefixDigest> = Vec::new();
        self.walk_lower_prefix(src, input_length, |w, cur: &mut Cursor, digest| {
            // What the disk holds (or is reading) is the disk tier's to bring back.
            if w.disk
                .as_ref()
                .is_some_and(|d| d.tier.contains(&digest) || d.tier.is_writing(&digest))
            {
                return false;
            }
            let r = w.remote.as_mut().expect("checked");
            if r.reads.contains(&digest) {
                out.pending += 1;
                cur.parent = Parent::Read(digest);
                return true;
            }
            match r.tier.known(&digest) {
                Known::Present if start && to_look.is_empty() => {
                    let Some(dest) = w.claim_landing_block(cur.anchor) else {
                        return false;
                    };
                    to_fetch.push((digest, dest, cur.parent));
                    cur.parent = Parent::Read(digest);
                    true
                }
                Known::Pending => {
                    out.pending += 1;
                    false
                }
                Known::Unknown | Known::Present if start => {
                    // The rest of the prefix, in one lookup.
                    to_look.push(digest);
                    to_look.len() < max_look
                }
                _ => false,
            }
        });
        let r = self.remote.as_mut().expect("checked");
        if !to_look.is_empty() {
            out.looked_up = r.tier.lookup(&to_look);
            out.pending += out.looked_up;
        }
        if !to_fetch.is_empty() {
            let digests: Vec<PrefixDigest> = to_fetch.iter().map(|f| f.0).collect();
            if r.tier.fetch(&digests) {
                for (digest, dest, parent) in to_fetch {
                    r.reads.insert(digest, dest, parent);
                    out.started += 1;
                }
                out.pending += out.started;
            } else {
                for (_, dest, _) in to_fetch {
                    self.queues.release(dest, Level::Secondary, false, 0);
                }
            }
        }
        out
    }

    /// Looks up and fetches the remote part of a waiting request's reusable prefix (see the
    /// module). Nothing waits: blocks become reusable in a later `remote_poll`.
    pub fn remote_prefetch(&mut self, src: &KeySource<'_>, input_length: usize) -> RemotePrefetch {
        self.walk_remote_prefix(src, input_length, true)
    }

    /// Blocks of a request's reusable prefix still being looked up or fetched (0: ready).
    pub fn remote_blocks_pending(&mut self, src: &KeySource<'_>, input_length: usize) -> usize {
        self.walk_remote_prefix(src, input_length, false).pending
    }

    /// Collects finished remote batches and places verified fetches in the tree as free host
    /// blocks under their parents. Returns the blocks placed.
    pub fn remote_poll(&mut self, now_ms: u64) -> usize {
        let Some(mut r) = self.remote.take() else {
            return 0;
        };
        r.reads.collect(&mut r.tier);
        let placed = self.poll_lower(&mut r.tier, &mut r.reads, now_ms);
        self.remote = Some(r);
        placed
    }

    /// Checks that every fetch's destination is claimed.
    pub(super) fn verify_remote(&self) -> Result<(), String> {
        let Some(r) = &self.remote else {
            return Ok(());
        };
        self.verify_reads(&r.reads, "remote fetch", "fetch")
    }
}
