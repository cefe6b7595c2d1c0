//! C entry point that carries sequences' recurrent state into their next block (hybrid models).

use super::handle::{count_arg, kvb_manager_t, require_out, slice_arg, with_manager_tx, write_out};
use super::status::kvb_status_t;

/// Carries the recurrent state (Mamba, linear attention) of each listed sequence into its next
/// block at a block boundary (TensorRT-LLM `copyLinearAttentionBlock` and
/// `copyLinearAttentionBlockBatch`). `positions[i]` is how many tokens of `request_ids[i]` the
/// engine has processed: when it is a positive multiple of `tokens_per_block`, in every window
/// with `KVB_CACHE_TYPE_RECURRENT_STATE` pools, the state rows of the block ending there (the
/// snapshot after its last token, kept for reuse) are copied into the rows of the block starting
/// there, where the engine goes on updating the state; the attention pools are not touched.
/// Otherwise, or when the sequence holds no block starting there, nothing is copied for it.
/// A destination in the reuse tree (another sequence's content) is never written. The copies of
/// the whole list go out in one submission per window, on the copy backend's stream, before
/// the engine's next work on it (`kvb_manager_refresh_blocks` waits for them, as for any copy).
/// `*out_num_copies` receives the block copies made (beams sharing both blocks copy once).
/// Unlike TensorRT-LLM, which copies only at prompt positions, a decode position copies too:
/// kvblock stores decode blocks for reuse, and each needs its snapshot. Fails with
/// `KVB_STATUS_INVALID_ARGUMENT` for an unknown request id or a negative position (nothing
/// copied), and `KVB_STATUS_COPY_FAILED` (rolled back) when the copy fails.
#[no_mangle]
pub extern "C" fn kvb_manager_copy_recurrent_state(
    manager: *mut kvb_manager_t,
    request_ids: *const u64,
    positions: *const i32,
    num_requests: usize,
    out_num_copies: *mut usize,
) -> kvb_status_t {
    with_manager_tx(manager, |m| {
        require_out(out_num_copies, "out_num_copies")?;
        let ids = slice_arg(request_ids, num_requests, "request_ids")?;
        let positions = slice_arg(positions, num_requests, "positions")?;
        let requests = ids
            .iter()
            .zip(positions)
            .map(|(&id, &p)| count_arg(p, "position").map(|p| (id, p)))
            .collect::<Result<Vec<_>, _>>()?;
        let n = m.copy_recurrent_state(&requests)?;
        write_out(out_num_copies, n, "out_num_copies")
    })
}
