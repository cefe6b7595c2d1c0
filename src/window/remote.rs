//! The window's side of the shared remote tier. Write path: blocks newly stored for reuse are
//! copied out of their rows and queued for the store (`remote_write_stored`, the `OnStore`
//! policy), or those the host tier evicts (`OnHostEvict`). Read path, the disk tier's
//! contract: a waiting request's prefix past the tree (and past what the disk holds) is looked
//! up in one pipelined batch; the blocks found are fetched in one pipelined batch into claimed
//! host blocks (`remote_prefetch`); fetched values are verified on a worker and placed in the
//! reuse tree as free host blocks by `remote_poll`. Only placed blocks count for estimates and
//! admission.

use super::lower::{Lower, LowerTier, Presence};
use super::lower_read::LowerPrefetch;
use super::{KeySource, LowerTiers, WindowBlockManager};
use crate::key::BlockKeyRef;
use crate::pool::Level;
use crate::remote::{FetchDone, Fetched, Known, RemoteStats, RemoteTier, StoreItem};
use crate::tier::sealed::{fits, OwnedKey, SlotHeader};
use crate::tier::PrefixDigest;

/// A prepared remote write: the store item, its row at `row_at` of the value (the header is
/// sealed on a worker).
#[derive(Debug)]
pub struct RemoteWrite {
    item: StoreItem,
    row_at: usize,
}

/// The remote tier behind the lower-tier seam: a shared store another instance writes, so a
/// block's presence is looked up (pipelined, per request); fetches of one walk go in one
/// pipelined batch, verified on a worker; writes of one call go in one batch.
impl LowerTier for RemoteTier {
    type Done = Fetched;
    type Write = RemoteWrite;
    const READS_IN_BATCHES: bool = true;

    fn of(tiers: &mut LowerTiers) -> Option<&mut Lower<Self>> {
        tiers.remote.as_deref_mut().map(|r| &mut r.lower)
    }

    /// What the disk holds (or is writing) is the disk tier's to bring back.
    fn held_above(tiers: &LowerTiers, digest: &PrefixDigest) -> bool {
        tiers
            .disk
            .as_ref()
            .is_some_and(|d| d.lower.tier.contains(digest) || d.lower.tier.is_writing(digest))
    }

    fn presence(&self, digest: &PrefixDigest) -> Presence {
        match self.known(digest) {
            Known::Present => Presence::Present,
            Known::Absent => Presence::Absent,
            Known::Pending => Presence::LookingUp,
            Known::Unknown => Presence::Unknown,
        }
    }

    fn lookup(&mut self, digests: &[PrefixDigest]) -> usize {
        RemoteTier::lookup(self, digests)
    }

    fn start_reads(&mut self, digests: &[PrefixDigest]) -> bool {
        self.fetch(digests)
    }

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

    fn harvest_before_write(&self) -> bool {
        true // what it knows is written saves sending it again
    }

    fn prepare_write(
        &mut self,
        parent: &PrefixDigest,
        digest: &PrefixDigest,
        key: &BlockKeyRef<'_>,
    ) -> Option<RemoteWrite> {
        if !fits(self.namespace().layout(), key) {
            self.stats_mut().policy_skips += 1;
            return None;
        }
        if !self.wants(digest) || !self.has_write_room() {
            return None;
        }
        let key = OwnedKey {
            token_ids: key.token_ids.to_vec(),
            extra_ids: key.extra_ids.map(|e| e.to_vec()),
            lora_task_id: key.lora_task_id,
            cache_salt: key.cache_salt,
            extra_keys: key.extra_keys.to_vec(),
        };
        Some(RemoteWrite {
            row_at: self.namespace().layout().header_bytes(),
            item: StoreItem {
                digest: *digest,
                parent: *parent,
                key,
                value: self.namespace().new_value(),
            },
        })
    }

    fn rows_mut(write: &mut RemoteWrite) -> &mut [u8] {
        &mut write.item.value[write.row_at..]
    }

    fn submit_write(&mut self, write: RemoteWrite) {
        self.stage(write.item);
    }

