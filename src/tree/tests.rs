//! Unit tests of the reuse tree.

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
