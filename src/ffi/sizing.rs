//! C entry points of the static sizing helpers (TensorRT-LLM `KVCacheManager`'s
//! `calculateMaxNumBlocks`, `calculateMaxAttentionWindow` and their helpers, and
//! `calculateFreeMemBytes`).

use super::handle::{
    count_arg, guard, i32_result, positive_arg, require_out, slice_arg, slice_arg_mut, write_out,
    FfiResult,
};
use super::status::kvb_status_t;
use crate::error::KvError;
use crate::sizing;

/// Blocks one beam needs for `sequence_length` tokens under `window_size`
/// (TensorRT-LLM `calculateMaxBlockRequirementsPerBeam`, no sink tokens).
/// `KVB_STATUS_INVALID_ARGUMENT` for a negative or zero size, or a result beyond `INT32_MAX`.
#[no_mangle]
pub extern "C" fn kvb_calculate_max_block_requirements_per_beam(
    sequence_length: i32,
    window_size: i32,
    tokens_per_block: i32,
    out: *mut i32,
) -> kvb_status_t {
    guard(|| {
        require_out(out, "out")?;
        let n = sizing::max_block_requirements_per_beam(
            count_arg(sequence_length, "sequence_length")?,
            positive_arg(window_size, "window_size")?,
            positive_arg(tokens_per_block, "tokens_per_block")?,
        );
        write_out(out, i32_result(n, "the result")?, "out")
    })
}

/// Blocks a request of `input_length + output_length` tokens with `beam_width` beams needs
/// (TensorRT-LLM `calculateMaxBlockRequirements`).
/// `KVB_STATUS_INVALID_ARGUMENT` for a negative or zero size, or a result beyond `INT32_MAX`.
#[no_mangle]
pub extern "C" fn kvb_calculate_max_block_requirements(
    input_length: i32,
    output_length: i32,
    window_size: i32,
    beam_width: i32,
    tokens_per_block: i32,
    out: *mut i32,
) -> kvb_status_t {
    guard(|| {
        require_out(out, "out")?;
        let n = sizing::max_block_requirements(
            count_arg(input_length, "input_length")?,
            count_arg(output_length, "output_length")?,
            positive_arg(window_size, "window_size")?,
            positive_arg(beam_width, "beam_width")?,
            positive_arg(tokens_per_block, "tokens_per_block")?,
        );
        write_out(out, i32_result(n, "the result")?, "out")
    })
}

/// The largest attention window that `capacity_blocks` allow for one request
/// (TensorRT-LLM `calculateMaxAttentionWindow`).
/// `KVB_STATUS_INVALID_ARGUMENT` for a negative or zero size, or a result beyond `INT32_MAX`.
#[no_mangle]
pub extern "C" fn kvb_calculate_max_attention_window(
    input_length: i32,
    output_length: i32,
    capacity_blocks: i32,
    beam_width: i32,
    tokens_per_block: i32,
    out: *mut i32,
) -> kvb_status_t {
    guard(|| {
        require_out(out, "out")?;
        let n = sizing::max_attention_window(
            count_arg(input_length, "input_length")?,
            count_arg(output_length, "output_length")?,
            count_arg(capacity_blocks, "capacity_blocks")?,
            positive_arg(beam_width, "beam_width")?,
            positive_arg(tokens_per_block, "tokens_per_block")?,
        );
        write_out(out, i32_result(n, "the result")?, "out")
    })
}

/// Memory share of each window, proportional to `window × cache bytes per token`
/// (TensorRT-LLM `calculateWindowSizeToShare`); writes `count` doubles to `out_shares`.
#[no_mangle]
pub extern "C" fn kvb_calculate_window_size_to_share(
    window_sizes: *const i32,
    cache_size_per_token: *const i32,
    count: usize,
    out_shares: *mut f64,
) -> kvb_status_t {
    guard(|| {
        if count == 0 {
            return Err(super::handle::invalid("count must be positive".into()));
        }
        let w = slice_arg(window_sizes, count, "window_sizes")?;
        let c = slice_arg(cache_size_per_token, count, "cache_size_per_token")?;
        let out = slice_arg_mut(out_shares, count, "out_shares")?;
        let w = w
            .iter()
            .map(|&v| positive_arg(v, "window size"))
            .collect::<FfiResult<Vec<_>>>()?;
        let c = c
            .iter()
            .map(|&v| positive_arg(v, "cache size per token"))
            .collect::<FfiResult<Vec<_>>>()?;
        out.copy_from_slice(&sizing::window_size_to_share(&w, &c));
        Ok(())
    })
}

