//! `#[repr(C)]` structs and enums of the C ABI, and their conversion to Rust types.
//!
//! Enum-valued fields and arguments coming from C are plain integers (an out-of-range value is an
//! error, never undefined behaviour); the enums below name their values.

use super::handle::{count_arg, invalid, null_error, positive_arg, slice_arg, FfiError, FfiResult};
use super::status::kvb_status_t;
use crate::cuda::{CudaConfig, TransferMode};
use crate::key::MultimodalItem;
use crate::manager::{
    Admission, BlockInfo, CopyBackend, KvCacheStats, ManagerConfig, Request, RequestPhase,
    RequestRef, RequestState, RequestStats, WindowSpec,
};
use crate::pool::Level;
use crate::retention::{RetentionConfig, TokenRangeRetention};

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
    /// The model's layers in layer order (`num_layers` entries, copied; not kept after create),
    /// or null with 0 (the default): one pool per window of the window's `num_layers ×
    /// K|V × num_kv_heads × size_per_head` elements of `bytes_per_element`. Given, layers are
    /// grouped into pools per (window, cache type, KV heads, head size, data type), the
    /// windows' `num_layers`, `num_kv_heads` and `size_per_head` are not used, and every
    /// window needs a layer (`kvb_manager_get_pool_info`, `kvb_manager_get_layer_to_pool_mapping`).
    /// Added in version 2 of this struct: a caller built against version 1 (whose
    /// `struct_size` ends before this field) is served as before.
    pub layers: *const super::pools::kvb_layer_spec_t,
    /// Entries of `layers`.
    pub num_layers: usize,
    /// Tokens between the recurrent-state snapshots prefix reuse restores (layers of
    /// `KVB_CACHE_TYPE_RECURRENT_STATE`), a multiple of `tokens_per_block`; 0 (the default) =
    /// every block. Added in version 2.
    pub recurrent_snapshot_interval_tokens: i32,
}

/// `struct_size` of version 1 of `kvb_manager_config_t` (before `layers`), still accepted.
pub(crate) const MANAGER_CONFIG_V1_SIZE: usize = std::mem::offset_of!(kvb_manager_config_t, layers);

/// Priority (0..=100) and optional duration for prompt tokens `[token_start, token_end)`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvb_token_range_retention_t {
    /// First prompt token of the range (inclusive, >= 0). Ranges may not overlap.
    pub token_start: i32,
    /// Exclusive end; -1 = to the end of the sequence (only the last range may be open).
    pub token_end: i32,
    /// Retention priority of the range's blocks, 0..=100 (higher is evicted later; 35 = default).
    pub priority: i32,
    /// Milliseconds after release before the priority decays to 35; -1 = forever.
    pub duration_ms: i64,
}

/// Retention of a request's blocks (TensorRT-LLM `KvCacheRetentionConfig`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvb_retention_config_t {
    /// Array of `num_ranges` token ranges (copied); null only when `num_ranges` is 0.
    pub ranges: *const kvb_token_range_retention_t,
    /// Entries of `ranges`; 0 = every prompt block keeps the default priority 35.
    pub num_ranges: usize,
    /// Priority of generated (decode) blocks (35 = default).
    pub decode_priority: i32,
    /// Duration of the decode priority in ms; -1 = forever.
    pub decode_duration_ms: i64,
}

/// A multimodal item: a 32-byte digest of its content covering `length` prompt tokens from
/// `position`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvb_multimodal_item_t {
    /// Hash of the item's content, mixed into the keys of the blocks it covers.
    pub digest: [u8; 32],
    /// First prompt token the item covers (>= 0).
    pub position: i32,
    /// Prompt tokens the item covers (> 0; `position + length` must fit in `int32_t`).
    pub length: i32,
}

