//! The window's side of the shared remote tier. Write path: blocks newly stored for reuse are
//! copied out of their rows and queued for the store (`remote_write_stored`, the `OnStore`
//! policy), or those the host tier evicts (`OnHostEvict`). Read path, the disk tier's
//! contract: a waiting request's prefix past the tree (and past what the disk holds) is looked
//! up in one pipelined batch; the blocks found are fetched in one pipelined batch into claimed
//! host blocks (`remote_prefetch`); fetched values are verified on a worker and placed in the
//! reuse tree as free host blocks by `remote_poll`. Only placed blocks count for estimates and
//! admission.

use std::collections::HashMap;

use super::{KeySource, WindowBlockManager};
use crate::pool::Level;
use crate::remote::{FetchDone, Fetched, Known, RemoteStats, RemoteTier, StoreItem};
use crate::tier::sealed::{fits, prefix_digest, OwnedKey};
use crate::tier::{PrefixDigest, ROOT_DIGEST};

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

/// Where a fetched block hangs once placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Parent {
    Tree { block: u32, epoch: u32 },
    Read(PrefixDigest),
    Gone,
}

#[derive(Debug)]
struct PendingFetch {
    dest: u32,
    parent: Parent,
    children: Vec<PrefixDigest>,
    done: Option<Fetched>,
}

/// The remote tier of a window and its fetches in flight.
#[derive(Debug)]
pub struct WindowRemote {
    pub(super) tier: RemoteTier,
    policy: RemoteWritePolicy,
    reads: HashMap<PrefixDigest, PendingFetch>,
    /// Most blocks of one request looked up at once.
    max_lookup_blocks: usize,
    /// Prefix digests of tree blocks, with what they were computed from.
    digests: HashMap<u32, (DigestTag, PrefixDigest)>,
}

/// What a remembered digest of a tree block was computed from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct DigestTag {
    epoch: u32,
    parent: PrefixDigest,
    lookup: u64,
}

