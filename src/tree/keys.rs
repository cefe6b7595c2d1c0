//! Block keys in the token arena: a block's key slot, its side attributes, and the slot keys a
//! sequence cuts from its tokens.

use super::*;

impl ReuseTree {
    /// The key stored for `block`.
    pub fn key(&self, block: u32) -> BlockKeyRef<'_> {
        let n = &self.nodes[block as usize];
        let start = block as usize * self.tokens_per_block;
        let end = start + n.key_len as usize;
        let attrs = if n.has_attrs {
            self.key_attrs[&block]
        } else {
            KeyAttrs::default()
        };
        BlockKeyRef {
            token_ids: &self.token_ids[start..end],
            extra_ids: n.uses_extra_ids.then(|| &self.extra_ids[start..end]),
            lora_task_id: attrs.lora_task_id,
            extra_keys: if self.mm_keys.is_empty() {
                &[]
            } else {
                self.mm_keys.get(&block).map_or(&[], |k| &k[..])
            },
            cache_salt: attrs.cache_salt,
        }
    }

    /// Writes `key` into the block's slot (the block must not be in the tree) and records its
    /// lookup hash for a later `insert_with_lookup` (see `current_lookup`).
    pub fn set_key(&mut self, block: u32, key: &BlockKeyRef<'_>) {
        self.set_key_with_lookup(block, key, lookup_hash(key));
    }

    /// The lookup hash of the block's key when that key was written for its current holder and
    /// is `len` tokens long: the holder's tokens for the block are already in the slot.
    #[inline]
    pub fn current_lookup(&self, block: u32, len: usize) -> Option<u64> {
        let n = &self.nodes[block as usize];
        (n.key_current && n.key_len as usize == len).then_some(n.lookup)
    }

    /// The block goes to a new holder: its key is no longer the holder's (the holder writes its
    /// own tokens into the slot).
    #[inline]
    pub fn disown_key(&mut self, block: u32) {
        self.nodes[block as usize].key_current = false;
    }

    /// `set_key` when the caller already has the key's `lookup_hash`.
    #[inline]
    pub fn set_key_with_lookup(&mut self, block: u32, key: &BlockKeyRef<'_>, lookup: u64) {
        debug_assert!(!self.is_in_tree(block));
        debug_assert_eq!(lookup, lookup_hash(key));
        debug_assert!(key.len() <= self.tokens_per_block);
        let start = block as usize * self.tokens_per_block;
        self.token_ids[start..start + key.len()].copy_from_slice(key.token_ids);
        if let Some(extra) = key.extra_ids {
            self.ensure_extra_ids();
            self.extra_ids[start..start + key.len()].copy_from_slice(extra);
        }
        self.set_key_fields(
            block,
            key.len(),
            key.extra_ids.is_some(),
            key.lora_task_id,
            key.cache_salt,
            key.extra_keys,
            lookup,
        );
    }

    pub(super) fn ensure_extra_ids(&mut self) {
        if self.extra_ids.is_empty() {
            self.extra_ids = vec![0; self.token_ids.len()];
        }
    }

    /// The key of the first `len` tokens already in the block's slot, with the holder's key
    /// attributes (`uses_extra_ids`: the extra ids in the slot are part of it). The slot of a
    /// block a sequence holds carries that sequence's tokens (see `write_token`).
    #[inline]
    pub fn slot_key<'s>(
        &'s self,
        block: u32,
        len: usize,
        attrs: SlotKeyAttrs,
        extra_keys: &'s [MmKey],
    ) -> BlockKeyRef<'s> {
        debug_assert!(len <= self.tokens_per_block);
        let start = block as usize * self.tokens_per_block;
        BlockKeyRef {
            token_ids: &self.token_ids[start..start + len],
            extra_ids: attrs
                .uses_extra_ids
                .then(|| &self.extra_ids[start..start + len]),
            lora_task_id: attrs.lora_task_id,
            extra_keys,
            cache_salt: attrs.cache_salt,
        }
    }

    /// Makes the first `len` tokens of the block's slot its key (`slot_key` with the same
    /// arguments, whose `lookup_hash` is `lookup`) without copying them. The block must not be
    /// in the tree.
    pub fn adopt_slot_key(
        &mut self,
        block: u32,
        len: usize,
        attrs: SlotKeyAttrs,
        extra_keys: &[MmKey],
        lookup: u64,
    ) {
        debug_assert!(!self.is_in_tree(block));
        debug_assert_eq!(
            lookup,
            lookup_hash(&self.slot_key(block, len, attrs, extra_keys))
        );
        self.set_key_fields(
            block,
            len,
            attrs.uses_extra_ids,
            attrs.lora_task_id,
            attrs.cache_salt,
            extra_keys,
            lookup,
        );
    }

    /// Writes the holder's token at position `pos` of the block's slot (its extra id too when
    /// the holder has extra ids). Positions inside a cached key are never written; writing
    /// inside a private block's key makes that key no longer the holder's (see `disown_key`).
    #[inline]
    pub fn write_token(&mut self, block: u32, pos: usize, token: i32, extra: Option<u64>) {
        debug_assert!(pos < self.tokens_per_block);
        let n = &mut self.nodes[block as usize];
        debug_assert!(
            !n.in_tree || pos >= n.key_len as usize,
            "cached key written"
        );
        if pos < n.key_len as usize {
            n.key_current = false;
        }
        let at = block as usize * self.tokens_per_block + pos;
        self.token_ids[at] = token;
        if let Some(e) = extra {
            self.ensure_extra_ids();
            self.extra_ids[at] = e;
        }
    }

    /// The token and extra id at position `pos` of the block's slot.
    pub fn slot_token(&self, block: u32, pos: usize) -> SlotToken {
        let at = block as usize * self.tokens_per_block + pos;
        SlotToken {
            token_id: self.token_ids[at],
            extra_id: self.extra_ids.get(at).copied().unwrap_or(0),
        }
    }

    /// Copies the first `len` slot tokens (and extra ids) of `src` into the slot of `dst` (a
    /// private block whose key is not its holder's).
    pub fn copy_slot(&mut self, src: u32, dst: u32, len: usize) {
        debug_assert!(!self.is_in_tree(dst) && !self.nodes[dst as usize].key_current);
        let tpb = self.tokens_per_block;
        let (s, d) = (src as usize * tpb, dst as usize * tpb);
        self.token_ids.copy_within(s..s + len, d);
        if !self.extra_ids.is_empty() {
            self.extra_ids.copy_within(s..s + len, d);
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn set_key_fields(
        &mut self,
        block: u32,
        len: usize,
        uses_extra_ids: bool,
        lora_task_id: Option<u64>,
        cache_salt: Option<u64>,
        extra_keys: &[MmKey],
        lookup: u64,
    ) {
        if !extra_keys.is_empty() {
            self.mm_keys.insert(block, extra_keys.into());
        } else if !self.mm_keys.is_empty() {
            self.mm_keys.remove(&block);
        }
        let n = &mut self.nodes[block as usize];
        n.key_len = len as u32;
        n.lookup = lookup;
        n.key_current = true;
        n.has_key = true;
        n.uses_extra_ids = uses_extra_ids;
        n.is_full = len == self.tokens_per_block;
        let attrs = KeyAttrs {
            lora_task_id,
            cache_salt,
        };
        let had_attrs = n.has_attrs;
        n.has_attrs = attrs != KeyAttrs::default();
        if n.has_attrs {
            self.key_attrs.insert(block, attrs);
        } else if had_attrs {
            self.key_attrs.remove(&block);
        }
    }
}
