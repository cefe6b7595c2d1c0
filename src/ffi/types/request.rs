//! Requests as C passes them (`kvb_request_t`, retention, multimodal items) and the scheduler's
//! per-request state (`kvb_request_state_t`), viewed or converted without copying tokens.

use super::*;
use crate::ffi::handle::{
    count_arg, invalid, null_error, positive_arg, slice_arg, FfiError, FfiResult,
};
use crate::ffi::status::kvb_status_t;
use crate::key::MultimodalItem;
use crate::manager::{Request, RequestPhase, RequestRef, RequestState};
use crate::retention::{RetentionConfig, TokenRangeRetention};

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
    /// The request opts out of reuse (default false; TensorRT-LLM's per-call
    /// `isEnableBlockReuse = false`): it reuses no cached block and nothing of it is ever
    /// stored, and its beams share a last prompt block the prompt fills. A caller built
    /// against the older struct without this field (its `struct_size` ends before it) gets
    /// false.
    pub disable_reuse: bool,
}

/// `struct_size` of the request before `disable_reuse` was added: still accepted, and what
/// `kvb_request_init` (the symbol programs built against that header call) writes.
pub(crate) const REQUEST_SIZE_BEFORE_DISABLE_REUSE: usize =
    std::mem::offset_of!(kvb_request_t, disable_reuse);

/// Writes the defaults of the first `size` bytes of a request (a layout this library reads)
/// with `struct_size = size`; nothing past them.
pub(crate) fn init_request(r: *mut kvb_request_t, size: usize) -> FfiResult {
    init_sized(
        r,
        size,
        &[
            REQUEST_SIZE_BEFORE_DISABLE_REUSE,
            std::mem::size_of::<kvb_request_t>(),
        ],
        "request",
        request_default(),
    )
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
        disable_reuse: false,
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
    disable_reuse: bool,
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
            disable_reuse: self.disable_reuse,
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
            disable_reuse: self.disable_reuse,
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

/// The request at `r`, copied whole: a request of the older, shorter layout (see
/// `REQUEST_SIZE_BEFORE_DISABLE_REUSE`) is read up to its end, the newer fields at their
/// defaults. Returns the request and its `struct_size`.
fn read_request(r: *const kvb_request_t) -> FfiResult<(kvb_request_t, usize)> {
    if r.is_null() {
        return Err(null_error("request"));
    }
    // SAFETY: non-null; `struct_size` comes first in every layout.
    let size = unsafe { std::ptr::addr_of!((*r).struct_size).read_unaligned() } as usize;
    if size == REQUEST_SIZE_BEFORE_DISABLE_REUSE {
        let mut out = request_default();
        // SAFETY: the caller's struct is `size` readable bytes (its own `struct_size`), fewer
        // than ours; the fields it lacks keep their defaults.
        unsafe {
            std::ptr::copy_nonoverlapping(r as *const u8, &mut out as *mut _ as *mut u8, size);
        }
        out.struct_size = std::mem::size_of::<kvb_request_t>() as u32;
        return Ok((out, size));
    }
    check_struct_size(
        size as u32,
        std::mem::size_of::<kvb_request_t>(),
        "kvb_request_t",
    )?;
    // SAFETY: a whole request of this library's layout (its size checked).
    Ok((unsafe { *r }, size))
}

/// Reads a C request without copying its token arrays (multimodal items and a retention config,
/// when given, are converted). Size checks that need the manager happen there.
pub(crate) fn request<'a>(r: *const kvb_request_t) -> FfiResult<CRequest<'a>> {
    let (r, _) = read_request(r)?;
    convert_request(&r)
}

fn convert_request<'a>(r: &kvb_request_t) -> FfiResult<CRequest<'a>> {
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
        disable_reuse: r.disable_reuse,
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

/// Views `n` C requests at `ptr` (null allowed only when `n` is 0).
pub(crate) fn request_array<'a>(
    ptr: *const kvb_request_t,
    n: usize,
) -> FfiResult<Vec<CRequest<'a>>> {
    if n > 0 && ptr.is_null() {
        return Err(null_error("requests"));
    }
    if n == 0 {
        return Ok(Vec::new());
    }
    // The first request's layout gives the array's stride; every request must share it.
    let (first, stride) = read_request(ptr)?;
    let mut out = Vec::with_capacity(n);
    out.push(convert_request(&first)?);
    for i in 1..n {
        // SAFETY: `n` readable requests of `stride` bytes at `ptr` (caller contract).
        let at = unsafe { (ptr as *const u8).add(i * stride) } as *const kvb_request_t;
        let (r, size) = read_request(at)?;
        if size != stride {
            return Err(FfiError(
                kvb_status_t::KVB_STATUS_STRUCT_SIZE,
                format!(
                    "requests[{i}].struct_size is {size}, requests[0]'s is {stride}: one array \
                     holds one layout"
                ),
            ));
        }
        out.push(convert_request(&r)?);
    }
    Ok(out)
}