/// A request to admit (what TensorRT-LLM reads from `LlmRequest`). Initialise with
/// `kvb_request_init`. Pointed-to arrays are copied; none is kept after the call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvb_request_t {
    /// `sizeof(kvb_request_t)`, set by `kvb_request_init`.
    pub struct_size: u32,
    /// Id of the sequence; unique among live sequences (`KVB_STATUS_DUPLICATE_REQUEST`).
    pub request_id: u64,
    /// Prompt tokens; at least 1 and at most `num_tokens`.
    pub input_length: i32,
    /// Beams (1 = no beam search).
    pub beam_width: i32,
    /// Array of `num_tokens` token ids; the first `input_length` are the prompt.
    pub tokens: *const i32,
    /// Entries of `tokens`; at least `input_length` (`KVB_STATUS_TOO_FEW_TOKENS`).
    pub num_tokens: usize,
    /// Optional per-token extra ids (prompt tuning); null or `num_tokens` entries.
    pub token_extra_ids: *const u64,
    /// Whether `lora_task_id` is set (default false).
    pub has_lora_task_id: bool,
    /// LoRA task id, part of every block key (only blocks of the same task are reused).
    pub lora_task_id: u64,
    /// Whether `cache_salt` is set (default false).
    pub has_cache_salt: bool,
    /// Cache salt, part of every block key (only blocks of the same salt are reused).
    pub cache_salt: u64,
    /// Array of `num_mm_items` multimodal items (copied); null only when `num_mm_items` is 0.
    pub mm_items: *const kvb_multimodal_item_t,
    /// Entries of `mm_items` (default 0).
    pub num_mm_items: usize,
    /// Optional retention config (null = default priority 35 everywhere).
    pub retention: *const kvb_retention_config_t,
}

/// Per-request allocation counters of an admission, summed over windows.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvb_request_stats_t {
    /// Blocks taken from the free queue: misses, per-beam blocks, partial-reuse copy destinations
    /// and blocks onboarded from the host tier.
    pub alloc_total_blocks: u64,
    /// Of `alloc_total_blocks`, those that held no cached content.
    pub alloc_new_blocks: u64,
    /// Prompt blocks found in the reuse tree (full or partial match, onboarded ones included).
    pub reused_blocks: u64,
    /// Prompt blocks not found in the reuse tree (computed anew; counted once for all beams).
    pub missed_blocks: u64,
    /// reused / (reused + missed); 0 when nothing was reused.
    pub cache_hit_rate: f64,
}

/// Result of an admission.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvb_admission_t {
    /// Prompt tokens already in the cache: the engine computes from this position on.
    pub prepopulated_prompt_len: i32,
    /// The request's allocation counters, summed over windows.
    pub stats: kvb_request_stats_t,
}

/// The estimate for one request of a candidate batch (`kvb_manager_estimate_batch`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvb_batch_estimate_t {
    /// Prompt tokens admission will reuse (its prepopulated length).
    pub reusable_tokens: i32,
    /// Blocks admission will allocate, over windows (the request's `alloc_total_blocks`).
    pub allocated_blocks: i32,
    /// Free primary blocks admission will consume, over windows.
    pub free_blocks_consumed: i32,
    /// Prompt blocks admission will reuse, over windows (the request's `reused_blocks`).
    pub reused_blocks: i32,
    /// Prompt blocks admission will miss, over windows (the request's `missed_blocks`).
    pub missed_blocks: i32,
    /// Whether this request and every one before it fit in the free blocks.
    pub fits: bool,
}

impl From<crate::manager::BatchEstimate> for kvb_batch_estimate_t {
    fn from(e: crate::manager::BatchEstimate) -> Self {
        kvb_batch_estimate_t {
            reusable_tokens: e.reusable_tokens as i32,
            allocated_blocks: e.allocated_blocks as i32,
            free_blocks_consumed: e.free_blocks_consumed as i32,
            reused_blocks: e.reused_blocks as i32,
            missed_blocks: e.missed_blocks as i32,
            fits: e.fits,
        }
    }
}

/// Whole-manager statistics (TensorRT-LLM `KvCacheStats`; `max_num_blocks` includes host blocks,
/// as there).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvb_kv_cache_stats_t {
    /// Primary and secondary blocks, over windows.
    pub max_num_blocks: u64,
    /// Free primary blocks.
    pub free_num_blocks: u64,
    /// `max_num_blocks - free_num_blocks` (host blocks count as used, as in TensorRT-LLM).
    pub used_num_blocks: u64,
    /// Tokens per block (the config's `tokens_per_block`).
    pub tokens_per_block: u64,
    /// Cumulative `kvb_request_stats_t::alloc_total_blocks` over admissions and windows, plus
    /// blocks allocated while generating.
    pub alloc_total_blocks: u64,
    /// Of `alloc_total_blocks`, those that held no cached content.
    pub alloc_new_blocks: u64,
    /// Cumulative prompt blocks reused from the reuse tree.
    pub reused_blocks: u64,
    /// Cumulative prompt blocks not found in the reuse tree.
    pub missed_blocks: u64,
    /// `reused_blocks / (reused_blocks + missed_blocks)`; 0 when nothing was reused.
    pub cache_hit_rate: f64,
    /// Primary (GPU) blocks, over windows.
    pub num_primary_blocks: u64,
    /// Secondary (host) blocks, over windows.
    pub num_secondary_blocks: u64,
    /// Free secondary blocks, over windows.
    pub free_secondary_blocks: u64,
    /// Cumulative blocks offloaded from primary to secondary memory.
    pub offloaded_blocks: u64,
    /// Cumulative blocks onboarded from secondary to primary memory.
    pub onboarded_blocks: u64,
    /// Blocks that left a reuse tree: evicted, detached with an evicted ancestor, or taken over
    /// after a partial match (as many as the hashes of Removed events).
    pub evicted_blocks: u64,
    /// Bytes of the primary pools.
    pub allocated_bytes: u64,
}

