//! Snapshots for tests and debugging: the reuse tree, one block, priorities, pool memory.

use super::KvCacheManager;
use crate::error::{KvError, KvResult};
use crate::pool::Level;
use crate::retention::DEFAULT_PRIORITY;

/// One block of a reuse-tree snapshot: hash, parent hash (`None` = the root), level, priority.
pub type TreeEntry = (u64, Option<u64>, Level, u8);

/// Snapshot of one block, for tests and debugging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    pub level: Level,
    pub memory_index: u32,
    pub ref_count: u32,
    pub priority: u8,
    pub in_reuse_tree: bool,
    pub is_leaf: bool,
    pub is_free: bool,
    pub num_tokens: usize,
    pub hash: u64,
    /// Tree parent block id; -1 for the root; `None` when not in the tree.
    pub parent: Option<i64>,
}

impl KvCacheManager {
    /// Every block in one window's reuse tree as `(hash, parent hash (None = root), level,
    /// priority)`, for checking an event consumer's view.
    pub fn reuse_tree_snapshot(&self, window_size: usize) -> KvResult<Vec<TreeEntry>> {
        let w = self.window(window_size)?;
        let tree = w.tree();
        let mut out = Vec::with_capacity(tree.num_in_tree());
        for b in 0..w.num_blocks() as u32 {
            if let Some(parent) = tree.parent(b) {
                let parent_hash = (parent != tree.root()).then(|| tree.hash(parent));
                out.push((tree.hash(b), parent_hash, w.arena().level(b), w.priority(b)));
            }
        }
        Ok(out)
    }

    /// Priority of a block, or the default (35) for an invalid id.
    pub fn priority_by_block_id(&self, window_size: usize, block: i64) -> KvResult<u8> {
        let w = self.window(window_size)?;
        if block < 0 || block as usize >= w.num_blocks() {
            return Ok(DEFAULT_PRIORITY);
        }
        Ok(w.priority(block as u32))
    }

    /// Last block of beam 0 in the smallest window.
    pub fn last_block_id(&self, id: u64) -> KvResult<u32> {
        self.sequence(id)?;
        self.windows[0]
            .block_ids(id, 0)
            .and_then(|ids| ids.last().copied())
            .ok_or(KvError::UnknownRequest(id))
    }

    /// A snapshot of one block.
    pub fn block_info(&self, window_size: usize, block: u32) -> KvResult<BlockInfo> {
        let w = self.window(window_size)?;
        if block as usize >= w.num_blocks() {
            return Err(KvError::InvalidArgument(format!(
                "block id {block} out of range"
            )));
        }
        let row = w.arena().row(block);
        let tree = w.tree();
        Ok(BlockInfo {
            level: row.level,
            memory_index: row.index,
            ref_count: w.arena().ref_count(block),
            priority: w.priority(block),
            in_reuse_tree: tree.is_in_tree(block),
            is_leaf: tree.is_leaf(block),
            is_free: w.queues().is_queued(block),
            num_tokens: if tree.has_key(block) {
                tree.key(block).len()
            } else {
                0
            },
            hash: tree.hash(block),
            parent: tree
                .parent(block)
                .map(|p| if p == tree.root() { -1 } else { i64::from(p) }),
        })
    }
}
