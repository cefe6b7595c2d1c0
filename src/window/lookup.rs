//! The reuse tree seen from outside a sequence: one-walk prefix analysis, lookups of a block
//! chain by its keys (optionally pinning it), truncating a cached chain, dropping the whole tree,
//! and the gauges of cached free blocks.

use super::{KeySource, WindowBlockManager};
use crate::error::{KvError, KvResult};
use crate::key::lookup_hash;
use crate::pool::Level;

/// What one walk of the tree along a prompt found (TensorRT-LLM `PrefixReuseSummary`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixReuse {
    /// Consecutive full prompt blocks found from the root whose block some sequence holds.
    pub reusable_allocated: usize,
    /// Consecutive full prompt blocks found from the root.
    pub reusable_all: usize,
    /// Index of the first prompt block the tree does not supply (`None` with reuse off or an
    /// empty prompt).
    pub first_new_block: Option<usize>,
}

impl WindowBlockManager {
    /// Walks the tree once along the full blocks of the first `input_length - 1` tokens (the
    /// last prompt token is always recomputed, as admission does).
    pub fn analyze_prefix_reuse(
        &mut self,
        src: &KeySource<'_>,
        input_length: usize,
    ) -> PrefixReuse {
        if !self.cfg.enable_reuse || input_length == 0 {
            return PrefixReuse::default();
        }
        let tpb = self.cfg.tokens_per_block;
        let full = (input_length - 1) / tpb;
        let mut scratch = std::mem::take(&mut self.mm_scratch);
        let mut parent = self.tree.root();
        let mut out = PrefixReuse::default();
        for bi in 0..full {
            let key = src.key(bi * tpb, (bi + 1) * tpb, &mut scratch);
            let Some(b) = self.tree.find_exact(parent, &key, lookup_hash(&key)) else {
                break;
            };
            out.reusable_all += 1;
            if self.arena.ref_count(b) > 0 {
                out.reusable_allocated += 1;
            }
            parent = b;
        }
        self.mm_scratch = scratch;
        out.first_new_block = Some(out.reusable_all);
        out
    }

    /// The chain of cached blocks whose keys spell tokens `[0, num_tokens)` of `src`, root
    /// first, stopping at the first block the tree lacks (a partial last block matches only a
    /// cached block with exactly that key).
    pub fn find_chain(&mut self, src: &KeySource<'_>, num_tokens: usize) -> Vec<u32> {
        let tpb = self.cfg.tokens_per_block;
        let mut scratch = std::mem::take(&mut self.mm_scratch);
        let mut parent = self.tree.root();
        let mut chain = Vec::new();
        for bi in 0..num_tokens.div_ceil(tpb) {
            let key = src.key(bi * tpb, ((bi + 1) * tpb).min(num_tokens), &mut scratch);
            let Some(b) = self.tree.find_exact(parent, &key, lookup_hash(&key)) else {
                break;
            };
            chain.push(b);
            parent = b;
        }
        self.mm_scratch = scratch;
        chain
    }

    /// The prefix of `chain` on the GPU tier: the blocks a pin can hold in place for a reader.
    pub fn primary_prefix_len(&self, chain: &[u32]) -> usize {
        chain
            .iter()
            .take_while(|&&b| self.arena.level(b) == Level::Primary)
            .count()
    }

    /// Pins each block (a free one leaves its free queue first, so it cannot be evicted while
    /// pinned). The blocks must be primary (see `primary_prefix_len`).
    pub fn pin_blocks(&mut self, blocks: &[u32]) {
        for &b in blocks {
            debug_assert_eq!(self.arena.level(b), Level::Primary);
            if self.arena.ref_count(b) == 0 {
                self.queues.claim(b);
            }
            self.arena.pin(b);
        }
    }

    /// Checks that every id is in range and on the GPU tier, before anything changes: what
    /// pinning and storing by id (`purpose`: "pinned", "stored") need.
    pub fn check_gpu_block_ids(&self, ids: &[u32], purpose: &str) -> KvResult<()> {
        for &b in ids {
            if b as usize >= self.arena.len() {
                return Err(KvError::InvalidArgument(format!(
                    "block id {b} out of range"
                )));
            }
            if self.arena.level(b) != Level::Primary {
                return Err(KvError::InvalidArgument(format!(
                    "block {b} is on the host tier; only GPU blocks can be {purpose} (onboard \
                     it first)"
                )));
            }
        }
        Ok(())
    }

    /// Removes `block` and everything cached below it from the tree (Removed events; the blocks
    /// stay with whoever holds them, and free ones become plain free blocks). Returns how many
    /// blocks left the tree.
    pub fn drop_cached_subtree(&mut self, block: u32) -> usize {
        let before = self.tree.num_in_tree();
        self.evict_from_tree(block);
        before - self.tree.num_in_tree()
    }

    /// Removes every block from the tree (TensorRT-LLM `resetReuseState`); returns how many
    /// left it.
    pub fn drop_reuse_tree(&mut self) -> usize {
        let root = self.tree.root();
        let tops: Vec<u32> = (0..self.arena.len() as u32)
            .filter(|&b| self.tree.parent(b) == Some(root))
            .collect();
        tops.into_iter().map(|b| self.drop_cached_subtree(b)).sum()
    }

    /// Free blocks of `level` whose content is still cached (in the tree): what eviction would
    /// destroy, as opposed to free blocks that hold nothing reusable. Walks the blocks.
    pub fn num_evictable_cached(&self, level: Level) -> usize {
        (0..self.arena.len() as u32)
            .filter(|&b| {
                self.arena.ref_count(b) == 0
                    && self.arena.level(b) == level
                    && self.tree.is_in_tree(b)
            })
            .count()
    }

    /// The fewest free blocks of `level` since the last call (then restarts from the current
    /// count): the peak occupancy of the interval is the pool size minus this.
    pub fn take_free_low_water(&mut self, level: Level) -> usize {
        self.queues.take_free_low_water(level)
    }

    /// Bytes of one block (its row in every pool of the window), for transfer byte counts.
    pub fn row_bytes(&self) -> usize {
        self.cfg.layout.row_bytes()
    }
}