/// Scheduler-side state of a request, for the estimates. Initialise with
/// `kvb_request_state_init`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvb_request_state_t {
    /// `sizeof(kvb_request_state_t)`, set by `kvb_request_state_init`.
    pub struct_size: u32,
    /// Id of the request's sequence: read in the generation phase (its token count) and by
    /// `kvb_manager_get_remaining_blocks_to_completion` (the blocks it already holds).
    pub request_id: u64,
    /// A `kvb_request_phase_t` value.
    pub phase: i32,
    /// Prompt tokens (>= 0).
    pub prompt_len: i32,
    /// Beams (> 0; default 1).
    pub beam_width: i32,
    /// Tokens of the next context chunk (>= 0): a first chunk needs blocks for at most `window_size
    /// + context_chunk_size` tokens.
    pub context_chunk_size: i32,
    /// Speculative draft tokens per step (>= 0; default 0): a generation step adds
    /// `num_draft_tokens + 1` tokens.
    pub num_draft_tokens: i32,
    /// Most tokens the request generates (>= 0).
    pub max_new_tokens: i32,
    /// Tokens generated so far (>= 0).
    pub num_generated_tokens: i32,
}

/// Snapshot of one block.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvb_block_info_t {
    /// A `kvb_cache_level_t` value.
    pub cache_level: i32,
    /// Row index inside the pools of that level.
    pub memory_index: i32,
    /// References: one per beam of each sequence holding the block, plus its pins.
    pub ref_count: i32,
    /// Retention priority, 0..=100 (35 = default).
    pub priority: i32,
    /// Holds reusable content in the reuse tree.
    pub in_reuse_tree: bool,
    /// Has no child in the reuse tree (also true outside the tree).
    pub is_leaf: bool,
    /// In a free queue (evictable).
    pub is_free: bool,
    /// Tokens of the block's key (0 if it never held a key).
    pub num_tokens: i32,
    /// TensorRT-LLM block hash (valid when in the tree).
    pub hash: u64,
    /// Tree parent block id; -1 = the root; -2 = not in the tree.
    pub parent: i64,
}

pub(crate) fn check_struct_size(got: u32, expected: usize, what: &str) -> FfiResult {
    if got as usize != expected {
        return Err(FfiError(
            kvb_status_t::KVB_STATUS_STRUCT_SIZE,
            format!("{what}.struct_size is {got}, this library expects {expected} (call the *_init function)"),
        ));
    }
    Ok(())
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
    let layers = super::pools::layer_specs(c.layers, c.num_layers)?;
    Ok(ManagerConfig {
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
    })
}

pub(crate) fn request_default() -> kvb_request_t {
    kvb_request_t {
        struct_size: std::mem::size_of::<kvb_request_t>() as u32,
        request_id: 0,
        input_length: 0,
        beam_width: 1,
        tokens: std::ptr::null(),
        num_tokens: 0,
        token_extra_ids: std::ptr::null(),
        has_lora_task_id: false,
        lora_task_id: 0,
        has_cache_salt: false,
        cache_salt: 0,
        mm_items: std::ptr::null(),
        num_mm_items: 0,
        retention: std::ptr::null(),
    }
}

fn optional_duration(v: i64, what: &str) -> FfiResult<Option<u64>> {
    match v {
        -1 => Ok(None),
        v if v >= 0 => Ok(Some(v as u64)),
        v => Err(FfiError(
            kvb_status_t::KVB_STATUS_INVALID_RETENTION,
            format!("{what} {v} is negative (use -1 for none)"),
        )),
    }
}

