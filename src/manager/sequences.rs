//! A running sequence: generated tokens, rewinding, store for reuse, release and pins.

use super::{absorb, KvCacheManager};
use crate::error::{KvError, KvResult};

impl KvCacheManager {
    /// Appends a generated token (TensorRT-LLM `addToken`): detaches out-of-window blocks and
    /// allocates a new block when the sequence crosses a block boundary.
    pub fn add_token(&mut self, id: u64, token_id: i32) -> KvResult<()> {
        self.grow_by_token(id, token_id).map(|_| ())
    }

    /// `add_token`, returning the sequence's new token count.
    fn grow_by_token(&mut self, id: u64, token_id: i32) -> KvResult<usize> {
        let max_len = self.cfg.max_sequence_length;
        let seq = self
            .sequences
            .get_mut(&id)
            .ok_or(KvError::UnknownRequest(id))?;
        Self::check_generating(id, seq)?;
        let num_tokens = seq.num_tokens + 1;
        let (step, step_slack) = seq
            .life
            .step_for(self.iteration, seq.num_tokens, num_tokens);
        if num_tokens > max_len {
            return Err(KvError::SequenceTooLong {
                length: num_tokens,
                max: max_len,
            });
        }
        // Generated tokens have no extra id (0).
        let extra = seq.key_attrs.uses_extra_ids.then_some(0);
        // The common case (31 tokens of 32): the token's slot is in a block every window holds.
        let in_place = match self.windows.as_mut_slice() {
            [w] => {
                let swa = w.config().is_swa(max_len);
                w.write_token_if_in_place(id, num_tokens, token_id, extra, swa, step_slack)
            }
            windows => {
                let fits = windows.iter().all(|w| {
                    w.token_fits_in_place(id, num_tokens, w.config().is_swa(max_len), step_slack)
                });
                if fits {
                    for w in windows.iter_mut() {
                        w.write_last_token(id, num_tokens, token_id, extra);
                    }
                }
                fits
            }
        };
        if in_place {
            seq.num_tokens = num_tokens;
            seq.life.token_added(num_tokens);
            seq.life.set_step(step);
            return Ok(num_tokens);
        }
        let decode = seq.retention.decode_retention();
        for w in &self.windows {
            w.check_add_token(id, num_tokens, w.config().is_swa(max_len), step_slack)?;
        }
        let now = self.op_now_ms();
        for w in &mut self.windows {
            let swa = w.config().is_swa(max_len);
            w.add_token(
                id, num_tokens, token_id, extra, swa, step_slack, decode, now,
            );
            absorb(&mut self.events, w);
        }
        let seq = self.sequences.get_mut(&id).expect("checked");
        seq.num_tokens = num_tokens;
        seq.life.token_added(num_tokens);
        seq.life.set_step(step);
        Ok(num_tokens)
    }

    /// One decode step for many sequences: `add_token` (then `store_new_block` when `store`)
    /// for each `(id, token)` in order. Stops at the first sequence that fails, which is left
    /// unchanged like the ones after it; returns how many sequences got their token, and the
    /// failure.
    pub fn add_tokens(
        &mut self,
        ids: &[u64],
        tokens: &[i32],
        store: bool,
    ) -> (usize, KvResult<()>) {
        let tpb = self.cfg.tokens_per_block;
        for (i, (&id, &token)) in ids.iter().zip(tokens).enumerate() {
            let num_tokens = match self.grow_by_token(id, token) {
                Ok(n) => n,
                Err(e) => return (i, Err(e)),
            };
            // `store_new_block` is a no-op unless the token opened a new block.
            if store && (num_tokens - 1) % tpb == 0 {
                // Cannot fail: the sequence exists (add_token just found it).
                self.store_new_block(id).expect("sequence exists");
            }
        }
        (ids.len().min(tokens.len()), Ok(()))
    }

