//! C entry points that store a sequence's blocks for reuse, release a finished sequence, and
//! pin and unpin blocks.

use super::handle::{
    block_ids_arg, copy_out, count_arg, kvb_manager_t, null_error, require_out, window_arg,
    with_manager, write_out,
};
use super::status::kvb_status_t;
use crate::error::KvError;

/// Stores the full prompt blocks computed so far (`context_position` tokens) for reuse, after a
/// context chunk (TensorRT-LLM `storeContextBlocks`).
#[no_mangle]
pub extern "C" fn kvb_manager_store_context_blocks(
    manager: *mut kvb_manager_t,
    request_id: u64,
    context_position: i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        let p = count_arg(context_position, "context_position")?;
        Ok(m.store_context_blocks(request_id, p)?)
    })
}

/// Stores the decode block that the last token completed (TensorRT-LLM `storeNewBlock`); a
/// no-op unless the last `add_token` opened a new block.
#[no_mangle]
pub extern "C" fn kvb_manager_store_new_block(
    manager: *mut kvb_manager_t,
    request_id: u64,
) -> kvb_status_t {
    with_manager(manager, |m| Ok(m.store_new_block(request_id)?))
}

/// Stores every computed token of a sequence for reuse (TensorRT-LLM `storeBlocksForReuse`):
/// the tokens of its history (reported by `kvb_manager_store_context_blocks` after each context
/// chunk, `kvb_manager_advance_history`, or `kvb_manager_add_token`), never the last known token
/// and never prompt tokens no chunk computed, so no block whose KV nobody wrote is cached.
/// With `pin`, every block on the stored path is pinned and the pinned ids of `window_size`
/// (0 = the smallest window) are written to `out_ids` (`capacity` entries; `*out_count` = how
/// many). Pass `out_ids = NULL, capacity = 0` when not pinning. When pinning, `capacity` must hold
/// one id per block of the stored tokens (`ceil(min(num_tokens - 1, history) / tokens_per_block)`, the history
/// being `kvb_sequence_lengths_t::history`); with less,
/// the call fails with `KVB_STATUS_BUFFER_TOO_SMALL`, writes that count to `*out_count` and
/// neither stores nor pins anything.
#[no_mangle]
pub extern "C" fn kvb_manager_store_blocks_for_reuse(
    manager: *mut kvb_manager_t,
    request_id: u64,
    pin: bool,
    window_size: i32,
    out_ids: *mut i32,
    capacity: usize,
    out_count: *mut usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out_count, "out_count")?;
        let window = match window_size {
            0 => None,
            w => Some(window_arg(w)?),
        };
        if pin && capacity > 0 && out_ids.is_null() {
            return Err(null_error("out_ids"));
        }
        let ids = match m.store_blocks_for_reuse(request_id, pin, window, capacity) {
            Ok(ids) => ids,
            Err(e @ KvError::BufferTooSmall { needed, .. }) => {
                write_out(out_count, needed, "out_count")?;
                return Err(e.into());
            }
            Err(e) => return Err(e.into()),
        };
        let ids: Vec<i32> = ids.into_iter().map(|b| b as i32).collect();
        copy_out(&ids, out_ids, capacity, out_count)
    })
}

/// Releases a finished sequence (TensorRT-LLM `removeSequence`). With `store_for_reuse`, its
/// computed blocks (partial last block included) are first stored in the reuse tree (beam width
/// 1): as `kvb_manager_store_blocks_for_reuse`, storing stops at the history, so a request
/// preempted in the middle of its chunked prefill stores only what its chunks computed.
#[no_mangle]
pub extern "C" fn kvb_manager_remove_sequence(
    manager: *mut kvb_manager_t,
    request_id: u64,
    store_for_reuse: bool,
) -> kvb_status_t {
    with_manager(manager, |m| {
        Ok(m.remove_sequence(request_id, store_for_reuse)?)
    })
}

/// Pins every block of a sequence in every window (TensorRT-LLM `pinBlocks`): they stay
/// allocated after `remove_sequence` until unpinned.
#[no_mangle]
pub extern "C" fn kvb_manager_pin_blocks(
    manager: *mut kvb_manager_t,
    request_id: u64,
) -> kvb_status_t {
    with_manager(manager, |m| Ok(m.pin_blocks(request_id)?))
}

/// Pins each listed block of `window_size` (TensorRT-LLM `WindowBlockManager::pinBlock`, by
/// id): a pinned block keeps its GPU row and content until `kvb_manager_unpin_blocks_by_id`
/// drops the pin, whoever else releases it, so a reader (a cache transceiver thread) can copy it
/// while the executor goes on. A block may take several pins. Every id must be in range and on
/// the GPU tier (`KVB_STATUS_INVALID_ARGUMENT` otherwise, with nothing pinned: onboard a host
/// block first with `kvb_manager_onboard_block`).
#[no_mangle]
pub extern "C" fn kvb_manager_pin_blocks_by_id(
    manager: *mut kvb_manager_t,
    window_size: i32,
    block_ids: *const i32,
    num_ids: usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        let w = window_arg(window_size)?;
        let ids = block_ids_arg(block_ids, num_ids, "block_ids")?;
        Ok(m.pin_blocks_by_id(w, &ids)?)
    })
}

/// Drops one pin of each listed block of `window_size` (TensorRT-LLM `unpinBlocksById`). Every
/// id must hold a pin (checked before anything changes).
#[no_mangle]
pub extern "C" fn kvb_manager_unpin_blocks_by_id(
    manager: *mut kvb_manager_t,
    window_size: i32,
    block_ids: *const i32,
    num_ids: usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        let w = window_arg(window_size)?;
        let ids = block_ids_arg(block_ids, num_ids, "block_ids")?;
        Ok(m.unpin_blocks_by_id(w, &ids)?)
    })
}
