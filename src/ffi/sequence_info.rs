//! C entry points that describe a live sequence and its blocks the way TensorRT-LLM's
//! `GenerationRequest` and the disaggregation transceiver ask: beam width, blocks a sliding
//! window detached, and block ids translated to pool rows.

use super::handle::{
    block_id_arg, i32_result, invalid, kvb_manager_t, require_out, slice_arg, slice_arg_mut,
    window_arg, with_manager, write_out,
};
use super::status::kvb_status_t;
use crate::pool::Level;

/// Beams of a live sequence (TensorRT-LLM `GenerationRequest::getBeamWidth`).
#[no_mangle]
pub extern "C" fn kvb_manager_get_beam_width(
    manager: *mut kvb_manager_t,
    request_id: u64,
    out: *mut i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        write_out(
            out,
            i32_result(m.beam_width(request_id)?, "the beam width")?,
            "out",
        )
    })
}

/// Blocks window `window_size` has detached from the front of a sequence because they left the
/// sliding window (TensorRT-LLM `GenerationRequest::getNumFrontBlocksRemoved`); 0 for a full
/// attention window. The detached ids stay listed first by `kvb_manager_get_cache_block_ids`.
#[no_mangle]
pub extern "C" fn kvb_manager_get_num_front_blocks_removed(
    manager: *mut kvb_manager_t,
    request_id: u64,
    window_size: i32,
    out: *mut i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        let n = m.num_front_blocks_removed(request_id, window_arg(window_size)?)?;
        write_out(out, i32_result(n, "the count")?, "out")
    })
}

/// The GPU-pool row of each of `num_ids` block ids of window `window_size` (TensorRT-LLM
/// `getMemoryPoolBlockIndicesByBlockIds`): `out_indices[i]` is the primary-pool row block
/// `block_ids[i]` occupies now, or -1 when it lives on the host tier (offloaded; its id and row
/// have parted). Ids out of range fail with `KVB_STATUS_INVALID_ARGUMENT` before anything is
/// written.
#[no_mangle]
pub extern "C" fn kvb_manager_get_memory_pool_block_indices(
    manager: *mut kvb_manager_t,
    window_size: i32,
    block_ids: *const i32,
    num_ids: usize,
    out_indices: *mut i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        let window = window_arg(window_size)?;
        let ids = slice_arg(block_ids, num_ids, "block_ids")?;
        if num_ids > 0 && out_indices.is_null() {
            return Err(invalid("out_indices is null".into()));
        }
        let mut rows = Vec::with_capacity(ids.len());
        for &id in ids {
            let info = m.block_info(window, block_id_arg(id)?)?;
            rows.push(match info.level {
                Level::Primary => i32_result(info.memory_index as usize, "a row")?,
                _ => -1,
            });
        }
        slice_arg_mut(out_indices, num_ids, "out_indices")?.copy_from_slice(&rows);
        Ok(())
    })
}
