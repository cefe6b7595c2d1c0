//! C entry points of a running sequence's tokens: generated tokens appended one sequence at a
//! time or one decode step at a time, removed or rewound, and counted.

use super::handle::{
    count_arg, kvb_manager_t, require_out, slice_arg, slice_arg_mut, with_manager, with_manager_tx,
    write_out, FfiError,
};
use super::status::kvb_status_t;

/// Appends generated token `token_id` to a sequence (TensorRT-LLM `addToken`): allocates a block
/// at block boundaries and detaches blocks that left a sliding window — only blocks wholly
/// before the window of the step's first token (see `kvb_manager_refresh_blocks`), so drafts
/// added in the same iteration never free a block that token attends. Fails with
/// `KVB_STATUS_OUT_OF_BLOCKS`, `KVB_STATUS_SEQUENCE_TOO_LONG`, and `KVB_STATUS_COPY_FAILED`
/// (rolled back) when offloading an evicted block fails (`KVB_STATUS_CUDA`, poisoned, for a
/// failed CUDA launch).
#[no_mangle]
pub extern "C" fn kvb_manager_add_token(
    manager: *mut kvb_manager_t,
    request_id: u64,
    token_id: i32,
) -> kvb_status_t {
    with_manager_tx(manager, |m| Ok(m.add_token(request_id, token_id)?))
}

/// One decode step for many sequences under one lock: for each `i < num_requests` in order,
/// appends `token_ids[i]` to sequence `request_ids[i]` (`kvb_manager_add_token`) and, with
/// `store_new_blocks`, stores the block it completed (`kvb_manager_store_new_block`). Each
/// sequence's step is all or nothing. The call stops at the first sequence that fails: it
/// returns that sequence's status (e.g. `KVB_STATUS_OUT_OF_BLOCKS`), that sequence and the ones
/// after it are unchanged. `*out_done` receives how many sequences got their token (the index
/// of the failing one); `statuses` (may be null, else `num_requests` entries) receives
/// `KVB_OK` for those, the failure for the failing one, and is not written past it.
#[no_mangle]
pub extern "C" fn kvb_manager_add_token_batch(
    manager: *mut kvb_manager_t,
    request_ids: *const u64,
    token_ids: *const i32,
    num_requests: usize,
    store_new_blocks: bool,
    statuses: *mut kvb_status_t,
    out_done: *mut usize,
) -> kvb_status_t {
    with_manager_tx(manager, |m| {
        require_out(out_done, "out_done")?;
        let ids = slice_arg(request_ids, num_requests, "request_ids")?;
        let tokens = slice_arg(token_ids, num_requests, "token_ids")?;
        let statuses = if statuses.is_null() {
            None
        } else {
            Some(slice_arg_mut(statuses, num_requests, "statuses")?)
        };
        let (done, result) = m.add_tokens(ids, tokens, store_new_blocks);
        let result = result.map_err(FfiError::from);
        if let Some(st) = statuses {
            st[..done].fill(kvb_status_t::KVB_OK);
            if let (Some(slot), Err(e)) = (st.get_mut(done), &result) {
                *slot = e.0;
            }
        }
        write_out(out_done, done, "out_done")?;
        result
    })
}

/// Removes the last generated token (TensorRT-LLM `removeToken`; beam width 1). Fails with
/// `KVB_STATUS_OUT_OF_BLOCKS` when the last block is shared and no free block is left to copy
/// it into, `KVB_STATUS_UNSUPPORTED` with beam search, `KVB_STATUS_INVALID_ARGUMENT` when the
/// sequence has no generated token, and with `KVB_STATUS_COPY_FAILED` (rolled back) when the
/// copy backend fails (`KVB_STATUS_CUDA`, poisoned, for a failed CUDA launch).
#[no_mangle]
pub extern "C" fn kvb_manager_remove_token(
    manager: *mut kvb_manager_t,
    request_id: u64,
) -> kvb_status_t {
    with_manager_tx(manager, |m| Ok(m.rewind(request_id, 1)?))
}

/// Removes the last `num_tokens` generated tokens (TensorRT-LLM `rewindKVCache`), returning
/// blocks no longer needed to the front of the free queue. Fails with `KVB_STATUS_OUT_OF_BLOCKS`
/// when the new last block is shared and no free block is left to copy it into,
/// `KVB_STATUS_INVALID_ARGUMENT` for a negative count or more tokens than were generated,
/// `KVB_STATUS_UNSUPPORTED` (nothing changed) when a sliding window would get back a block it
/// already detached (a sliding window keeps `max_draft_tokens` tokens of blocks past the window
/// before detaching, so rewinds of rejected drafts up to that many always succeed),
/// `KVB_STATUS_UNSUPPORTED` with beam search, and `KVB_STATUS_COPY_FAILED` (rolled back) when
/// the copy backend fails (`KVB_STATUS_CUDA`, poisoned, for a failed CUDA launch).
#[no_mangle]
pub extern "C" fn kvb_manager_rewind_kv_cache(
    manager: *mut kvb_manager_t,
    request_id: u64,
    num_tokens: i32,
) -> kvb_status_t {
    with_manager_tx(manager, |m| {
        let n = count_arg(num_tokens, "num_tokens")?;
        Ok(m.rewind(request_id, n)?)
    })
}

/// Tokens (prompt + generated) of a sequence.
#[no_mangle]
pub extern "C" fn kvb_manager_get_num_tokens(
    manager: *mut kvb_manager_t,
    request_id: u64,
    out: *mut i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        write_out(out, m.num_tokens(request_id)? as i32, "out")
    })
}
