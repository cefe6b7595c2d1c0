//! Giving blocks back: releasing a sequence, pins, and expiring timed retentions.

use std::collections::HashMap;

use super::WindowBlockManager;
use crate::error::{KvError, KvResult};
use crate::retention::DEFAULT_PRIORITY;

impl WindowBlockManager {
    /// Releases every block of sequence `id`, last to first, and forgets the sequence.
    pub fn release_sequence(&mut self, id: u64, now_ms: u64) {
        let Some(seq) = self.seqs.remove(&id) else {
            return;
        };
        if seq.suspended_at.is_some() {
            self.num_suspended -= 1;
        }
        // Blocks were last touched at admission: fetch a few ahead of the release loop.
        const AHEAD: usize = 8;
        let first = &seq.beams[0][seq.front_removed..];
        for (idx, &b) in first.iter().enumerate().rev() {
            if idx >= AHEAD {
                let ahead = first[idx - AHEAD];
                self.arena.prefetch_for_release(ahead);
                self.queues.prefetch(ahead);
            }
            // Beams last to first, beam 0 (`b`) last.
            for beam in seq.beams[1..].iter().rev() {
                self.release_ref(beam[seq.front_removed + idx], now_ms);
            }
            self.release_ref(b, now_ms);
        }
    }

    /// Drops one reference of `block`, queueing it for eviction when it was the last.
    #[inline(always)]
    fn release_ref(&mut self, block: u32, now_ms: u64) {
        if self.arena.remove_ref(block) == 0 {
            self.queues
                .release(block, self.arena.level(block), false, now_ms);
        }
    }

    /// Pins every listed (not detached) block of sequence `id`.
    pub fn pin_sequence(&mut self, id: u64) {
        let Some(seq) = self.seqs.get(&id) else {
            return;
        };
        let mut blocks = Vec::new();
        for beam in &seq.beams {
            blocks.extend_from_slice(&beam[seq.front_removed..]);
        }
        for b in blocks {
            self.arena.pin(b);
        }
    }

    /// Checks that every id is a pinned block.
    pub fn check_unpin(&self, ids: &[u32]) -> KvResult<()> {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &b in ids {
            if b as usize >= self.arena.len() {
                return Err(KvError::InvalidArgument(format!(
                    "block id {b} out of range"
                )));
            }
            let c = counts.entry(b).or_default();
            *c += 1;
            if *c > self.arena.pins(b) {
                return Err(KvError::InvalidArgument(format!("block {b} is not pinned")));
            }
        }
        Ok(())
    }

    /// Drops one pin of each block, releasing blocks whose last reference it was.
    pub fn unpin(&mut self, ids: &[u32], now_ms: u64) {
        for &b in ids {
            if self.arena.unpin(b) == 0 {
                self.queues.release(b, self.arena.level(b), false, now_ms);
            }
        }
    }

    /// Expires timed retentions and waits for outstanding copies.
    pub fn refresh(&mut self, now_ms: u64) {
        let mut decayed = Vec::new();
        self.queues
            .refresh(now_ms, |block, old| decayed.push((block, old)));
        for (block, old) in decayed {
            self.record_priority_change(block, old, DEFAULT_PRIORITY);
        }
        self.flush_copies();
        self.engine.sync();
    }
}
