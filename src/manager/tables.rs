//! Block tables: a sequence's block ids and the offset tables the engine reads.

use super::KvCacheManager;
use crate::error::{KvError, KvResult};

/// Value written into offset tables where a sequence has no block.
pub const NO_BLOCK_OFFSET: i32 = i32::MAX;

impl KvCacheManager {
    /// Block ids of one beam of a sequence in one window.
    pub fn cache_block_ids(&self, id: u64, window_size: usize, beam: usize) -> KvResult<Vec<u32>> {
        let seq = self.sequence(id)?;
        if beam >= seq.beam_width {
            return Err(KvError::InvalidArgument(format!(
                "beam {beam} of a sequence with beam width {}",
                seq.beam_width
            )));
        }
        let w = self.window(window_size)?;
        Ok(w.block_ids(id, beam).unwrap_or(&[]).to_vec())
    }

    /// `(max blocks per sequence over windows, number of pools)`: the last and first dimensions
    /// of an offset table `[pools][slots][2][max_blocks]`.
    pub fn offset_table_dimensions(&self) -> (usize, usize) {
        let max_blocks = self
            .windows
            .iter()
            .map(|w| w.config().max_blocks_per_seq)
            .max()
            .unwrap_or(0);
        (max_blocks, self.windows.len())
    }

    /// Writes a sequence's block offsets into `table`, laid out `[pool][slot][K|V][block]` with
    /// `num_slots` slots, at slots `slot_offset..slot_offset + beam_width` (one pool per window,
    /// ascending). The entry of block b is `memory_index(b) * 2 * layers + field`; unused entries
    /// of the written rows are `NO_BLOCK_OFFSET`. Returns the most blocks of any beam.
    pub fn copy_block_offsets(
        &self,
        table: &mut [i32],
        num_slots: usize,
        slot_offset: usize,
        id: u64,
    ) -> KvResult<usize> {
        // A suspended sequence's blocks may be on the host tier: no offsets for kernels.
        let seq = self.active_sequence(id)?;
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
        for (pool, w) in self.windows.iter().enumerate() {
            let layers = w.config().geometry.num_layers.max(1) as i64;
            for beam in 0..seq.beam_width {
                let ids = w.block_ids(id, beam).unwrap_or(&[]);
                max_count = max_count.max(ids.len());
                for field in 0..2 {
                    let base = ((pool * num_slots + slot_offset + beam) * 2 + field) * max_blocks;
                    let row = &mut table[base..base + max_blocks];
                    row.fill(NO_BLOCK_OFFSET);
                    for (slot, &b) in row.iter_mut().zip(ids) {
                        let mem = i64::from(w.arena().row(b).index);
                        *slot = (mem * layers * 2 + field as i64) as i32;
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
