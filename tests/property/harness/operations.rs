//! Every other operation: tokens, stores, pins, releases, rewinds, offloads, truncations.

use super::*;

impl Harness {
    pub(super) fn op_add_token(&mut self) {
        let Some(id) = self.random_live() else {
            return self.op_add_sequence();
        };
        let token = self.rng.below(4) as i32;
        let len = self.seqs[&id].tokens.len();
        let beam = self.seqs[&id].beam;
        // The scheduler's one-step estimate, summed over windows, is what the step allocates.
        let state = RequestState {
            request_id: id,
            phase: RequestPhase::Generation,
            prompt_len: self.seqs[&id].input_length,
            beam_width: beam,
            context_chunk_size: 0,
            num_draft_tokens: 0,
            max_new_tokens: MAX_SEQ,
            num_generated_tokens: len - self.seqs[&id].input_length,
        };
        let mut needed = 0;
        for w in self.windows.clone() {
            needed += self
                .m
                .needed_blocks_one_step(&state, None, false, w)
                .unwrap_or_else(|e| self.fail(format!("needed_blocks_one_step: {e}")));
        }
        let before = self.snapshot();
        let result = self.m.add_token(id, token);
        self.log(|| format!("add_token {id} {token} -> {result:?}"));
        match result {
            Ok(()) => {
                if len >= MAX_SEQ {
                    self.fail(format!("add_token past the maximum length ({len} tokens)"));
                }
                self.seqs.get_mut(&id).unwrap().push(token);
                let allocated =
                    (self.m.stats().alloc_total_blocks - before.0.alloc_total_blocks) as usize;
                if allocated != needed {
                    self.fail(format!(
                        "add_token allocated {allocated} blocks, needed_blocks_one_step said \
                         {needed}"
                    ));
                }
                self.data(id, len..len + 1, true, "");
                if self.rng.percent(40) {
                    self.log(|| format!("store_new_block {id}"));
                    self.m
                        .store_new_block(id)
                        .unwrap_or_else(|e| self.fail(format!("store_new_block: {e}")));
                    // Stores the block the new token completed: tokens 0..len.
                    if len.is_multiple_of(TPB) {
                        self.record_store(id, len);
                    }
                }
            }
            Err(KvError::SequenceTooLong { .. }) if len >= MAX_SEQ => {
                self.expect_unchanged(&before, "add_token");
            }
            Err(KvError::OutOfBlocks { .. }) => {
                self.cov.oob_tokens += 1;
                self.expect_unchanged(&before, "add_token");
                if self.m.num_tokens(id).unwrap() != len {
                    self.fail("a failed add_token appended the token");
                }
            }
            Err(e) => self.fail(format!("add_token({id}): {e}")),
        }
    }

    pub(super) fn op_store_context(&mut self) {
        let Some(id) = self.random_live() else { return };
        let input = self.seqs[&id].input_length;
        let pos = self.rng.range(0, input);
        self.log(|| format!("store_context_blocks {id} {pos}"));
        self.m
            .store_context_blocks(id, pos)
            .unwrap_or_else(|e| self.fail(format!("store_context_blocks({id}, {pos}): {e}")));
        let n = pos.min(input - 1) / TPB * TPB;
        self.record_store(id, n);
    }

    pub(super) fn op_store_new_block(&mut self) {
        let Some(id) = self.random_live() else { return };
        self.log(|| format!("store_new_block {id}"));
        self.m
            .store_new_block(id)
            .unwrap_or_else(|e| self.fail(format!("store_new_block({id}): {e}")));
        let n = self.seqs[&id].tokens.len() - 1;
        if n.is_multiple_of(TPB) {
            self.record_store(id, n);
        }
    }

    pub(super) fn op_store_for_reuse(&mut self) {
        let Some(id) = self.random_live() else { return };
        let pin = self.rng.percent(60) && self.pins.len() < 8;
        let before = self.pin_counts();
        let ids = self
            .m
            .store_blocks_for_reuse(id, pin, None, usize::MAX)
            .unwrap_or_else(|e| self.fail(format!("store_blocks_for_reuse({id}): {e}")));
        self.log(|| format!("store_blocks_for_reuse {id} pin {pin} -> {ids:?}"));
        let n = self.seqs[&id].tokens.len() - 1;
        self.record_store(id, n);
        let mut new_pins = self.record_new_pins(&before);
        if !pin && !new_pins.is_empty() {
            self.fail("store without pin pinned blocks");
        }
        let mut returned = ids.clone();
        returned.sort_unstable();
        new_pins.sort_unstable();
        if returned != new_pins {
            self.fail(format!(
                "store_blocks_for_reuse returned pins {ids:?}, the smallest window gained {new_pins:?}"
            ));
        }
    }

