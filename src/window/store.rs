//! The reuse tree seen from a sequence: storing its blocks for reuse, and counting the reusable
//! prefix of a prompt.

use super::{KeySource, SeqKeyAttrs, WindowBlockManager};
use crate::events::{StoredBlock, WindowEvent};
use crate::key::{lookup_hash, multimodal_keys_for_range};

impl WindowBlockManager {
    /// Stores the first `num_tokens` tokens of sequence `id` (beam 0 blocks) in the reuse tree.
    /// Only full blocks unless `allow_partial`. The keys are the sequence's tokens in its
    /// blocks' slots, with `attrs`. Existing equal blocks are descended into and the sequence's
    /// own copies stay private; with `pin`, every block on the path gets a pin. Returns the ids
    /// of the pinned blocks (empty without `pin`); the newly stored ones go into a Stored event
    /// when events are on.
    pub fn store_blocks(
        &mut self,
        id: u64,
        attrs: &SeqKeyAttrs<'_>,
        num_tokens: usize,
        allow_partial: bool,
        pin: bool,
    ) -> Vec<u32> {
        let tpb = self.cfg.tokens_per_block;
        let mut stored = Vec::new();
        let mut pinned = Vec::new();
        let Some(seq) = self.seqs.get_mut(&id) else {
            return pinned;
        };
        // Taken out for the walk (no copy); put back below.
        let ids = std::mem::take(&mut seq.beams[0]);
        let num_blocks = if allow_partial {
            num_tokens.div_ceil(tpb)
        } else {
            num_tokens / tpb
        }
        .min(ids.len());
        // Resume after the deepest block of ours already in the tree with a full-length key:
        // the path to it spells our prefix (no need to walk it again, e.g. for every decode
        // block). Pinning needs the whole path, so it walks from the root.
        let mut first = 0;
        let mut parent = self.tree.root();
        if !pin {
            if let Some(i) = (0..num_blocks).rev().find(|&i| {
                let b = ids[i];
                self.tree.is_in_tree(b)
                    && self.tree.key(b).len() == ((i + 1) * tpb).min(num_tokens) - i * tpb
            }) {
                first = i + 1;
                parent = ids[i];
            }
        }
        let mut scratch = std::mem::take(&mut self.mm_scratch);
        let mut matching = true;
        for (i, &block) in ids.iter().enumerate().take(num_blocks).skip(first) {
            let start = i * tpb;
            let end = ((i + 1) * tpb).min(num_tokens);
            let len = end - start;
            if attrs.mm_items.is_empty() {
                scratch.clear();
            } else {
                multimodal_keys_for_range(attrs.mm_items, start as i32, end as i32, &mut scratch);
            }
            // Admission hashed a prompt block's key when it wrote it: not again here.
            let current = self.tree.current_lookup(block, len);
            let (lookup, existing) = match current {
                // Past the first miss with the key in place: nothing to compare.
                Some(lookup) if !matching => (lookup, None),
                _ => {
                    let key = self.tree.slot_key(block, len, attrs.slot, &scratch);
                    let lookup = current.unwrap_or_else(|| lookup_hash(&key));
                    let found = if matching {
                        self.tree.find_exact(parent, &key, lookup)
                    } else {
                        None
                    };
                    matching = found.is_some();
                    (lookup, found)
                }
            };
            let node = match existing {
                Some(n) => n,
                None => {
                    if self.tree.is_in_tree(block) || !self.arena.is_primary(block) {
                        break;
                    }
                    if current.is_none() {
                        self.tree
                            .adopt_slot_key(block, len, attrs.slot, &scratch, lookup);
                    }
                    if !self.tree.insert_with_lookup(parent, block, lookup) {
                        break;
                    }
                    // Only a Stored event and the remote tier's write path use them.
                    if self.events.is_some() || self.lower.remote.is_some() {
                        stored.push(block);
                    }
                    block
                }
            };
            if pin {
                self.pin_on_path(node, &mut pinned);
            }
            parent = node;
        }
        self.mm_scratch = scratch;
        self.seqs.get_mut(&id).expect("exists").beams[0] = ids;
        self.remote_write_stored(&stored);
        self.record_stored(&stored);
        pinned
    }

