//! The write side of the lower tiers, once for every backend: a chain of cached host blocks
//! (each the child of the one before) is offered to the tier block by block, each wanted
//! block's row copied out now (after the copies queued by this call, which may write it) and
//! sealed under its prefix digest (`write_lower`).

use super::lower::LowerTier;
use super::WindowBlockManager;
use crate::pool::MemRow;
use crate::tier::sealed::prefix_digest;
use crate::tier::{PrefixDigest, ROOT_DIGEST};

/// Why a row could not be copied out for a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CopyOut {
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
    /// copies queued by this call (they may write the rows), for a write to `T`.
    fn copy_out_rows<T: LowerTier>(&mut self, block: u32, out: &mut [u8]) -> Result<(), CopyOut> {
        if T::JOBS_AT_END_OF_CALL {
            self.submit_copies();
        } else {
            self.flush_copies();
        }
        let rows: Vec<MemRow> = self.host_rows(block).collect();
        if !rows.iter().all(|&r| self.engine.host_row_ready(r)) {
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

    /// Offers the blocks of `chain` (cached host blocks, each the child of the one before) to
    /// the tier `T`, which takes those it wants; `submitted` hears of each block queued, with
    /// its digest. Finished jobs are harvested first when the tier asks for it, so that its
    /// write queue drains even when the engine never polls.
    pub(super) fn write_lower<T: LowerTier>(
        &mut self,
        chain: &[u32],
        mut submitted: impl FnMut(&mut Self, u32, PrefixDigest),
    ) {
        if chain.is_empty() {
            return;
        }
        let Some(l) = T::of(&mut self.lower) else {
            return;
        };
        if l.tier.harvest_before_write() {
            l.collect();
        }
        let mut parent: Option<PrefixDigest> = None;
        for &block in chain {
            let l = T::of(&mut self.lower).expect("checked");
            if !l.tier.has_write_room() {
                // The queue only fills within a call: no later block of the chain has room
                // either (and skipping one would leave the next without its parent's digest).
                break;
            }
            // The first block's digest may need its ancestors'; the others follow the chain.
            let (up, digest) = match parent {
                None => self.tree_digests(block),
                Some(p) => (p, prefix_digest(&p, &self.tree.key(block))),
            };
            parent = Some(digest);
            let key = self.tree.key(block);
            let l = T::of(&mut self.lower).expect("checked");
            let Some(mut write) = l.tier.prepare_write(&up, &digest, &key) else {
                continue;
            };
            let copied = self.copy_out_rows::<T>(block, T::rows_mut(&mut write));
            let l = T::of(&mut self.lower).expect("checked");
            match copied {
                Ok(()) => {
                    l.tier.submit_write(write);
                    submitted(self, block, digest);
                }
                Err(CopyOut::NotReady) => {
                    l.tier.count_write_drop();
                    l.tier.abandon_write(write, false);
                }
                Err(CopyOut::Failed) => l.tier.abandon_write(write, true),
            }
        }
        if let Some(l) = T::of(&mut self.lower) {
            l.tier.end_writes();
        }
    }
}