    fn abandon_write(&mut self, _write: RemoteWrite, failed: bool) {
        if failed {
            self.stats_mut().policy_skips += 1;
        }
    }

    fn end_writes(&mut self) {
        self.store_staged();
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
    pub(super) lower: Lower<RemoteTier>,
    policy: RemoteWritePolicy,
}

impl WindowRemote {
    /// A window's remote tier, writing under `policy`.
    pub fn new(tier: RemoteTier, policy: RemoteWritePolicy) -> Self {
        WindowRemote {
            lower: Lower::new(tier),
            policy,
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

impl From<LowerPrefetch> for RemotePrefetch {
    /// Everything not ready is pending: looked up or started now, read or looked up before.
    fn from(p: LowerPrefetch) -> Self {
        RemotePrefetch {
            looked_up: p.looked_up,
            started: p.started,
            pending: p.looked_up + p.started + p.in_flight + p.waiting,
        }
    }
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
        self.lower.remote = Some(Box::new(remote));
    }

    /// Whether a remote tier is attached.
    pub fn has_remote(&self) -> bool {
        self.lower.remote.is_some()
    }

    /// The remote tier's counters (zeros without one).
    pub fn remote_stats(&self) -> RemoteStats {
        self.lower
            .remote
            .as_ref()
            .map_or_else(RemoteStats::default, |r| r.lower.tier.stats())
    }

    /// Whether `block` is claimed as the destination of a remote fetch.
    pub(super) fn is_claimed_by_remote(&self, block: u32) -> bool {
        self.lower
            .remote
            .as_ref()
            .is_some_and(|r| r.lower.reads.is_claimed(block))
    }

    /// Queues the blocks just stored for reuse (consecutive, each the child of the one before)
    /// for the store, under the `OnStore` policy.
    pub(super) fn remote_write_stored(&mut self, stored: &[u32]) {
        if self
            .lower
            .remote
            .as_ref()
            .is_some_and(|r| r.policy == RemoteWritePolicy::OnStore)
        {
            self.write_lower::<RemoteTier>(stored, |_, _, _| {});
        }
    }

    /// Queues a block the host tier is about to evict, under the `OnHostEvict` policy.
    pub(super) fn spill_to_remote(&mut self, block: u32) {
        if self
            .lower
            .remote
            .as_ref()
            .is_some_and(|r| r.policy == RemoteWritePolicy::OnHostEvict)
            && self.tree.is_in_tree(block)
            && self.arena.level(block) == Level::Secondary
        {
            self.write_lower::<RemoteTier>(&[block], |_, _, _| {});
        }
    }

    /// Looks up and fetches the remote part of a waiting request's reusable prefix (see the
    /// module). Nothing waits: blocks become reusable in a later `remote_poll`.
    pub fn remote_prefetch(&mut self, src: &KeySource<'_>, input_length: usize) -> RemotePrefetch {
        self.prefetch_lower::<RemoteTier>(src, input_length, true)
            .into()
    }

    /// Blocks of a request's reusable prefix still being looked up or fetched (0: ready).
    pub fn remote_blocks_pending(&mut self, src: &KeySource<'_>, input_length: usize) -> usize {
        RemotePrefetch::from(self.prefetch_lower::<RemoteTier>(src, input_length, false)).pending
    }

    /// Collects finished remote batches and places verified fetches in the tree as free host
    /// blocks under their parents. Returns the blocks placed.
    pub fn remote_poll(&mut self, now_ms: u64) -> usize {
        let Some(mut r) = self.lower.remote.take() else {
            return 0;
        };
        r.lower.collect();
        let placed = self.poll_lower(&mut r.lower, now_ms);
        self.lower.remote = Some(r);
        placed
    }

    /// Checks that every fetch's destination is claimed.
    pub(super) fn verify_remote(&self) -> Result<(), String> {
        let Some(r) = &self.lower.remote else {
            return Ok(());
        };
        self.verify_reads(&r.lower, "remote fetch", "fetch")
    }
}
