//! Block tables: a sequence's block ids and the offset tables the engine reads.

use super::KvCacheManager;
use crate::error::{KvError, KvResult};

/// Value written into offset tables where a sequence has no block.
pub const NO_BLOCK_OFFSET: i32 = i32::MAX;

impl KvCacheManager {
    /// Block ids of one beam of a sequence in one window.
    /// Also answers for a receiving sequence (its receiving rows are in these blocks).
    pub fn cache_block_ids(&self, id: u64, window_size: usize, beam: usize) -> KvResult<Vec<u32>> {
        let seq = self.sequences.get(&id).ok_or(KvError::UnknownRequest(id))?;
        if beam >= seq.beam_width {
            return Err(KvError::InvalidArgument(format!(
                "beam {beam} of a sequence with beam width {}",
                seq.beam_width
            )));
        }
        let w = self.window(window_size)?;
        Ok(w.block_ids(id, beam).unwrap_or(&[]).to_vec())
    }

    /// The most blocks one beam of a sequence may list in a window: the rows of its offset
    /// table, `ceil((min(max_sequence_length, window limit) + num_extra_kv_tokens +
    /// max_draft_tokens) / tokens_per_block)`.
    pub fn max_blocks_per_seq(&self, window_size: usize) -> KvResult<usize> {
        Ok(self.window(window_size)?.config().max_blocks_per_seq)
    }

    /// `(max blocks per sequence over windows, number of pools)`: the last and first dimensions
    /// of an offset table `[pools][slots][2][max_blocks]`. The pools are the model's data pools
    /// (block-scale pools share their data pool's offsets), one per window without layers.
    pub fn offset_table_dimensions(&self) -> (usize, usize) {
        let max_blocks = self
            .windows
            .iter()
            .map(|w| w.config().max_blocks_per_seq)
            .max()
            .unwrap_or(0);
        (max_blocks, self.pool_model.data_pools().len())
    }

    /// Writes a sequence's block offsets into `table`, laid out `[pool][slot][K|V][block]` with
    /// `num_slots` slots, at slots `slot_offset..slot_offset + beam_width` (the model's data
    /// pools in order; one pool per window, ascending, without layers). As in TensorRT-LLM, the
    /// entry of block b in a pool of `L` layers is `memory_index(b) * L * kv_factor + field`,
    /// where field is 0 for K and 1 for V (always 0 in a K-only pool, whose kv_factor is 1);
    /// unused entries of the written rows are `NO_BLOCK_OFFSET`. Returns the most blocks of any
    /// beam.
    pub fn copy_block_offsets(
        &self,
        table: &mut [i32],
        num_slots: usize,
        slot_offset: usize,
        id: u64,
    ) -> KvResult<usize> {
        // A suspended sequence's blocks may be on the host tier: no offsets for kernels.
        let seq = self.active_sequence(id)?;
        // Nor for a block an explicit offload moved there; checked before anything is written.
        for w in self.windows.iter().filter(|w| w.may_hold_on_host()) {
            for beam in 0..seq.beam_width {
                let ids = w.block_ids(id, beam).unwrap_or(&[]);
                if let Some(&b) = ids.iter().find(|&&b| w.is_held_on_host(b)) {
                    return Err(KvError::InvalidArgument(format!(
                        "block {b} of sequence {id} is on the host tier (offload_block); \
                         onboard it before writing the sequence's offsets"
                    )));
                }
            }
        }
        let (max_blocks, num_pools) = self.offset_table_dimensions();
        let needed = num_pools * num_slots * 2 * max_blocks;
        if table.len() < needed {
            return Err(KvError::BufferTooSmall {
                needed,
                given: table.len(),
            });
        }
        if slot_offset + seq.beam_width > num_slots {
            return Err(KvError::InvalidArgument(format!(
                "slots {slot_offset}..{} exceed the table's {num_slots} slots",
                slot_offset + seq.beam_width
            )));
        }
        let mut max_count = 0;
        for (pool, info) in self.pool_model.data_pools().iter().enumerate() {
            let w = &self.windows[info.window_index];
            let g = &info.geometry;
            let stride = (g.num_layers.max(1) * g.kv_factor) as i64;
            let k_only = g.kv_factor == 1;
            for beam in 0..seq.beam_width {
                let ids = w.block_ids(id, beam).unwrap_or(&[]);
                // A sequence never lists more blocks than its table row holds (an invariant:
                // capacities stay within `max_kv_tokens`); refuse rather than truncate.
                if ids.len() > max_blocks {
                    return Err(KvError::InvariantViolation(format!(
                        "sequence {id} lists {} blocks in window {}, more than the {max_blocks} \
                         of an offset table row",
                        ids.len(),
                        w.window_size()
                    )));
                }
                max_count = max_count.max(ids.len());
                for field in 0..2 {
                    let base = ((pool * num_slots + slot_offset + beam) * 2 + field) * max_blocks;
                    let row = &mut table[base..base + max_blocks];
                    row.fill(NO_BLOCK_OFFSET);
                    for (slot, &b) in row.iter_mut().zip(ids) {
                        let mem = i64::from(w.arena().row(b).index);
                        let field = if k_only { 0 } else { field as i64 };
                        *slot = (mem * stride + field) as i32;
                    }
                }
            }
        }
        Ok(max_count)
    }

    /// Offsets of a batch: request `i` of `ids` goes to slots `i * beam_width ..`. (TensorRT-LLM
    /// takes a first slot index and treats `first + i` as a request id; this takes the ids.)
    pub fn block_offsets_of_batch(
        &self,
        table: &mut [i32],
        num_slots: usize,
        ids: &[u64],
        beam_width: usize,
    ) -> KvResult<()> {
        for &id in ids {
            let seq = self.active_sequence(id)?;
            if seq.beam_width > beam_width {
                return Err(KvError::InvalidArgument(format!(
                    "request {id} has beam width {} > {beam_width}",
                    seq.beam_width
                )));
            }
        }
        if ids.len() * beam_width > num_slots {
            return Err(KvError::InvalidArgument(format!(
                "{} requests × {beam_width} beams exceed {num_slots} slots",
                ids.len()
            )));
        }
        for (i, &id) in ids.iter().enumerate() {
            self.copy_block_offsets(table, num_slots, i * beam_width, id)?;
        }
        Ok(())
    }
}