    pub(super) fn op_pin_blocks(&mut self) {
        if self.pins.len() >= 8 {
            return self.op_unpin();
        }
        let Some(id) = self.random_live() else { return };
        let before = self.pin_counts();
        self.log(|| format!("pin_blocks {id}"));
        self.m
            .pin_blocks(id)
            .unwrap_or_else(|e| self.fail(format!("pin_blocks({id}): {e}")));
        self.record_new_pins(&before);
    }

    pub(super) fn op_unpin(&mut self) {
        if self.pins.is_empty() {
            return;
        }
        let i = self.rng.below(self.pins.len());
        let (w, mut ids) = self.pins.swap_remove(i);
        // Sometimes only part of the group.
        if ids.len() > 1 && self.rng.percent(30) {
            let keep = ids.split_off(self.rng.range(1, ids.len() - 1));
            self.pins.push((w, keep));
        }
        self.log(|| format!("unpin_blocks_by_id {w} {ids:?}"));
        self.m
            .unpin_blocks_by_id(w, &ids)
            .unwrap_or_else(|e| self.fail(format!("unpin_blocks_by_id({w}, {ids:?}): {e}")));
        self.cov.unpinned += ids.len();
    }

    pub(super) fn op_remove(&mut self) {
        let Some(id) = self.random_live() else { return };
        let store = self.rng.percent(70);
        self.log(|| format!("remove_sequence {id} store {store}"));
        // The scheduling simulation predicts the free blocks after the removal.
        self.m.start_scheduling();
        self.m.scheduling_remove_sequence(id).unwrap();
        let predicted: Vec<usize> = self
            .windows
            .iter()
            .map(|&w| self.m.window(w).unwrap().scheduling_free_blocks())
            .collect();
        if store {
            let n = self.seqs[&id].tokens.len() - 1;
            self.record_store(id, n);
        }
        self.m
            .remove_sequence(id, store)
            .unwrap_or_else(|e| self.fail(format!("remove_sequence({id}, {store}): {e}")));
        self.seqs.remove(&id);
        let free: Vec<usize> = self.snapshot().1.iter().map(|f| f.0).collect();
        if free != predicted {
            self.fail(format!(
                "scheduling_remove_sequence predicted {predicted:?} free blocks, removal left \
                 {free:?}"
            ));
        }
    }

    pub(super) fn op_rewind(&mut self) {
        let Some(id) = self.random_live() else { return };
        let seq = &self.seqs[&id];
        let len = seq.tokens.len();
        let floor = seq.input_length;
        if len <= floor {
            return;
        }
        let n = self.rng.range(1, len - floor);
        let beam = seq.beam;
        let before = self.snapshot();
        let result = self.m.rewind(id, n);
        self.log(|| format!("rewind {id} {n} -> {result:?}"));
        match result {
            Ok(()) => {
                if beam > 1 {
                    self.fail("rewind accepted a beam-search sequence");
                }
                self.cov.rewinds += 1;
                self.seqs.get_mut(&id).unwrap().truncate(len - n);
            }
            Err(KvError::Unsupported(_)) | Err(KvError::OutOfBlocks { .. }) => {
                self.cov.unsupported_rewinds += 1;
                self.expect_unchanged(&before, "rewind");
                if self.m.num_tokens(id).unwrap() != len {
                    self.fail("a failed rewind removed tokens");
                }
            }
            Err(e) => self.fail(format!("rewind({id}, {n}): {e}")),
        }
    }

