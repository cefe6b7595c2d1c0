//! Operations on the reuse tree that TensorRT-LLM's 2026 manager exposes beside admission:
//! prefix analysis in one walk, lookups of a cached chain by its keys (with pins for a reader on
//! another thread), truncating a cached chain, dropping the whole tree, and committing a
//! sequence's full blocks to get their hash chain.

use super::scheduling::check_prompt_keys;
use super::{absorb, KvCacheManager, Request};
use crate::error::{KvError, KvResult};
use crate::key::{block_hash, BlockKeyRef};
use crate::window::{KeySource, PrefixReuse};

impl KvCacheManager {
    /// One walk of a window's tree along `request`'s prompt (TensorRT-LLM
    /// `analyzePrefixReuse`): reusable full blocks (all, and those some sequence holds) and the
    /// first block the tree does not supply.
    pub fn analyze_prefix_reuse(
        &mut self,
        request: &Request,
        window_size: usize,
    ) -> KvResult<PrefixReuse> {
        let wi = self.window_index(window_size)?;
        check_prompt_keys(request)?;
        if !self.cfg.enable_block_reuse {
            return Ok(PrefixReuse::default());
        }
        let src = request.key_source();
        Ok(self.windows[wi].analyze_prefix_reuse(&src, request.input_length))
    }

    /// The cached chain whose keys spell the first `num_tokens` tokens of `request` in one
    /// window, root first (TensorRT-LLM `findBlocksInReuseTreeByBlockKeys`). With `pin`, the
    /// chain is cut at its first block not on the GPU tier and every block of it is pinned
    /// (drop them with `unpin_blocks_by_id`), so a reader can copy them while the executor goes
    /// on.
    pub fn find_blocks_in_reuse_tree(
        &mut self,
        request: &Request,
        num_tokens: usize,
        window_size: usize,
        pin: bool,
    ) -> KvResult<Vec<u32>> {
        let wi = self.window_index(window_size)?;
        check_key_range(request, num_tokens)?;
        let w = &mut self.windows[wi];
        let mut chain = w.find_chain(&request.key_source(), num_tokens);
        if pin {
            chain.truncate(w.primary_prefix_len(&chain));
            w.pin_blocks(&chain);
        }
        Ok(chain)
    }

    /// Stores `block_ids` of `window_size` under the keys of `request`'s first `num_tokens`
    /// tokens (TensorRT-LLM `BlockManager::storeBlocks`; see `store_blocks_by_key`). Every id
    /// must be in range and on the GPU tier (checked before anything changes). Returns how many
    /// blocks joined the tree and, with `pin`, the ids pinned along the path.
    pub fn store_blocks_by_key(
        &mut self,
        request: &Request,
        num_tokens: usize,
        window_size: usize,
        block_ids: &[u32],
        pin: bool,
    ) -> KvResult<(usize, Vec<u32>)> {
        let wi = self.window_index(window_size)?;
        check_key_range(request, num_tokens)?;
        self.windows[wi].check_gpu_block_ids(block_ids, "stored")?;
        if !self.cfg.enable_block_reuse {
            return Ok((0, Vec::new()));
        }
        let w = &mut self.windows[wi];
        let out = w.store_blocks_by_key(&request.key_source(), num_tokens, block_ids, pin);
        absorb(&mut self.events, w);
        Ok(out)
    }

    /// Drops from every window's tree the cached blocks of the token sequence `tokens` (plain
    /// tokens: no extra ids, LoRA, salt or multimodal keys) past its first `num_tokens_to_keep`
    /// tokens, rounded up to whole blocks (TensorRT-LLM `truncateBlocks`). Blocks held by
    /// sequences stay with them, no longer reusable; free ones become plain free blocks. Returns
    /// how many blocks left the trees.
    pub fn truncate_blocks(&mut self, tokens: &[i32], num_tokens_to_keep: usize) -> usize {
        let keep_blocks = num_tokens_to_keep.div_ceil(self.cfg.tokens_per_block);
        let src = KeySource {
            token_ids: tokens,
            extra_ids: None,
            lora_task_id: None,
            cache_salt: None,
            mm_items: &[],
        };
        let mut removed = 0;
        for w in &mut self.windows {
            let chain = w.find_chain(&src, tokens.len());
            if let Some(&first) = chain.get(keep_blocks) {
                removed += w.drop_cached_subtree(first);
                absorb(&mut self.events, w);
            }
        }
        removed
    }

