//! The manager configuration (`kvb_manager_config_t`, `kvb_window_config_t`): defaults and
//! validation into [`ManagerConfig`].

use super::*;
use crate::cuda::{CudaConfig, TransferMode};
use crate::ffi::handle::{count_arg, slice_arg, FfiError, FfiResult};
use crate::ffi::status::kvb_status_t;
use crate::manager::{CopyBackend, ManagerConfig, WindowSpec};

/// One attention-window size and its pool layout.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvb_window_config_t {
    /// Attention window in tokens (distinct per window; windows below the maximum sequence
    /// length are sliding windows).
    pub window_size: i32,
    /// Blocks in GPU (primary) memory; must be positive.
    pub primary_blocks: i32,
    /// Blocks in host (secondary) memory for offloading; may be 0.
    pub secondary_blocks: i32,
    /// Layers using this window (pool row = layers × 2 × heads × tokens_per_block × head size).
    pub num_layers: i32,
    /// KV heads per layer.
    pub num_kv_heads: i32,
    /// Elements per head.
    pub size_per_head: i32,
    /// Provision the host tier automatically (default false; `secondary_blocks` must then be
    /// 0). Its size is `min(primary_blocks, 50% of the available host memory / row bytes,
    /// 80% of RLIMIT_MEMLOCK / row bytes)` (row bytes: one block row of this window); a figure
    /// the system does not give, or an unlimited one, caps nothing, and caps that round down to
    /// no block fall back to `primary_blocks`. Several automatic windows split the memory and
    /// lock budgets in proportion to their GPU pool bytes. The size chosen is reported by
    /// `kvb_manager_get_host_tier_blocks` (and in the statistics' secondary blocks). A host tier
    /// gives suspended sequences somewhere to go, so that suspend/resume scheduling cannot
    /// deadlock on a full GPU pool.
    pub auto_host_tier: bool,
}

