//! Free queues: one LRU list per (cache level, priority 0..=100), intrusive over block indices.
//!
//! Eviction takes the front of the lowest non-empty priority of a level (a bitmap finds it in
//! O(1)); within a priority, blocks leave in release order. Each queued block records the (level,
//! priority) it was queued under, and removal always uses that record, never the block's current
//! memory level or priority (TensorRT-LLM issue 11879: an offload claims both blocks before
//! swapping their rows, so a row's level can change while its block is queued). The free counter of
//! a level is the length of its lists by construction.

use std::collections::BTreeSet;

use crate::pool::Level;
use crate::premixed::PremixedMap;
use crate::retention::{BlockRetention, DEFAULT_PRIORITY, MAX_PRIORITY};

const NIL: u32 = u32::MAX;
const NUM_PRIORITIES: usize = MAX_PRIORITY as usize + 1;
/// Primary blocks at or above this priority are offloaded to the host tier instead of dropped.
pub const DEFAULT_SECONDARY_OFFLOAD_MIN_PRIORITY: u8 = 30;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct QueueSlot {
    level: Level,
    priority: u8,
}

/// A block's queue links and priority: 12 bytes. Durations and expiries, which only timed
/// retentions have, live in a side table (`Timed`).
#[derive(Clone, Copy, Debug)]
struct Link {
    prev: u32,
    next: u32,
    slot: Option<QueueSlot>,
    priority: u8,
}

const _: () = assert!(std::mem::size_of::<Link>() == 12);

/// The timed part of a block's retention (present only when it has some).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Timed {
    duration_ms: Option<u64>,
    expires_at_ms: Option<u64>,
}

#[derive(Clone, Copy, Debug, Default)]
struct List {
    head: u32,
    tail: u32,
    len: u32,
}

/// The eviction policy of one window.
#[derive(Clone, Debug)]
pub struct FreeQueues {
    links: Vec<Link>,
    timed: PremixedMap<u32, Timed>,
    lists: [[List; NUM_PRIORITIES]; 2],
    non_empty: [u128; 2],
    free: [usize; 2],
    /// The fewest free blocks per level since `take_free_low_water` last read it.
    free_low_water: [usize; 2],
    expiring: BTreeSet<(u64, u32)>,
    offload_min_priority: u8,
}

impl FreeQueues {
    /// A policy over `num_blocks` blocks, none queued.
    pub fn new(num_blocks: usize, offload_min_priority: u8) -> Self {
        let empty = List {
            head: NIL,
            tail: NIL,
            len: 0,
        };
        FreeQueues {
            links: vec![
                Link {
                    prev: NIL,
                    next: NIL,
                    slot: None,
                    priority: DEFAULT_PRIORITY,
                };
                num_blocks
            ],
            timed: PremixedMap::default(),
            lists: [[empty; NUM_PRIORITIES]; 2],
            non_empty: [0; 2],
            free: [0; 2],
            free_low_water: [0; 2],
            expiring: BTreeSet::new(),
            offload_min_priority,
        }
    }

    #[inline]
    pub fn num_free(&self, level: Level) -> usize {
        self.free[level as usize]
    }

    /// The fewest free blocks of `level` since the last call; restarts from the current count.
    pub fn take_free_low_water(&mut self, level: Level) -> usize {
        let l = level as usize;
        std::mem::replace(&mut self.free_low_water[l], self.free[l]).min(self.free[l])
    }

    pub fn is_queued(&self, block: u32) -> bool {
        self.links[block as usize].slot.is_some()
    }

    /// The (level, priority) queue a queued block waits in: two blocks in the same queue rank
    /// equally for eviction apart from their release order.
    pub fn queue_of(&self, block: u32) -> Option<(Level, u8)> {
        self.links[block as usize]
            .slot
            .map(|s| (s.level, s.priority))
    }

    /// The level a queued block was queued at.
    pub fn queued_level(&self, block: u32) -> Option<Level> {
        self.links[block as usize].slot.map(|s| s.level)
    }

    pub fn priority(&self, block: u32) -> u8 {
        self.links[block as usize].priority
    }

    pub fn duration_ms(&self, block: u32) -> Option<u64> {
        self.timed(block).duration_ms
    }

    #[inline]
    fn timed(&self, block: u32) -> Timed {
        if self.timed.is_empty() {
            return Timed::default();
        }
        self.timed.get(&block).copied().unwrap_or_default()
    }

