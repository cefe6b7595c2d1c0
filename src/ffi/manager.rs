//! C entry points of the manager. Each validates its arguments, converts them, and calls one
//! `KvCacheManager` method under the handle's lock.

use super::handle::{
    copy_out, count_arg, destroy_handle, guard, i32_result, invalid, kvb_manager_t, new_handle,
    null_error, positive_arg, require_out, slice_arg, slice_arg_mut, with_manager, with_manager_tx,
    write_out, FfiError,
};
use super::status::kvb_status_t;
use super::types::*;
use crate::manager::KvCacheManager;

fn window_arg(v: i32) -> Result<usize, FfiError> {
    positive_arg(v, "window_size")
}

/// Fills `config` with defaults (reuse, partial reuse, copy-on-partial and onboarding on,
/// 32 tokens per block, beam 1, offload minimum priority 30, 2 bytes per element, no pool
/// memory) and sets `struct_size`. The caller then sets `windows` and `max_sequence_length`.
#[no_mangle]
pub extern "C" fn kvb_manager_config_init(config: *mut kvb_manager_config_t) -> kvb_status_t {
    guard(|| write_out(config, manager_config_default(), "config"))
}

/// Initialises a request descriptor: beam width 1, no optional fields, `struct_size` set.
#[no_mangle]
pub extern "C" fn kvb_request_init(request: *mut kvb_request_t) -> kvb_status_t {
    guard(|| write_out(request, request_default(), "request"))
}

/// Initialises a scheduler request state (phase context-init, beam width 1).
#[no_mangle]
pub extern "C" fn kvb_request_state_init(state: *mut kvb_request_state_t) -> kvb_status_t {
    guard(|| write_out(state, request_state_default(), "state"))
}

/// Creates a manager. On success `*out` is a handle to free with `kvb_manager_destroy`; on
/// failure `*out` is set to null. Fails with `KVB_STATUS_INVALID_CONFIG` (inconsistent config,
/// pool sizes that overflow, more than `INT32_MAX` blocks in a window),
/// `KVB_STATUS_STRUCT_SIZE`, `KVB_STATUS_OUT_OF_MEMORY` (pools or bookkeeping the allocator
/// refuses), `KVB_STATUS_UNSUPPORTED` or `KVB_STATUS_CUDA` (CUDA backend).
#[no_mangle]
pub extern "C" fn kvb_manager_create(
    config: *const kvb_manager_config_t,
    out: *mut *mut kvb_manager_t,
) -> kvb_status_t {
    guard(|| {
        require_out(out, "out")?;
        write_out(out, std::ptr::null_mut(), "out")?;
        // SAFETY: valid pointer or null (checked).
        let c = unsafe { config.as_ref() }.ok_or_else(|| null_error("config"))?;
        let cfg = manager_config(c)?;
        let m = KvCacheManager::new(cfg)?;
        write_out(out, new_handle(m), "out")
    })
}

/// Destroys a manager. Null is accepted (no-op). Destroying twice returns
/// `KVB_STATUS_DESTROYED`; any other call on a destroyed handle returns it too.
#[no_mangle]
pub extern "C" fn kvb_manager_destroy(manager: *mut kvb_manager_t) -> kvb_status_t {
    guard(|| {
        if destroy_handle(manager) {
            Ok(())
        } else {
            Err(FfiError(
                kvb_status_t::KVB_STATUS_DESTROYED,
                "the manager was already destroyed".into(),
            ))
        }
    })
}

/// Admits a request (TensorRT-LLM `addSequence`): reuses cached prefix blocks, onboards host
/// blocks, copies partial matches, allocates the rest in every window. `out` (may be null)
/// receives the prepopulated prompt length and the per-request counters. Fails with
/// `KVB_STATUS_OUT_OF_BLOCKS` when a window lacks blocks, and with `KVB_STATUS_COPY_FAILED`
/// when the copy backend fails (the call is rolled back); a failed call changes nothing. A
/// failed CUDA launch returns `KVB_STATUS_CUDA` and poisons the handle.
#[no_mangle]
pub extern "C" fn kvb_manager_add_sequence(
    manager: *mut kvb_manager_t,
    request: *const kvb_request_t,
    out: *mut kvb_admission_t,
) -> kvb_status_t {
    with_manager_tx(manager, |m| {
        let req = self::request(request)?;
        let admission = m.add_sequence_ref(&req.as_ref())?;
        if !out.is_null() {
            write_out(out, admission.into(), "out")?;
        }
        Ok(())
    })
}

