//! A request as admission sees it, and what admitting it delivered.

use crate::key::MultimodalItem;
use crate::retention::RetentionConfig;
use crate::window::KeySource;

/// What the manager needs of a request (TensorRT-LLM's `LlmRequest` fields).
#[derive(Clone, Debug, Default)]
pub struct Request {
    pub id: u64,
    pub input_length: usize,
    pub beam_width: usize,
    pub token_ids: Vec<i32>,
    pub extra_ids: Option<Vec<u64>>,
    pub lora_task_id: Option<u64>,
    pub cache_salt: Option<u64>,
    pub mm_items: Vec<MultimodalItem>,
    pub retention: RetentionConfig,
    /// The request opts out of reuse (TensorRT-LLM's per-call `isEnableBlockReuse = false`):
    /// it reuses no cached block, and nothing of it is ever stored. Beams then share a last
    /// prompt block the prompt fills, as they do in a manager without reuse.
    pub disable_reuse: bool,
}

impl Request {
    /// A plain request: beam 1, input length = number of tokens.
    pub fn new(id: u64, token_ids: Vec<i32>) -> Self {
        Request {
            id,
            input_length: token_ids.len(),
            beam_width: 1,
            token_ids,
            ..Request::default()
        }
    }

    pub(super) fn key_source(&self) -> KeySource<'_> {
        self.as_ref().key_source()
    }

    /// The request's fields borrowed, as admission takes them.
    pub fn as_ref(&self) -> RequestRef<'_> {
        RequestRef {
            id: self.id,
            input_length: self.input_length,
            beam_width: self.beam_width,
            token_ids: &self.token_ids,
            extra_ids: self.extra_ids.as_deref(),
            lora_task_id: self.lora_task_id,
            cache_salt: self.cache_salt,
            mm_items: &self.mm_items,
            retention: &self.retention,
            disable_reuse: self.disable_reuse,
        }
    }
}

/// A request whose arrays are borrowed from the caller for the duration of one call: admission
/// plans against the caller's tokens and copies them (once) only into the key slots of the blocks
/// of a sequence it admits, so an admission that does not fit copies nothing.
#[derive(Clone, Copy, Debug)]
pub struct RequestRef<'a> {
    pub id: u64,
    pub input_length: usize,
    pub beam_width: usize,
    pub token_ids: &'a [i32],
    pub extra_ids: Option<&'a [u64]>,
    pub lora_task_id: Option<u64>,
    pub cache_salt: Option<u64>,
    pub mm_items: &'a [MultimodalItem],
    pub retention: &'a RetentionConfig,
    /// See `Request::disable_reuse`.
    pub disable_reuse: bool,
}

impl<'a> RequestRef<'a> {
    pub(super) fn key_source(&self) -> KeySource<'a> {
        KeySource {
            token_ids: self.token_ids,
            extra_ids: self.extra_ids,
            lora_task_id: self.lora_task_id,
            cache_salt: self.cache_salt,
            mm_items: self.mm_items,
        }
    }
}

/// Per-request allocation counters of one admission, summed over windows.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RequestStats {
    pub alloc_total_blocks: u64,
    pub alloc_new_blocks: u64,
    pub reused_blocks: u64,
    pub missed_blocks: u64,
}

impl RequestStats {
    pub fn hit_rate(&self) -> f64 {
        if self.reused_blocks == 0 {
            0.0
        } else {
            self.reused_blocks as f64 / (self.reused_blocks + self.missed_blocks) as f64
        }
    }
}

/// Result of admitting one sequence.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Admission {
    /// Prompt tokens whose KV is already in the cache (the engine starts computing here).
    pub prepopulated_prompt_len: usize,
    pub stats: RequestStats,
}
