//! The prefill side: leases on a request's computed blocks, settled by the transfer's outcome,
//! and the release of quarantined holds.

use super::{Hold, HoldId, HoldState, TransferOutcome, WindowRows};
use crate::error::{KvError, KvResult};
use crate::manager::KvCacheManager;

impl KvCacheManager {
    /// Takes a lease on the blocks of request `id` that hold tokens `[skip_tokens,
    /// computed_tokens)` (whole blocks; beam 0; in each window the blocks it still holds): they
    /// are pinned, so the engine may remove the sequence at once and the rows stay as they are
    /// until the lease is settled. `skip_tokens` is what the receiver already caches (a multiple
    /// of the tokens per block); `computed_tokens` the tokens whose KV the engine has computed.
    /// Every block must be on the GPU level. Nothing changes on error.
    pub fn begin_send(
        &mut self,
        id: u64,
        skip_tokens: usize,
        computed_tokens: usize,
    ) -> KvResult<HoldId> {
        let seq = self.active_sequence(id)?;
        if seq.beam_width != 1 {
            return Err(KvError::Unsupported(format!(
                "sequence {id} has beam width {}: a transfer sends beam 0 of a context \
                 request (beam width 1)",
                seq.beam_width
            )));
        }
        let limit = seq.num_tokens.min(seq.life.capacity);
        let tpb = self.cfg.tokens_per_block;
        if computed_tokens > limit
            || !skip_tokens.is_multiple_of(tpb)
            || skip_tokens >= computed_tokens
        {
            return Err(KvError::InvalidArgument(format!(
                "a lease on tokens [{skip_tokens}, {computed_tokens}) of sequence {id}: the start \
                 must be a multiple of {tpb} tokens below the end, the end at most the {limit} \
                 tokens it has slots for"
            )));
        }
        let mut windows = Vec::with_capacity(self.windows.len());
        for w in &self.windows {
            let blocks = w.block_ids(id, 0).unwrap_or(&[]);
            let first = (skip_tokens / tpb).max(w.front_blocks_removed(id));
            let end = computed_tokens.div_ceil(tpb).min(blocks.len());
            let blocks = blocks.get(first..end).unwrap_or(&[]).to_vec();
            let mut rows = Vec::with_capacity(blocks.len());
            for &b in &blocks {
                let row = w.arena().row(b);
                if row.level != crate::pool::Level::Primary {
                    return Err(KvError::Unsupported(format!(
                        "block {b} of sequence {id} (window {}) is on the host tier: resume the \
                         sequence before leasing it",
                        w.window_size()
                    )));
                }
                rows.push(row.index);
            }
            windows.push(WindowRows {
                window_size: w.window_size(),
                first_block_index: first,
                blocks,
                rows,
            });
        }
        for (w, rows) in self.windows.iter_mut().zip(&windows) {
            w.pin_blocks(&rows.blocks);
        }
        let hold = Hold {
            request_id: id,
            state: HoldState::Leased,
            computed_tokens,
            windows,
            xfer: None,
            deadline_ms: 0,
        };
        self.disagg.stats.active_leases += 1;
        self.disagg.stats.leased_blocks += hold.num_blocks() as u64;
        Ok(self.disagg.new_hold(hold))
    }

    /// The rows a hold covers, per window.
    pub fn hold_rows(&self, hold: HoldId) -> KvResult<&[WindowRows]> {
        Ok(&self.hold(hold)?.windows)
    }

    /// The state of a hold, and the request it was taken for.
    pub fn hold_state(&self, hold: HoldId) -> KvResult<(HoldState, u64)> {
        let h = self.hold(hold)?;
        Ok((h.state, h.request_id))
    }

    /// Settles a lease (or a quarantine) with the outcome of its transfer: `Done` and
    /// `NotSubmitted` release its blocks (the hold ends); anything else quarantines them (the
    /// hold stays, in `HoldState::Quarantined`). A posted lease whose transfer the manager
    /// still watches is settled by `poll_transfers`; settling it here is refused unless the
    /// outcome quarantines it. Returns whether the hold still exists.
    pub fn settle_hold(&mut self, hold: HoldId, outcome: TransferOutcome) -> KvResult<bool> {
        let h = self.hold(hold)?;
        if h.state == HoldState::Posted && outcome.is_quiescent() {
            return Err(KvError::InvalidArgument(format!(
                "hold {} has a transfer in flight: its completion is read by poll_transfers, \
                 not declared",
                hold.0
            )));
        }
        if outcome.is_quiescent() {
            self.end_hold(hold);
            Ok(false)
        } else {
            self.quarantine(hold);
            Ok(true)
        }
    }

    /// Releases a quarantined hold: the engine (or the peer's acknowledgement) says no transfer
    /// touches its rows any more. Its blocks go back to the free queues.
    pub fn release_quarantine(&mut self, hold: HoldId) -> KvResult<()> {
        let h = self.hold(hold)?;
        if h.state != HoldState::Quarantined {
            return Err(KvError::InvalidArgument(format!(
                "hold {} is not quarantined (it is {:?})",
                hold.0, h.state
            )));
        }
        self.end_hold(hold);
        self.disagg.stats.quarantines_released += 1;
        Ok(())
    }

    fn hold(&self, hold: HoldId) -> KvResult<&Hold> {
        self.disagg
            .holds
            .get(&hold.0)
            .ok_or_else(|| KvError::InvalidArgument(format!("no hold {}", hold.0)))
    }

    /// Moves a hold into quarantine (its transfer, if watched, stays watched: a later `Done`
    /// releases it).
    pub(super) fn quarantine(&mut self, hold: HoldId) {
        let stats = &mut self.disagg.stats;
        let h = self.disagg.holds.get_mut(&hold.0).expect("hold checked");
        if h.state == HoldState::Quarantined {
            return;
        }
        let blocks = h.num_blocks() as u64;
        stats.active_leases -= 1;
        stats.leased_blocks -= blocks;
        h.state = HoldState::Quarantined;
        stats.quarantined_holds += 1;
        stats.quarantined_blocks += blocks;
    }

    /// Drops a hold's pins (its blocks return to the free queues when nothing else holds them)
    /// and forgets it.
    pub(super) fn end_hold(&mut self, hold: HoldId) {
        let h = self.disagg.holds.remove(&hold.0).expect("hold checked");
        let blocks = h.num_blocks() as u64;
        let stats = &mut self.disagg.stats;
        if h.state == HoldState::Quarantined {
            stats.quarantined_holds -= 1;
            stats.quarantined_blocks -= blocks;
        } else {
            stats.active_leases -= 1;
            stats.leased_blocks -= blocks;
        }
        if let (Some(x), Some(a)) = (h.xfer, self.disagg.attached.as_mut()) {
            // Quiescent by now (Done or Failed after the deadline): forgetting cannot fail.
            let _ = a.backend.release(x);
        }
        let now = self.op_now_ms();
        for rows in &h.windows {
            if let Ok(i) = self.window_index(rows.window_size) {
                self.windows[i].unpin(&rows.blocks, now);
            }
        }
    }
}
