//! C entry points of the scheduler: the scheduling simulation and the per-request block
//! estimates of TensorRT-LLM's capacity scheduler.

use super::handle::{
    count_arg, guard, i32_result, kvb_manager_t, require_out, window_arg, with_manager, write_out,
};
use super::status::kvb_status_t;
use super::types::{
    init_exact, kvb_request_state_t, kvb_request_t, optional_request, request, request_state,
    request_state_default,
};

/// Initialises a scheduler request state (phase context-init, beam width 1).
#[no_mangle]
pub extern "C" fn kvb_request_state_init(state: *mut kvb_request_state_t) -> kvb_status_t {
    guard(|| write_out(state, request_state_default(), "state"))
}

/// `kvb_request_state_init` of a struct of the caller's `size` (its `sizeof`, which the header's
/// `kvb_request_state_init` macro passes): writes nothing past it. `KVB_STATUS_STRUCT_SIZE` for a
/// size that is no layout of this struct.
#[no_mangle]
pub extern "C" fn kvb_request_state_init_sized(
    state: *mut kvb_request_state_t,
    size: usize,
) -> kvb_status_t {
    init_exact(state, size, "state", request_state_default())
}

/// Tells the estimates the most prompt tokens one context step computes (TensorRT-LLM's
/// `maxNumTokens` with paged context attention; 0, the default: not given). A sliding window's
/// `kvb_manager_get_remaining_blocks_to_completion` then counts up to that many tokens past the
/// window, capped at what `max_sequence_length` leaves past it (TensorRT-LLM's temporary
/// attention window). `KVB_STATUS_INVALID_ARGUMENT` for a negative count, nothing changed.
#[no_mangle]
pub extern "C" fn kvb_manager_set_max_context_chunk_tokens(
    manager: *mut kvb_manager_t,
    tokens: i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        let tokens = count_arg(tokens, "tokens")?;
        m.set_max_context_chunk_tokens(tokens);
        Ok(())
    })
}

/// Starts a scheduling simulation: copies free counts and reference counts
/// (TensorRT-LLM `startScheduling`).
#[no_mangle]
pub extern "C" fn kvb_manager_start_scheduling(manager: *mut kvb_manager_t) -> kvb_status_t {
    with_manager(manager, |m| {
        m.start_scheduling();
        Ok(())
    })
}

/// In the scheduling simulation, counts the blocks that removing a sequence would free
/// (TensorRT-LLM `schedulingRemoveSequence`).
#[no_mangle]
pub extern "C" fn kvb_manager_scheduling_remove_sequence(
    manager: *mut kvb_manager_t,
    request_id: u64,
) -> kvb_status_t {
    with_manager(manager, |m| Ok(m.scheduling_remove_sequence(request_id)?))
}

/// Whether the scheduling simulation has at least `num_blocks` free blocks in a window
/// (TensorRT-LLM `schedulingHasFreeBlocks`).
#[no_mangle]
pub extern "C" fn kvb_manager_scheduling_has_free_blocks(
    manager: *mut kvb_manager_t,
    num_blocks: i32,
    window_size: i32,
    out: *mut bool,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        let n = count_arg(num_blocks, "num_blocks")?;
        write_out(
            out,
            m.scheduling_has_free_blocks(n, window_arg(window_size)?)?,
            "out",
        )
    })
}

/// Blocks the next step of a request needs in one window (TensorRT-LLM
/// `getNeededBlocksOneStep`). `request` (may be null) lets a first context chunk discount
/// prefix blocks already held by other sequences.
#[no_mangle]
pub extern "C" fn kvb_manager_get_needed_blocks_one_step(
    manager: *mut kvb_manager_t,
    state: *const kvb_request_state_t,
    request: *const kvb_request_t,
    two_steps_look_ahead: bool,
    window_size: i32,
    out: *mut i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        let st = request_state(state)?;
        let req = optional_request(request)?;
        let n = m.needed_blocks_one_step(
            &st,
            req.as_ref(),
            two_steps_look_ahead,
            window_arg(window_size)?,
        )?;
        write_out(out, i32_result(n, "the result")?, "out")
    })
}

/// Blocks a request still needs in one window until completion (TensorRT-LLM
/// `getRemainingBlocksToCompletion`). `request` may be null.
#[no_mangle]
pub extern "C" fn kvb_manager_get_remaining_blocks_to_completion(
    manager: *mut kvb_manager_t,
    state: *const kvb_request_state_t,
    request: *const kvb_request_t,
    window_size: i32,
    out: *mut i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        let st = request_state(state)?;
        let req = optional_request(request)?;
        let n = m.remaining_blocks_to_completion(&st, req.as_ref(), window_arg(window_size)?)?;
        write_out(out, i32_result(n, "the result")?, "out")
    })
}

/// Consecutive full prompt blocks of `request` present in a window's reuse tree
/// (TensorRT-LLM `countReusableBlocks`); with `only_allocated`, only those currently referenced.
#[no_mangle]
pub extern "C" fn kvb_manager_count_reusable_blocks(
    manager: *mut kvb_manager_t,
    request: *const kvb_request_t,
    window_size: i32,
    only_allocated: bool,
    out: *mut i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        let req = self::request(request)?.to_request();
        let n = m.count_reusable_blocks(&req, window_arg(window_size)?, only_allocated)?;
        write_out(out, i32_result(n, "the result")?, "out")
    })
}

/// Most concurrent requests of `input_length + output_length` tokens the primary pools hold
/// (TensorRT-LLM `getMaxCapacityBatchSize`).
#[no_mangle]
pub extern "C" fn kvb_manager_get_max_capacity_batch_size(
    manager: *mut kvb_manager_t,
    input_length: i32,
    output_length: i32,
    out: *mut i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        let i = count_arg(input_length, "input_length")?;
        let o = count_arg(output_length, "output_length")?;
        write_out(
            out,
            i32_result(m.max_capacity_batch_size(i, o), "the batch size")?,
            "out",
        )
    })
}
