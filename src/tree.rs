//! The reuse (radix) tree of one window. Nodes are blocks; the path from the root spells a token
//! prefix. Each block's key lives in a fixed slot of a token arena (no allocation per block).
//!
//! Each block stores a lookup hash, a fast hash of its own key (the parent already pins the
//! prefix). The children of a node form an intrusive sibling list, walked for partial matching
//! and for detaching subtrees. Exact lookups under a narrow node (at most `WIDE_CHILDREN`
//! children, the common case: chains) scan that list comparing lookup hashes; under a wide node
//! (the root, a shared system prompt's last block) they go through a map
//! `(parent, lookup hash) -> child`. Either way the full key is compared. A key whose
//! `(parent, lookup hash)` is already taken by a different key (a 64-bit collision) is simply not
//! inserted: the block stays private, reuse is lost, nothing is corrupted.
//!
//! TensorRT-LLM's chained block hash (what events and inspection report) is computed at insertion
//! when `track_hashes` is on (events need it), and otherwise on demand by walking the path.

use std::collections::HashMap;

use crate::key::{block_hash, lookup_hash, BlockKeyRef, MmKey};
use crate::premixed::PremixedMap;

pub const NIL: u32 = u32::MAX;

/// Above this many children a node's children are indexed in the child map.
const WIDE_CHILDREN: u32 = 8;

/// The child-map key of a child with `lookup` hash under `parent`. Distinct (parent, lookup)
/// pairs collide with probability 2^-64; a colliding insertion is refused like any other.
fn child_key(parent: u32, lookup: u64) -> u64 {
    lookup ^ u64::from(parent).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The first-token index key of the children of `parent` whose keys start with `token` (exact:
/// both fit in 32 bits).
fn first_token_key(parent: u32, token: i32) -> u64 {
    (u64::from(parent) << 32) | u64::from(token as u32)
}

/// One block's place in the tree: 40 bytes. What few keys carry (LoRA id, cache salt,
/// multimodal keys, extra ids) and the TensorRT-LLM hashes (only tracked for events) live in side
/// tables, so the common block costs only this.
#[derive(Clone, Copy, Debug)]
struct Node {
    /// `lookup_hash` of the key, the child-map key.
    lookup: u64,
    parent: u32,
    first_child: u32,
    next_sibling: u32,
    prev_sibling: u32,
    key_len: u32,
    num_children: u32,
    /// Children are indexed in the child map (once wide, until detached).
    wide: bool,
    has_key: bool,
    /// The key was written for the block's current holder and `lookup` is its lookup hash
    /// (cleared when the block is handed to a new holder): storing it needs no rewrite.
    key_current: bool,
    uses_extra_ids: bool,
    is_full: bool,
    in_tree: bool,
    /// The key has a LoRA id or a cache salt (in `key_attrs`).
    has_attrs: bool,
}

const _: () = assert!(std::mem::size_of::<Node>() == 40);

/// Key fields few requests use, kept apart from `Node`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct KeyAttrs {
    lora_task_id: Option<u64>,
    cache_salt: Option<u64>,
}

const EMPTY_NODE: Node = Node {
    lookup: 0,
    parent: NIL,
    first_child: NIL,
    next_sibling: NIL,
    prev_sibling: NIL,
    key_len: 0,
    num_children: 0,
    wide: false,
    has_key: false,
    key_current: false,
    uses_extra_ids: false,
    is_full: false,
    in_tree: false,
    has_attrs: false,
};

/// The key attributes a sequence gives every block key cut from its tokens (`slot_key`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotKeyAttrs {
    pub uses_extra_ids: bool,
    pub lora_task_id: Option<u64>,
    pub cache_salt: Option<u64>,
}

/// One position of a block's key slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotToken {
    pub token_id: i32,
    /// 0 when no key of the tree has extra ids.
    pub extra_id: u64,
}

/// Result of matching one key under a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Match {
    pub block: u32,
    /// Tokens matched (the whole key for an exact match).
    pub num_tokens: usize,
    /// True unless the match is an exact match of a full block.
    pub partial: bool,
}

