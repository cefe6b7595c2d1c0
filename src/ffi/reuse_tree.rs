//! C entry points of TensorRT-LLM's 2026 reuse-tree calls: prefix analysis in one walk (and the
//! estimates that take its result), lookups of a cached chain by its keys with optional pins,
//! storing given blocks under given keys, truncation, dropping the whole tree, and a sequence's committed hash chain.

use super::handle::{
    block_ids_arg, copy_out, count_arg, i32_result, invalid, kvb_manager_t, null_error,
    require_out, slice_arg, window_arg, with_manager, write_out, FfiResult,
};
use super::status::kvb_status_t;
use super::types::{kvb_request_state_t, kvb_request_t, request, request_state};

/// What one walk of a window's reuse tree along a prompt found (TensorRT-LLM
/// `PrefixReuseSummary`), from `kvb_manager_analyze_prefix_reuse`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvb_prefix_reuse_summary_t {
    /// Consecutive full prompt blocks found from the root that some sequence holds (what the
    /// scheduler's estimates discount).
    pub reusable_blocks_allocated: i32,
    /// Consecutive full prompt blocks found from the root (held or free).
    pub reusable_blocks_all: i32,
    /// Index of the first prompt block the tree does not supply (TensorRT-LLM
    /// `firstNewBlock`); -1 with reuse off or an empty prompt. Its tokens are
    /// `[index * tokens_per_block, min((index + 1) * tokens_per_block, input_length))`.
    pub first_new_block_index: i32,
}

/// Walks window `window_size`'s reuse tree once along `request`'s prompt (TensorRT-LLM
/// `analyzePrefixReuse`) and writes what it found to `*out`. The last prompt token is never
/// counted (admission always recomputes it). Changes nothing.
#[no_mangle]
pub extern "C" fn kvb_manager_analyze_prefix_reuse(
    manager: *mut kvb_manager_t,
    request: *const kvb_request_t,
    window_size: i32,
    out: *mut kvb_prefix_reuse_summary_t,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        let req = self::request(request)?.to_request();
        let r = m.analyze_prefix_reuse(&req, window_arg(window_size)?)?;
        let summary = kvb_prefix_reuse_summary_t {
            reusable_blocks_allocated: i32_result(r.reusable_allocated, "the reusable blocks")?,
            reusable_blocks_all: i32_result(r.reusable_all, "the reusable blocks")?,
            first_new_block_index: match r.first_new_block {
                Some(i) => i32_result(i, "the first new block")?,
                None => -1,
            },
        };
        write_out(out, summary, "out")
    })
}

/// The discount a summary carries.
fn summary_arg(summary: *const kvb_prefix_reuse_summary_t) -> FfiResult<usize> {
    // SAFETY: caller passes a valid pointer or null (checked).
    let s = unsafe { summary.as_ref() }.ok_or_else(|| null_error("summary"))?;
    count_arg(
        s.reusable_blocks_allocated,
        "summary.reusable_blocks_allocated",
    )
}

/// `kvb_manager_get_needed_blocks_one_step` with the prefix reuse of an earlier
/// `kvb_manager_analyze_prefix_reuse` of the same request (TensorRT-LLM's `cachedSummary`), so
/// the tree is not walked again. Same argument order: state, then what stands for the request's
/// prompt, then `two_steps_look_ahead`, then the window.
#[no_mangle]
pub extern "C" fn kvb_manager_get_needed_blocks_one_step_cached(
    manager: *mut kvb_manager_t,
    state: *const kvb_request_state_t,
    summary: *const kvb_prefix_reuse_summary_t,
    two_steps_look_ahead: bool,
    window_size: i32,
    out: *mut i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        let st = request_state(state)?;
        let reusable = summary_arg(summary)?;
        let n = m.needed_blocks_one_step_cached(
            &st,
            reusable,
            two_steps_look_ahead,
            window_arg(window_size)?,
        )?;
        write_out(out, i32_result(n, "the result")?, "out")
    })
}

/// `kvb_manager_get_remaining_blocks_to_completion` with the prefix reuse of an earlier
/// `kvb_manager_analyze_prefix_reuse` (TensorRT-LLM's `cachedSummary`).
#[no_mangle]
pub extern "C" fn kvb_manager_get_remaining_blocks_to_completion_cached(
    manager: *mut kvb_manager_t,
    state: *const kvb_request_state_t,
    summary: *const kvb_prefix_reuse_summary_t,
    window_size: i32,
    out: *mut i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        let st = request_state(state)?;
        let reusable = summary_arg(summary)?;
        let n = m.remaining_blocks_to_completion_cached(&st, reusable, window_arg(window_size)?)?;
        write_out(out, i32_result(n, "the result")?, "out")
    })
}