    fn set_timed(&mut self, block: u32, t: Timed) {
        if t == Timed::default() {
            if !self.timed.is_empty() {
                self.timed.remove(&block);
            }
        } else {
            self.timed.insert(block, t);
        }
    }

    pub fn offload_min_priority(&self) -> u8 {
        self.offload_min_priority
    }

    /// The next block to evict at `level` without removing it, and whether it may be offloaded
    /// to the secondary level instead of dropped.
    #[inline]
    pub fn peek(&self, level: Level) -> Option<(u32, bool)> {
        let bits = self.non_empty[level as usize];
        if bits == 0 {
            return None;
        }
        let priority = bits.trailing_zeros() as usize;
        let block = self.lists[level as usize][priority].head;
        let can_offload = level == Level::Primary && priority as u8 >= self.offload_min_priority;
        Some((block, can_offload))
    }

    /// The block queued after `block` in its queue (`None` when it is the last or not queued):
    /// the next victim once `block` is claimed, for prefetching.
    #[inline]
    pub fn next_queued(&self, block: u32) -> Option<u32> {
        let link = &self.links[block as usize];
        (link.slot.is_some() && link.next != NIL).then_some(link.next)
    }

    /// Prefetches the queue link of `block`.
    pub fn prefetch(&self, block: u32) {
        crate::prefetch::prefetch(&self.links[block as usize]);
    }

    /// Removes `block` from its queue if it is queued (using the recorded slot) and drops its
    /// pending expiry. Returns whether it was queued.
    #[inline(always)]
    pub fn claim(&mut self, block: u32) -> bool {
        let Some(slot) = self.links[block as usize].slot else {
            return false;
        };
        self.unlink(block, slot);
        let mut t = self.timed(block);
        if let Some(at) = t.expires_at_ms.take() {
            self.expiring.remove(&(at, block));
            self.set_timed(block, t);
        }
        true
    }

    /// Sets a block's retention priority. A free block moves to the back of its new priority's
    /// queue (keeping its expiry); a referenced one is queued at it when released.
    pub fn set_priority(&mut self, block: u32, priority: u8, now_ms: u64) {
        let Some(slot) = self.links[block as usize].slot else {
            self.links[block as usize].priority = priority;
            return;
        };
        let expiry = self.expiry(block);
        self.claim(block);
        self.links[block as usize].priority = priority;
        self.release(block, slot.level, false, now_ms);
        self.restore_expiry(block, expiry);
    }

    /// Claims `block` and applies a retention the way TensorRT-LLM's `claimBlock` does: the
    /// priority changes only when given; the duration always becomes the given one.
    #[inline(always)]
    pub fn claim_with_retention(&mut self, block: u32, retention: BlockRetention) {
        self.claim(block);
        if let Some(p) = retention.priority {
            self.links[block as usize].priority = p;
        }
        let t = self.timed(block);
        if t.duration_ms != retention.duration_ms {
            self.set_timed(
                block,
                Timed {
                    duration_ms: retention.duration_ms,
                    ..t
                },
            );
        }
    }

    /// Appends (or prepends) `block` to the queue of `level` and its current priority. A block
    /// with a duration and a non-default priority gets an expiry `now + duration`.
    #[inline(always)]
    pub fn release(&mut self, block: u32, level: Level, to_front: bool, now_ms: u64) {
        debug_assert!(!self.is_queued(block), "block {block} released twice");
        let priority = self.links[block as usize].priority;
        self.link(block, level, priority, to_front);
        if self.timed.is_empty() {
            return;
        }
        let t = self.timed(block);
        if let Some(d) = t.duration_ms {
            if priority != DEFAULT_PRIORITY {
                let at = now_ms.saturating_add(d);
                self.set_timed(
                    block,
                    Timed {
                        expires_at_ms: Some(at),
                        ..t
                    },
                );
                self.expiring.insert((at, block));
            }
        }
    }

    /// Returns the expiry of a block so it can survive a claim/release pair (offload).
    pub fn expiry(&self, block: u32) -> Option<u64> {
        self.timed(block).expires_at_ms
    }

    /// Re-arms a saved expiry on a queued block.
    pub fn restore_expiry(&mut self, block: u32, at: Option<u64>) {
        let mut t = self.timed(block);
        if let Some(old) = t.expires_at_ms.take() {
            self.expiring.remove(&(old, block));
        }
        if let Some(at) = at {
            t.expires_at_ms = Some(at);
            self.expiring.insert((at, block));
        }
        self.set_timed(block, t);
    }