/// Blocks per window that memory budgets allow (TensorRT-LLM `calculateMaxNumBlocks` on one
/// rank). `bytes_per_token[w]` is the KV bytes one token takes in window w (all its layers, K and
/// V); `shares` (null = equal) splits both budgets between windows (normalised); `max_tokens`
/// (-1 = none) caps a single window's primary tokens. Writes `count` entries to
/// `out_primary_blocks` and `out_secondary_blocks`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn kvb_calculate_max_num_blocks(
    bytes_per_token: *const u64,
    shares: *const f64,
    count: usize,
    primary_bytes: u64,
    secondary_bytes: u64,
    extra_cost_bytes: u64,
    max_tokens: i64,
    tokens_per_block: i32,
    out_primary_blocks: *mut u64,
    out_secondary_blocks: *mut u64,
) -> kvb_status_t {
    guard(|| {
        if count == 0 {
            return Err(super::handle::invalid("count must be positive".into()));
        }
        let per_token = slice_arg(bytes_per_token, count, "bytes_per_token")?;
        if per_token.contains(&0) {
            return Err(super::handle::invalid(
                "bytes_per_token must be positive".into(),
            ));
        }
        let shares = if shares.is_null() {
            None
        } else {
            let s = slice_arg(shares, count, "shares")?;
            if s.iter().any(|&x| !(x.is_finite() && x > 0.0)) {
                return Err(super::handle::invalid(
                    "shares must be positive and finite".into(),
                ));
            }
            if !s.iter().sum::<f64>().is_finite() {
                return Err(super::handle::invalid(
                    "shares overflow when summed (scale them down: only their proportions count)"
                        .into(),
                ));
            }
            Some(s)
        };
        let max_tokens = match max_tokens {
            -1 => None,
            t if t >= 0 => Some(t as u64),
            t => {
                return Err(super::handle::invalid(format!(
                    "max_tokens {t} is negative (use -1 for none)"
                )))
            }
        };
        let tpb = positive_arg(tokens_per_block, "tokens_per_block")?;
        let primary = slice_arg_mut(out_primary_blocks, count, "out_primary_blocks")?;
        let secondary = slice_arg_mut(out_secondary_blocks, count, "out_secondary_blocks")?;
        let blocks = sizing::max_num_blocks(
            per_token,
            shares,
            primary_bytes,
            secondary_bytes,
            extra_cost_bytes,
            max_tokens,
            tpb,
        );
        for (w, (p, s)) in blocks.into_iter().enumerate() {
            primary[w] = p;
            secondary[w] = s;
        }
        Ok(())
    })
}

/// The size policy of an automatic host tier (`kvb_window_config_t::auto_host_tier`) on given
/// figures: `min(gpu_quota_blocks, 50% of available_host_bytes / row_bytes, 80% of
/// memlock_limit_bytes / row_bytes)`, rounded down. A figure of 0 is unknown and caps nothing;
/// pass `UINT64_MAX` for an unlimited one (RLIM_INFINITY). A `row_bytes` of 0 leaves the quota,
/// and caps that round down to 0 blocks fall back to the quota. `KVB_STATUS_INVALID_ARGUMENT`
/// for a negative quota.
#[no_mangle]
pub extern "C" fn kvb_calculate_auto_host_tier_blocks(
    gpu_quota_blocks: i64,
    available_host_bytes: u64,
    memlock_limit_bytes: u64,
    row_bytes: u64,
    out_blocks: *mut i64,
) -> kvb_status_t {
    guard(|| {
        require_out(out_blocks, "out_blocks")?;
        let quota = usize::try_from(gpu_quota_blocks).map_err(|_| {
            super::handle::invalid(format!("gpu_quota_blocks {gpu_quota_blocks} is negative"))
        })?;
        let blocks = sizing::auto_host_tier_blocks(
            quota,
            available_host_bytes,
            memlock_limit_bytes,
            row_bytes,
        );
        write_out(out_blocks, blocks as i64, "out_blocks")
    })
}

