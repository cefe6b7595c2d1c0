//! C entry points of the scheduler capacity lifecycle: lengths, resize, generation and context
//! allocations with their reverts, padding extension, suspend / resume, GPU utilization and
//! stall detection.

use super::handle::{kvb_manager_t, require_out, with_manager, with_manager_tx, write_out};
use super::status::kvb_status_t;
use crate::manager::{ContextRevert, SchedulingPass, SequenceLengths};

/// A sequence's lengths in tokens: `reused ≤ committed ≤ history ≤ capacity`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvb_sequence_lengths_t {
    /// Token ids known: prompt plus generated tokens.
    pub num_tokens: usize,
    /// Tokens with KV slots (blocks). Equal to `num_tokens` in V1 use; larger after a
    /// generation allocation or padding extension, smaller after a reverted context
    /// allocation (the tokens past it are kept and get blocks when it grows again).
    pub capacity: usize,
    /// Tokens whose KV is computed: the reused prompt at admission, then each stored context
    /// chunk, `num_tokens - 1` once generating, or what `kvb_manager_advance_history` says.
    pub history: usize,
    /// Tokens reusable through this sequence: reused at admission or stored since.
    pub committed: usize,
    /// Prompt tokens reused at admission (`prepopulated_prompt_len`).
    pub reused: usize,
    /// The sequence is suspended (`kvb_manager_suspend`).
    pub suspended: bool,
}

impl From<SequenceLengths> for kvb_sequence_lengths_t {
    fn from(l: SequenceLengths) -> Self {
        kvb_sequence_lengths_t {
            num_tokens: l.num_tokens,
            capacity: l.capacity,
            history: l.history,
            committed: l.committed,
            reused: l.reused,
            suspended: l.suspended,
        }
    }
}

/// What `kvb_manager_revert_allocate_context` did.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvb_context_revert_t {
    /// No context allocation had grown the capacity: nothing changed.
    KVB_CONTEXT_REVERT_NOTHING = 0,
    /// The capacity is back to what it was before the allocation and the sequence is
    /// suspended: resume it and allocate its context again to continue.
    KVB_CONTEXT_REVERT_SUSPENDED = 1,
    /// Prefill had already computed past the old capacity, so the sequence could not shrink:
    /// its computed blocks were stored for reuse and it was released. Admit the request again
    /// (it restarts prefill, reusing what was stored).
    KVB_CONTEXT_REVERT_RELEASED = 2,
}

impl From<ContextRevert> for kvb_context_revert_t {
    fn from(r: ContextRevert) -> Self {
        match r {
            ContextRevert::NothingToRevert => kvb_context_revert_t::KVB_CONTEXT_REVERT_NOTHING,
            ContextRevert::ShrunkAndSuspended => kvb_context_revert_t::KVB_CONTEXT_REVERT_SUSPENDED,
            ContextRevert::Released => kvb_context_revert_t::KVB_CONTEXT_REVERT_RELEASED,
        }
    }
}

/// Runs a capacity operation that answers yes or no into `out`.
fn answer(
    manager: *mut kvb_manager_t,
    out: *mut bool,
    f: impl FnOnce(&mut crate::manager::KvCacheManager) -> crate::error::KvResult<bool>,
) -> kvb_status_t {
    with_manager_tx(manager, |m| {
        require_out(out, "out")?;
        let done = f(m)?;
        write_out(out, done, "out")
    })
}

/// Writes a sequence's lengths (see `kvb_sequence_lengths_t`) into `*out`.
#[no_mangle]
pub extern "C" fn kvb_manager_get_sequence_lengths(
    manager: *mut kvb_manager_t,
    request_id: u64,
    out: *mut kvb_sequence_lengths_t,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        write_out(out, m.sequence_lengths(request_id)?.into(), "out")
    })
}

/// Resizes a live sequence to `capacity` tokens in every window (beam width 1). Growing
/// allocates blocks, moving suspended sequences' blocks to the host tier where the GPU pool
/// needs room; when the blocks cannot be had, `*out_resized` is false and nothing changed.
/// Shrinking gives the surplus blocks back; it never drops computed, committed or reused
/// tokens and fails with `KVB_STATUS_INVALID_ARGUMENT` (nothing changed) if asked to. Known
/// tokens past a smaller capacity are kept and written back, the same tokens into the same
/// slots, when it grows again, so a shrink never needs a free block (a shared last block is
/// kept, not copied) and never fails with `KVB_STATUS_OUT_OF_BLOCKS`. Forgets the
/// recorded generation and context allocations (their reverts become no-ops). Fails with
/// `KVB_STATUS_SEQUENCE_SUSPENDED` for a suspended sequence, `KVB_STATUS_SEQUENCE_TOO_LONG`
/// beyond `max_sequence_length + num_extra_kv_tokens + max_draft_tokens` of the config,
/// `KVB_STATUS_UNSUPPORTED` with beam search.
#[no_mangle]
pub extern "C" fn kvb_manager_resize(
    manager: *mut kvb_manager_t,
    request_id: u64,
    capacity: usize,
    out_resized: *mut bool,
) -> kvb_status_t {
    answer(manager, out_resized, |m| m.resize(request_id, capacity))
}

