//! The decode side: a request whose prompt is computed by another engine. It is admitted with
//! local reuse as usual; the blocks past the reused prefix (whole blocks) receive the peer's
//! KV. Until the engine completes the receive, the sequence answers only the receive calls and
//! its block ids: nothing is stored or published, no token is added, it is never suspended or
//! moved, and removing it is refused (abort the receive instead).

use super::{Hold, HoldId, HoldState, Receiving, TransferOutcome, WindowRows};
use crate::disagg::{ReceiveTicket, TicketWindow};
use crate::error::{KvError, KvResult};
use crate::manager::{Admission, KvCacheManager, Request};

impl KvCacheManager {
    /// Admits a request whose prompt's KV will arrive from another engine. Local reuse works
    /// as for `add_sequence`; the receive starts at the reused prefix rounded down to whole
    /// blocks (`receive_ticket` says where). Beam width 1 only.
    pub fn add_sequence_receiving(&mut self, req: &Request) -> KvResult<Admission> {
        if req.beam_width != 1 {
            return Err(KvError::Unsupported(format!(
                "request {} has beam width {}: a receive fills beam 0 of a context computed \
                 elsewhere (beam width 1)",
                req.id, req.beam_width
            )));
        }
        let admission = self.add_sequence(req)?;
        let tpb = self.cfg.tokens_per_block;
        let skip_blocks = admission.prepopulated_prompt_len / tpb;
        let first_block_index = self
            .windows
            .iter()
            .map(|w| skip_blocks.max(w.front_blocks_removed(req.id)))
            .collect();
        self.disagg
            .receiving
            .insert(req.id, Receiving { first_block_index });
        self.sequences
            .get_mut(&req.id)
            .expect("admitted")
            .life
            .receiving = true;
        let blocks = self
            .receiving_rows(req.id)?
            .iter()
            .map(|w| w.blocks.len())
            .sum::<usize>();
        self.disagg.stats.receiving_requests += 1;
        self.disagg.stats.receiving_blocks += blocks as u64;
        Ok(admission)
    }

    /// Whether sequence `id` is receiving.
    pub fn is_receiving(&self, id: u64) -> bool {
        self.disagg.is_receiving(id)
    }

    /// The receiving blocks and rows of sequence `id`, per window.
    pub fn receiving_rows(&self, id: u64) -> KvResult<Vec<WindowRows>> {
        let r = self.receiving_record(id)?;
        Ok(self
            .windows
            .iter()
            .zip(&r.first_block_index)
            .map(|(w, &first)| {
                let blocks = w.block_ids(id, 0).unwrap_or(&[]);
                let blocks = blocks.get(first..).unwrap_or(&[]).to_vec();
                let rows = blocks.iter().map(|&b| w.arena().row(b).index).collect();
                WindowRows {
                    window_size: w.window_size(),
                    first_block_index: first,
                    blocks,
                    rows,
                }
            })
            .collect())
    }

    /// What to send the prefill engine so that it writes sequence `id`'s KV into its rows.
    pub fn receive_ticket(&self, id: u64) -> KvResult<ReceiveTicket> {
        let rows = self.receiving_rows(id)?;
        let seq = self.sequences.get(&id).expect("receiving sequences exist");
        let tpb = self.cfg.tokens_per_block;
        let skip_blocks = seq.admission.prepopulated_prompt_len / tpb;
        Ok(ReceiveTicket {
            request_id: id,
            skip_tokens: (skip_blocks * tpb) as u64,
            num_tokens: seq.input_length as u64,
            windows: rows
                .into_iter()
                .map(|w| TicketWindow {
                    window_size: w.window_size as u64,
                    first_block_index: w.first_block_index as u64,
                    rows: w.rows,
                })
                .collect(),
        })
    }

    /// The prompt's KV has landed: the history covers the prompt, its full blocks are stored
    /// for reuse (their events are emitted now, not before), and the sequence is an ordinary
    /// one (its first generated token is the engine's to add).
    pub fn complete_receive(&mut self, id: u64) -> KvResult<()> {
        self.receiving_record(id)?;
        let blocks = self.receiving_block_count(id);
        self.stop_receiving(id, blocks);
        self.disagg.stats.receives_completed += 1;
        let prompt = self.sequences[&id].input_length;
        self.advance_history(id, prompt)?;
        self.store_context_blocks(id, prompt)
    }

    /// Gives up a receive. A quiescent outcome (`Done` without the data wanted, or
    /// `NotSubmitted`) releases the sequence's blocks at once (nothing stored); any other
    /// outcome releases the sequence but keeps its receiving rows in quarantine under the
    /// returned hold, never reused until `release_quarantine` (a transfer may still write
    /// them). The reused prefix is released either way: no transfer writes it.
    pub fn abort_receive(&mut self, id: u64, outcome: TransferOutcome) -> KvResult<Option<HoldId>> {
        self.receiving_record(id)?;
        let rows = self.receiving_rows(id)?;
        let blocks = self.receiving_block_count(id);
        self.stop_receiving(id, blocks);
        self.disagg.stats.receives_aborted += 1;
        let hold = if outcome.is_quiescent() {
            None
        } else {
            for (w, r) in self.windows.iter_mut().zip(&rows) {
                w.pin_blocks(&r.blocks);
            }
            let prompt = self.sequences[&id].input_length;
            self.disagg.stats.quarantined_holds += 1;
            self.disagg.stats.quarantined_blocks += blocks;
            Some(self.disagg.new_hold(Hold {
                request_id: id,
                state: HoldState::Quarantined,
                computed_tokens: prompt,
                windows: rows,
                xfer: None,
                deadline_ms: 0,
            }))
        };
        self.remove_sequence(id, false)?;
        Ok(hold)
    }

    fn receiving_record(&self, id: u64) -> KvResult<&Receiving> {
        match self.disagg.receiving.get(&id) {
            Some(r) => Ok(r),
            None if self.sequences.contains_key(&id) => Err(KvError::InvalidArgument(format!(
                "sequence {id} is not receiving"
            ))),
            None => Err(KvError::UnknownRequest(id)),
        }
    }

    fn stop_receiving(&mut self, id: u64, blocks: u64) {
        self.disagg.receiving.remove(&id);
        self.sequences
            .get_mut(&id)
            .expect("receiving")
            .life
            .receiving = false;
        self.disagg.stats.receiving_requests -= 1;
        self.disagg.stats.receiving_blocks -= blocks;
    }

    fn receiving_block_count(&self, id: u64) -> u64 {
        self.receiving_rows(id)
            .map_or(0, |rows| rows.iter().map(|w| w.blocks.len() as u64).sum())
    }
}
