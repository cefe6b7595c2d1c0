//! Growing and shrinking a sequence: new last blocks, sliding-window detach of front blocks,
//! and rewinding with copy on write.

use super::{SeqBlocks, WindowBlockManager, WindowConfig};
use crate::error::{KvError, KvResult};
use crate::pool::Level;
use crate::retention::BlockRetention;
use crate::tree::ReuseTree;

/// What growing a sequence by one token takes in one window (`add_token`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TokenNeeds {
    /// Out-of-window front blocks detached first (sliding window, beam width 1).
    detach: usize,
    /// Of the detached blocks, those that become free (this sequence held their last reference).
    freed: usize,
    /// New last blocks to allocate (one per beam when the token crosses a block boundary).
    new_blocks: usize,
}

/// The block a shrunk sequence will write again that is cached or shared (`remove_tokens`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RewrittenBlock {
    /// Its index in the sequence's block list.
    index: usize,
    block: u32,
    /// Tokens of the block the sequence keeps (1..tokens_per_block).
    kept: usize,
}

/// Writes token number `num_tokens` into its slot in every beam of `seq` (with reuse on:
/// storing reads the slots).
#[inline(always)]
fn write_slots(
    tree: &mut ReuseTree,
    cfg: &WindowConfig,
    seq: &SeqBlocks,
    num_tokens: usize,
    token: i32,
    extra: Option<u64>,
) {
    if !cfg.enable_reuse {
        return;
    }
    let pos = num_tokens - 1;
    let (index, offset) = (pos / cfg.tokens_per_block, pos % cfg.tokens_per_block);
    if index < seq.front_removed {
        // Slid past before the token arrived (`slide_to_slots`): the block is not the
        // sequence's any more (the sequence no longer stores in this window).
        return;
    }
    for beam in &seq.beams {
        tree.write_token(beam[index], offset, token, extra);
    }
}

impl WindowBlockManager {
    /// Blocks `add_token` needs in this window when the sequence grows to `num_tokens`, and the
    /// blocks it frees first by detaching out-of-window front blocks.
    /// Runs for every decode token: inlined, and without a division.
    #[inline(always)]
    fn token_needs(
        &self,
        seq: &SeqBlocks,
        num_tokens: usize,
        swa: bool,
        step_slack: usize,
    ) -> TokenNeeds {
        let tpb = self.cfg.tokens_per_block;
        let mut detach = 0;
        let mut freed = 0;
        if swa && seq.beams.len() == 1 {
            let mut removed = seq.front_removed;
            let reach = self.cfg.window_size + tpb + self.cfg.detach_slack_tokens.max(step_slack);
            // (`slide_to_slots` may have detached past the known tokens: saturate.)
            while num_tokens.saturating_sub(removed * tpb) >= reach {
                let b = seq.beams[0][removed];
                if self.arena.ref_count(b) == 1 {
                    freed += 1;
                }
                removed += 1;
                detach += 1;
            }
        }
        // A block reserved by a capacity grow already holds the token's slot. (The listed
        // blocks hold `len * tpb` slots: `blocks_for_tokens(n) > len` without dividing.)
        let new_blocks = if num_tokens.min(self.cfg.max_token_num) > seq.beams[0].len() * tpb {
            seq.beams.len()
        } else {
            0
        };
        TokenNeeds {
            detach,
            freed,
            new_blocks,
        }
    }

    /// Checks that growing sequence `id` to `num_tokens` tokens can be served. `step_slack`:
    /// tokens of the current step after its first (see `add_token`).
    pub fn check_add_token(
        &self,
        id: u64,
        num_tokens: usize,
        swa: bool,
        step_slack: usize,
    ) -> KvResult<()> {
        let seq = &self.seqs[&id];
        let TokenNeeds {
            freed,
            new_blocks: needed,
            ..
        } = self.token_needs(seq, num_tokens, swa, step_slack);
        let mut available = self.queues.num_free(Level::Primary) + freed;
        if needed > available {
            available += self.movable_count(&|_| false, 0);
        }
        if needed > available {
            return Err(KvError::OutOfBlocks {
                window_size: self.cfg.window_size,
                needed,
                available,
            });
        }
        Ok(())
    }