    /// Empties every window's reuse tree (TensorRT-LLM `resetReuseState`), e.g. after the
    /// weights changed: no later request reuses KV computed before. Blocks held by sequences
    /// stay with them; cached free blocks become plain free blocks. Removed events name every
    /// block that left. Returns how many did.
    pub fn reset_reuse_state(&mut self) -> usize {
        let mut removed = 0;
        for w in &mut self.windows {
            removed += w.drop_reuse_tree();
            absorb(&mut self.events, w);
        }
        removed
    }

    /// Stores the full blocks of a sequence's computed tokens (its history) in the reuse trees
    /// and returns their TensorRT-LLM hash chain in `window_size`, first block first
    /// (TensorRT-LLM `commitAndGetBlockHashesForRequest`, for a KV connector). Beam 0; empty
    /// for a sequence with beam search.
    pub fn commit_block_hashes(&mut self, id: u64, window_size: usize) -> KvResult<Vec<u64>> {
        self.window_index(window_size)?;
        let seq = self.sequence(id)?;
        // Without reuse nothing is committed, and the blocks' slots (which hold the tokens the
        // hashes are made of) are never written.
        if seq.beam_width > 1 || !self.cfg.enable_block_reuse {
            return Ok(Vec::new());
        }
        let tpb = self.cfg.tokens_per_block;
        let n = seq.life.history.min(self.stored_limit(id)) / tpb * tpb;
        let max_len = self.cfg.max_sequence_length;
        let attrs = self.sequences[&id].key_attrs();
        for w in self.windows.iter_mut().rev() {
            if !w.config().is_swa(max_len) && w.is_valid_for_store(id) {
                w.store_blocks(id, &attrs, n, false, false);
                absorb(&mut self.events, w);
            }
        }
        self.note_stored(id, n, n);
        // The hashes follow from the keys in the sequence's own slots, whether its blocks or
        // equal ones already cached hold the tree's copy. The chain is the same in every
        // window; the largest one keeps the front blocks a sliding window detaches.
        let seq = &self.sequences[&id];
        let attrs = seq.key_attrs();
        let w = self.windows.last().expect("a manager has a window");
        let ids = w.block_ids(id, 0).unwrap_or(&[]);
        let mut hashes = Vec::with_capacity(n / tpb);
        let mut parent = 0u64;
        let mut scratch = Vec::new();
        for (i, &b) in ids.iter().enumerate().take(n / tpb) {
            if attrs.mm_items.is_empty() {
                scratch.clear();
            } else {
                crate::key::multimodal_keys_for_range(
                    attrs.mm_items,
                    (i * tpb) as i32,
                    ((i + 1) * tpb) as i32,
                    &mut scratch,
                );
            }
            let key: BlockKeyRef<'_> = w.tree().slot_key(b, tpb, attrs.slot, &scratch);
            parent = block_hash(&key, parent);
            hashes.push(parent);
        }
        Ok(hashes)
    }

    /// How many hashes `commit_block_hashes` returns for a sequence now.
    pub fn num_committable_blocks(&self, id: u64) -> KvResult<usize> {
        let seq = self.sequence(id)?;
        if seq.beam_width > 1 {
            return Ok(0);
        }
        Ok(seq.life.history.min(self.stored_limit(id)) / self.cfg.tokens_per_block)
    }

    /// Blocks a sliding window has detached from the front of a sequence (TensorRT-LLM
    /// `GenerationRequest::getNumFrontBlocksRemoved`).
    pub fn num_front_blocks_removed(&self, id: u64, window_size: usize) -> KvResult<usize> {
        self.sequence(id)?;
        Ok(self.window(window_size)?.front_blocks_removed(id))
    }

    /// Beam width of a live sequence.
    pub fn beam_width(&self, id: u64) -> KvResult<usize> {
        Ok(self.sequence(id)?.beam_width)
    }
}

/// A request whose first `num_tokens` tokens key blocks: valid prompt keys, enough tokens.
fn check_key_range(request: &Request, num_tokens: usize) -> KvResult<()> {
    check_prompt_keys(request)?;
    if num_tokens > request.token_ids.len() {
        return Err(KvError::InvalidArgument(format!(
            "num_tokens {num_tokens} exceeds the request's {} tokens",
            request.token_ids.len()
        )));
    }
    Ok(())
}