    /// Expires timed retentions: every queued block whose expiry is due moves to the back of the
    /// default-priority queue of its level and takes the default priority. `on_expired` gets
    /// each such block with its old priority.
    pub fn refresh(&mut self, now_ms: u64, mut on_expired: impl FnMut(u32, u8)) -> usize {
        let mut expired = 0;
        while let Some(&(at, block)) = self.expiring.first() {
            if at > now_ms {
                break;
            }
            self.expiring.pop_first();
            on_expired(block, self.links[block as usize].priority);
            self.links[block as usize].priority = DEFAULT_PRIORITY;
            self.set_timed(block, Timed::default());
            if let Some(slot) = self.links[block as usize].slot {
                self.unlink(block, slot);
                self.link(block, slot.level, DEFAULT_PRIORITY, false);
            }
            expired += 1;
        }
        expired
    }

    /// Checks list linkage and counters; returns the first problem found.
    pub fn verify(&self) -> Result<(), String> {
        for level in [Level::Primary, Level::Secondary] {
            let mut count = 0usize;
            for (p, list) in self.lists[level as usize].iter().enumerate() {
                let mut n = 0u32;
                let mut prev = NIL;
                let mut b = list.head;
                while b != NIL {
                    let link = self.links[b as usize];
                    let expected = QueueSlot {
                        level,
                        priority: p as u8,
                    };
                    if link.slot != Some(expected) || link.prev != prev {
                        return Err(format!(
                            "block {b} is linked in queue ({level:?}, {p}) but records {:?}",
                            link.slot
                        ));
                    }
                    prev = b;
                    b = link.next;
                    n += 1;
                    if n as usize > self.links.len() {
                        return Err(format!("queue ({level:?}, {p}) has a cycle"));
                    }
                }
                if n != list.len || list.tail != prev {
                    return Err(format!("queue ({level:?}, {p}) length or tail is wrong"));
                }
                let bit = self.non_empty[level as usize] >> p & 1 == 1;
                if bit != (n > 0) {
                    return Err(format!("non-empty bitmap wrong for ({level:?}, {p})"));
                }
                count += n as usize;
            }
            if count != self.free[level as usize] {
                return Err(format!(
                    "free counter of {level:?} is {} but its queues hold {count}",
                    self.free[level as usize]
                ));
            }
        }
        for &(at, b) in &self.expiring {
            if self.timed(b).expires_at_ms != Some(at) || !self.is_queued(b) {
                return Err(format!("expiry entry of block {b} is stale"));
            }
        }
        Ok(())
    }

    #[inline(always)]
    fn link(&mut self, block: u32, level: Level, priority: u8, to_front: bool) {
        let l = level as usize;
        let p = priority as usize;
        let list = &mut self.lists[l][p];
        let link = &mut self.links[block as usize];
        link.slot = Some(QueueSlot { level, priority });
        if list.head == NIL {
            link.prev = NIL;
            link.next = NIL;
            list.head = block;
            list.tail = block;
            self.non_empty[l] |= 1u128 << p;
        } else if to_front {
            let old = list.head;
            link.prev = NIL;
            link.next = old;
            list.head = block;
            self.links[old as usize].prev = block;
        } else {
            let old = list.tail;
            link.prev = old;
            link.next = NIL;
            list.tail = block;
            self.links[old as usize].next = block;
        }
        list.len += 1;
        self.free[l] += 1;
    }