    /// Grows sequence `id` to `num_tokens` tokens, the last being `token` (with extra id
    /// `extra` when the sequence has extra ids): detaches out-of-window blocks (SWA), allocates a
    /// new last block (per beam with beam search) when a block boundary is crossed, and writes
    /// the token into the last block's slot (with reuse on: storing reads the slots).
    ///
    /// A block is detached only when it lies wholly before the window of the current step's
    /// first token: `step_slack` is how many tokens the step added before this one (drafts
    /// after the step's token), so the blocks that token attends stay held, however many
    /// drafts follow it in the same step (the configured `detach_slack_tokens` is a floor).
    #[allow(clippy::too_many_arguments)]
    pub fn add_token(
        &mut self,
        id: u64,
        num_tokens: usize,
        token: i32,
        extra: Option<u64>,
        swa: bool,
        step_slack: usize,
        decode: BlockRetention,
        now_ms: u64,
    ) {
        let TokenNeeds {
            detach,
            new_blocks: needed,
            ..
        } = self.token_needs(&self.seqs[&id], num_tokens, swa, step_slack);
        for _ in 0..detach {
            let seq = self.seqs.get_mut(&id).expect("sequence exists");
            let b = seq.beams[0][seq.front_removed];
            seq.front_removed += 1;
            seq.detached_epochs.push(self.alloc_epoch[b as usize]);
            if self.arena.remove_ref(b) == 0 {
                self.queues.release(b, self.arena.level(b), false, now_ms);
            }
        }
        if needed > 0 {
            self.make_room(needed, &|_| false, now_ms);
            let beam_width = self.seqs[&id].beams.len();
            if beam_width == 1 {
                let b = self.get_free_block(decode, now_ms);
                self.arena.add_refs(b, 1);
                self.seqs.get_mut(&id).expect("exists").beams[0].push(b);
            } else {
                for beam in 0..beam_width {
                    let b = self.get_free_block(decode, now_ms);
                    self.arena.add_refs(b, 1);
                    self.seqs.get_mut(&id).expect("exists").beams[beam].push(b);
                }
            }
            self.flush_copies();
        }
        self.write_last_token(id, num_tokens, token, extra);
    }

    /// Out-of-window front blocks of `seq` when its slots end at `slots` and the engine computes
    /// the token at position `slots - 1` next: `(detach, freed)`, the blocks to detach and of
    /// them those this sequence holds the last reference of. The rule is `add_token`'s (a block
    /// leaves once `slots - front * tpb` reaches `window + tpb` plus the configured slack), on
    /// the slots instead of the known tokens. Beam width 1 and sliding windows only.
    fn slide_needs(&self, seq: &SeqBlocks, slots: usize, swa: bool) -> (usize, usize) {
        let tpb = self.cfg.tokens_per_block;
        let (mut detach, mut freed) = (0, 0);
        if !swa || seq.beams.len() != 1 {
            return (0, 0);
        }
        let reach = self.cfg.window_size + tpb + self.cfg.detach_slack_tokens;
        let mut removed = seq.front_removed;
        while removed < seq.beams[0].len() && slots.saturating_sub(removed * tpb) >= reach {
            if self.arena.ref_count(seq.beams[0][removed]) == 1 {
                freed += 1;
            }
            removed += 1;
            detach += 1;
        }
        (detach, freed)
    }

    /// Whether sequence `id` can grow to `slots` slots once `slide_to_slots(id, slots, ..)` has
    /// detached the blocks that leave the window (their freed blocks count as free).
    pub fn can_grow_sliding(&self, id: u64, slots: usize, swa: bool) -> bool {
        let (_, freed) = self.slide_needs(&self.seqs[&id], slots, swa);
        let needed = self.blocks_to_grow(id, slots);
        let free = self.queues.num_free(Level::Primary) + freed;
        needed <= free || needed <= free + self.movable_count(&|_| false, 0)
    }