/// Admits a batch of requests in order (TensorRT-LLM `addSequenceBatch`): every reusable block
/// of every request is claimed before anything is onboarded or allocated, so what
/// `kvb_manager_estimate_batch` estimated is what is delivered. `results` (may be null) receives
/// `num_requests` entries; `*out_admitted` how many requests were admitted. Without
/// `longest_prefix` the batch is all or nothing (`KVB_STATUS_OUT_OF_BLOCKS`, nothing changed);
/// with it, the longest prefix that fits is admitted (possibly none).
#[no_mangle]
pub extern "C" fn kvb_manager_add_sequence_batch(
    manager: *mut kvb_manager_t,
    requests: *const kvb_request_t,
    num_requests: usize,
    longest_prefix: bool,
    results: *mut kvb_admission_t,
    out_admitted: *mut usize,
) -> kvb_status_t {
    with_manager_tx(manager, |m| {
        require_out(out_admitted, "out_admitted")?;
        let reqs = requests_arg(requests, num_requests)?;
        let out = if results.is_null() {
            None
        } else {
            Some(slice_arg_mut(results, num_requests, "results")?)
        };
        let refs: Vec<_> = reqs.iter().map(|r| r.as_ref()).collect();
        let admitted = m.add_sequence_batch_refs(&refs, longest_prefix)?;
        if let Some(out) = out {
            for (slot, a) in out.iter_mut().zip(&admitted) {
                *slot = (*a).into();
            }
        }
        write_out(out_admitted, admitted.len(), "out_admitted")
    })
}

/// The scheduler's estimate for a candidate batch, in order, counting the requests before each
/// one (a block one request allocates is not free for the next; a block one claims is reusable
/// by the next). Changes nothing. `out` receives `num_requests` entries; admitting the same
/// batch on the same state delivers exactly these figures.
#[no_mangle]
pub extern "C" fn kvb_manager_estimate_batch(
    manager: *mut kvb_manager_t,
    requests: *const kvb_request_t,
    num_requests: usize,
    out: *mut kvb_batch_estimate_t,
) -> kvb_status_t {
    with_manager(manager, |m| {
        let reqs = requests_arg(requests, num_requests)?;
        let out = slice_arg_mut(out, num_requests, "out")?;
        let refs: Vec<_> = reqs.iter().map(|r| r.as_ref()).collect();
        let estimates = m.estimate_batch_refs(&refs)?;
        for (slot, e) in out.iter_mut().zip(estimates) {
            *slot = e.into();
        }
        Ok(())
    })
}

fn requests_arg<'a>(
    requests: *const kvb_request_t,
    n: usize,
) -> Result<Vec<CRequest<'a>>, FfiError> {
    if n == 0 {
        return Err(invalid("a batch needs at least one request".into()));
    }
    if requests.is_null() {
        return Err(null_error("requests"));
    }
    (0..n)
        // SAFETY: `n` readable requests at `requests` (caller contract; null checked).
        .map(|i| self::request(unsafe { requests.add(i) }))
        .collect()
}

/// Appends generated token `token_id` to a sequence (TensorRT-LLM `addToken`): allocates a block
/// at block boundaries and detaches blocks that left a sliding window. Fails with
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

/// Stores every computed token of a sequence for reuse (TensorRT-LLM `storeBlocksForReuse`).
/// With `pin`, every block on the stored path is pinned and the pinned ids of `window_size`
/// (0 = the smallest window) are written to `out_ids` (`capacity` entries; `*out_count` = how
/// many). Pass `out_ids = NULL, capacity = 0` when not pinning. When pinning, `capacity` must hold
/// one id per block of the stored tokens (`ceil((num_tokens - 1) / tokens_per_block)`); with less,
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
        if pin {
            // The pinned ids are known only after storing; check the bound first so that a
            // failed call changes nothing.
            if let Some(w) = window {
                m.window(w)?;
            }
            let bound = (m.num_tokens(request_id)? - 1).div_ceil(m.tokens_per_block());
            if capacity < bound {
                write_out(out_count, bound, "out_count")?;
                return Err(FfiError(
                    kvb_status_t::KVB_STATUS_BUFFER_TOO_SMALL,
                    format!(
                        "buffer too small: pinning may return {bound} ids, capacity is {capacity}"
                    ),
                ));
            }
        }
        let ids = m.store_blocks_for_reuse(request_id, pin, window)?;
        let ids: Vec<i32> = ids.into_iter().map(|b| b as i32).collect();
        copy_out(&ids, out_ids, capacity, out_count)
    })
}