impl WindowRemote {
    pub fn new(tier: RemoteTier, policy: RemoteWritePolicy) -> Self {
        WindowRemote {
            tier,
            policy,
            reads: HashMap::new(),
            max_lookup_blocks: 256,
            digests: HashMap::new(),
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

fn collect(r: &mut WindowRemote) {
    for FetchDone { digest, fetched } in r.tier.harvest() {
        if let Some(p) = r.reads.get_mut(&digest) {
            p.done = Some(fetched);
        }
    }
}

impl WindowBlockManager {
    pub fn attach_remote(&mut self, remote: WindowRemote) {
        self.remote = Some(Box::new(remote));
    }

    pub fn has_remote(&self) -> bool {
        self.remote.is_some()
    }

    pub fn remote_stats(&self) -> RemoteStats {
        self.remote
            .as_ref()
            .map_or_else(RemoteStats::default, |r| r.tier.stats())
    }

    pub(super) fn is_claimed_by_remote(&self, block: u32) -> bool {
        self.remote
            .as_ref()
            .is_some_and(|r| r.reads.values().any(|p| p.dest == block))
    }

    /// The prefix digest of a block in the tree and of its parent (a walk to the root).
    fn remote_tree_digests(&self, block: u32) -> (PrefixDigest, PrefixDigest) {
        let root = self.tree.root();
        let mut chain = vec![block];
        let mut b = block;
        while let Some(p) = self.tree.parent(b) {
            if p == root {
                break;
            }
            chain.push(p);
            b = p;
        }
        let (mut parent, mut digest) = (ROOT_DIGEST, ROOT_DIGEST);
        for &b in chain.iter().rev() {
            parent = digest;
            digest = prefix_digest(&parent, &self.tree.key(b));
        }
        (parent, digest)
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
        let (mut parent, _) = self.remote_tree_digests(*first);
        let mut items = Vec::new();
        let mut r = self.remote.take().expect("checked");
        collect(&mut r);
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
            collect(&mut r);
            let (parent, digest) = self.remote_tree_digests(block);
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
        // Copies queued by this call may write the row: they go first.
        self.flush_copies();
        if !self.engine.host_row_ready(self.arena.row(block)) {
            // A GPU copy still writes the row (CUDA backend): the write falls behind, dropped.
            r.tier.stats_mut().write_drops += 1;
            return None;
        }
        let ns = r.tier.namespace();
        let mut value = ns.new_value();
        if self
            .engine
            .read_row(self.arena.row(block), ns.row_mut(&mut value))
            .is_err()
        {
            r.tier.stats_mut().policy_skips += 1;
            return None;
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
        if !self.cfg.enable_reuse || self.remote.is_none() || input_length < 2 {
            return out;
        }
        let tpb = self.cfg.tokens_per_block;
        let reusable = (input_length - 1).min(src.token_ids.len());
        let mut scratch = std::mem::take(&mut self.mm_scratch);
        let mut parent = Parent::Tree {
            block: self.tree.root(),
            epoch: 0,
        };
        let mut anchor = self.tree.root();
        let mut parent_digest = ROOT_DIGEST;
        let mut to_fetch: Vec<(PrefixDigest, u32, Parent)> = Vec::new();
        let mut to_look: Vec<PrefixDigest> = Vec::new();
        let max_look = self.remote.as_ref().expect("checked").max_lookup_blocks;
        let mut bi = 0;
        while bi * tpb < reusable {
            let (s, e) = (bi * tpb, ((bi + 1) * tpb).min(reusable));
            let key = src.key(s, e, &mut scratch);
            let lookup = crate::key::lookup_hash(&key);
            let in_tree = match parent {
                Parent::Tree { block, .. } => self.tree.find_exact(block, &key, lookup),
                _ => None,
            };
            // A waiting request walks its prefix on every scheduling pass: a tree block's
            // digest is remembered, valid while its allocation epoch, its parent's digest and
            // its key's hash are those it was computed from (its full key equals `key`: the
            // tree compared them).
            let digest = match in_tree {
                Some(b) => {
                    let tag = DigestTag {
                        epoch: self.epoch_of(b),
                        parent: parent_digest,
                        lookup,
                    };
                    let cap = self.arena.len();
                    let r = self.remote.as_mut().expect("checked");
                    match r.digests.get(&b) {
                        Some((t, d)) if *t == tag => *d,
                        _ => {
                            let d = prefix_digest(&parent_digest, &key);
                            if r.digests.len() >= cap {
                                r.digests.clear();
                            }
                            r.digests.insert(b, (tag, d));
                            d
                        }
                    }
                }
                None => prefix_digest(&parent_digest, &key),
            };
            parent_digest = digest;
            bi += 1;
            if let Some(b) = in_tree {
                parent = Parent::Tree {
                    block: b,
                    epoch: self.epoch_of(b),
                };
                anchor = b;
                continue;
            }
            // What the disk holds (or is reading) is the disk tier's to bring back.
            if self
                .disk
                .as_ref()
                .is_some_and(|d| d.tier.contains(&digest) || d.tier.is_writing(&digest))
            {
                break;
            }
            let r = self.remote.as_mut().expect("checked");
            if r.reads.contains_key(&digest) {
                out.pending += 1;
                parent = Parent::Read(digest);
                continue;
            }
            match r.tier.known(&digest) {
                Known::Present if start && to_look.is_empty() => {
                    let Some(dest) = self.claim_landing_block(anchor) else {
                        break;
                    };
                    to_fetch.push((digest, dest, parent));
                    parent = Parent::Read(digest);
                }
                Known::Pending => {
                    out.pending += 1;
                    break;
                }
                Known::Unknown | Known::Present if start => {
                    // The rest of the prefix, in one lookup.
                    to_look.push(digest);
                    if to_look.len() >= max_look {
                        break;
                    }
                }
                _ => break,
            }
        }
        self.mm_scratch = scratch;
        let r = self.remote.as_mut().expect("checked");
        if !to_look.is_empty() {
            out.looked_up = r.tier.lookup(&to_look);
            out.pending += out.looked_up;
        }
        if !to_fetch.is_empty() {
            let digests: Vec<PrefixDigest> = to_fetch.iter().map(|f| f.0).collect();
            if r.tier.fetch(&digests) {
                for (digest, dest, parent) in to_fetch {
                    if let Parent::Read(p) = parent {
                        if let Some(pr) = r.reads.get_mut(&p) {
                            pr.children.push(digest);
                        }
                    }
                    r.reads.insert(
                        digest,
                        PendingFetch {
                            dest,
                            parent,
                            children: Vec::new(),
                            done: None,
                        },
                    );
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
        collect(&mut r);
        let mut placed = 0;
        loop {
            let ready: Vec<PrefixDigest> = r
                .reads
                .iter()
                .filter(|(_, p)| p.done.is_some() && !matches!(p.parent, Parent::Read(_)))
                .map(|(k, _)| *k)
                .collect();
            if ready.is_empty() {
                break;
            }
            for digest in ready {
                let p = r.reads.remove(&digest).expect("listed");
                let landed = self.place_fetch(&mut r, p.dest, p.parent, p.done.expect("done"));
                placed += landed as usize;
                self.queues.release(p.dest, Level::Secondary, false, now_ms);
                let next = if landed {
                    Parent::Tree {
                        block: p.dest,
                        epoch: self.epoch_of(p.dest),
                    }
                } else {
                    Parent::Gone
                };
                for c in p.children {
                    if let Some(child) = r.reads.get_mut(&c) {
                        child.parent = next;
                    }
                }
            }
        }
        self.remote = Some(r);
        placed
    }

    fn place_fetch(&mut self, r: &mut WindowRemote, dest: u32, parent: Parent, f: Fetched) -> bool {
        let Fetched::Block(header, value) = f else {
            return false;
        };
        let placed = match parent {
            Parent::Tree { block, epoch } if self.parent_is_valid(block, epoch) => {
                let key = header.key.as_ref();
                self.tree.set_key(dest, &key);
                if self.tree.insert(block, dest) {
                    let row = self.arena.row(dest);
                    if self
                        .engine
                        .write_row(row, r.tier.namespace().row(&value))
                        .is_ok()
                    {
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
        let s = r.tier.stats_mut();
        if placed {
            s.hits += 1;
        } else {
            s.fetches_discarded += 1;
        }
        placed
    }

    /// Checks that every fetch's destination is claimed.
    pub(super) fn verify_remote(&self) -> Result<(), String> {
        let Some(r) = &self.remote else {
            return Ok(());
        };
        for p in r.reads.values() {
            if self.queues.is_queued(p.dest) || self.arena.ref_count(p.dest) > 0 {
                return Err(format!(
                    "remote fetch destination {} is not claimed for the fetch",
                    p.dest
                ));
            }
        }
        Ok(())
    }
}