/// Reserves one more KV slot for a sequence without its token id (TensorRT-LLM's
/// `addToken(requestId)`, which takes the token from the request later): in every sliding
/// window, first detaches the front blocks that lie wholly before the window of the new last
/// slot (the token the engine computes next; TensorRT-LLM's rule, on slots instead of known
/// tokens), so their references are dropped and
/// `kvb_manager_get_num_front_blocks_removed` counts them; then grows the capacity by one
/// (`kvb_manager_resize`), allocating a block at a block boundary. The token id goes into the
/// reserved slot later (`kvb_manager_add_token`). A block detached before all its tokens were
/// known never gets them in its slots: the sequence then stores nothing more in that window
/// (no key is cut from unknown tokens). With beam search a block boundary takes a new block for
/// every beam (beams keep their front blocks, as with known tokens). `*out_added` is false, with
/// nothing changed, when the new slot's blocks cannot be had even with the detached blocks
/// freed. Fails with `KVB_STATUS_SEQUENCE_SUSPENDED` for a suspended sequence,
/// `KVB_STATUS_SEQUENCE_TOO_LONG` beyond `max_sequence_length + num_extra_kv_tokens +
/// max_draft_tokens` of the config.
#[no_mangle]
pub extern "C" fn kvb_manager_add_slot(
    manager: *mut kvb_manager_t,
    request_id: u64,
    out_added: *mut bool,
) -> kvb_status_t {
    answer(manager, out_added, |m| m.add_slot(request_id))
}

/// Reserves KV slots for a generation step: capacity for `1 + num_draft_tokens` tokens past
/// the known ones (capped at `max_sequence_length + num_extra_kv_tokens + max_draft_tokens`
/// of the config, the capacity whose blocks still fit the offset table), so that the step's
/// `kvb_manager_add_token` calls cannot run out of blocks. `*out_allocated` is false, with
/// nothing changed, when the blocks cannot be had (suspend a victim and retry). Records the
/// capacity before it for `kvb_manager_revert_allocate_generation`. Fails with
/// `KVB_STATUS_SEQUENCE_SUSPENDED` for a suspended sequence (resume it first),
/// `KVB_STATUS_SEQUENCE_TOO_LONG` when `num_tokens + 1 + num_draft_tokens` overflows `size_t`,
/// `KVB_STATUS_INVALID_ARGUMENT` when the capacity does not cover the known tokens yet.
#[no_mangle]
pub extern "C" fn kvb_manager_allocate_generation(
    manager: *mut kvb_manager_t,
    request_id: u64,
    num_draft_tokens: usize,
    out_allocated: *mut bool,
) -> kvb_status_t {
    answer(manager, out_allocated, |m| {
        m.allocate_generation(request_id, num_draft_tokens)
    })
}

/// Undoes the last `kvb_manager_allocate_generation` of a sequence (with its padding
/// extensions), using what was recorded at allocation, not the current draft length: the
/// capacity returns to its value before. `*out_reverted` is false, with nothing changed, when
/// there is none to undo: the step's first `kvb_manager_add_token` consumes the allocation, and
/// a resize or rewind forgets it. The blocks it took leave `alloc_total_blocks` and
/// `alloc_new_blocks` (only committed allocations are counted). Never needs a free block: it
/// does not fail with `KVB_STATUS_OUT_OF_BLOCKS`.
#[no_mangle]
pub extern "C" fn kvb_manager_revert_allocate_generation(
    manager: *mut kvb_manager_t,
    request_id: u64,
    out_reverted: *mut bool,
) -> kvb_status_t {
    answer(manager, out_reverted, |m| {
        m.revert_allocate_generation(request_id)
    })
}

/// Extends a sequence's capacity by `num_tokens` padding tokens: a CUDA graph that pads a
/// step's draft tokens to a fixed count needs KV slots for the padded length, so that the
/// rewind after verification matches. The padding counts as draft tokens of the recorded
/// generation allocation (its revert undoes both). `*out_extended` is false, with nothing
/// changed, when the blocks cannot be had. `KVB_STATUS_SEQUENCE_TOO_LONG` past
/// `max_sequence_length + num_extra_kv_tokens + max_draft_tokens`, or when the sum overflows.
#[no_mangle]
pub extern "C" fn kvb_manager_extend_capacity_for_tokens(
    manager: *mut kvb_manager_t,
    request_id: u64,
    num_tokens: usize,
    out_extended: *mut bool,
) -> kvb_status_t {
    answer(manager, out_extended, |m| {
        m.extend_capacity_for_tokens(request_id, num_tokens)
    })
}

