//! The invariants of one window: free queues consistent with their counters, memory rows, the
//! reuse tree, and reference counts and block lists that match the sequences and pins.

use super::WindowBlockManager;
use crate::pool::Level;

/// A sequence's lengths as the window's invariants need them.
#[derive(Clone, Copy, Debug)]
pub struct SeqLengths {
    /// Known tokens (prompt + generated).
    pub num_tokens: usize,
    pub input_length: usize,
    /// Tokens with KV slots: the blocks listed cover exactly this many.
    pub capacity: usize,
    /// Tokens with KV computed.
    pub history: usize,
    /// Tokens the current step added after its first (see `WindowBlockManager::add_token`):
    /// blocks that first token attends are held past the configured slack.
    pub step_slack: usize,
}

impl WindowBlockManager {
    /// Checks this window's invariants: the free queues (free counters equal queue lengths) and
    /// memory rows are consistent, the reuse tree verifies; every beam of a sequence lists one
    /// block per `tokens_per_block` tokens of its capacity, primary unless the sequence is
    /// suspended (or onboarding is off), with no cached key longer than its tokens there and none
    /// outside a sliding window; each block's reference count equals the sequences and pins
    /// holding it; a block is free exactly when unreferenced, queued at its row's level.
    /// `lengths_of` gives each sequence's lengths.
    pub fn verify(
        &self,
        lengths_of: impl Fn(u64) -> Option<SeqLengths>,
        max_sequence_length: usize,
    ) -> Result<(), String> {
        let w = self.cfg.window_size;
        self.queues
            .verify()
            .map_err(|e| format!("window {w}: {e}"))?;
        self.arena
            .verify_rows()
            .map_err(|e| format!("window {w}: {e}"))?;
        self.tree.verify().map_err(|e| format!("window {w}: {e}"))?;
        self.verify_disk().map_err(|e| format!("window {w}: {e}"))?;
        self.verify_remote()
            .map_err(|e| format!("window {w}: {e}"))?;
        let suspended = self.seqs.values().filter(|s| s.suspended_at.is_some());
        if suspended.count() != self.num_suspended {
            return Err(format!(
                "window {w}: {} suspended sequences counted, not the number marked",
                self.num_suspended
            ));
        }
        let n = self.arena.len();
        let mut expected_refs = vec![0u32; n];
        let swa = self.cfg.is_swa(max_sequence_length);
        let tpb = self.cfg.tokens_per_block;
        for (&id, seq) in &self.seqs {
            let Some(SeqLengths {
                num_tokens,
                input_length,
                capacity,
                history,
                step_slack,
            }) = lengths_of(id)
            else {
                return Err(format!("window {w}: blocks held for unknown sequence {id}"));
            };
            let suspended = seq.suspended_at.is_some();
            for beam in &seq.beams {
                if beam.len() > self.cfg.max_blocks_per_seq {
                    return Err(format!(
                        "window {w}: sequence {id} lists {} blocks, more than max_blocks_per_seq {}",
                        beam.len(),
                        self.cfg.max_blocks_per_seq
                    ));
                }
                if beam.len() != self.blocks_for_tokens(capacity) {
                    return Err(format!(
                        "window {w}: sequence {id} lists {} blocks for a capacity of {capacity} tokens",
                        beam.len()
                    ));
                }
                for &b in &beam[seq.front_removed..] {
                    expected_refs[b as usize] += 1;
                    // Only a suspended sequence's blocks, and those an explicit offload moved,
                    // may be on the host tier.
                    if !self.arena.is_primary(b)
                        && !suspended
                        && self.cfg.onboard_blocks
                        && !self.held_on_host.contains(&b)
                    {
                        return Err(format!(
                            "window {w}: active sequence {id} references non-primary block {b}"
                        ));
                    }
                }
            }
            // A sequence's tokens live in its blocks' slots: a cached block it holds must not
            // have a key longer than the sequence's tokens there (it would be overwritten).
            for (i, &b) in seq.beams[0].iter().enumerate().skip(seq.front_removed) {
                // Known tokens past a shrunk capacity count: they are written back, the same
                // tokens in the same slots, when the capacity grows again.
                let held = num_tokens.saturating_sub(i * tpb).min(tpb);
                if self.tree.is_in_tree(b) && self.tree.key(b).len() > held {
                    return Err(format!(
                        "window {w}: sequence {id} holds cached block {b} with a key longer than its {held} tokens there"
                    ));
                }
            }
            // The prompt is allocated whole; detaching starts with the first generated token.
            let generating = num_tokens > input_length;
            let reach = w + tpb + self.cfg.detach_slack_tokens.max(step_slack);
            if swa
                && generating
                && seq.beams.len() == 1
                && num_tokens.saturating_sub(seq.front_removed * tpb) >= reach
            {
                return Err(format!(
                    "window {w}: sequence {id} holds blocks outside its window"
                ));
            }
            // Never an offset to a block the sequence does not hold: every detached block lies
            // wholly before the window of the next token computed (at `history`, and at most
            // the last known token).
            // After `slide_to_slots` the next token computed is the last slot's (the known
            // tokens may lag it).
            let next = num_tokens.min(history + 1).max(seq.slid_to.min(capacity));
            if seq.front_removed * tpb > next.saturating_sub(w) {
                return Err(format!(
                    "window {w}: sequence {id} detached {} blocks but its window reaches back to \
                     token {} (a detached block is inside the window)",
                    seq.front_removed,
                    next.saturating_sub(w)
                ));
            }
        }
        for b in 0..n as u32 {
            let refs = self.arena.ref_count(b);
            let want = expected_refs[b as usize] + self.arena.pins(b);
            if refs != want {
                return Err(format!(
                    "window {w}: block {b} has {refs} references, sequences and pins account for {want}"
                ));
            }
            match self.queues.queued_level(b) {
                Some(level) if refs > 0 => {
                    return Err(format!(
                        "window {w}: block {b} is queued at {level:?} with {refs} references"
                    ));
                }
                Some(level) if level != self.arena.level(b) => {
                    return Err(format!(
                        "window {w}: block {b} is queued at {level:?} but its row is {:?}",
                        self.arena.level(b)
                    ));
                }
                None if refs == 0
                    && !self.is_claimed_by_disk(b)
                    && !self.is_claimed_by_remote(b) =>
                {
                    return Err(format!(
                        "window {w}: block {b} is neither referenced nor free"
                    ));
                }
                _ => {}
            }
        }
        if self.queues.num_free(Level::Primary) > self.cfg.num_primary
            || self.queues.num_free(Level::Secondary) > self.cfg.num_secondary
        {
            return Err(format!("window {w}: more free blocks than blocks"));
        }
        Ok(())
    }
}
