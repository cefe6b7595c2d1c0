//! C entry points of the data path: whether CUDA is available, stream changes, transfer
//! synchronization, pools registered by the engine, pool addresses and copy counts.

use std::ffi::c_void;

use super::handle::{
    guard, kvb_manager_t, positive_arg, require_out, window_arg, with_manager, write_out,
};
use super::status::kvb_status_t;
use super::types::level_arg;
use crate::cuda::{driver_library_supported, nvrtc_library_present};

/// Writes whether this process can create `KVB_COPY_BACKEND_CUDA` managers as far as the
/// libraries go: a CUDA driver library of CUDA 12.4 (12040) or newer and NVRTC (for the copy
/// kernel) are loadable. False for a driver older than 12.4, with which creating a CUDA manager
/// fails with `KVB_STATUS_UNSUPPORTED` and a message naming the version found and the version
/// needed. A GPU is still needed; creation reports `KVB_STATUS_UNSUPPORTED` otherwise. Never
/// fails on a machine without CUDA.
#[no_mangle]
pub extern "C" fn kvb_cuda_libraries_available(out: *mut bool) -> kvb_status_t {
    guard(|| {
        let available = driver_library_supported() && nvrtc_library_present();
        write_out(out, available, "out")
    })
}

/// Switches the engine stream (`cudaStream_t`/`CUstream`) that copies are ordered with. Copies
/// submitted before stay ordered before the new stream's later work (the new stream waits on
/// the GPU for the old one's enqueued work). Only for `KVB_COPY_BACKEND_CUDA` managers.
#[no_mangle]
pub extern "C" fn kvb_manager_set_stream(
    manager: *mut kvb_manager_t,
    stream: *mut c_void,
) -> kvb_status_t {
    with_manager(manager, |m| Ok(m.set_stream(stream as usize)?))
}

/// With `KVB_CUDA_TRANSFER_COPY_STREAM`: makes the engine stream wait (on the GPU, not the
/// host) for every copy submitted so far, as TensorRT-LLM's `syncTransfers`. Call it before
/// enqueuing work that reads or writes blocks the manager handed out since the last call. A
/// no-op with the engine-stream ordering and for the other backends (whose copies are done when
/// the call that submitted them returns).
#[no_mangle]
pub extern "C" fn kvb_manager_sync_transfers(manager: *mut kvb_manager_t) -> kvb_status_t {
    with_manager(manager, |m| Ok(m.sync_transfers()?))
}

/// Waits on the host until every copy the manager submitted so far has finished, so that the
/// host may read or write pool rows: e.g. copy an offloaded block's host row to a file, or
/// fill it before `kvb_manager_onboard_block`. Not for the hot path (an engine orders its GPU
/// work after the copies with `kvb_manager_sync_transfers`); immediate for the host backends,
/// whose copies are done when the call that submitted them returns. `KVB_STATUS_COPY_FAILED`
/// when a copy of the CUDA backend failed (sticky).
#[no_mangle]
pub extern "C" fn kvb_manager_wait_for_copies_on_host(manager: *mut kvb_manager_t) -> kvb_status_t {
    with_manager(manager, |m| Ok(m.wait_for_copies_on_host()?))
}

/// Registers the engine's own memory as the pool of (`window_size`, `cache_level`): GPU memory
/// of the manager's device for `KVB_CACHE_LEVEL_PRIMARY`, pinned host memory (allocated mapped,
/// or registered with `cudaHostRegister`) for `KVB_CACHE_LEVEL_SECONDARY`. `bytes` must cover
/// the window's rows (`num_blocks × row bytes`, see `kvb_manager_get_pool_pointer`). Allowed
/// only while no sequence exists and no block is cached (the pool holds no data yet); kvblock's
/// own pool of that level is freed. The memory stays the engine's: it must outlive the manager.
/// Only for `KVB_COPY_BACKEND_CUDA` managers.
#[no_mangle]
pub extern "C" fn kvb_manager_register_pool(
    manager: *mut kvb_manager_t,
    window_size: i32,
    cache_level: i32,
    pointer: *mut c_void,
    bytes: usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        let window = positive_arg(window_size, "window_size")?;
        let level = level_arg(cache_level)?;
        Ok(m.register_pool(window, level, pointer as u64, bytes)?)
    })
}

/// Address of a window's pool at `cache_level` (a `kvb_cache_level_t`) and the bytes of one row:
/// host memory with `KVB_COPY_BACKEND_HOST`; with `KVB_COPY_BACKEND_CUDA` the device address
/// (GPU memory for the primary level, the device-mapped pinned host pool for the secondary one),
/// usable by the engine's kernels. Row r starts at `*out_base + r * *out_row_bytes`; a block's
/// row is its `memory_index` (`kvb_manager_get_block_info`). `KVB_STATUS_UNSUPPORTED` where the
/// pool has no memory (no backend, an empty level, a pool not registered yet);
/// `KVB_STATUS_INVALID_ARGUMENT` for a window of several pools (a config with layers: see
/// `kvb_manager_get_model_pool_pointer`).
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

/// Writes the number of batched copy submissions so far, over all windows: kernel launches for
/// `KVB_COPY_BACKEND_CUDA` (one per call that copies, one more per wave of copies that depend
/// on each other inside the call), 0 for the other backends. For tests and diagnostics.
#[no_mangle]
pub extern "C" fn kvb_manager_copy_launches(
    manager: *mut kvb_manager_t,
    out: *mut u64,
) -> kvb_status_t {
    with_manager(manager, |m| write_out(out, m.copy_launches(), "out"))
}