    #[inline(always)]
    fn unlink(&mut self, block: u32, slot: QueueSlot) {
        let l = slot.level as usize;
        let p = slot.priority as usize;
        let Link { prev, next, .. } = self.links[block as usize];
        if prev == NIL {
            self.lists[l][p].head = next;
        } else {
            self.links[prev as usize].next = next;
        }
        if next == NIL {
            self.lists[l][p].tail = prev;
        } else {
            self.links[next as usize].prev = prev;
        }
        let list = &mut self.lists[l][p];
        list.len -= 1;
        if list.len == 0 {
            self.non_empty[l] &= !(1u128 << p);
        }
        self.free[l] -= 1;
        self.free_low_water[l] = self.free_low_water[l].min(self.free[l]);
        let link = &mut self.links[block as usize];
        link.prev = NIL;
        link.next = NIL;
        link.slot = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queues(p: u32, s: u32) -> FreeQueues {
        let mut q = FreeQueues::new((p + s) as usize, DEFAULT_SECONDARY_OFFLOAD_MIN_PRIORITY);
        for b in 0..p {
            q.release(b, Level::Primary, false, 0);
        }
        for b in p..p + s {
            q.release(b, Level::Secondary, false, 0);
        }
        q
    }

    fn retention(priority: u8, duration_ms: Option<u64>) -> BlockRetention {
        BlockRetention {
            priority: Some(priority),
            duration_ms,
        }
    }

    #[test]
    fn counts_follow_claims_and_releases() {
        let mut q = queues(4, 2);
        assert_eq!(q.num_free(Level::Primary), 4);
        assert_eq!(q.num_free(Level::Secondary), 2);
        assert!(q.claim(1));
        assert!(!q.claim(1), "claiming twice is a no-op");
        assert_eq!(q.num_free(Level::Primary), 3);
        q.release(1, Level::Primary, false, 0);
        assert_eq!(q.num_free(Level::Primary), 4);
        q.verify().unwrap();
    }

    #[test]
    fn lru_order_within_a_priority() {
        let mut q = queues(3, 0);
        assert_eq!(q.peek(Level::Primary), Some((0, true)));
        q.claim(0);
        q.release(0, Level::Primary, false, 0);
        assert_eq!(q.peek(Level::Primary).unwrap().0, 1);
        q.claim(2);
        q.release(2, Level::Primary, true, 0);
        assert_eq!(
            q.peek(Level::Primary).unwrap().0,
            2,
            "to_front makes it next"
        );
    }

    #[test]
    fn lowest_priority_is_evicted_first() {
        let mut q = queues(3, 0);
        for (b, p) in [(0, 90), (1, 10), (2, 50)] {
            q.claim_with_retention(b, retention(p, None));
            q.release(b, Level::Primary, false, 0);
        }
        assert_eq!(
            q.peek(Level::Primary),
            Some((1, false)),
            "priority 10 < offload minimum"
        );
        q.claim(1);
        assert_eq!(q.peek(Level::Primary), Some((2, true)));
        q.claim(2);
        assert_eq!(q.peek(Level::Primary), Some((0, true)));
        q.verify().unwrap();
    }

    #[test]
    fn timed_retention_decays_on_refresh() {
        let mut q = queues(2, 0);
        q.claim_with_retention(0, retention(80, Some(10)));
        q.release(0, Level::Primary, false, 100);
        q.claim_with_retention(1, retention(50, None));
        q.release(1, Level::Primary, false, 100);
        assert_eq!(q.peek(Level::Primary).unwrap().0, 1);
        assert_eq!(q.refresh(109, |_, _| {}), 0);
        assert_eq!(q.refresh(110, |_, _| {}), 1);
        assert_eq!(q.priority(0), DEFAULT_PRIORITY);
        assert_eq!(q.peek(Level::Primary).unwrap().0, 0, "decayed to 35 < 50");
        q.verify().unwrap();
    }

    #[test]
    fn default_priority_duration_never_expires() {
        let mut q = queues(1, 0);
        q.claim_with_retention(0, retention(DEFAULT_PRIORITY, Some(1)));
        q.release(0, Level::Primary, false, 0);
        assert_eq!(q.expiry(0), None);
    }

    #[test]
    fn claim_uses_the_slot_recorded_at_enqueue() {
        // A block queued at (secondary, 70) after living at (primary, 35): removal goes through
        // the slot recorded when it was queued, whatever its row or priority was before.
        let mut q = queues(2, 2);
        q.claim_with_retention(0, retention(70, None));
        q.release(0, Level::Secondary, false, 0);
        assert_eq!(q.queued_level(0), Some(Level::Secondary));
        assert_eq!(
            (q.num_free(Level::Primary), q.num_free(Level::Secondary)),
            (1, 3)
        );
        assert!(q.claim(0));
        assert_eq!(
            (q.num_free(Level::Primary), q.num_free(Level::Secondary)),
            (1, 2)
        );
        q.verify().unwrap();
    }

    #[test]
    fn an_expiry_survives_a_claim_and_release_at_another_level() {
        // What offloading does: claim, release at the host level, restore the expiry.
        let mut q = queues(1, 1);
        q.claim_with_retention(0, retention(60, Some(50)));
        q.release(0, Level::Primary, false, 0);
        let expiry = q.expiry(0);
        q.claim(0);
        q.release(0, Level::Secondary, false, 30);
        q.restore_expiry(0, expiry);
        assert_eq!(q.queued_level(0), Some(Level::Secondary));
        assert_eq!(q.priority(0), 60);
        assert_eq!(q.expiry(0), Some(50), "not extended to 30 + 50");
        q.verify().unwrap();
        assert_eq!(q.refresh(50, |_, _| {}), 1);
        q.verify().unwrap();
    }
}