pub(crate) fn retention_config(r: &kvb_retention_config_t) -> FfiResult<RetentionConfig> {
    let ranges = slice_arg(r.ranges, r.num_ranges, "retention.ranges")?
        .iter()
        .map(|t| {
            Ok(TokenRangeRetention {
                token_start: t.token_start,
                token_end: match t.token_end {
                    -1 => None,
                    e => Some(e),
                },
                priority: t.priority,
                duration_ms: optional_duration(t.duration_ms, "token range duration_ms")?,
            })
        })
        .collect::<FfiResult<Vec<_>>>()?;
    let decode_duration = optional_duration(r.decode_duration_ms, "decode_duration_ms")?;
    Ok(RetentionConfig::new(
        ranges,
        r.decode_priority,
        decode_duration,
    )?)
}

/// A C request's fields, its token arrays borrowed from the caller for the call's duration.
pub(crate) struct CRequest<'a> {
    id: u64,
    input_length: usize,
    beam_width: usize,
    tokens: &'a [i32],
    extra_ids: Option<&'a [u64]>,
    lora_task_id: Option<u64>,
    cache_salt: Option<u64>,
    mm_items: Vec<MultimodalItem>,
    retention: RetentionConfig,
}

impl CRequest<'_> {
    /// The request as admission takes it (nothing copied).
    pub(crate) fn as_ref(&self) -> RequestRef<'_> {
        RequestRef {
            id: self.id,
            input_length: self.input_length,
            beam_width: self.beam_width,
            token_ids: self.tokens,
            extra_ids: self.extra_ids,
            lora_task_id: self.lora_task_id,
            cache_salt: self.cache_salt,
            mm_items: &self.mm_items,
            retention: &self.retention,
        }
    }

    /// An owned copy, for the calls that keep or take whole requests.
    pub(crate) fn to_request(&self) -> Request {
        Request {
            id: self.id,
            input_length: self.input_length,
            beam_width: self.beam_width,
            token_ids: self.tokens.to_vec(),
            extra_ids: self.extra_ids.map(<[u64]>::to_vec),
            lora_task_id: self.lora_task_id,
            cache_salt: self.cache_salt,
            mm_items: self.mm_items.clone(),
            retention: self.retention.clone(),
        }
    }
}

/// `request` of an optional argument: null is `None`.
pub(crate) fn optional_request(
    r: *const kvb_request_t,
) -> FfiResult<Option<crate::manager::Request>> {
    if r.is_null() {
        return Ok(None);
    }
    Ok(Some(request(r)?.to_request()))
}

/// Reads a C request without copying its token arrays (multimodal items and a retention config,
/// when given, are converted). Size checks that need the manager happen there.
pub(crate) fn request<'a>(r: *const kvb_request_t) -> FfiResult<CRequest<'a>> {
    // SAFETY: caller passes a valid pointer or null (checked).
    let r = unsafe { r.as_ref() }.ok_or_else(|| null_error("request"))?;
    check_struct_size(
        r.struct_size,
        std::mem::size_of::<kvb_request_t>(),
        "kvb_request_t",
    )?;
    let input_length = positive_arg(r.input_length, "input_length")?;
    let beam_width = positive_arg(r.beam_width, "beam_width")?;
    let tokens = slice_arg(r.tokens, r.num_tokens, "tokens")?;
    let extra_ids = if r.token_extra_ids.is_null() {
        None
    } else {
        Some(slice_arg(
            r.token_extra_ids,
            r.num_tokens,
            "token_extra_ids",
        )?)
    };
    let mm_items = slice_arg(r.mm_items, r.num_mm_items, "mm_items")?
        .iter()
        .map(|m| {
            // Checked here for every call that takes a request (estimates too): an item whose
            // end wraps would silently lose its digest from the block keys.
            if m.position < 0 || m.length <= 0 || m.position.checked_add(m.length).is_none() {
                return Err(invalid(format!(
                    "multimodal item at position {} with length {} is invalid (position >= 0, \
                     length > 0, position + length <= INT32_MAX)",
                    m.position, m.length
                )));
            }
            Ok(MultimodalItem {
                digest: m.digest,
                position: m.position,
                length: m.length,
            })
        })
        .collect::<FfiResult<Vec<_>>>()?;
    // SAFETY: optional pointer, valid when non-null.
    let retention = match unsafe { r.retention.as_ref() } {
        Some(ret) => retention_config(ret)?,
        None => RetentionConfig::default(),
    };
    Ok(CRequest {
        id: r.request_id,
        input_length,
        beam_width,
        tokens,
        extra_ids,
        lora_task_id: r.has_lora_task_id.then_some(r.lora_task_id),
        cache_salt: r.has_cache_salt.then_some(r.cache_salt),
        mm_items,
        retention,
    })
}

