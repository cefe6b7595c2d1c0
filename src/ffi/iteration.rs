//! C entry points of once-per-iteration work: expiring timed retentions and syncing copies, and
//! the explicit offload and onboard of a free block.

use super::handle::{
    block_id_arg, kvb_manager_t, require_out, window_arg, with_manager_tx, write_out,
};
use super::status::kvb_status_t;

/// Expires timed retentions and syncs outstanding copies; call once per iteration
/// (TensorRT-LLM `refreshBlocks`). It also marks the step: the tokens a sequence gets between
/// two calls are one step (its token and any drafts), and a sliding window keeps every block
/// the step's first token attends, whatever `max_draft_tokens` says. Before the first call,
/// every token is a step of its own. Fails only with the copy backend's errors
/// (`KVB_STATUS_COPY_FAILED` rolled back; `KVB_STATUS_CUDA`, poisoned).
#[no_mangle]
pub extern "C" fn kvb_manager_refresh_blocks(manager: *mut kvb_manager_t) -> kvb_status_t {
    with_manager_tx(manager, |m| {
        m.refresh_blocks();
        Ok(())
    })
}

/// Offloads a primary block to the host tier (TensorRT-LLM `offloadBlock`). A free block moves
/// with its place in the reuse tree. A block sequences hold moves too, as TensorRT-LLM's does
/// (its row is swapped with a free host block's, whose GPU row becomes free): the sequences
/// keep it, `kvb_manager_copy_block_offsets` refuses their offsets
/// (`KVB_STATUS_INVALID_ARGUMENT`) and storing them stops before it until
/// `kvb_manager_onboard_block` brings it back. `*out_offloaded` is false when there is no free
/// host block, offloading is off or the block is on the host tier already. Fails with
/// `KVB_STATUS_INVALID_ARGUMENT` for an unknown window, an id out of range or a pinned block (a
/// pin promises a reader its GPU row), and `KVB_STATUS_COPY_FAILED` (rolled back) when the copy fails (`KVB_STATUS_CUDA`,
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
        let b = block_id_arg(block_id)?;
        let done = m.offload_block(window_arg(window_size)?, b)?;
        write_out(out_offloaded, done, "out_offloaded")
    })
}

/// Sets the retention priority of one block (TensorRT-LLM `KVCacheBlock::setPriority`), 0..=100:
/// a sequence's block is queued at it when released; a free block is queued again at it now, at
/// the back of that priority's queue, keeping its expiry. A cached block's change is reported as
/// an Updated event. Fails with `KVB_STATUS_INVALID_ARGUMENT` for an unknown window or an id out
/// of range and `KVB_STATUS_INVALID_RETENTION` for a priority outside 0..=100, changing nothing.
#[no_mangle]
pub extern "C" fn kvb_manager_set_block_priority(
    manager: *mut kvb_manager_t,
    window_size: i32,
    block_id: i32,
    priority: i32,
) -> kvb_status_t {
    with_manager_tx(manager, |m| {
        let b = block_id_arg(block_id)?;
        m.set_block_priority(window_arg(window_size)?, b, priority)?;
        Ok(())
    })
}

/// Brings a host block back to the GPU tier now (TensorRT-LLM `onboardBlock`), so that a
/// transfer or a later admission finds it on the GPU: its bytes move into the next free GPU
/// block's row (evicting, and offloading, as an allocation does); a free cached block keeps its
/// place in the reuse tree, its priority and its expiry, and a held block that
/// `kvb_manager_offload_block` moved stays its sequences'. `*out_onboarded` is false when it does
/// not move: already on the GPU, a free block with nothing cached, no host tier, or no free GPU
/// block. Fails with `KVB_STATUS_INVALID_ARGUMENT` for an unknown window, an id out of range or
/// a suspended sequence's block that its suspension moved (it comes back with
/// `kvb_manager_resume`), and
/// `KVB_STATUS_COPY_FAILED` (rolled back) when the copy fails (`KVB_STATUS_CUDA`, poisoned, for
/// a failed CUDA launch).
#[no_mangle]
pub extern "C" fn kvb_manager_onboard_block(
    manager: *mut kvb_manager_t,
    window_size: i32,
    block_id: i32,
    out_onboarded: *mut bool,
) -> kvb_status_t {
    with_manager_tx(manager, |m| {
        require_out(out_onboarded, "out_onboarded")?;
        let b = block_id_arg(block_id)?;
        let done = m.onboard_block(window_arg(window_size)?, b)?;
        write_out(out_onboarded, done, "out_onboarded")
    })
}