    pub(super) fn op_offload(&mut self) {
        let w = self.windows[self.rng.below(self.windows.len())];
        let num_blocks = self.m.window(w).unwrap().num_blocks() as u32;
        let free_primary: Vec<u32> = (0..num_blocks)
            .filter(|&b| {
                let i = self.m.block_info(w, b).unwrap();
                i.is_free && i.level == Level::Primary
            })
            .collect();
        let before = self.snapshot();
        if free_primary.is_empty() || self.rng.percent(10) {
            // A block sequences hold goes to the host tier and back (TensorRT-LLM's offload and
            // onboard of a held block): its sequences keep it, and its bytes come back, which
            // the reuse checks of later admissions read.
            let referenced: Vec<u32> = (0..num_blocks)
                .filter(|&b| {
                    let info = self.m.block_info(w, b).unwrap();
                    info.ref_count > 0 && info.level == Level::Primary
                })
                .collect();
            if let Some(&b) = referenced.get(self.rng.below(referenced.len().max(1))) {
                let refs = self.m.block_info(w, b).unwrap().ref_count;
                match self.m.offload_block(w, b) {
                    Ok(true) => {
                        let info = self.m.block_info(w, b).unwrap();
                        if info.level != Level::Secondary || info.ref_count != refs {
                            self.fail(format!("held block {b} after its offload: {info:?}"));
                        }
                        if let Err(e) = self.m.check_invariants() {
                            self.fail(format!("held block {b} on the host tier: {e}"));
                        }
                        match self.m.onboard_block(w, b) {
                            Ok(true)
                                if self.m.block_info(w, b).unwrap().level == Level::Primary =>
                            {
                                self.cov.held_round_trips += 1;
                            }
                            other => self.fail(format!("onboard of held block {b}: {other:?}")),
                        }
                    }
                    Ok(false) => self.expect_unchanged(&before, "offload"),
                    // A pinned block stays (its pin promises a reader the GPU row).
                    Err(KvError::InvalidArgument(e)) if e.contains("pinned") => {
                        self.expect_unchanged(&before, "offload of a pinned block")
                    }
                    Err(e) => self.fail(format!("offload of held block {b}: {e}")),
                }
            }
            return;
        }
        let b = free_primary[self.rng.below(free_primary.len())];
        let result = self.m.offload_block(w, b);
        self.log(|| format!("offload_block {w} {b} -> {result:?}"));
        match result {
            Ok(true) => {
                self.cov.explicit_offloads += 1;
                let info = self.m.block_info(w, b).unwrap();
                if info.level != Level::Secondary || !info.is_free {
                    self.fail(format!("offloaded block {b} is {info:?}"));
                }
            }
            Ok(false) => self.expect_unchanged(&before, "offload"),
            Err(e) => self.fail(format!("offload_block({w}, {b}): {e}")),
        }
    }

    pub(super) fn op_reset_reuse_state(&mut self) {
        self.log(|| "reset_reuse_state".into());
        self.m.reset_reuse_state();
        for w in self.windows.clone() {
            if self.m.window(w).unwrap().num_in_tree() != 0 {
                self.fail(format!("window {w} keeps cached blocks after a reset"));
            }
        }
        self.cov.resets += 1;
    }

    pub(super) fn op_truncate_blocks(&mut self) {
        let Some(tokens) = self.plain_history_prompt() else {
            return;
        };
        let keep = self.rng.range(0, tokens.len());
        self.log(|| format!("truncate_blocks {tokens:?} keep {keep}"));
        self.m.truncate_blocks(&tokens, keep);
        let probe = Request::new(0, tokens.clone());
        for w in self.windows.clone() {
            let left = self.m.count_reusable_blocks(&probe, w, false).unwrap();
            if left > keep.div_ceil(TPB) {
                self.fail(format!(
                    "window {w}: {left} blocks of a prompt truncated to {keep} tokens stay reusable"
                ));
            }
        }
        self.cov.truncations += 1;
    }

    /// A transceiver's lookup with pins: the chain is cached and on the GPU; its pins are
    /// dropped later by `op_unpin` like any other.
    pub(super) fn op_pinned_lookup(&mut self) {
        if self.history.is_empty() || self.pins.len() >= 8 {
            return self.op_unpin();
        }
        let (tokens, lora, salt) = self.history[self.rng.below(self.history.len())].clone();
        let mut req = Request::new(0, tokens.clone());
        req.lora_task_id = lora;
        req.cache_salt = salt;
        let n = self.rng.range(1, tokens.len());
        let w = self.windows[self.rng.below(self.windows.len())];
        self.log(|| format!("find_blocks_in_reuse_tree {tokens:?} n {n} window {w} pin"));
        let chain = self
            .m
            .find_blocks_in_reuse_tree(&req, n, w, true)
            .unwrap_or_else(|e| self.fail(format!("find_blocks_in_reuse_tree: {e}")));
        for &b in &chain {
            let info = self.m.block_info(w, b).unwrap();
            if !info.in_reuse_tree || info.level != Level::Primary || info.ref_count == 0 {
                self.fail(format!("looked-up block {b} of window {w}: {info:?}"));
            }
        }
        if !chain.is_empty() {
            self.cov.pinned += chain.len();
            self.cov.pinned_lookups += 1;
            self.pins.push((w, chain));
        }
    }
}