pub(crate) fn request_state_default() -> kvb_request_state_t {
    kvb_request_state_t {
        struct_size: std::mem::size_of::<kvb_request_state_t>() as u32,
        request_id: 0,
        phase: kvb_request_phase_t::KVB_PHASE_CONTEXT_INIT as i32,
        prompt_len: 0,
        beam_width: 1,
        context_chunk_size: 0,
        num_draft_tokens: 0,
        max_new_tokens: 0,
        num_generated_tokens: 0,
    }
}

pub(crate) fn request_state(s: *const kvb_request_state_t) -> FfiResult<RequestState> {
    // SAFETY: valid pointer or null (checked).
    let s = unsafe { s.as_ref() }.ok_or_else(|| null_error("state"))?;
    check_struct_size(
        s.struct_size,
        std::mem::size_of::<kvb_request_state_t>(),
        "kvb_request_state_t",
    )?;
    let phase = match s.phase {
        0 => RequestPhase::ContextInit,
        1 => RequestPhase::ContextContinue,
        2 => RequestPhase::Generation,
        3 => RequestPhase::Other,
        v => return Err(invalid(format!("unknown request phase {v}"))),
    };
    Ok(RequestState {
        request_id: s.request_id,
        phase,
        prompt_len: count_arg(s.prompt_len, "prompt_len")?,
        beam_width: positive_arg(s.beam_width, "beam_width")?,
        context_chunk_size: count_arg(s.context_chunk_size, "context_chunk_size")?,
        num_draft_tokens: count_arg(s.num_draft_tokens, "num_draft_tokens")?,
        max_new_tokens: count_arg(s.max_new_tokens, "max_new_tokens")?,
        num_generated_tokens: count_arg(s.num_generated_tokens, "num_generated_tokens")?,
    })
}

impl From<RequestStats> for kvb_request_stats_t {
    fn from(s: RequestStats) -> Self {
        kvb_request_stats_t {
            alloc_total_blocks: s.alloc_total_blocks,
            alloc_new_blocks: s.alloc_new_blocks,
            reused_blocks: s.reused_blocks,
            missed_blocks: s.missed_blocks,
            cache_hit_rate: s.hit_rate(),
        }
    }
}

impl From<Admission> for kvb_admission_t {
    fn from(a: Admission) -> Self {
        kvb_admission_t {
            prepopulated_prompt_len: a.prepopulated_prompt_len as i32,
            stats: a.stats.into(),
        }
    }
}

impl From<KvCacheStats> for kvb_kv_cache_stats_t {
    fn from(s: KvCacheStats) -> Self {
        kvb_kv_cache_stats_t {
            max_num_blocks: s.max_num_blocks,
            free_num_blocks: s.free_num_blocks,
            used_num_blocks: s.used_num_blocks,
            tokens_per_block: s.tokens_per_block,
            alloc_total_blocks: s.alloc_total_blocks,
            alloc_new_blocks: s.alloc_new_blocks,
            reused_blocks: s.reused_blocks,
            missed_blocks: s.missed_blocks,
            cache_hit_rate: s.cache_hit_rate,
            num_primary_blocks: s.num_primary_blocks,
            num_secondary_blocks: s.num_secondary_blocks,
            free_secondary_blocks: s.free_secondary_blocks,
            offloaded_blocks: s.offloaded_blocks,
            onboarded_blocks: s.onboarded_blocks,
            evicted_blocks: s.evicted_blocks,
            allocated_bytes: s.allocated_bytes,
        }
    }
}

impl From<BlockInfo> for kvb_block_info_t {
    fn from(b: BlockInfo) -> Self {
        kvb_block_info_t {
            cache_level: b.level as i32,
            memory_index: b.memory_index as i32,
            ref_count: b.ref_count as i32,
            priority: i32::from(b.priority),
            in_reuse_tree: b.in_reuse_tree,
            is_leaf: b.is_leaf,
            is_free: b.is_free,
            num_tokens: b.num_tokens as i32,
            hash: b.hash,
            parent: b.parent.unwrap_or(-2),
        }
    }
}

pub(crate) fn level_arg(v: i32) -> FfiResult<Level> {
    match v {
        0 => Ok(Level::Primary),
        1 => Ok(Level::Secondary),
        v => Err(invalid(format!("unknown cache level {v}"))),
    }
}