/// Manager configuration. Initialise with `kvb_manager_config_init`, then set fields.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvb_manager_config_t {
    /// `sizeof(kvb_manager_config_t)`, set by `kvb_manager_config_init`.
    pub struct_size: u32,
    /// Array of `num_windows` windows (copied; not kept after create).
    pub windows: *const kvb_window_config_t,
    /// Entries of `windows`; at least 1.
    pub num_windows: usize,
    /// Tokens per KV block (default 32).
    pub tokens_per_block: i32,
    /// Maximum beam width of any request (default 1).
    pub max_beam_width: i32,
    /// Maximum tokens (prompt + generated) of a sequence; required.
    pub max_sequence_length: i32,
    /// Prefix reuse through the radix tree (default true).
    pub enable_block_reuse: bool,
    /// Reuse of partially matching blocks (default true).
    pub enable_partial_reuse: bool,
    /// Copy partially matched blocks that are in use instead of skipping them (default true).
    pub copy_on_partial_reuse: bool,
    /// Offload evicted blocks to the host tier and onboard them on reuse (default true).
    pub onboard_blocks: bool,
    /// Primary blocks at or above this priority are offloaded instead of dropped (default 30).
    pub secondary_offload_min_priority: i32,
    /// Bytes per KV element, for pool sizes (default 2).
    pub bytes_per_element: i32,
    /// A `kvb_copy_backend_t` value (default `KVB_COPY_BACKEND_NONE`).
    pub copy_backend: i32,
    /// Time moves only through `kvb_manager_advance_time` (for tests; default false).
    pub manual_clock: bool,
    /// Capacity of the KV-cache event buffer (oldest events are dropped beyond it); 0 = events
    /// off, at no cost (default 0).
    pub max_kv_event_entries: i32,
    /// Attention data-parallel rank carried by every event; -1 = none (default).
    pub attention_dp_rank: i32,
    /// CUDA backend: device ordinal (default 0). kvblock works in its primary context, the one
    /// the CUDA runtime, PyTorch and TensorRT-LLM use, so pointers are shared with the engine.
    pub cuda_device: i32,
    /// CUDA backend: the engine's `cudaStream_t`/`CUstream` (default null = the legacy default
    /// stream); change it later with `kvb_manager_set_stream`.
    pub cuda_stream: *mut std::ffi::c_void,
    /// CUDA backend: a `kvb_cuda_transfer_mode_t` value (default engine stream).
    pub cuda_transfer_mode: i32,
    /// CUDA backend: allocate the pools (default true: `cuMemAlloc` for primary,
    /// `cuMemHostAlloc` pinned and mapped for secondary). False: the engine registers its own
    /// with `kvb_manager_register_pool` before the first admission.
    pub cuda_allocate_pools: bool,
    /// `kvb_manager_resume` is refused while the GPU utilization is above this, in (0, 1]
    /// (default 0.97). Utilization is the maximum over windows of (total − free − movable) /
    /// total primary blocks, where movable counts suspended sequences' blocks that could move
    /// to the host tier: headroom for running sequences to grow without suspend/resume thrash.
    pub max_utilization_for_resume: f64,
    /// Consecutive stalled scheduling passes after which `kvb_manager_end_scheduling_pass`
    /// returns `KVB_STATUS_STALLED` (default 1000; at least 1).
    pub stall_pass_threshold: i32,
    /// KV slots a sequence may hold beyond `max_sequence_length` for tokens that are not part
    /// of its text, e.g. the extra KV of some speculative-decoding heads (default 0; at least
    /// 0). Counted in `max_blocks_per_seq` and in the capacity limit of `kvb_manager_resize`.
    pub num_extra_kv_tokens: i32,
    /// The most draft tokens one generation step reserves slots for (default 0; at least 0).
    /// Each window's `max_blocks_per_seq` (the last dimension of offset tables, see
    /// `kvb_manager_get_max_blocks_per_seq`) is `ceil((min(max_sequence_length, window limit) +
    /// num_extra_kv_tokens + max_draft_tokens) / tokens_per_block)`, and a sequence's capacity
    /// may reach `max_sequence_length + num_extra_kv_tokens + max_draft_tokens` tokens, so a
    /// sequence at its maximum length with a full draft still fits its table row.
    /// `max_sequence_length + num_extra_kv_tokens + max_draft_tokens` must be at most
    /// `INT32_MAX`.
    pub max_draft_tokens: i32,
    /// The disk tier below the host tier (`kvb_disk_tier_config_t`, read at creation); null:
    /// none. Added after the first version: a caller whose `struct_size` stops before this
    /// field gets no disk tier.
    pub disk: *const crate::ffi::disk::kvb_disk_tier_config_t,
    /// The shared remote tier (`kvb_remote_tier_config_t`, read at creation); null: none.
    /// Added after `disk`: a caller whose `struct_size` stops before this field gets no
    /// remote tier.
    pub remote: *const crate::ffi::remote::kvb_remote_tier_config_t,
    /// The model's layers in layer order (`num_layers` entries, copied; not kept after create),
    /// or null with 0 (the default): one pool per window of the window's `num_layers ×
    /// K|V × num_kv_heads × size_per_head` elements of `bytes_per_element`. Given, layers are
    /// grouped into pools per (window, cache type, KV heads, head size, data type), the
    /// windows' `num_layers`, `num_kv_heads` and `size_per_head` are not used, and every
    /// window needs a layer (`kvb_manager_get_pool_info`, `kvb_manager_get_layer_to_pool_mapping`).
    /// Added in version 2 of this struct: a caller built against version 1 (whose
    /// `struct_size` ends before this field) is served as before.
    pub layers: *const crate::ffi::pools::kvb_layer_spec_t,
    /// Entries of `layers`.
    pub num_layers: usize,
    /// Tokens between the recurrent-state snapshots prefix reuse restores (layers of
    /// `KVB_CACHE_TYPE_RECURRENT_STATE`), a multiple of `tokens_per_block`; 0 (the default) =
    /// every block. Added in version 2.
    pub recurrent_snapshot_interval_tokens: i32,
}

/// The `struct_size` of each earlier version of `kvb_manager_config_t`, still accepted: the first
/// (before `disk`), then before `remote`, then before `layers`. The fields such a caller lacks
/// keep their defaults (no disk tier, no remote tier, one pool per window).
pub(crate) const MANAGER_CONFIG_EARLIER_SIZES: [usize; 3] = [
    std::mem::offset_of!(kvb_manager_config_t, disk),
    std::mem::offset_of!(kvb_manager_config_t, remote),
    std::mem::offset_of!(kvb_manager_config_t, layers),
];