/// The context allocation of a chunked prefill: grows the capacity to the history plus
/// `num_tokens` (never shrinks it). `kvb_manager_add_sequence` is the first one (from the
/// reused tokens to the whole prompt); this one serves the chunks after a reverted allocation.
/// Each call starts a scheduling iteration: it forgets the previous iteration's record
/// (admission's included) and records the capacity before only when it grew, so that a
/// request whose allocation did not grow has nothing to revert (seed 001).
/// `*out_allocated` is false when the blocks cannot be had (the capacity is unchanged, the
/// stale record forgotten). `KVB_STATUS_SEQUENCE_TOO_LONG` past `max_sequence_length +
/// num_extra_kv_tokens + max_draft_tokens`, or when `history + num_tokens` overflows.
#[no_mangle]
pub extern "C" fn kvb_manager_allocate_context(
    manager: *mut kvb_manager_t,
    request_id: u64,
    num_tokens: usize,
    out_allocated: *mut bool,
) -> kvb_status_t {
    answer(manager, out_allocated, |m| {
        m.allocate_context(request_id, num_tokens)
    })
}

/// Undoes the last context allocation of a request whose prefill the scheduler deferred (delay
/// batching), so its fresh blocks do not sit idle. `*out_outcome` says what happened:
/// `KVB_CONTEXT_REVERT_NOTHING` (no allocation grew the capacity this iteration, it was already
/// reverted — a second revert reports this, suspended or not — or prefill is over and the
/// sequence is generating: nothing changed); shrunk back and suspended (never needing a free
/// block; the allocation's blocks leave the statistics); or released, because prefill had
/// already computed past the old capacity: then the computed blocks (the history) were stored
/// for reuse, the sequence is gone, and the caller restarts prefill by admitting the request
/// again. `KVB_STATUS_SEQUENCE_SUSPENDED` only for a suspended sequence that still has a
/// record to undo.
#[no_mangle]
pub extern "C" fn kvb_manager_revert_allocate_context(
    manager: *mut kvb_manager_t,
    request_id: u64,
    out_outcome: *mut kvb_context_revert_t,
) -> kvb_status_t {
    with_manager_tx(manager, |m| {
        require_out(out_outcome, "out_outcome")?;
        let outcome = m.revert_allocate_context(request_id)?;
        write_out(out_outcome, outcome.into(), "out_outcome")
    })
}

/// Advances a sequence's history (tokens whose KV is computed) for engines that compute
/// without storing: it never decreases (a smaller value changes nothing) and fails with
/// `KVB_STATUS_INVALID_ARGUMENT` beyond the capacity or the known tokens.
#[no_mangle]
pub extern "C" fn kvb_manager_advance_history(
    manager: *mut kvb_manager_t,
    request_id: u64,
    history: usize,
) -> kvb_status_t {
    with_manager(manager, |m| Ok(m.advance_history(request_id, history)?))
}

/// Suspends an active sequence to free GPU memory: every block it holds becomes movable to the
/// host tier but never droppable. No data moves now; blocks move lazily, when an allocation
/// needs their GPU rows. Until `kvb_manager_resume`, the sequence takes no tokens and has no
/// offsets (`KVB_STATUS_SEQUENCE_SUSPENDED`); it can be removed. Fails with
/// `KVB_STATUS_SEQUENCE_SUSPENDED` when it already is.
#[no_mangle]
pub extern "C" fn kvb_manager_suspend(
    manager: *mut kvb_manager_t,
    request_id: u64,
) -> kvb_status_t {
    with_manager(manager, |m| Ok(m.suspend(request_id)?))
}

/// Resumes a suspended sequence: all its blocks come back to the GPU (copied from the host tier
/// where they moved; their bytes are the bytes they had), or none. `*out_resumed` is false, with
/// no side effects, when the GPU utilization (`kvb_manager_get_gpu_utilization`) is above the
/// config's `max_utilization_for_resume` or the blocks cannot all come back. Fails with
/// `KVB_STATUS_INVALID_ARGUMENT` when the sequence is not suspended.
#[no_mangle]
pub extern "C" fn kvb_manager_resume(
    manager: *mut kvb_manager_t,
    request_id: u64,
    out_resumed: *mut bool,
) -> kvb_status_t {
    answer(manager, out_resumed, |m| m.resume(request_id))
}

/// The GPU utilization `kvb_manager_resume` is gated on, in [0, 1]: the maximum over windows of
/// (total − free − movable) / total primary blocks, movable counting suspended sequences'
/// blocks that could move to the host tier.
#[no_mangle]
pub extern "C" fn kvb_manager_get_gpu_utilization(
    manager: *mut kvb_manager_t,
    out: *mut f64,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        write_out(out, m.gpu_utilization(), "out")
    })
}

/// Ends a scheduling pass: `num_generation_requests` generation requests wanted to run and
/// `num_scheduled` requests were scheduled. A pass with generation requests in which nothing
/// was scheduled and no block moved between the GPU and the host tier is stalled (a suspension
/// counts once its blocks move: without a host tier it frees nothing); after the config's
/// `stall_pass_threshold` stalled passes in a row this returns `KVB_STATUS_STALLED` (and keeps
/// doing so until a pass makes progress), with a message naming the cause (no host tier, host
/// tier too small, a request larger than the pool) and the remedy.
#[no_mangle]
pub extern "C" fn kvb_manager_end_scheduling_pass(
    manager: *mut kvb_manager_t,
    num_generation_requests: usize,
    num_scheduled: usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        Ok(m.end_scheduling_pass(SchedulingPass {
            num_generation_requests,
            num_scheduled,
        })?)
    })
}