    /// Slides the window of sequence `id` to its slots, without token ids: detaches the front
    /// blocks that lie wholly before the window of the token at position `slots - 1` (the one
    /// the engine computes next), as `add_token` does for known tokens. `num_tokens`: the
    /// sequence's known tokens. A detached block holding a position at or past them never gets
    /// those tokens in its slots, so the sequence stops storing in this window (no key is ever
    /// cut from slots that miss their tokens). Returns how many blocks were detached.
    pub fn slide_to_slots(
        &mut self,
        id: u64,
        slots: usize,
        num_tokens: usize,
        swa: bool,
        now_ms: u64,
    ) -> usize {
        let (detach, _) = self.slide_needs(&self.seqs[&id], slots, swa);
        let tpb = self.cfg.tokens_per_block;
        for _ in 0..detach {
            let seq = self.seqs.get_mut(&id).expect("sequence exists");
            let b = seq.beams[0][seq.front_removed];
            seq.front_removed += 1;
            if seq.front_removed * tpb > num_tokens {
                seq.lost_tokens = true;
            }
            seq.detached_epochs.push(self.alloc_epoch[b as usize]);
            if self.arena.remove_ref(b) == 0 {
                self.queues.release(b, self.arena.level(b), false, now_ms);
            }
        }
        let seq = self.seqs.get_mut(&id).expect("sequence exists");
        if swa && seq.beams.len() == 1 {
            seq.slid_to = seq.slid_to.max(slots);
        }
        detach
    }

    /// Whether growing sequence `id` to `num_tokens` tokens only writes the token into a block
    /// it already holds (nothing to detach, no block to allocate): `add_token`'s common case,
    /// which needs no check and cannot fail.
    pub fn token_fits_in_place(
        &self,
        id: u64,
        num_tokens: usize,
        swa: bool,
        step_slack: usize,
    ) -> bool {
        self.fits_in_place(&self.seqs[&id], num_tokens, swa, step_slack)
    }

    /// `token_needs` is all zeros: nothing to detach, no block to allocate.
    #[inline(always)]
    fn fits_in_place(
        &self,
        seq: &SeqBlocks,
        num_tokens: usize,
        swa: bool,
        step_slack: usize,
    ) -> bool {
        let needs = self.token_needs(seq, num_tokens, swa, step_slack);
        needs.detach == 0 && needs.new_blocks == 0
    }

    /// `token_fits_in_place`, then `write_last_token` when it fits, with one sequence lookup:
    /// all a manager with a single window does for the common decode token.
    pub fn write_token_if_in_place(
        &mut self,
        id: u64,
        num_tokens: usize,
        token: i32,
        extra: Option<u64>,
        swa: bool,
        step_slack: usize,
    ) -> bool {
        let seq = &self.seqs[&id];
        if !self.fits_in_place(seq, num_tokens, swa, step_slack) {
            return false;
        }
        write_slots(&mut self.tree, &self.cfg, seq, num_tokens, token, extra);
        true
    }

    /// Writes token number `num_tokens` (the last) into its block's slot on every beam (with
    /// reuse on: storing reads the slots). The block must be held (`token_fits_in_place`, or
    /// `add_token` after allocating it).
    pub fn write_last_token(&mut self, id: u64, num_tokens: usize, token: i32, extra: Option<u64>) {
        let seq = &self.seqs[&id];
        write_slots(&mut self.tree, &self.cfg, seq, num_tokens, token, extra);
    }

    /// Number of listed blocks (front-detached included) a sequence of `num_tokens` needs.
    pub fn blocks_for_tokens(&self, num_tokens: usize) -> usize {
        num_tokens
            .min(self.cfg.max_token_num)
            .div_ceil(self.cfg.tokens_per_block)
    }

    /// Whether shrinking sequence `id` to `num_tokens` would release a front-detached block.
    /// After `slide_to_slots`, also whether the token at position `num_tokens - 1` (computed
    /// next once the slots end there) would still find every block of its window held.
    pub fn can_shrink_to(&self, id: u64, num_tokens: usize) -> bool {
        let seq = &self.seqs[&id];
        let keep = self.blocks_for_tokens(num_tokens);
        let kept = keep > seq.front_removed || (keep == 0 && seq.front_removed == 0);
        let slid_window_held = seq.slid_to <= num_tokens
            || seq.front_removed * self.cfg.tokens_per_block
                <= num_tokens.saturating_sub(self.cfg.window_size);
        kept && slid_window_held
    }