/// Reads the caller's manager config: the whole struct, or an earlier version (its fields over
/// the defaults of the later ones).
pub(crate) fn read_manager_config(
    config: *const kvb_manager_config_t,
) -> FfiResult<kvb_manager_config_t> {
    if config.is_null() {
        return Err(crate::ffi::handle::null_error("config"));
    }
    // SAFETY: every version of the struct starts with its `struct_size`.
    let size = unsafe { config.cast::<u32>().read_unaligned() } as usize;
    if MANAGER_CONFIG_EARLIER_SIZES.contains(&size) {
        let mut c = manager_config_default();
        // SAFETY: the caller's struct has `size` readable bytes, a prefix of this layout of
        // plain data and pointers; `c` is larger.
        unsafe {
            std::ptr::copy_nonoverlapping(
                config.cast::<u8>(),
                (&mut c as *mut kvb_manager_config_t).cast::<u8>(),
                size,
            )
        };
        c.struct_size = std::mem::size_of::<kvb_manager_config_t>() as u32;
        return Ok(c);
    }
    // SAFETY: a config of this version, or a size `manager_config` refuses (it checks
    // `struct_size` first).
    Ok(unsafe { config.read() })
}

fn usize_field(v: i32, what: &str) -> FfiResult<usize> {
    usize::try_from(v).map_err(|_| {
        FfiError(
            kvb_status_t::KVB_STATUS_INVALID_CONFIG,
            format!("{what} is negative ({v})"),
        )
    })
}

pub(crate) fn manager_config_default() -> kvb_manager_config_t {
    let d = ManagerConfig::default();
    kvb_manager_config_t {
        struct_size: std::mem::size_of::<kvb_manager_config_t>() as u32,
        windows: std::ptr::null(),
        num_windows: 0,
        tokens_per_block: d.tokens_per_block as i32,
        max_beam_width: d.max_beam_width as i32,
        max_sequence_length: 0,
        enable_block_reuse: d.enable_block_reuse,
        enable_partial_reuse: d.enable_partial_reuse,
        copy_on_partial_reuse: d.copy_on_partial_reuse,
        onboard_blocks: d.onboard_blocks,
        secondary_offload_min_priority: i32::from(d.secondary_offload_min_priority),
        bytes_per_element: d.bytes_per_element as i32,
        copy_backend: kvb_copy_backend_t::KVB_COPY_BACKEND_NONE as i32,
        manual_clock: false,
        max_kv_event_entries: 0,
        attention_dp_rank: -1,
        cuda_device: d.cuda.device,
        cuda_stream: std::ptr::null_mut(),
        cuda_transfer_mode: kvb_cuda_transfer_mode_t::KVB_CUDA_TRANSFER_ENGINE_STREAM as i32,
        cuda_allocate_pools: d.cuda.allocate_pools,
        max_utilization_for_resume: d.max_utilization_for_resume,
        stall_pass_threshold: d.stall_pass_threshold as i32,
        num_extra_kv_tokens: d.num_extra_kv_tokens as i32,
        max_draft_tokens: d.max_draft_tokens as i32,
        disk: std::ptr::null(),
        remote: std::ptr::null(),
        layers: std::ptr::null(),
        num_layers: 0,
        recurrent_snapshot_interval_tokens: 0,
    }
}