/// Releases a finished sequence (TensorRT-LLM `removeSequence`). With `store_for_reuse`, its
/// blocks (partial last block included) are first stored in the reuse tree (beam width 1).
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
        let ids = slice_arg(block_ids, num_ids, "block_ids")?
            .iter()
            .map(|&b| u32::try_from(b).map_err(|_| invalid(format!("block id {b} is negative"))))
            .collect::<Result<Vec<u32>, _>>()?;
        Ok(m.unpin_blocks_by_id(w, &ids)?)
    })
}

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
/// blocks of any beam.
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

/// Whole-manager statistics (TensorRT-LLM `getKvCacheStats`).
#[no_mangle]
pub extern "C" fn kvb_manager_get_kv_cache_stats(
    manager: *mut kvb_manager_t,
    out: *mut kvb_kv_cache_stats_t,
) -> kvb_status_t {
    with_manager(manager, |m| write_out(out, m.stats().into(), "out"))
}

/// Free primary blocks over all windows (TensorRT-LLM `getNumFreeBlocks`).
#[no_mangle]
pub extern "C" fn kvb_manager_get_num_free_blocks(
    manager: *mut kvb_manager_t,
    out: *mut i64,
) -> kvb_status_t {
    with_manager(manager, |m| {
        write_out(out, m.num_free_blocks() as i64, "out")
    })
}

/// Free primary and secondary blocks of one window (TensorRT-LLM
/// `getNumFreeBlocksPerWindowSize`).
#[no_mangle]
pub extern "C" fn kvb_manager_get_num_free_blocks_per_window_size(
    manager: *mut kvb_manager_t,
    window_size: i32,
    out_primary: *mut i64,
    out_secondary: *mut i64,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out_primary, "out_primary")?;
        require_out(out_secondary, "out_secondary")?;
        let (p, s) = m.num_free_blocks_of_window(window_arg(window_size)?)?;
        write_out(out_primary, p as i64, "out_primary")?;
        write_out(out_secondary, s as i64, "out_secondary")
    })
}

/// Host-tier (secondary) blocks of window `window_size`: the configured `secondary_blocks`, or
/// the size chosen for an automatic host tier (`kvb_window_config_t::auto_host_tier`).
/// `KVB_STATUS_INVALID_ARGUMENT` for a window size the manager does not have.
#[no_mangle]
pub extern "C" fn kvb_manager_get_host_tier_blocks(
    manager: *mut kvb_manager_t,
    window_size: i32,
    out_blocks: *mut i64,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out_blocks, "out_blocks")?;
        let blocks = m.host_tier_blocks(window_arg(window_size)?)?;
        write_out(out_blocks, blocks as i64, "out_blocks")
    })
}

/// The admission result of a live sequence: prepopulated length and per-request counters
/// (TensorRT-LLM's per-request stats on `LlmRequest`).
#[no_mangle]
pub extern "C" fn kvb_manager_get_request_stats(
    manager: *mut kvb_manager_t,
    request_id: u64,
    out: *mut kvb_admission_t,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        write_out(out, m.admission(request_id)?.into(), "out")
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
        let req = if request.is_null() {
            None
        } else {
            Some(self::request(request)?.to_request())
        };
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
        let req = if request.is_null() {
            None
        } else {
            Some(self::request(request)?.to_request())
        };
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

/// Expires timed retentions and syncs outstanding copies; call once per iteration
/// (TensorRT-LLM `refreshBlocks`). Fails only with the copy backend's errors
/// (`KVB_STATUS_COPY_FAILED` rolled back; `KVB_STATUS_CUDA`, poisoned).
#[no_mangle]
pub extern "C" fn kvb_manager_refresh_blocks(manager: *mut kvb_manager_t) -> kvb_status_t {
    with_manager_tx(manager, |m| {
        m.refresh_blocks();
        Ok(())
    })
}

/// Verifies the manager's invariants (free counters = queue lengths, queue levels, reference
/// counts, tree hashes and links, sliding-window bounds, ...). Returns
/// `KVB_STATUS_INVARIANT_VIOLATION` naming the first violation in the message.
#[no_mangle]
pub extern "C" fn kvb_manager_check_invariants(manager: *mut kvb_manager_t) -> kvb_status_t {
    with_manager(manager, |m| Ok(m.check_invariants()?))
}

/// Advances the manual clock by `ms` (managers created with `manual_clock`).
#[no_mangle]
pub extern "C" fn kvb_manager_advance_time(manager: *mut kvb_manager_t, ms: i64) -> kvb_status_t {
    with_manager(manager, |m| {
        let ms = u64::try_from(ms).map_err(|_| invalid(format!("ms is negative ({ms})")))?;
        Ok(m.advance_time(ms)?)
    })
}

/// Address of a window's pool at `cache_level` (a `kvb_cache_level_t`) and the bytes of one row:
/// host memory with `KVB_COPY_BACKEND_HOST`; with `KVB_COPY_BACKEND_CUDA` the device address
/// (GPU memory for the primary level, the device-mapped pinned host pool for the secondary one),
/// usable by the engine's kernels. Row r starts at `*out_base + r * *out_row_bytes`; a block's
/// row is its `memory_index` (`kvb_manager_get_block_info`). `KVB_STATUS_UNSUPPORTED` where the
/// pool has no memory (no backend, an empty level, a pool not registered yet).
#[no_mangle]
pub extern "C" fn kvb_manager_get_pool_pointer(
    manager: *mut kvb_manager_t,
    window_size: i32,
    cache_level: i32,
    out_base: *mut *mut u8,
    out_row_bytes: *mut usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out_base, "out_base")?;
        require_out(out_row_bytes, "out_row_bytes")?;
        let level = level_arg(cache_level)?;
        let (p, row) = m.pool_pointer(window_arg(window_size)?, level)?;
        write_out(out_base, p, "out_base")?;
        write_out(out_row_bytes, row, "out_row_bytes")
    })
}

