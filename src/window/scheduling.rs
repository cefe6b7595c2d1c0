//! Scheduling simulation: free blocks as if some sequences were already released.

use super::WindowBlockManager;
use crate::pool::Level;

impl WindowBlockManager {
    pub fn start_scheduling(&mut self) {
        self.arena.start_scheduling();
        self.scheduling_free = self.queues.num_free(Level::Primary);
    }

    pub fn scheduling_remove_sequence(&mut self, id: u64) {
        let Some(seq) = self.seqs.get(&id) else {
            return;
        };
        let mut freed = 0;
        for beam in &seq.beams {
            for &b in &beam[seq.front_removed..] {
                if self.arena.scheduling_remove_ref(b) {
                    freed += 1;
                }
            }
        }
        self.scheduling_free += freed;
    }

    pub fn scheduling_free_blocks(&self) -> usize {
        self.scheduling_free
    }
}
