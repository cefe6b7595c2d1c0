//! Ancestry checks and the tree's invariant audit.

use super::*;

impl ReuseTree {
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
    pub(super) fn verify_first_token_index(&self) -> Result<(), String> {
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