/// Looks up the cached chain whose block keys spell the first `num_tokens` tokens of `request`
/// (its tokens, extra ids, LoRA task, salt and multimodal items make the keys) in window
/// `window_size` (TensorRT-LLM `findBlocksInReuseTreeByBlockKey(s)`; `BlockRange::fromReuseTree`).
/// Writes the block ids, root first, to `out_ids` (`capacity` entries; `*out_count` = how
/// many); the chain stops at the first block the tree lacks. With `pin`, the chain is cut at
/// its first block not on the GPU tier and each of its blocks gets a pin, so a reader (a cache
/// transceiver thread) can copy them while the executor goes on; drop the pins with
/// `kvb_manager_unpin_blocks_by_id`. A chain longer than `capacity` fails with
/// `KVB_STATUS_BUFFER_TOO_SMALL` (`*out_count` = its length) and pins nothing.
#[no_mangle]
pub extern "C" fn kvb_manager_find_blocks_in_reuse_tree(
    manager: *mut kvb_manager_t,
    request: *const kvb_request_t,
    num_tokens: i32,
    window_size: i32,
    pin: bool,
    out_ids: *mut i32,
    capacity: usize,
    out_count: *mut usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out_count, "out_count")?;
        let req = self::request(request)?.to_request();
        let n = count_arg(num_tokens, "num_tokens")?;
        let window = window_arg(window_size)?;
        // Look first without pinning, so that a buffer too small changes nothing.
        let chain = m.find_blocks_in_reuse_tree(&req, n, window, false)?;
        if chain.len() > capacity {
            write_out(out_count, chain.len(), "out_count")?;
            return Err(crate::error::KvError::BufferTooSmall {
                needed: chain.len(),
                given: capacity,
            }
            .into());
        }
        if capacity > 0 {
            slice_arg(out_ids as *const i32, capacity, "out_ids")?;
        }
        let chain = if pin {
            m.find_blocks_in_reuse_tree(&req, n, window, true)?
        } else {
            chain
        };
        let ids: Vec<i32> = chain.iter().map(|&b| b as i32).collect();
        copy_out(&ids, out_ids, capacity, out_count)
    })
}

/// Stores blocks whose bytes the engine wrote some other way (a cache transceiver's receive)
/// under the keys of `request`'s first `num_tokens` tokens in window `window_size`
/// (TensorRT-LLM `BlockManager::storeBlocks`): `block_ids[i]` under tokens
/// `[i * tokens_per_block, min((i + 1) * tokens_per_block, num_tokens))` (its tokens, extra
/// ids, LoRA task, salt and multimodal items make the keys, a partial last block included).
/// While the tree already holds each key, the cached block is kept and the given one skipped;
/// from the first key it lacks, each given block joins the tree under the previous one (its
/// key replaces the tokens kvblock keeps for it: store a sequence's blocks under its own
/// tokens). The walk stops at a given block already in the tree at another place. With `pin`,
/// every block on the walked path (the cached one where a key matched) gets a pin, released by
/// `kvb_manager_unpin_blocks_by_id`, and their ids are written to `out_pinned_ids`
/// (`capacity` entries, which must be at least `num_ids`; `*out_num_pinned` = how many; pass
/// NULL and 0 without `pin`). `*out_num_stored` receives how many blocks joined the tree (one
/// Stored event names them). With reuse off nothing is stored. Fails, changing nothing, with
/// `KVB_STATUS_INVALID_ARGUMENT` for an unknown window, `num_tokens` beyond the request's
/// tokens, or an id out of range or on the host tier, and `KVB_STATUS_BUFFER_TOO_SMALL`
/// (`*out_num_pinned` = `num_ids`) for a pin buffer smaller than `num_ids`.
#[no_mangle]
pub extern "C" fn kvb_manager_store_blocks(
    manager: *mut kvb_manager_t,
    request: *const kvb_request_t,
    num_tokens: i32,
    window_size: i32,
    block_ids: *const i32,
    num_ids: usize,
    pin: bool,
    out_pinned_ids: *mut i32,
    capacity: usize,
    out_num_pinned: *mut usize,
    out_num_stored: *mut i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out_num_stored, "out_num_stored")?;
        require_out(out_num_pinned, "out_num_pinned")?;
        let req = self::request(request)?.to_request();
        let n = count_arg(num_tokens, "num_tokens")?;
        let window = window_arg(window_size)?;
        let ids = block_ids_arg(block_ids, num_ids, "block_ids")?;
        if pin && capacity < ids.len() {
            write_out(out_num_pinned, ids.len(), "out_num_pinned")?;
            return Err(crate::error::KvError::BufferTooSmall {
                needed: ids.len(),
                given: capacity,
            }
            .into());
        }
        if pin && capacity > 0 && out_pinned_ids.is_null() {
            return Err(null_error("out_pinned_ids"));
        }
        let (stored, pinned) = m.store_blocks_by_key(&req, n, window, &ids, pin)?;
        write_out(
            out_num_stored,
            i32_result(stored, "blocks stored")?,
            "out_num_stored",
        )?;
        let pinned: Vec<i32> = pinned.into_iter().map(|b| b as i32).collect();
        copy_out(&pinned, out_pinned_ids, capacity, out_num_pinned)
    })
}