#[derive(Clone, Debug)]
pub struct ReuseTree {
    tokens_per_block: usize,
    nodes: Vec<Node>,
    token_ids: Vec<i32>,
    /// Extra ids per token slot; allocated the first time a key uses them.
    extra_ids: Vec<u64>,
    mm_keys: HashMap<u32, Box<[MmKey]>>,
    /// LoRA ids and cache salts of the keys that have them.
    key_attrs: PremixedMap<u32, KeyAttrs>,
    /// TensorRT-LLM chained hash per block (valid for blocks in the tree, kept after they
    /// leave it for their removal events); empty unless hashes are tracked.
    hashes: Vec<u64>,
    /// `child_key(parent, lookup hash)` → child, for the children of wide nodes.
    children: PremixedMap<u64, u32>,
    /// `first_token_key(parent, token)` → the most recently inserted child of a wide `parent`
    /// whose key starts with `token`; the others follow in `same_first_token_next`, in sibling
    /// order. A partial match shares at least the first token, so it only visits these instead
    /// of every child (the root of a pool of unrelated prompts has thousands).
    first_token_heads: PremixedMap<u64, u32>,
    same_first_token_next: PremixedMap<u32, u32>,
    root: u32,
    num_in_tree: usize,
    track_hashes: bool,
    /// Scratch stack for subtree walks (no allocation per eviction).
    stack: Vec<u32>,
}

impl ReuseTree {
    pub fn new(num_blocks: usize, tokens_per_block: usize) -> Self {
        let mut nodes = vec![EMPTY_NODE; num_blocks + 1];
        nodes[num_blocks].in_tree = true;
        nodes[num_blocks].wide = true;
        ReuseTree {
            tokens_per_block,
            nodes,
            token_ids: vec![0; num_blocks * tokens_per_block],
            extra_ids: Vec::new(),
            mm_keys: HashMap::new(),
            key_attrs: PremixedMap::default(),
            hashes: Vec::new(),
            children: PremixedMap::default(),
            first_token_heads: PremixedMap::default(),
            same_first_token_next: PremixedMap::default(),
            root: num_blocks as u32,
            num_in_tree: 0,
            track_hashes: false,
            stack: Vec::new(),
        }
    }

    /// Computes TensorRT-LLM hashes at insertion from now on (call before anything is inserted).
    pub fn track_hashes(&mut self) {
        debug_assert_eq!(self.num_in_tree, 0);
        self.track_hashes = true;
        self.hashes = vec![0; self.nodes.len()];
    }

    /// The root node id (not a block).
    pub fn root(&self) -> u32 {
        self.root
    }

    pub fn num_in_tree(&self) -> usize {
        self.num_in_tree
    }

    #[inline]
    pub fn is_in_tree(&self, block: u32) -> bool {
        block != self.root && self.nodes[block as usize].in_tree
    }

    #[inline]
    pub fn has_key(&self, block: u32) -> bool {
        self.nodes[block as usize].has_key
    }

    pub fn is_full(&self, block: u32) -> bool {
        self.nodes[block as usize].is_full
    }

    pub fn is_leaf(&self, block: u32) -> bool {
        self.nodes[block as usize].first_child == NIL
    }

    /// TensorRT-LLM hash of a block in the tree (0 for the root): stored when hashes are
    /// tracked, otherwise computed along the path from the root.
    pub fn hash(&self, node: u32) -> u64 {
        if node == self.root {
            return 0;
        }
        if self.track_hashes {
            return self.hashes[node as usize];
        }
        if !self.nodes[node as usize].in_tree {
            return 0;
        }
        let mut path = Vec::new();
        let mut n = node;
        while n != self.root {
            path.push(n);
            n = self.nodes[n as usize].parent;
        }
        path.iter()
            .rev()
            .fold(0, |parent_hash, &b| block_hash(&self.key(b), parent_hash))
    }

    /// Prefetches what evicting `block` first touches: its node and its key slot.
    pub fn prefetch_block(&self, block: u32) {
        let b = block as usize;
        crate::prefetch::prefetch(&self.nodes[b]);
        let slot = b * self.tokens_per_block;
        let mut at = slot;
        // Every cache line of the slot (16 tokens of 4 bytes per line).
        while at < slot + self.tokens_per_block {
            crate::prefetch::prefetch(&self.token_ids[at]);
            at += 16;
        }
    }

