//! Finding a key under a node: exact lookups (child list or child map) and partial matches.

use super::*;

impl ReuseTree {
    /// The child of `parent` whose key equals `key` (`lookup` = `lookup_hash(key)`).
    pub fn find_exact(&self, parent: u32, key: &BlockKeyRef<'_>, lookup: u64) -> Option<u32> {
        let child = self.child_with_lookup(parent, lookup)?;
        self.key(child).equals(key).then_some(child)
    }

    /// The child of `parent` with this lookup hash, if any.
    #[inline]
    pub(super) fn child_with_lookup(&self, parent: u32, lookup: u64) -> Option<u32> {
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
}