/// The memory budgets of a KV cache on CUDA device `cuda_device` (TensorRT-LLM
/// `calculateFreeMemBytes`): `*out_primary_bytes` = (the device's free bytes after its work
/// finishes + `memory_pool_free_bytes`) × `free_gpu_memory_fraction`, `*out_secondary_bytes`
/// = `host_cache_bytes`; feed them to `kvb_calculate_max_num_blocks`. `memory_pool_free_bytes`
/// is what the engine's stream-ordered memory pool holds free (TensorRT-LLM adds
/// `BufferManager::memoryPoolFree()`; 0 without one). Waits for the device's queued work
/// (`cuCtxSynchronize` in its primary context) so that memory it frees counts. Fails with
/// `KVB_STATUS_INVALID_ARGUMENT` for a negative device, a fraction outside (0, 1) or free
/// figures beyond the device's memory, `KVB_STATUS_UNSUPPORTED` where no CUDA driver or device
/// is usable (a message says which), and `KVB_STATUS_CUDA` for a failed driver call.
#[no_mangle]
pub extern "C" fn kvb_calculate_free_mem_bytes(
    cuda_device: i32,
    free_gpu_memory_fraction: f64,
    memory_pool_free_bytes: u64,
    host_cache_bytes: u64,
    out_primary_bytes: *mut u64,
    out_secondary_bytes: *mut u64,
) -> kvb_status_t {
    guard(|| {
        require_out(out_primary_bytes, "out_primary_bytes")?;
        require_out(out_secondary_bytes, "out_secondary_bytes")?;
        // Arguments first: a bad one is reported the same with or without a GPU.
        if cuda_device < 0 {
            return Err(super::handle::invalid(format!(
                "cuda_device {cuda_device} is negative"
            )));
        }
        sizing::check_free_gpu_memory_fraction(free_gpu_memory_fraction)?;
        let (free, total) = crate::cuda::memory_info(cuda_device).map_err(KvError::from)?;
        let (primary, secondary) = sizing::free_mem_bytes(
            free,
            total,
            memory_pool_free_bytes,
            free_gpu_memory_fraction,
            host_cache_bytes,
        )?;
        write_out(out_primary_bytes, primary, "out_primary_bytes")?;
        write_out(out_secondary_bytes, secondary, "out_secondary_bytes")
    })
}

/// Sizing of a window's disk tier: `out_slot_bytes` gets the bytes one block takes on disk (its
/// row of `row_bytes`, every pool of the window, behind a header holding its key and checksums,
/// aligned to 4 KiB) and `out_blocks` the blocks `disk_bytes` holds: what a manager whose
/// `kvb_disk_tier_config_t::bytes_per_window` is `disk_bytes` gets (`kvb_disk_stats_t::slots`).
/// `KVB_STATUS_INVALID_ARGUMENT` for `tokens_per_block` not positive; `KVB_STATUS_NULL_POINTER`
/// for a null output.
#[no_mangle]
pub extern "C" fn kvb_calculate_disk_tier_blocks(
    tokens_per_block: i32,
    row_bytes: u64,
    disk_bytes: u64,
    out_blocks: *mut i64,
    out_slot_bytes: *mut u64,
) -> kvb_status_t {
    guard(|| {
        require_out(out_blocks, "out_blocks")?;
        require_out(out_slot_bytes, "out_slot_bytes")?;
        let tpb = positive_arg(tokens_per_block, "tokens_per_block")?;
        let (blocks, slot) = sizing::disk_tier_blocks(tpb, row_bytes, disk_bytes);
        write_out(out_slot_bytes, slot, "out_slot_bytes")?;
        write_out(out_blocks, blocks as i64, "out_blocks")
    })
}
