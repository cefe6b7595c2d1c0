//! The replay ring: the last N published batches, served from a start sequence number.

use std::collections::VecDeque;

/// Sequence number of the end marker that closes every replay answer.
pub const END_SEQ: u64 = u64::MAX;

#[derive(Debug)]
pub struct ReplayRing {
    capacity: usize,
    batches: VecDeque<(u64, Vec<u8>)>,
}

impl ReplayRing {
    pub fn new(capacity: usize) -> Self {
        ReplayRing {
            capacity,
            batches: VecDeque::with_capacity(capacity.min(1 << 16)),
        }
    }

    /// Keeps a published batch, forgetting the oldest beyond the capacity.
    pub fn push(&mut self, seq: u64, payload: Vec<u8>) {
        if self.capacity == 0 {
            return;
        }
        if self.batches.len() == self.capacity {
            self.batches.pop_front();
        }
        self.batches.push_back((seq, payload));
    }

    /// The buffered batches with a sequence number at or after `start`, oldest first.
    pub fn since(&self, start: u64) -> impl Iterator<Item = &(u64, Vec<u8>)> {
        // Sequence numbers increase along the ring: skip the older part by binary search.
        let first = self.batches.partition_point(|(s, _)| *s < start);
        self.batches.range(first..)
    }

    pub fn len(&self) -> usize {
        self.batches.len()
    }

    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_batches_and_serves_from_a_start() {
        let mut r = ReplayRing::new(3);
        for seq in [0, 1, 3, 4] {
            r.push(seq, vec![seq as u8]);
        }
        assert_eq!(r.len(), 3);
        let seqs = |start| r.since(start).map(|(s, _)| *s).collect::<Vec<_>>();
        assert_eq!(seqs(0), vec![1, 3, 4]);
        assert_eq!(seqs(2), vec![3, 4]);
        assert_eq!(seqs(4), vec![4]);
        assert!(seqs(5).is_empty());
    }

    #[test]
    fn zero_capacity_keeps_nothing() {
        let mut r = ReplayRing::new(0);
        r.push(0, vec![1]);
        assert_eq!(r.since(0).count(), 0);
    }
}