    /// Stores `blocks` under the keys of `src`'s first `num_tokens` tokens, block `i` under
    /// tokens `[i × tpb, min((i + 1) × tpb, num_tokens))` (TensorRT-LLM
    /// `WindowBlockManager::storeBlocks`, for blocks whose bytes arrived from elsewhere, such
    /// as a cache transceiver's). The walk follows the tree while it finds each key: there the
    /// block already cached is kept and the given one skipped; from the first miss on, each
    /// given block takes its key (written into its slot, where kvblock keeps its holder's
    /// tokens) and joins the tree under the previous one. It stops at a given block already in
    /// the tree elsewhere, or off the GPU tier. With `pin`, every block on the walked path (the
    /// cached ones where matched) gets a pin. Returns how many blocks joined the tree and the
    /// pinned ids; the joined ones go into one Stored event.
    pub fn store_blocks_by_key(
        &mut self,
        src: &KeySource<'_>,
        num_tokens: usize,
        blocks: &[u32],
        pin: bool,
    ) -> (usize, Vec<u32>) {
        let tpb = self.cfg.tokens_per_block;
        let mut scratch = std::mem::take(&mut self.mm_scratch);
        let mut parent = self.tree.root();
        let mut matching = true;
        let mut stored = Vec::new();
        let mut pinned = Vec::new();
        for (i, &block) in blocks.iter().enumerate().take(num_tokens.div_ceil(tpb)) {
            let key = src.key(i * tpb, ((i + 1) * tpb).min(num_tokens), &mut scratch);
            let lookup = lookup_hash(&key);
            let found = if matching {
                self.tree.find_exact(parent, &key, lookup)
            } else {
                None
            };
            let node = match found {
                Some(cached) => cached,
                None => {
                    matching = false;
                    if self.tree.is_in_tree(block) || !self.arena.is_primary(block) {
                        break;
                    }
                    self.tree.set_key_with_lookup(block, &key, lookup);
                    if !self.tree.insert_with_lookup(parent, block, lookup) {
                        break;
                    }
                    stored.push(block);
                    block
                }
            };
            if pin {
                self.pin_on_path(node, &mut pinned);
            }
            parent = node;
        }
        self.mm_scratch = scratch;
        self.remote_write_stored(&stored);
        self.record_stored(&stored);
        (stored.len(), pinned)
    }

    /// Pins a block on a stored path (a free one leaves its free queue).
    fn pin_on_path(&mut self, node: u32, pinned: &mut Vec<u32>) {
        self.arena.pin(node);
        self.queues.claim(node);
        pinned.push(node);
    }

    pub(super) fn record_stored(&mut self, stored: &[u32]) {
        let (Some(events), Some(&first)) = (&mut self.events, stored.first()) else {
            return;
        };
        let parent = self.tree.parent(first).expect("just stored");
        let parent_hash = (parent != self.tree.root()).then(|| self.tree.hash(parent));
        let blocks = stored
            .iter()
            .map(|&b| {
                let key = self.tree.key(b);
                StoredBlock {
                    hash: self.tree.hash(b),
                    token_ids: key.token_ids.to_vec(),
                    extra_ids: key.extra_ids.map(|e| e.to_vec()),
                    lora_task_id: key.lora_task_id,
                    cache_level: self.arena.level(b),
                    priority: self.queues.priority(b),
                    mm_keys: key.extra_keys.to_vec(),
                    cache_salt: key.cache_salt,
                }
            })
            .collect();
        events.push(WindowEvent::Stored {
            parent_hash,
            blocks,
        });
    }

    /// Number of consecutive full prompt blocks found in the tree from the root (optionally only
    /// those currently referenced).
    pub fn count_reusable_blocks(
        &mut self,
        src: &KeySource<'_>,
        input_length: usize,
        only_allocated: bool,
    ) -> usize {
        if !self.cfg.enable_reuse || input_length == 0 {
            return 0;
        }
        let tpb = self.cfg.tokens_per_block;
        let full = (input_length - 1) / tpb;
        let mut scratch = std::mem::take(&mut self.mm_scratch);
        let mut parent = self.tree.root();
        let mut count = 0;
        for bi in 0..full {
            let key = src.key(bi * tpb, (bi + 1) * tpb, &mut scratch);
            let Some(b) = self.tree.find_exact(parent, &key, lookup_hash(&key)) else {
                break;
            };
            if !only_allocated || self.arena.ref_count(b) > 0 {
                count += 1;
            }
            parent = b;
        }
        self.mm_scratch = scratch;
        count
    }
}