pub(crate) fn manager_config(c: &kvb_manager_config_t) -> FfiResult<ManagerConfig> {
    check_struct_size(
        c.struct_size,
        std::mem::size_of::<kvb_manager_config_t>(),
        "kvb_manager_config_t",
    )?;
    let windows = slice_arg(c.windows, c.num_windows, "config.windows")?;
    let windows = windows
        .iter()
        .map(|w| {
            Ok(WindowSpec {
                window_size: usize_field(w.window_size, "window_size")?,
                primary_blocks: usize_field(w.primary_blocks, "primary_blocks")?,
                secondary_blocks: usize_field(w.secondary_blocks, "secondary_blocks")?,
                num_layers: usize_field(w.num_layers, "num_layers")?,
                num_kv_heads: usize_field(w.num_kv_heads, "num_kv_heads")?,
                size_per_head: usize_field(w.size_per_head, "size_per_head")?,
                auto_host_tier: w.auto_host_tier,
            })
        })
        .collect::<FfiResult<Vec<_>>>()?;
    let copy_backend = match c.copy_backend {
        0 => CopyBackend::None,
        1 => CopyBackend::HostMemory,
        2 => CopyBackend::Cuda,
        v => {
            return Err(FfiError(
                kvb_status_t::KVB_STATUS_INVALID_CONFIG,
                format!("unknown copy_backend {v}"),
            ))
        }
    };
    let cuda = CudaConfig {
        device: count_arg(c.cuda_device, "cuda_device")? as i32,
        stream: c.cuda_stream as usize,
        mode: match c.cuda_transfer_mode {
            0 => TransferMode::EngineStream,
            1 => TransferMode::CopyStream,
            v => {
                return Err(FfiError(
                    kvb_status_t::KVB_STATUS_INVALID_CONFIG,
                    format!("unknown cuda_transfer_mode {v}"),
                ))
            }
        },
        allocate_pools: c.cuda_allocate_pools,
    };
    let min_priority = c.secondary_offload_min_priority;
    if !(0..=100).contains(&min_priority) {
        return Err(FfiError(
            kvb_status_t::KVB_STATUS_INVALID_CONFIG,
            format!("secondary_offload_min_priority {min_priority} is outside 0..=100"),
        ));
    }
    let num_extra_kv_tokens = usize_field(c.num_extra_kv_tokens, "num_extra_kv_tokens")?;
    let max_draft_tokens = usize_field(c.max_draft_tokens, "max_draft_tokens")?;
    // Positions, capacities and offset-table dimensions are int32 in the C ABI.
    let max_kv_tokens = i64::from(c.max_sequence_length)
        + i64::from(c.num_extra_kv_tokens)
        + i64::from(c.max_draft_tokens);
    if max_kv_tokens > i64::from(i32::MAX) {
        return Err(FfiError(
            kvb_status_t::KVB_STATUS_INVALID_CONFIG,
            format!(
                "max_sequence_length {} + num_extra_kv_tokens {} + max_draft_tokens {} exceeds \
                 INT32_MAX",
                c.max_sequence_length, c.num_extra_kv_tokens, c.max_draft_tokens
            ),
        ));
    }
    let layers = crate::ffi::pools::layer_specs(c.layers, c.num_layers)?;
    Ok(ManagerConfig {
        // Set after creation: kvb_manager_set_contiguous_runs.
        contiguous_runs: false,
        // Set after creation: kvb_manager_set_max_context_chunk_tokens.
        max_context_chunk_tokens: 0,
        layers,
        recurrent_snapshot_interval_tokens: usize_field(
            c.recurrent_snapshot_interval_tokens,
            "recurrent_snapshot_interval_tokens",
        )?,
        windows,
        tokens_per_block: usize_field(c.tokens_per_block, "tokens_per_block")?,
        max_beam_width: usize_field(c.max_beam_width, "max_beam_width")?,
        max_sequence_length: usize_field(c.max_sequence_length, "max_sequence_length")?,
        enable_block_reuse: c.enable_block_reuse,
        enable_partial_reuse: c.enable_partial_reuse,
        copy_on_partial_reuse: c.copy_on_partial_reuse,
        onboard_blocks: c.onboard_blocks,
        secondary_offload_min_priority: min_priority as u8,
        bytes_per_element: usize_field(c.bytes_per_element, "bytes_per_element")?,
        copy_backend,
        cuda,
        manual_clock: c.manual_clock,
        max_kv_event_entries: usize_field(c.max_kv_event_entries, "max_kv_event_entries")?,
        attention_dp_rank: match c.attention_dp_rank {
            -1 => None,
            r if r >= 0 => Some(r),
            r => {
                return Err(FfiError(
                    kvb_status_t::KVB_STATUS_INVALID_CONFIG,
                    format!("attention_dp_rank {r} is negative (use -1 for none)"),
                ))
            }
        },
        max_utilization_for_resume: c.max_utilization_for_resume,
        stall_pass_threshold: u32::try_from(c.stall_pass_threshold).map_err(|_| {
            FfiError(
                kvb_status_t::KVB_STATUS_INVALID_CONFIG,
                format!(
                    "stall_pass_threshold {} is negative",
                    c.stall_pass_threshold
                ),
            )
        })?,
        num_extra_kv_tokens,
        max_draft_tokens,
        disk: crate::ffi::disk::disk_config(c.disk)?,
        remote: crate::ffi::remote::remote_config(c.remote)?,
    })
}
