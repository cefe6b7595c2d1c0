//! Enums of the C ABI. Enum-valued fields and arguments coming from C are plain integers (an
//! out-of-range value is an error, never undefined behaviour); these enums name their values.

use crate::ffi::handle::{invalid, FfiResult};
use crate::pool::Level;

/// Where the bytes of the KV pools live (values of `kvb_manager_config_t::copy_backend`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvb_copy_backend_t {
    /// Bookkeeping only: no pool memory, copies are counted and dropped.
    KVB_COPY_BACKEND_NONE = 0,
    /// Pools are host buffers owned by the library; copies are memcpy (tests, host-only use).
    KVB_COPY_BACKEND_HOST = 1,
    /// Primary pools in GPU memory, secondary pools in pinned mapped host memory; copies by one
    /// batched kernel per operation on the engine's stream (see `kvb_cuda_transfer_mode_t`).
    /// Creating such a manager without a CUDA driver or GPU fails with
    /// `KVB_STATUS_UNSUPPORTED`.
    KVB_COPY_BACKEND_CUDA = 2,
}

/// How CUDA copies are ordered against the engine's stream (values of
/// `kvb_manager_config_t::cuda_transfer_mode`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvb_cuda_transfer_mode_t {
    /// Copies are enqueued on the engine's stream: the engine's later work on that stream sees
    /// their bytes, and a block freed by an offload is rewritten only after the offload read it.
    /// Nothing to call. The default.
    KVB_CUDA_TRANSFER_ENGINE_STREAM = 0,
    /// Copies run on kvblock's own stream, after the work the engine had enqueued when they were
    /// submitted. The engine calls `kvb_manager_sync_transfers` before it enqueues work that
    /// reads or writes blocks handed out since the last sync (the engine stream then waits on
    /// the GPU; the host never waits).
    KVB_CUDA_TRANSFER_COPY_STREAM = 1,
}

/// Cache level of a block's memory row.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvb_cache_level_t {
    /// GPU (primary) memory.
    KVB_CACHE_LEVEL_PRIMARY = 0,
    /// Host (secondary) memory.
    KVB_CACHE_LEVEL_SECONDARY = 1,
    /// The disk tier below host memory. Only events use it (a block written to disk, or a
    /// disk slot removed); it names no pool, so calls taking a cache level refuse it.
    KVB_CACHE_LEVEL_DISK = 2,
}

/// Where a request is in its life (values of `kvb_request_state_t::phase`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvb_request_phase_t {
    /// Before its first context chunk.
    KVB_PHASE_CONTEXT_INIT = 0,
    /// Between context chunks.
    KVB_PHASE_CONTEXT_CONTINUE = 1,
    /// Generating tokens.
    KVB_PHASE_GENERATION = 2,
    /// Finished or idle.
    KVB_PHASE_OTHER = 3,
}

pub(crate) fn level_arg(v: i32) -> FfiResult<Level> {
    match v {
        0 => Ok(Level::Primary),
        1 => Ok(Level::Secondary),
        v => Err(invalid(format!("unknown cache level {v}"))),
    }
}