    /// Removes the last `n` tokens (TensorRT-LLM `rewindKVCache`; `removeToken` is `n = 1`).
    /// Blocks no longer needed go to the front of their free queue. The new last block, which
    /// the sequence will write again, is copied first when other sequences share it and leaves
    /// the reuse tree when it was cached (TensorRT-LLM would overwrite cached KV in place).
    /// Beam width 1 only; the prompt cannot be rewound.
    pub fn rewind(&mut self, id: u64, n: usize) -> KvResult<()> {
        let seq = self.sequence(id)?;
        Self::check_generating(id, seq)?;
        if seq.beam_width != 1 {
            return Err(KvError::Unsupported("rewinding needs beam width 1".into()));
        }
        if n > seq.num_tokens - seq.input_length {
            return Err(KvError::InvalidArgument(format!(
                "cannot rewind {n} tokens: only {} were generated",
                seq.num_tokens - seq.input_length
            )));
        }
        let target = seq.num_tokens - n;
        let back_in_window = |w: &&crate::window::WindowBlockManager| {
            !w.can_shrink_to(id, target) || !w.rewind_keeps_window(id, target)
        };
        if let Some(w) = self.windows.iter().find(back_in_window) {
            return Err(KvError::Unsupported(format!(
                "rewinding to {target} tokens would bring blocks window {} already detached back \
                 into the window (a sliding window keeps max_draft_tokens tokens of blocks past \
                 it for rewinds)",
                w.window_size()
            )));
        }
        for w in &self.windows {
            w.check_remove_tokens(id, target)?;
        }
        self.shrink_windows(id, target, false);
        let seq = self.sequences.get_mut(&id).expect("checked");
        seq.num_tokens = target;
        self.note_rewound(id, target);
        Ok(())
    }

    /// Shrinks sequence `id` to `num_tokens` token slots in every window (checked by the
    /// caller): rewind, and capacity shrinks (`same_tokens`: the known tokens past it are kept).
    pub(super) fn shrink_windows(&mut self, id: u64, num_tokens: usize, same_tokens: bool) {
        let now = self.op_now_ms();
        let decode = self.sequences[&id].retention.decode_retention();
        for w in &mut self.windows {
            w.remove_tokens(id, num_tokens, same_tokens, decode, now);
            absorb(&mut self.events, w);
        }
    }

    /// Stores the full blocks of the prompt computed so far (`context_position` tokens, never
    /// the last prompt token) for reuse, after a context chunk. Windows are visited largest
    /// first; sequences with beam search or an invalidated window are skipped there.
    pub fn store_context_blocks(&mut self, id: u64, context_position: usize) -> KvResult<()> {
        let seq = self.sequence(id)?;
        if context_position > seq.input_length {
            return Err(KvError::InvalidArgument(format!(
                "context position {context_position} is beyond the input length {}",
                seq.input_length
            )));
        }
        if context_position > seq.life.capacity {
            return Err(KvError::InvalidArgument(format!(
                "context position {context_position} is beyond the capacity {} of sequence {id}",
                seq.life.capacity
            )));
        }
        if !self.cfg.enable_block_reuse {
            self.note_stored(id, 0, context_position);
            return Ok(());
        }
        let n = context_position.min(seq.input_length - 1);
        let seq = self.sequences.get(&id).expect("checked");
        let attrs = seq.key_attrs();
        for w in self.windows.iter_mut().rev() {
            if w.is_valid_for_store(id) {
                w.store_blocks(id, &attrs, n, false, false);
                absorb(&mut self.events, w);
            }
        }
        let tpb = self.cfg.tokens_per_block;
        self.note_stored(id, n / tpb * tpb, context_position);
        Ok(())
    }

    /// Stores a decode block that just became full (TensorRT-LLM `storeNewBlock`): a no-op unless
    /// the last token opened a new block. Skipped for beam search and sliding windows.
    pub fn store_new_block(&mut self, id: u64) -> KvResult<()> {
        let seq = self.sequence(id)?;
        let tpb = self.cfg.tokens_per_block;
        if !self.cfg.enable_block_reuse || seq.beam_width > 1 || (seq.num_tokens - 1) % tpb != 0 {
            return Ok(());
        }
        let max_len = self.cfg.max_sequence_length;
        let n = seq.num_tokens - 1;
        if n > self.stored_limit(id) {
            return Ok(());
        }
        let seq = self.sequences.get(&id).expect("checked");
        let attrs = seq.key_attrs();
        for w in self.windows.iter_mut().rev() {
            if !w.config().is_swa(max_len) && w.is_valid_for_store(id) {
                w.store_blocks(id, &attrs, n, false, false);
                absorb(&mut self.events, w);
            }
        }
        self.note_stored(id, n, n);
        Ok(())
    }

