//! C entry points of block tables: a sequence's block ids and the offset tables the engine's
//! attention kernels read.

use super::handle::{
    copy_out, count_arg, kvb_manager_t, positive_arg, require_out, slice_arg, slice_arg_mut,
    window_arg, with_manager, write_out,
};
use super::status::kvb_status_t;

/// Block ids of one beam of a sequence in one window (TensorRT-LLM `getCacheBlockIds`),
/// front-detached sliding-window blocks included.
#[no_mangle]
pub extern "C" fn kvb_manager_get_cache_block_ids(
    manager: *mut kvb_manager_t,
    request_id: u64,
    window_size: i32,
    beam: i32,
    out_ids: *mut i32,
    capacity: usize,
    out_count: *mut usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        let w = window_arg(window_size)?;
        let beam = count_arg(beam, "beam")?;
        let ids: Vec<i32> = m
            .cache_block_ids(request_id, w, beam)?
            .into_iter()
            .map(|b| b as i32)
            .collect();
        copy_out(&ids, out_ids, capacity, out_count)
    })
}

/// Dimensions of an offset table `[num_pools][num_slots][2][max_blocks_per_seq]` (TensorRT-LLM
/// `getOffsetTableDimensions`); one pool per window, ascending window size.
#[no_mangle]
pub extern "C" fn kvb_manager_get_offset_table_dimensions(
    manager: *mut kvb_manager_t,
    out_max_blocks_per_seq: *mut i32,
    out_num_pools: *mut i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out_max_blocks_per_seq, "out_max_blocks_per_seq")?;
        require_out(out_num_pools, "out_num_pools")?;
        let (blocks, pools) = m.offset_table_dimensions();
        write_out(
            out_max_blocks_per_seq,
            blocks as i32,
            "out_max_blocks_per_seq",
        )?;
        write_out(out_num_pools, pools as i32, "out_num_pools")
    })
}

/// The most blocks one beam of a sequence may list in window `window_size`: `ceil((min(
/// max_sequence_length, window limit) + num_extra_kv_tokens + max_draft_tokens) /
/// tokens_per_block)`, where the window limit is `max(window_size, max_sequence_length)`.
/// `kvb_manager_get_offset_table_dimensions` reports the largest of these over windows.
/// `KVB_STATUS_INVALID_ARGUMENT` for a window size the manager does not have.
#[no_mangle]
pub extern "C" fn kvb_manager_get_max_blocks_per_seq(
    manager: *mut kvb_manager_t,
    window_size: i32,
    out_max_blocks_per_seq: *mut i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out_max_blocks_per_seq, "out_max_blocks_per_seq")?;
        let blocks = m.max_blocks_per_seq(window_arg(window_size)?)?;
        write_out(
            out_max_blocks_per_seq,
            blocks as i32,
            "out_max_blocks_per_seq",
        )
    })
}

/// Writes a sequence's block offsets into `table` (`table_len` int32 entries, layout
/// `[pool][num_slots][K|V][max_blocks_per_seq]`) at slots `slot_offset..+beam_width`
/// (TensorRT-LLM `copyBlockOffsets`). Entry for block b: `memory_index(b) * 2 * num_layers`
/// (+1 for V); the rest of each written row is `INT32_MAX`. `*out_max_block_count` = most
/// blocks of any beam. `KVB_STATUS_INVALID_ARGUMENT`, with nothing written, while one of the
/// sequence's blocks is on the host tier (`kvb_manager_offload_block`: onboard it first).
#[no_mangle]
pub extern "C" fn kvb_manager_copy_block_offsets(
    manager: *mut kvb_manager_t,
    table: *mut i32,
    table_len: usize,
    num_slots: i32,
    slot_offset: i32,
    request_id: u64,
    out_max_block_count: *mut i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out_max_block_count, "out_max_block_count")?;
        let slots = positive_arg(num_slots, "num_slots")?;
        let offset = count_arg(slot_offset, "slot_offset")?;
        let table = slice_arg_mut(table, table_len, "table")?;
        let n = m.copy_block_offsets(table, slots, offset, request_id)?;
        write_out(out_max_block_count, n as i32, "out_max_block_count")
    })
}

/// Offsets of a batch (TensorRT-LLM `getBlockOffsetsOfBatch`): request `request_ids[i]` is
/// written at slots `i * beam_width ..`. Unlike TensorRT-LLM, the request ids are explicit.
#[no_mangle]
pub extern "C" fn kvb_manager_get_block_offsets_of_batch(
    manager: *mut kvb_manager_t,
    table: *mut i32,
    table_len: usize,
    num_slots: i32,
    request_ids: *const u64,
    num_requests: usize,
    beam_width: i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        let slots = positive_arg(num_slots, "num_slots")?;
        let beam = positive_arg(beam_width, "beam_width")?;
        let ids = slice_arg(request_ids, num_requests, "request_ids")?;
        let table = slice_arg_mut(table, table_len, "table")?;
        Ok(m.block_offsets_of_batch(table, slots, ids, beam)?)
    })
}
