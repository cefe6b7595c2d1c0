//! Linking blocks into the tree and out of it: insertion, wide nodes, the first-token index,
//! subtree detachment.

use super::*;

impl ReuseTree {
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
    pub(super) fn make_wide(&mut self, parent: u32) {
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
    pub(super) fn detach_descendants(&mut self, block: u32, mut on_removed: impl FnMut(u32, u64)) {
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
    pub(super) fn reset_detached(&mut self, block: u32) {
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
    pub(super) fn removed_hash(&self, block: u32) -> u64 {
        if self.track_hashes {
            self.hashes[block as usize]
        } else {
            0
        }
    }

    pub(super) fn first_token(&self, block: u32) -> i32 {
        self.token_ids[block as usize * self.tokens_per_block]
    }

    /// Puts `child` of the wide `parent` at the head of its first-token chain.
    pub(super) fn index_first_token(&mut self, parent: u32, child: u32) {
        let k = first_token_key(parent, self.first_token(child));
        if let Some(next) = self.first_token_heads.insert(k, child) {
            self.same_first_token_next.insert(child, next);
        }
    }

    /// Takes `child` of the wide `parent` out of its first-token chain.
    pub(super) fn unindex_first_token(&mut self, parent: u32, child: u32) {
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
    pub(super) fn unlink_from_parent(&mut self, block: u32) {
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
}