    /// Stores every computed token of the sequence (its history: the last known token never
    /// counts, and a prefill stops at what its chunks computed; partial last block included) for reuse,
    /// optionally pinning the path; returns the pinned block ids of `pin_window` (the smallest
    /// window when `None`). With `pin`, the caller takes at most `max_pins` ids: when the stored
    /// tokens span more blocks than that, fails with `KvError::BufferTooSmall` (`needed` = that
    /// many blocks) and stores and pins nothing. `max_pins` is ignored without `pin`.
    pub fn store_blocks_for_reuse(
        &mut self,
        id: u64,
        pin: bool,
        pin_window: Option<usize>,
        max_pins: usize,
    ) -> KvResult<Vec<u32>> {
        let pin_window = match pin_window {
            Some(w) => self.window_index(w)?,
            None => 0,
        };
        let seq = self.sequence(id)?;
        // Only tokens in blocks (a reverted context allocation gave some back) whose KV is
        // computed: a request preempted in the middle of its prefill stores what its chunks
        // computed (the history), never prompt blocks nobody wrote.
        let n = (seq.num_tokens - 1)
            .min(self.stored_limit(id))
            .min(seq.life.history);
        if pin {
            // The pinned ids are known only after storing: check their bound first, so that a
            // failed call changes nothing.
            let needed = n.div_ceil(self.tokens_per_block());
            if needed > max_pins {
                return Err(KvError::BufferTooSmall {
                    needed,
                    given: max_pins,
                });
            }
        }
        if !self.cfg.enable_block_reuse || seq.beam_width > 1 {
            return Ok(Vec::new());
        }
        let seq = self.sequences.get(&id).expect("checked");
        let attrs = seq.key_attrs();
        let mut out = Vec::new();
        for (i, w) in self.windows.iter_mut().enumerate().rev() {
            if w.is_valid_for_store(id) {
                let pinned = w.store_blocks(id, &attrs, n, true, pin);
                absorb(&mut self.events, w);
                if i == pin_window {
                    out = pinned;
                }
            }
        }
        Ok(out)
    }

    /// Releases a finished sequence (TensorRT-LLM `removeSequence`): stores it for reuse first
    /// when asked (beam 1, reuse on, still valid), then releases its blocks last to first.
    pub fn remove_sequence(&mut self, id: u64, store_for_reuse: bool) -> KvResult<()> {
        let seq = self.sequence(id)?;
        if store_for_reuse && self.cfg.enable_block_reuse && seq.beam_width == 1 {
            let all_valid = self.windows.iter().all(|w| w.is_valid_for_store(id));
            if all_valid {
                self.store_blocks_for_reuse(id, false, None, 0)?;
            }
        }
        let now = self.op_now_ms();
        for w in &mut self.windows {
            w.release_sequence(id, now);
        }
        self.sequences.remove(&id);
        Ok(())
    }

    /// Pins every block of a sequence in every window so it survives `remove_sequence`.
    pub fn pin_blocks(&mut self, id: u64) -> KvResult<()> {
        self.sequence(id)?;
        for w in &mut self.windows {
            w.pin_sequence(id);
        }
        Ok(())
    }

    /// Pins each listed GPU block of `window_size` (TensorRT-LLM `WindowBlockManager::pinBlock`):
    /// a free one leaves its free queue, so it cannot be evicted until unpinned. All ids are
    /// checked before any is pinned.
    pub fn pin_blocks_by_id(&mut self, window_size: usize, ids: &[u32]) -> KvResult<()> {
        let i = self.window_index(window_size)?;
        self.windows[i].check_gpu_block_ids(ids, "pinned")?;
        self.windows[i].pin_blocks(ids);
        Ok(())
    }

    /// Drops one pin of each listed block of `window_size`.
    pub fn unpin_blocks_by_id(&mut self, window_size: usize, ids: &[u32]) -> KvResult<()> {
        let i = self.window_index(window_size)?;
        self.windows[i].check_unpin(ids)?;
        let now = self.op_now_ms();
        self.windows[i].unpin(ids, now);
        Ok(())
    }
}
