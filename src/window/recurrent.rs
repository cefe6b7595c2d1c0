//! Carrying a sequence's recurrent state (Mamba, linear attention) from one block's row into the
//! next block's (TensorRT-LLM `copyLinearAttentionBlock`).
//!
//! Every block of a window with recurrent-state pools owns a state row: the snapshot of the
//! state after the block's last token, which is what prefix reuse restores. An engine that keeps
//! a sequence's running state in the row of the block holding its next token calls this when the
//! sequence reaches a block boundary: the finished block's row keeps its snapshot, and the next
//! block starts from a copy of it. Only the recurrent-state pools move; the attention pools of
//! the destination are left alone.

use super::WindowBlockManager;
use crate::pool::Level;
use crate::transfer::RowCopy;

impl WindowBlockManager {
    /// Whether this window holds recurrent-state pools.
    pub fn has_recurrent_state(&self) -> bool {
        self.cfg.layout.pools().iter().any(|p| p.recurrent_state)
    }

    /// For each `(sequence, position)`, queues for each beam the copy of the recurrent-state rows
    /// of the block that ends at token `position` into the block that starts there; then
    /// submits them all at once (one launch on the CUDA backend). A request copies nothing unless
    /// `position` is a positive multiple of `tokens_per_block` and its sequence holds the block
    /// starting there. A destination that another sequence could read (a block in the reuse
    /// tree, or one not on the GPU tier) is skipped, as is a source the window detached (sliding
    /// window), and a copy already queued is not queued twice (beams sharing both blocks).
    /// Returns how many copies were queued.
    pub fn copy_recurrent_state(&mut self, requests: &[(u64, usize)]) -> usize {
        if !self.has_recurrent_state() {
            return 0;
        }
        let tpb = self.cfg.tokens_per_block;
        let mut pairs: Vec<(u32, u32)> = Vec::new();
        for &(id, position) in requests {
            if position == 0 || position % tpb != 0 {
                continue;
            }
            let next = position / tpb;
            let Some(seq) = self.seqs.get(&id) else {
                continue;
            };
            for beam in &seq.beams {
                if next >= beam.len() || next - 1 < seq.front_removed {
                    continue;
                }
                let (src, dst) = (beam[next - 1], beam[next]);
                let movable = src != dst
                    && !self.tree.is_in_tree(dst)
                    && self.arena.level(src) == Level::Primary
                    && self.arena.level(dst) == Level::Primary;
                if movable && !pairs.contains(&(src, dst)) {
                    pairs.push((src, dst));
                }
            }
        }
        for &(src, dst) in &pairs {
            self.queue_copy(src, dst, RowCopy::STATE_ONLY as usize);
        }
        self.flush_copies();
        pairs.len()
    }
}
