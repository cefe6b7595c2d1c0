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

mod keys;
mod links;
mod lookup;
mod verify;

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
}

#[cfg(test)]
mod tests;