/// A snapshot of one block of a window.
#[no_mangle]
pub extern "C" fn kvb_manager_get_block_info(
    manager: *mut kvb_manager_t,
    window_size: i32,
    block_id: i32,
    out: *mut kvb_block_info_t,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        let b = u32::try_from(block_id)
            .map_err(|_| invalid(format!("block id {block_id} is negative")))?;
        write_out(
            out,
            m.block_info(window_arg(window_size)?, b)?.into(),
            "out",
        )
    })
}

/// Offloads a free primary block to the host tier (TensorRT-LLM `offloadBlock`).
/// `*out_offloaded` is false when there is no free host block or offloading is off. Fails with
/// `KVB_STATUS_INVALID_ARGUMENT` for an unknown window, an id out of range or a referenced
/// block, and `KVB_STATUS_COPY_FAILED` (rolled back) when the copy fails (`KVB_STATUS_CUDA`,
/// poisoned, for a failed CUDA launch).
#[no_mangle]
pub extern "C" fn kvb_manager_offload_block(
    manager: *mut kvb_manager_t,
    window_size: i32,
    block_id: i32,
    out_offloaded: *mut bool,
) -> kvb_status_t {
    with_manager_tx(manager, |m| {
        require_out(out_offloaded, "out_offloaded")?;
        let b = u32::try_from(block_id)
            .map_err(|_| invalid(format!("block id {block_id} is negative")))?;
        let done = m.offload_block(window_arg(window_size)?, b)?;
        write_out(out_offloaded, done, "out_offloaded")
    })
}

/// Retention priority of a block; 35 (the default) for an invalid id (TensorRT-LLM
/// `getPriorityByBlockId`).
#[no_mangle]
pub extern "C" fn kvb_manager_get_priority_by_block_id(
    manager: *mut kvb_manager_t,
    window_size: i32,
    block_id: i64,
    out: *mut i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        let p = m.priority_by_block_id(window_arg(window_size)?, block_id)?;
        write_out(out, i32::from(p), "out")
    })
}

/// Last block of beam 0 in the smallest window (TensorRT-LLM `getLastBlockId`).
#[no_mangle]
pub extern "C" fn kvb_manager_get_last_block_id(
    manager: *mut kvb_manager_t,
    request_id: u64,
    out: *mut i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        write_out(out, m.last_block_id(request_id)? as i32, "out")
    })
}

/// Tokens per block.
#[no_mangle]
pub extern "C" fn kvb_manager_get_tokens_per_block(
    manager: *mut kvb_manager_t,
    out: *mut i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        write_out(out, m.tokens_per_block() as i32, "out")
    })
}

/// Test hook for the panic guard: panics inside the library while holding the manager. The call
/// returns `KVB_STATUS_INTERNAL` and every later call on the handle `KVB_STATUS_POISONED`.
#[no_mangle]
pub extern "C" fn kvb_manager_debug_trigger_panic(manager: *mut kvb_manager_t) -> kvb_status_t {
    with_manager(manager, |_| panic!("kvb_manager_debug_trigger_panic"))
}