    /// Prefetches the nodes unlinking `block` from the tree touches (parent, siblings); reads
    /// its node, so call it after `prefetch_block` had time to bring that in.
    pub fn prefetch_neighbors(&self, block: u32) {
        let n = &self.nodes[block as usize];
        if !n.in_tree {
            return;
        }
        for b in [n.parent, n.prev_sibling, n.next_sibling] {
            if b != NIL {
                crate::prefetch::prefetch(&self.nodes[b as usize]);
            }
        }
    }

    /// Tree parent (the root for first-level blocks), or `None` when not in the tree.
    pub fn parent(&self, block: u32) -> Option<u32> {
        let n = &self.nodes[block as usize];
        (n.in_tree && block != self.root).then_some(n.parent)
    }

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

    fn ensure_extra_ids(&mut self) {
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
    fn set_key_fields(
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

    /// The child of `parent` whose key equals `key` (`lookup` = `lookup_hash(key)`).
    pub fn find_exact(&self, parent: u32, key: &BlockKeyRef<'_>, lookup: u64) -> Option<u32> {
        let child = self.child_with_lookup(parent, lookup)?;
        self.key(child).equals(key).then_some(child)
    }

    /// The child of `parent` with this lookup hash, if any.
    #[inline]
    fn child_with_lookup(&self, parent: u32, lookup: u64) -> Option<u32> {
        if self.nodes[parent as usize].wide {
            let child = *self.children.get(&child_key(parent, lookup))?;
            return (self.nodes[child as usize].parent == parent).then_some(child);
        }
        let mut child = self.nodes[parent as usize].first_child;
        while child != NIL {
            let n = &self.nodes[child as usize];
            if n.lookup == lookup {
                return Some(child);
            }
            child = n.next_sibling;
        }
        None
    }

    /// TensorRT-LLM `findMatchingBlock`: an exact child, else (with partial reuse) the eligible
    /// child sharing the longest token prefix. Eligible: any child when `copy_on_partial`,
    /// otherwise only unreferenced leaves (`is_unused`).
    pub fn find_match(
        &self,
        parent: u32,
        key: &BlockKeyRef<'_>,
        lookup: u64,
        partial_reuse: bool,
        copy_on_partial: bool,
        is_unused: impl Fn(u32) -> bool,
    ) -> Option<Match> {
        if key.is_empty() {
            return None;
        }
        if let Some(block) = self.find_exact(parent, key, lookup) {
            return Some(Match {
                block,
                num_tokens: key.len(),
                partial: !self.nodes[block as usize].is_full,
            });
        }
        if !partial_reuse {
            return None;
        }
        // Candidates in sibling order (the first of the longest wins): every child of a narrow
        // node, only those sharing the first token under a wide one.
        let wide = self.nodes[parent as usize].wide;
        let mut child = if wide {
            self.first_token_heads
                .get(&first_token_key(parent, key.token_ids[0]))
                .copied()
                .unwrap_or(NIL)
        } else {
            self.nodes[parent as usize].first_child
        };
        let mut best: Option<Match> = None;
        while child != NIL {
            if copy_on_partial || (self.is_leaf(child) && is_unused(child)) {
                let n = self.key(child).common_prefix_len(key);
                if n > 0 && best.is_none_or(|b| n > b.num_tokens) {
                    best = Some(Match {
                        block: child,
                        num_tokens: n,
                        partial: true,
                    });
                }
            }
            child = if wide {
                self.same_first_token_next
                    .get(&child)
                    .copied()
                    .unwrap_or(NIL)
            } else {
                self.nodes[child as usize].next_sibling
            };
        }
        best
    }

    /// Inserts `block` (key already set) as a child of `parent`. Returns false, inserting
    /// nothing, when another child already holds that lookup hash.
    pub fn insert(&mut self, parent: u32, block: u32) -> bool {
        let lookup = lookup_hash(&self.key(block));
        self.insert_with_lookup(parent, block, lookup)
    }

    /// `insert` when the caller already has the key's `lookup_hash`.
    #[inline]
    pub fn insert_with_lookup(&mut self, parent: u32, block: u32, lookup: u64) -> bool {
        debug_assert!(!self.is_in_tree(block) && self.nodes[parent as usize].in_tree);
        debug_assert_eq!(lookup, lookup_hash(&self.key(block)));
        let parent_wide = self.nodes[parent as usize].wide;
        if parent_wide {
            match self.children.entry(child_key(parent, lookup)) {
                std::collections::hash_map::Entry::Occupied(_) => return false,
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(block);
                }
            }
            self.index_first_token(parent, block);
        } else if self.child_with_lookup(parent, lookup).is_some() {
            return false;
        }
        let hash = if self.track_hashes {
            block_hash(&self.key(block), self.hash(parent))
        } else {
            0
        };
        let old_first = self.nodes[parent as usize].first_child;
        if old_first != NIL {
            self.nodes[old_first as usize].prev_sibling = block;
        }
        self.nodes[parent as usize].first_child = block;
        if self.track_hashes {
            self.hashes[block as usize] = hash;
        }
        let n = &mut self.nodes[block as usize];
        n.lookup = lookup;
        n.parent = parent;
        n.next_sibling = old_first;
        n.prev_sibling = NIL;
        n.first_child = NIL;
        n.num_children = 0;
        n.wide = false;
        n.in_tree = true;
        self.num_in_tree += 1;
        let p = &mut self.nodes[parent as usize];
        p.num_children += 1;
        if !p.wide && p.num_children > WIDE_CHILDREN {
            self.make_wide(parent);
        }
        true
    }

    /// Indexes the children of `parent`, which just passed `WIDE_CHILDREN`, in the child map
    /// and the first-token chains.
    #[cold]
    fn make_wide(&mut self, parent: u32) {
        let p = &mut self.nodes[parent as usize];
        p.wide = true;
        let mut listed = std::mem::take(&mut self.stack);
        let mut child = p.first_child;
        while child != NIL {
            let c = &self.nodes[child as usize];
            self.children.insert(child_key(parent, c.lookup), child);
            listed.push(child);
            child = c.next_sibling;
        }
        // Last sibling first, so that each first-token chain is in sibling order.
        while let Some(child) = listed.pop() {
            self.index_first_token(parent, child);
        }
        self.stack = listed;
    }

    /// Removes `block` and its whole subtree from the tree, calling `on_removed` for each block
    /// that left it (the block itself first, then descendants) with its TensorRT-LLM hash when
    /// hashes are tracked (0 otherwise). No-op when not in the tree.
    #[inline]
    pub fn detach_subtree(&mut self, block: u32, mut on_removed: impl FnMut(u32, u64)) {
        if !self.is_in_tree(block) {
            return;
        }
        self.unlink_from_parent(block);
        if self.nodes[block as usize].first_child == NIL {
            // A leaf, the common case (eviction takes leaves first: a released chain queues
            // its tail first): no walk.
            self.reset_detached(block);
            on_removed(block, self.removed_hash(block));
            return;
        }
        self.detach_descendants(block, on_removed);
    }

    /// `detach_subtree` of an inner block already unlinked from its parent: walks its subtree.
    fn detach_descendants(&mut self, block: u32, mut on_removed: impl FnMut(u32, u64)) {
        let mut stack = std::mem::take(&mut self.stack);
        stack.push(block);
        while let Some(b) = stack.pop() {
            let wide = self.nodes[b as usize].wide;
            let mut child = self.nodes[b as usize].first_child;
            while child != NIL {
                stack.push(child);
                let next = self.nodes[child as usize].next_sibling;
                if wide {
                    self.children
                        .remove(&child_key(b, self.nodes[child as usize].lookup));
                    self.first_token_heads
                        .remove(&first_token_key(b, self.first_token(child)));
                    self.same_first_token_next.remove(&child);
                }
                child = next;
            }
            self.reset_detached(b);
            on_removed(b, self.removed_hash(b));
        }
        self.stack = stack;
    }

    /// Clears the tree links of a block that has left the tree (its children, if any, are
    /// handled by the caller).
    #[inline]
    fn reset_detached(&mut self, block: u32) {
        let n = &mut self.nodes[block as usize];
        n.num_children = 0;
        n.wide = false;
        n.in_tree = false;
        n.parent = NIL;
        n.first_child = NIL;
        n.next_sibling = NIL;
        n.prev_sibling = NIL;
        self.num_in_tree -= 1;
    }

    /// The TensorRT-LLM hash a block that just left the tree had, for its removal event: kept
    /// when hashes are tracked, 0 otherwise (what `hash` answers for a block out of the tree).
    #[inline]
    fn removed_hash(&self, block: u32) -> u64 {
        if self.track_hashes {
            self.hashes[block as usize]
        } else {
            0
        }
    }

    fn first_token(&self, block: u32) -> i32 {
        self.token_ids[block as usize * self.tokens_per_block]
    }

    /// Puts `child` of the wide `parent` at the head of its first-token chain.
    fn index_first_token(&mut self, parent: u32, child: u32) {
        let k = first_token_key(parent, self.first_token(child));
        if let Some(next) = self.first_token_heads.insert(k, child) {
            self.same_first_token_next.insert(child, next);
        }
    }

    /// Takes `child` of the wide `parent` out of its first-token chain.
    fn unindex_first_token(&mut self, parent: u32, child: u32) {
        let k = first_token_key(parent, self.first_token(child));
        let next = self.same_first_token_next.remove(&child);
        let head = self.first_token_heads[&k];
        if head == child {
            match next {
                Some(n) => self.first_token_heads.insert(k, n),
                None => self.first_token_heads.remove(&k),
            };
            return;
        }
        let mut prev = head;
        while self.same_first_token_next[&prev] != child {
            prev = self.same_first_token_next[&prev];
        }
        match next {
            Some(n) => self.same_first_token_next.insert(prev, n),
            None => self.same_first_token_next.remove(&prev),
        };
    }

    #[inline]
    fn unlink_from_parent(&mut self, block: u32) {
        let Node {
            parent,
            prev_sibling,
            next_sibling,
            lookup,
            ..
        } = self.nodes[block as usize];
        let p = &mut self.nodes[parent as usize];
        p.num_children -= 1;
        if p.wide {
            self.children.remove(&child_key(parent, lookup));
            self.unindex_first_token(parent, block);
        }
        if prev_sibling == NIL {
            self.nodes[parent as usize].first_child = next_sibling;
        } else {
            self.nodes[prev_sibling as usize].next_sibling = next_sibling;
        }
        if next_sibling != NIL {
            self.nodes[next_sibling as usize].prev_sibling = prev_sibling;
        }
    }

    /// Whether `ancestor` is a strict ancestor of `block` in the tree, deciding in at most
    /// `max_steps` parent steps; `None` when undecided.
    pub fn is_ancestor_within(&self, ancestor: u32, block: u32, max_steps: u32) -> Option<bool> {
        if !self.is_in_tree(ancestor) || !self.is_in_tree(block) || self.is_leaf(ancestor) {
            return Some(false);
        }
        let mut node = block;
        for _ in 0..max_steps {
            node = self.nodes[node as usize].parent;
            if node == ancestor {
                return Some(true);
            }
            if node == self.root {
                return Some(false);
            }
        }
        None
    }

    /// Checks that the first-token chains of every wide node list exactly its children with
    /// that first token, in sibling order.
    fn verify_first_token_index(&self) -> Result<(), String> {
        let (mut heads, mut links) = (0, 0);
        for node in 0..=self.root {
            let n = &self.nodes[node as usize];
            if !n.in_tree || !n.wide {
                continue;
            }
            let mut groups: HashMap<i32, Vec<u32>> = HashMap::new();
            let mut c = n.first_child;
            while c != NIL {
                groups.entry(self.first_token(c)).or_default().push(c);
                c = self.nodes[c as usize].next_sibling;
            }
            for (t, expected) in &groups {
                let mut chain = Vec::new();
                let mut c = self
                    .first_token_heads
                    .get(&first_token_key(node, *t))
                    .copied();
                while let Some(b) = c {
                    chain.push(b);
                    c = self.same_first_token_next.get(&b).copied();
                }
                if &chain != expected {
                    return Err(format!(
                        "node {node}: first-token chain of {t} is {chain:?}, children {expected:?}"
                    ));
                }
                heads += 1;
                links += expected.len() - 1;
            }
        }
        if heads != self.first_token_heads.len() || links != self.same_first_token_next.len() {
            return Err(format!(
                "first-token index: {} heads and {} links, {heads} and {links} expected",
                self.first_token_heads.len(),
                self.same_first_token_next.len()
            ));
        }
        Ok(())
    }

    /// Checks tree invariants: every node's hash is H(key, parent hash), the child map and sibling
    /// lists agree, parents are in the tree.
    pub fn verify(&self) -> Result<(), String> {
        let mut count = 0;
        let mut linked = 0;
        let mut mapped = 0;
        for b in 0..self.root {
            let n = &self.nodes[b as usize];
            if !n.in_tree {
                continue;
            }
            count += 1;
            let parent = &self.nodes[n.parent as usize];
            if !parent.in_tree {
                return Err(format!("block {b} is in the tree under a detached parent"));
            }
            if self.track_hashes && block_hash(&self.key(b), self.hash(n.parent)) != self.hash(b) {
                return Err(format!("block {b} hash does not match its key and parent"));
            }
            if lookup_hash(&self.key(b)) != n.lookup {
                return Err(format!("block {b} lookup hash does not match its key"));
            }
            if self.child_with_lookup(n.parent, n.lookup) != Some(b) {
                return Err(format!("block {b} is not found under its parent"));
            }
            if parent.wide {
                mapped += 1;
            }
        }
        for node in 0..=self.root {
            let n = &self.nodes[node as usize];
            if !n.in_tree {
                continue;
            }
            let mut prev = NIL;
            let mut children = 0;
            let mut c = n.first_child;
            while c != NIL {
                let cn = &self.nodes[c as usize];
                if cn.parent != node || cn.prev_sibling != prev || !cn.in_tree {
                    return Err(format!("sibling list of node {node} is corrupt at {c}"));
                }
                children += 1;
                prev = c;
                c = cn.next_sibling;
            }
            if children != n.num_children {
                return Err(format!(
                    "node {node} counts {} children, lists {children}",
                    n.num_children
                ));
            }
            linked += children as usize;
        }
        self.verify_first_token_index()?;
        if count != self.num_in_tree || linked != count || self.children.len() != mapped {
            return Err(format!(
                "tree count mismatch: {count} nodes, {linked} linked, {} mapped of {mapped}, counter {}",
                self.children.len(),
                self.num_in_tree
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(tree: &mut ReuseTree, block: u32, tokens: &[i32]) {
        tree.set_key(block, &BlockKeyRef::plain(tokens));
    }

    #[test]
    fn insert_find_and_hash_chain() {
        let mut t = ReuseTree::new(4, 4);
        let root = t.root();
        set(&mut t, 0, &[1, 2, 3, 4]);
        assert!(t.insert(root, 0));
        set(&mut t, 1, &[5, 6]);
        assert!(t.insert(0, 1));
        let h0 = block_hash(&BlockKeyRef::plain(&[1, 2, 3, 4]), 0);
        assert_eq!(t.hash(0), h0);
        let q = BlockKeyRef::plain(&[5, 6]);
        let m = t.find_match(0, &q, lookup_hash(&q), true, true, |_| true);
        assert_eq!(
            m,
            Some(Match {
                block: 1,
                num_tokens: 2,
                partial: true
            }),
            "an exact match of a non-full block is partial"
        );
        t.verify().unwrap();
    }

    #[test]
    fn partial_match_picks_longest_prefix_and_respects_eligibility() {
        let mut t = ReuseTree::new(4, 4);
        let root = t.root();
        set(&mut t, 0, &[1, 2, 9, 9]);
        t.insert(root, 0);
        set(&mut t, 1, &[1, 2, 3, 9]);
        t.insert(root, 1);
        let q = BlockKeyRef::plain(&[1, 2, 3, 4]);
        let h = lookup_hash(&q);
        let m = t.find_match(root, &q, h, true, true, |_| false).unwrap();
        assert_eq!((m.block, m.num_tokens), (1, 3));
        assert!(t.find_match(root, &q, h, true, false, |_| false).is_none());
        assert!(t.find_match(root, &q, h, false, true, |_| true).is_none());
        let m = t.find_match(root, &q, h, true, false, |b| b == 0).unwrap();
        assert_eq!((m.block, m.num_tokens), (0, 2));
    }

    #[test]
    fn detaching_removes_the_whole_subtree() {
        let mut t = ReuseTree::new(4, 2);
        let root = t.root();
        set(&mut t, 0, &[1, 2]);
        t.insert(root, 0);
        set(&mut t, 1, &[3, 4]);
        t.insert(0, 1);
        set(&mut t, 2, &[5, 6]);
        t.insert(1, 2);
        set(&mut t, 3, &[3, 5]);
        t.insert(0, 3);
        let mut removed = Vec::new();
        t.detach_subtree(1, |b, _| removed.push(b));
        removed.sort();
        assert_eq!(removed, vec![1, 2]);
        assert!(t.is_in_tree(0) && t.is_in_tree(3));
        assert!(!t.is_in_tree(2));
        assert_eq!(t.parent(2), None);
        let within = |a, b| t.is_ancestor_within(a, b, u32::MAX);
        assert_eq!(
            (within(0, 3), within(3, 0), within(1, 3)),
            (Some(true), Some(false), Some(false))
        );
        assert_eq!(
            t.is_ancestor_within(0, 3, 0),
            None,
            "one step needed, none allowed"
        );
        assert_eq!(
            t.is_ancestor_within(3, 0, 0),
            Some(false),
            "deeper cannot be an ancestor"
        );
        assert_eq!(t.num_in_tree(), 2);
        t.verify().unwrap();
        // Detached blocks keep their tokens.
        assert_eq!(t.key(2).token_ids, &[5, 6]);
    }

    #[test]
    fn wide_nodes_index_children_in_the_map() {
        let n = (WIDE_CHILDREN + 4) as usize;
        let mut t = ReuseTree::new(n + 1, 2);
        let root = t.root();
        set(&mut t, 0, &[1, 1]);
        t.insert(root, 0);
        for i in 1..=n as u32 {
            set(&mut t, i, &[7, i as i32]);
            assert!(t.insert(0, i));
            t.verify().unwrap();
        }
        for i in 1..=n as u32 {
            let tokens = [7, i as i32];
            let key = BlockKeyRef::plain(&tokens);
            assert_eq!(t.find_exact(0, &key, lookup_hash(&key)), Some(i));
        }
        t.detach_subtree(3, |_, _| {});
        t.verify().unwrap();
        t.detach_subtree(0, |_, _| {});
        t.verify().unwrap();
        assert_eq!(t.num_in_tree(), 0);
    }

    /// The partial match of a wide node (first-token chains) finds what a scan of every child
    /// finds: the longest common prefix, the most recently inserted on a tie.
    #[test]
    fn partial_match_under_a_wide_node_equals_a_scan_of_every_child() {
        let n = 40u32;
        let mut t = ReuseTree::new(n as usize + 1, 4);
        let wide = t.root();
        let narrow_parent = n;
        set(&mut t, narrow_parent, &[99, 99, 99, 99]);
        t.insert(wide, narrow_parent);
        // Children under the (wide) root with first tokens 0..4 and varied continuations.
        let key_of = |i: u32| [(i % 4) as i32, (i % 3) as i32, (i % 5) as i32, i as i32];
        for i in 0..n {
            set(&mut t, i, &key_of(i));
            assert!(t.insert(wide, i));
        }
        t.verify().unwrap();
        let scan = |q: &BlockKeyRef<'_>, gone: &[u32]| -> Option<(u32, usize)> {
            // Children in sibling order: most recently inserted first.
            let mut best: Option<(u32, usize)> = None;
            for i in (0..n).rev().filter(|i| !gone.contains(i)) {
                let k = key_of(i);
                let m = BlockKeyRef::plain(&k).common_prefix_len(q);
                if m > 0 && best.is_none_or(|(_, b)| m > b) {
                    best = Some((i, m));
                }
            }
            best
        };
        let mut gone = Vec::new();
        for round in 0..3 {
            for a in 0..5 {
                for b in 0..4 {
                    let tokens = [a, b, 2, 1000];
                    let q = BlockKeyRef::plain(&tokens);
                    let got = t
                        .find_match(wide, &q, lookup_hash(&q), true, true, |_| true)
                        .map(|m| (m.block, m.num_tokens));
                    assert_eq!(got, scan(&q, &gone), "round {round} query {tokens:?}");
                }
            }
            // Detach a head, a middle and a tail of chains; the chains follow.
            for b in [n - 1 - round, 17 + round, round] {
                t.detach_subtree(b, |_, _| {});
                gone.push(b);
                t.verify().unwrap();
            }
        }
    }

    #[test]
    fn colliding_insert_is_refused() {
        let mut t = ReuseTree::new(2, 2);
        let root = t.root();
        set(&mut t, 0, &[1, 2]);
        assert!(t.insert(root, 0));
        set(&mut t, 1, &[1, 2]);
        assert!(!t.insert(root, 1));
        assert!(!t.is_in_tree(1));
        t.verify().unwrap();
    }
}