    /// Whether rewinding sequence `id` to `num_tokens` known tokens keeps every block inside the
    /// window held: a detached block must lie wholly before the window of the next token
    /// (positions `num_tokens - window_size ..`). Otherwise the offset table would point attention
    /// at a block the sequence no longer holds, which another request may have rewritten.
    pub fn rewind_keeps_window(&self, id: u64, num_tokens: usize) -> bool {
        let seq = &self.seqs[&id];
        seq.front_removed * self.cfg.tokens_per_block
            <= num_tokens.saturating_sub(self.cfg.window_size)
    }

    /// The block a sequence shrunk to `num_tokens` tokens will write again from position
    /// `num_tokens` on, with the tokens it keeps — when that block is cached or shared, so its
    /// content must not change under the tree or another sequence.
    fn rewritten_shared_block(&self, id: u64, num_tokens: usize) -> Option<RewrittenBlock> {
        let tpb = self.cfg.tokens_per_block;
        let kept = num_tokens % tpb;
        if kept == 0 {
            return None;
        }
        let index = num_tokens / tpb;
        let block = *self.seqs[&id].beams[0].get(index)?;
        (self.tree.is_in_tree(block) || self.arena.ref_count(block) > 1).then_some(RewrittenBlock {
            index,
            block,
            kept,
        })
    }

    /// Checks that rewinding sequence `id` to `num_tokens` tokens can be served: a shared block
    /// that will be written again with other tokens needs a fresh block for its copy.
    pub fn check_remove_tokens(&self, id: u64, num_tokens: usize) -> KvResult<()> {
        let Some(RewrittenBlock { block, .. }) = self.rewritten_shared_block(id, num_tokens) else {
            return Ok(());
        };
        if self.arena.ref_count(block) == 1 {
            return Ok(());
        }
        let seq = &self.seqs[&id];
        let keep = self.blocks_for_tokens(num_tokens);
        let freed = seq.beams[0][keep..]
            .iter()
            .filter(|&&b| self.arena.ref_count(b) == 1)
            .count();
        let available = self.queues.num_free(Level::Primary) + freed;
        if available == 0 {
            return Err(KvError::OutOfBlocks {
                window_size: self.cfg.window_size,
                needed: 1,
                available,
            });
        }
        Ok(())
    }

    /// Shrinks sequence `id` to `num_tokens` tokens (beam width 1), releasing surplus last blocks
    /// to the front of their queue (they are the next to evict). The new last block will be
    /// written again past the kept tokens: if other sequences share it, it is copied into a fresh
    /// block first (copy on write); if only the reuse tree holds it, it leaves the tree. With
    /// `same_tokens` (a capacity shrink: the known tokens past it are kept and written back into
    /// the same slots), a shared block keeps its content, so no copy and no free block is needed.
    pub fn remove_tokens(
        &mut self,
        id: u64,
        num_tokens: usize,
        same_tokens: bool,
        decode: BlockRetention,
        now_ms: u64,
    ) {
        let keep = self.blocks_for_tokens(num_tokens);
        let seq = self.seqs.get_mut(&id).expect("sequence exists");
        seq.slid_to = seq.slid_to.min(num_tokens);
        let mut released = Vec::new();
        for beam in seq.beams.iter_mut() {
            while beam.len() > keep {
                released.push(beam.pop().expect("non-empty"));
            }
        }
        for b in released {
            if self.arena.remove_ref(b) == 0 {
                self.queues.release(b, self.arena.level(b), true, now_ms);
            }
        }
        if let Some(RewrittenBlock { index, block, kept }) =
            self.rewritten_shared_block(id, num_tokens)
        {
            if self.arena.ref_count(block) > 1 {
                if same_tokens {
                    return;
                }
                let fresh = self.get_free_block(decode, now_ms);
                self.queue_copy(block, fresh, kept);
                self.tree.copy_slot(block, fresh, kept);
                self.arena.remove_ref(block);
                self.arena.add_refs(fresh, 1);
                self.seqs.get_mut(&id).expect("exists").beams[0][index] = fresh;
                self.flush_copies();
            } else {
                self.evict_from_tree(block);
                // Its tokens past `kept` will change: the key is no longer the sequence's.
                self.tree.disown_key(block);
            }
        }
    }
}
