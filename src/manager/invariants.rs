//! The manager's invariants, over every window and every sequence.

use super::KvCacheManager;
use crate::error::{KvError, KvResult};
use crate::window::SeqLengths;

impl KvCacheManager {
    /// Verifies every window's invariants (`WindowBlockManager::verify`: free counters equal
    /// queue lengths, reference counts match sequences and pins, tree hashes and links, sliding
    /// window bounds), that every sequence has blocks in every window and that no sequence
    /// reuses its whole prompt; the error names the first violation.
    pub fn check_invariants(&self) -> KvResult<()> {
        let max_len = self.cfg.max_sequence_length;
        for w in &self.windows {
            w.verify(
                |id| {
                    self.sequences.get(&id).map(|s| SeqLengths {
                        num_tokens: s.num_tokens,
                        input_length: s.input_length,
                        capacity: s.life.capacity,
                        history: s.life.history,
                        step_slack: s.life.step_slack(s.num_tokens),
                    })
                },
                max_len,
            )
            .map_err(KvError::InvariantViolation)?;
            for &id in self.sequences.keys() {
                if !w.has_sequence(id) {
                    return Err(KvError::InvariantViolation(format!(
                        "sequence {id} has no blocks in window {}",
                        w.window_size()
                    )));
                }
            }
        }
        for (&id, s) in &self.sequences {
            self.verify_lifecycle(id)
                .map_err(KvError::InvariantViolation)?;
            if s.admission.prepopulated_prompt_len >= s.input_length {
                return Err(KvError::InvariantViolation(format!(
                    "sequence {id} reuses its whole prompt"
                )));
            }
        }
        Ok(())
    }
}