/// Drops from every window's reuse tree the cached blocks of the token sequence `tokens`
/// (`num_tokens` plain tokens: no extra ids, LoRA, salt or multimodal keys) past its first
/// `num_tokens_to_keep` tokens, rounded up to whole blocks (TensorRT-LLM `truncateBlocks`).
/// Blocks sequences hold stay with them but are no longer reusable; cached free blocks become
/// plain free blocks; Removed events name them. `*out_removed` (may be null) receives how many
/// blocks left the trees.
#[no_mangle]
pub extern "C" fn kvb_manager_truncate_blocks(
    manager: *mut kvb_manager_t,
    tokens: *const i32,
    num_tokens: usize,
    num_tokens_to_keep: i32,
    out_removed: *mut usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        let tokens = slice_arg(tokens, num_tokens, "tokens")?;
        let keep = count_arg(num_tokens_to_keep, "num_tokens_to_keep")?;
        let removed = m.truncate_blocks(tokens, keep);
        if !out_removed.is_null() {
            write_out(out_removed, removed, "out_removed")?;
        }
        Ok(())
    })
}

/// Empties every window's reuse tree (TensorRT-LLM `resetReuseState`), e.g. after a weight
/// update: no later admission reuses KV computed before. Blocks sequences hold stay with them;
/// cached free blocks become plain free blocks; Removed events name every block that left.
/// `*out_removed` (may be null) receives how many did.
#[no_mangle]
pub extern "C" fn kvb_manager_reset_reuse_state(
    manager: *mut kvb_manager_t,
    out_removed: *mut usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        let removed = m.reset_reuse_state();
        if !out_removed.is_null() {
            write_out(out_removed, removed, "out_removed")?;
        }
        Ok(())
    })
}

/// Stores the full blocks of a sequence's computed tokens (its history) in the reuse trees and
/// writes their block hashes (TensorRT-LLM's V1 hash, as in Stored events), first block first,
/// to `out_hashes` (`capacity` entries; `*out_count` = how many) (TensorRT-LLM
/// `commitAndGetBlockHashesForRequest`, for a KV connector). The chain is the same in every
/// window; `window_size` must be one of the manager's. Empty with beam search, and with reuse
/// off (nothing is committed, and kvblock keeps no tokens to hash then). Too small a
/// buffer fails with `KVB_STATUS_BUFFER_TOO_SMALL` (`*out_count` = the needed size) and
/// stores nothing.
#[no_mangle]
pub extern "C" fn kvb_manager_commit_block_hashes(
    manager: *mut kvb_manager_t,
    request_id: u64,
    window_size: i32,
    out_hashes: *mut u64,
    capacity: usize,
    out_count: *mut usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out_count, "out_count")?;
        if capacity > 0 && out_hashes.is_null() {
            return Err(invalid("out_hashes is null with a nonzero capacity".into()));
        }
        let window = window_arg(window_size)?;
        let needed = m.num_committable_blocks(request_id)?;
        if needed > capacity {
            write_out(out_count, needed, "out_count")?;
            return Err(crate::error::KvError::BufferTooSmall {
                needed,
                given: capacity,
            }
            .into());
        }
        let hashes = m.commit_block_hashes(request_id, window)?;
        copy_out(&hashes, out_hashes, capacity, out_count)
    })
}
