//! C entry points of statistics: whole-manager counters, free-block counts and a sequence's
//! admission result.

use super::handle::{kvb_manager_t, require_out, window_arg, with_manager, write_out};
use super::status::kvb_status_t;
use super::types::{kvb_admission_t, kvb_kv_cache_stats_t};

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
