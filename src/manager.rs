//! `KvCacheManager`: sequences and their tokens over one `WindowBlockManager` per attention-window
//! size. Admission, generation, store for reuse, release, block tables, stats, scheduling
//! simulation and estimates.
//!
//! Every public operation validates its arguments and checks capacity in every window before it
//! changes anything: a failed call leaves the manager exactly as it was.

use std::sync::Arc;
use std::time::Instant;

use crate::cuda::{CudaConfig, CudaDevice};
use crate::error::{KvError, KvResult};
use crate::events::{EventDelivery, EventQueue, KvCacheEvent};
use crate::eviction::DEFAULT_SECONDARY_OFFLOAD_MIN_PRIORITY;
use crate::key::MultimodalItem;
use crate::pool::{Level, PoolGeometry};
use crate::retention::{RetentionConfig, DEFAULT_PRIORITY};
use crate::sizing;
use crate::tree::PremixedMap;
use crate::window::{AdmissionPlan, AdmitItem, KeySource, WindowBlockManager, WindowConfig};

mod transfers;

/// Value written into offset tables where a sequence has no block.
pub const NO_BLOCK_OFFSET: i32 = i32::MAX;

/// Where the bytes of the pools live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyBackend {
    /// No bytes: bookkeeping only (copies are counted and dropped).
    None,
    /// Host byte buffers; copies are memcpy.
    HostMemory,
    /// GPU and pinned host pools; copies by a batched CUDA kernel (`crate::cuda`).
    Cuda,
}

/// One attention-window size and its pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowSpec {
    pub window_size: usize,
    pub primary_blocks: usize,
    pub secondary_blocks: usize,
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub size_per_head: usize,
}

#[derive(Clone, Debug)]
pub struct ManagerConfig {
    pub windows: Vec<WindowSpec>,
    pub tokens_per_block: usize,
    pub max_beam_width: usize,
    pub max_sequence_length: usize,
    pub enable_block_reuse: bool,
    pub enable_partial_reuse: bool,
    pub copy_on_partial_reuse: bool,
    pub onboard_blocks: bool,
    pub secondary_offload_min_priority: u8,
    pub bytes_per_element: usize,
    pub copy_backend: CopyBackend,
    /// Device, stream, ordering and pool ownership of the CUDA backend.
    pub cuda: CudaConfig,
    /// Time only moves through `advance_time` (tests).
    pub manual_clock: bool,
    /// Capacity of the event delivery buffer; 0 turns events off (and they cost nothing).
    pub max_kv_event_entries: usize,
    /// Attention data-parallel rank carried by every event.
    pub attention_dp_rank: Option<i32>,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        ManagerConfig {
            windows: Vec::new(),
            tokens_per_block: 32,
            max_beam_width: 1,
            max_sequence_length: 0,
            enable_block_reuse: true,
            enable_partial_reuse: true,
            copy_on_partial_reuse: true,
            onboard_blocks: true,
            secondary_offload_min_priority: DEFAULT_SECONDARY_OFFLOAD_MIN_PRIORITY,
            bytes_per_element: 2,
            copy_backend: CopyBackend::None,
            cuda: CudaConfig {
                allocate_pools: true,
                ..CudaConfig::default()
            },
            manual_clock: false,
            max_kv_event_entries: 0,
            attention_dp_rank: None,
        }
    }
}

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

    fn key_source(&self) -> KeySource<'_> {
        KeySource {
            token_ids: &self.token_ids,
            extra_ids: self.extra_ids.as_deref(),
            lora_task_id: self.lora_task_id,
            cache_salt: self.cache_salt,
            mm_items: &self.mm_items,
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

/// The scheduler's estimate of one request of a candidate batch (counting the requests before
/// it), equal to what `add_sequence_batch` then delivers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchEstimate {
    /// Prompt tokens that will be reused (the prepopulated length).
    pub reusable_tokens: usize,
    /// Blocks admission will allocate (the request's `alloc_total` delta), over windows.
    pub allocated_blocks: usize,
    /// Free primary blocks admission will consume (allocations and claimed free cached blocks),
    /// over windows.
    pub free_blocks_consumed: usize,
    pub reused_blocks: usize,
    pub missed_blocks: usize,
    /// Whether this request (and every one before it) fits in the free blocks.
    pub fits: bool,
}

/// A request's plan in every window.
#[derive(Clone, Debug)]
struct RequestPlan {
    matched_tokens: usize,
    windows: Vec<AdmissionPlan>,
}

/// Whole-manager statistics (reference §2.9; `max_num_blocks` counts host blocks too, as in
/// TensorRT-LLM).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KvCacheStats {
    pub max_num_blocks: u64,
    pub free_num_blocks: u64,
    pub used_num_blocks: u64,
    pub tokens_per_block: u64,
    pub alloc_total_blocks: u64,
    pub alloc_new_blocks: u64,
    pub reused_blocks: u64,
    pub missed_blocks: u64,
    pub cache_hit_rate: f64,
    pub num_primary_blocks: u64,
    pub num_secondary_blocks: u64,
    pub free_secondary_blocks: u64,
    pub offloaded_blocks: u64,
    pub onboarded_blocks: u64,
    /// Blocks that left a reuse tree (evicted, detached with an evicted ancestor, taken over).
    pub evicted_blocks: u64,
    pub allocated_bytes: u64,
}

/// Where a request is in its life, for the scheduler estimates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestPhase {
    /// Before its first context chunk.
    ContextInit,
    /// Between context chunks.
    ContextContinue,
    /// Generating.
    Generation,
    /// Finished or otherwise idle.
    Other,
}

/// Scheduler-side state of a request (what TensorRT-LLM reads from `LlmRequest`).
#[derive(Clone, Copy, Debug)]
pub struct RequestState {
    pub request_id: u64,
    pub phase: RequestPhase,
    pub prompt_len: usize,
    pub beam_width: usize,
    pub context_chunk_size: usize,
    pub num_draft_tokens: usize,
    pub max_new_tokens: usize,
    pub num_generated_tokens: usize,
}

/// One block of a reuse-tree snapshot: hash, parent hash (`None` = the root), level, priority.
pub type TreeEntry = (u64, Option<u64>, Level, u8);

/// Snapshot of one block, for tests and debugging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    pub level: Level,
    pub memory_index: u32,
    pub ref_count: u32,
    pub priority: u8,
    pub in_reuse_tree: bool,
    pub is_leaf: bool,
    pub is_free: bool,
    pub num_tokens: usize,
    pub hash: u64,
    /// Tree parent block id; -1 for the root; `None` when not in the tree.
    pub parent: Option<i64>,
}

#[derive(Clone, Debug)]
struct Sequence {
    input_length: usize,
    beam_width: usize,
    token_ids: Vec<i32>,
    extra_ids: Option<Vec<u64>>,
    lora_task_id: Option<u64>,
    cache_salt: Option<u64>,
    mm_items: Vec<MultimodalItem>,
    retention: RetentionConfig,
    num_tokens: usize,
    admission: Admission,
}

impl Sequence {
    fn key_source(&self) -> KeySource<'_> {
        KeySource {
            token_ids: &self.token_ids,
            extra_ids: self.extra_ids.as_deref(),
            lora_task_id: self.lora_task_id,
            cache_salt: self.cache_salt,
            mm_items: &self.mm_items,
        }
    }
}

#[derive(Clone, Debug)]
struct Clock {
    start: Instant,
    manual_ms: Option<u64>,
}

impl Clock {
    fn now_ms(&self) -> u64 {
        self.manual_ms
            .unwrap_or_else(|| self.start.elapsed().as_millis() as u64)
    }
}

/// The KV-cache manager.
#[derive(Debug)]
pub struct KvCacheManager {
    cfg: ManagerConfig,
    /// Ascending window size.
    windows: Vec<WindowBlockManager>,
    sequences: PremixedMap<u64, Sequence>,
    clock: Clock,
    /// The iteration's events (`None` when events are off).
    events: Option<EventQueue>,
    delivery: Arc<EventDelivery>,
    /// The GPU of the CUDA backend (shared with the windows' engines).
    cuda: Option<Arc<CudaDevice>>,
    /// Pools the engine still has to register (CUDA backend without own allocation).
    unregistered_pools: Vec<(usize, Level)>,
}

/// Moves a window's raw events into the iteration queue, in order.
fn absorb(events: &mut Option<EventQueue>, w: &mut WindowBlockManager) {
    if let Some(q) = events {
        q.absorb(w.window_size(), w.take_events());
    }
}

fn positive(v: usize, what: &str) -> KvResult<()> {
    if v == 0 {
        Err(KvError::InvalidConfig(format!("{what} must be positive")))
    } else {
        Ok(())
    }
}

impl KvCacheManager {
    /// Creates a manager; validates the config.
    pub fn new(mut cfg: ManagerConfig) -> KvResult<Self> {
        positive(cfg.tokens_per_block, "tokens_per_block")?;
        positive(cfg.max_beam_width, "max_beam_width")?;
        positive(cfg.max_sequence_length, "max_sequence_length")?;
        if cfg.windows.is_empty() {
            return Err(KvError::InvalidConfig(
                "at least one window is required".into(),
            ));
        }
        if cfg.secondary_offload_min_priority > crate::retention::MAX_PRIORITY {
            return Err(KvError::InvalidConfig(format!(
                "secondary_offload_min_priority {} is above 100",
                cfg.secondary_offload_min_priority
            )));
        }
        if cfg.tokens_per_block > u16::MAX as usize {
            return Err(KvError::InvalidConfig(
                "tokens_per_block is too large".into(),
            ));
        }
        cfg.windows.sort_by_key(|w| w.window_size);
        for pair in cfg.windows.windows(2) {
            if pair[0].window_size == pair[1].window_size {
                return Err(KvError::InvalidConfig(format!(
                    "window size {} is listed twice",
                    pair[0].window_size
                )));
            }
        }
        let cuda = transfers::open_device(cfg.copy_backend, &cfg.cuda)?;
        let mut windows = Vec::with_capacity(cfg.windows.len());
        for spec in &cfg.windows {
            positive(spec.window_size, "window_size")?;
            positive(spec.primary_blocks, "primary_blocks")?;
            if spec.primary_blocks + spec.secondary_blocks >= u32::MAX as usize {
                return Err(KvError::InvalidConfig(
                    "too many blocks in one window".into(),
                ));
            }
            let geometry = PoolGeometry {
                num_layers: spec.num_layers,
                kv_factor: 2,
                num_kv_heads: spec.num_kv_heads,
                size_per_head: spec.size_per_head,
                tokens_per_block: cfg.tokens_per_block,
                bytes_per_element: cfg.bytes_per_element,
            };
            let engine = transfers::window_engine(
                cfg.copy_backend,
                cuda.as_ref(),
                cfg.cuda.allocate_pools,
                spec,
                geometry,
            )?;
            let max_token_num = spec.window_size.max(cfg.max_sequence_length);
            let wc = WindowConfig {
                window_size: spec.window_size,
                num_primary: spec.primary_blocks,
                num_secondary: spec.secondary_blocks,
                tokens_per_block: cfg.tokens_per_block,
                max_token_num,
                max_blocks_per_seq: cfg
                    .max_sequence_length
                    .min(max_token_num)
                    .div_ceil(cfg.tokens_per_block),
                enable_reuse: cfg.enable_block_reuse,
                enable_partial_reuse: cfg.enable_partial_reuse,
                copy_on_partial_reuse: cfg.copy_on_partial_reuse,
                onboard_blocks: cfg.onboard_blocks,
                offload_min_priority: cfg.secondary_offload_min_priority,
                geometry,
            };
            windows.push(WindowBlockManager::new(wc, engine));
        }
        let clock = Clock {
            start: Instant::now(),
            manual_ms: cfg.manual_clock.then_some(0),
        };
        let delivery = Arc::new(EventDelivery::new(cfg.max_kv_event_entries));
        let events = (cfg.max_kv_event_entries > 0).then(|| {
            let sizes: Vec<usize> = windows.iter().map(|w| w.window_size()).collect();
            let mut q = EventQueue::new(&sizes, cfg.attention_dp_rank);
            for w in &mut windows {
                w.enable_events();
                let c = w.config();
                q.created(c.window_size, c.num_primary, c.num_secondary);
            }
            q
        });
        let unregistered_pools =
            transfers::pools_to_register(cfg.copy_backend, &cfg.cuda, &cfg.windows);
        Ok(KvCacheManager {
            cfg,
            windows,
            sequences: PremixedMap::default(),
            clock,
            events,
            delivery,
            cuda,
            unregistered_pools,
        })
    }

    pub fn config(&self) -> &ManagerConfig {
        &self.cfg
    }

    pub fn tokens_per_block(&self) -> usize {
        self.cfg.tokens_per_block
    }

    /// Window sizes in ascending order.
    pub fn window_sizes(&self) -> Vec<usize> {
        self.windows.iter().map(|w| w.window_size()).collect()
    }

    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Moves the manual clock forward.
    pub fn advance_time(&mut self, ms: u64) -> KvResult<()> {
        match &mut self.clock.manual_ms {
            Some(t) => {
                *t = t.saturating_add(ms);
                Ok(())
            }
            None => Err(KvError::Unsupported(
                "advance_time needs a manager created with manual_clock".into(),
            )),
        }
    }

    fn window_index(&self, window_size: usize) -> KvResult<usize> {
        self.windows
            .iter()
            .position(|w| w.window_size() == window_size)
            .ok_or_else(|| KvError::InvalidArgument(format!("no window of size {window_size}")))
    }

    pub fn window(&self, window_size: usize) -> KvResult<&WindowBlockManager> {
        Ok(&self.windows[self.window_index(window_size)?])
    }

    pub fn window_mut(&mut self, window_size: usize) -> KvResult<&mut WindowBlockManager> {
        let i = self.window_index(window_size)?;
        Ok(&mut self.windows[i])
    }

    fn sequence(&self, id: u64) -> KvResult<&Sequence> {
        self.sequences.get(&id).ok_or(KvError::UnknownRequest(id))
    }

    pub fn has_sequence(&self, id: u64) -> bool {
        self.sequences.contains_key(&id)
    }

    pub fn num_sequences(&self) -> usize {
        self.sequences.len()
    }

    /// Tokens (prompt + generated) of a sequence.
    pub fn num_tokens(&self, id: u64) -> KvResult<usize> {
        Ok(self.sequence(id)?.num_tokens)
    }

    fn validate_request(&self, req: &Request) -> KvResult<()> {
        if self.sequences.contains_key(&req.id) {
            return Err(KvError::DuplicateRequest(req.id));
        }
        if req.input_length == 0 {
            return Err(KvError::InvalidArgument(
                "input_length must be positive".into(),
            ));
        }
        if req.token_ids.len() < req.input_length {
            return Err(KvError::TooFewTokens {
                input_length: req.input_length,
                num_tokens: req.token_ids.len(),
            });
        }
        if req.beam_width == 0 {
            return Err(KvError::InvalidArgument(
                "beam_width must be positive".into(),
            ));
        }
        if req.beam_width > self.cfg.max_beam_width {
            return Err(KvError::BeamWidthExceeded {
                beam_width: req.beam_width,
                max: self.cfg.max_beam_width,
            });
        }
        if req.input_length > self.cfg.max_sequence_length {
            return Err(KvError::SequenceTooLong {
                length: req.input_length,
                max: self.cfg.max_sequence_length,
            });
        }
        if let Some(extra) = &req.extra_ids {
            if extra.len() < req.input_length {
                return Err(KvError::InvalidArgument(format!(
                    "{} token extra ids for input length {}",
                    extra.len(),
                    req.input_length
                )));
            }
        }
        for item in &req.mm_items {
            if item.position < 0 || item.length <= 0 {
                return Err(KvError::InvalidArgument(format!(
                    "multimodal item at position {} with length {} is invalid",
                    item.position, item.length
                )));
            }
        }
        Ok(())
    }

    /// Plans a batch in order (phase 1, read-only): each request is planned in every window
    /// against the claims of the requests before it. Reuse is capped so that every window
    /// reuses the same number of tokens (the minimum over windows): the engine recomputes from
    /// there, and no window holds reused blocks that the engine would write again.
    fn plan_batch(&mut self, reqs: &[Request]) -> KvResult<Vec<RequestPlan>> {
        let mut ids = std::collections::HashSet::with_capacity(reqs.len());
        for req in reqs {
            self.validate_request(req)?;
            if !ids.insert(req.id) {
                return Err(KvError::DuplicateRequest(req.id));
            }
        }
        for w in &mut self.windows {
            w.begin_batch();
        }
        let mut plans = Vec::with_capacity(reqs.len());
        for req in reqs {
            let src = req.key_source();
            let mut cap = usize::MAX;
            let per_window = loop {
                let p: Vec<AdmissionPlan> = self
                    .windows
                    .iter_mut()
                    .map(|w| w.plan_admission(&src, req.input_length, req.beam_width, cap))
                    .collect();
                let min = p.iter().map(|x| x.matched_tokens).min().unwrap_or(0);
                if p.iter().all(|x| x.matched_tokens == min) {
                    break p;
                }
                cap = min;
            };
            // The last request's claims constrain nobody.
            if plans.len() + 1 < reqs.len() {
                for (w, plan) in self.windows.iter_mut().zip(&per_window) {
                    w.record_claims(plan);
                }
            }
            plans.push(RequestPlan {
                matched_tokens: per_window[0].matched_tokens,
                windows: per_window,
            });
        }
        Ok(plans)
    }

    /// How many requests of a planned batch fit: all of them, or none, or (with
    /// `longest_prefix`) the longest prefix whose blocks are free in every window.
    fn fitting_prefix(&self, plans: &[RequestPlan], longest_prefix: bool) -> KvResult<usize> {
        let mut needed = vec![0usize; self.windows.len()];
        for (i, plan) in plans.iter().enumerate() {
            for (wi, w) in self.windows.iter().enumerate() {
                needed[wi] += plan.windows[wi].primary_blocks_needed;
                let available = w.num_free(Level::Primary);
                if needed[wi] > available {
                    if longest_prefix {
                        return Ok(i);
                    }
                    let total: usize = plans
                        .iter()
                        .map(|p| p.windows[wi].primary_blocks_needed)
                        .sum();
                    return Err(KvError::OutOfBlocks {
                        window_size: w.window_size(),
                        needed: total,
                        available,
                    });
                }
            }
        }
        Ok(plans.len())
    }

    /// What admitting `reqs` in this order would deliver, request by request, without changing
    /// anything: the scheduler's estimate. `add_sequence_batch` on the same state delivers
    /// exactly this (same reused tokens, allocations and free blocks consumed).
    pub fn estimate_batch(&mut self, reqs: &[Request]) -> KvResult<Vec<BatchEstimate>> {
        let plans = self.plan_batch(reqs)?;
        let fitting = self.fitting_prefix(&plans, true)?;
        Ok(plans
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut e = BatchEstimate {
                    reusable_tokens: p.matched_tokens,
                    fits: i < fitting,
                    ..BatchEstimate::default()
                };
                for wp in &p.windows {
                    e.allocated_blocks += wp.allocations;
                    e.free_blocks_consumed += wp.free_blocks_consumed();
                    e.reused_blocks += wp.steps.len();
                    e.missed_blocks += wp.num_context_blocks - wp.steps.len();
                }
                e
            })
            .collect())
    }

    /// Admits a batch of requests (TensorRT-LLM `addSequenceBatch`) with a two-phase pre-claim:
    /// every reusable block of every request is claimed before anything is onboarded or
    /// allocated, so one request's allocations cannot evict what another was counted on
    /// reusing. All or nothing: when the batch does not fit, fails with `OutOfBlocks` and
    /// changes nothing; with `longest_prefix`, admits the longest prefix that fits instead and
    /// returns only its admissions.
    pub fn add_sequence_batch(
        &mut self,
        reqs: &[Request],
        longest_prefix: bool,
    ) -> KvResult<Vec<Admission>> {
        self.add_sequence_batch_owned(reqs.to_vec(), longest_prefix)
    }

    /// `add_sequence_batch` taking the requests by value: their token vectors become the
    /// sequences' (no copy of the prompts).
    pub fn add_sequence_batch_owned(
        &mut self,
        mut reqs: Vec<Request>,
        longest_prefix: bool,
    ) -> KvResult<Vec<Admission>> {
        self.require_pools()?;
        let plans = self.plan_batch(&reqs)?;
        let n = self.fitting_prefix(&plans, longest_prefix)?;
        reqs.truncate(n);
        let plans = &plans[..n];
        let now = self.now_ms();
        let mut alloc_new = vec![0u64; n];
        for (wi, w) in self.windows.iter_mut().enumerate() {
            let items: Vec<AdmitItem<'_>> = reqs
                .iter()
                .zip(plans)
                .map(|(r, p)| AdmitItem {
                    id: r.id,
                    src: r.key_source(),
                    input_length: r.input_length,
                    beam_width: r.beam_width,
                    retention: &r.retention,
                    plan: &p.windows[wi],
                })
                .collect();
            for (total, new) in alloc_new.iter_mut().zip(w.admit_batch(&items, now)) {
                *total += new;
            }
            absorb(&mut self.events, w);
        }
        let admissions: Vec<Admission> = plans
            .iter()
            .zip(&alloc_new)
            .map(|(plan, &new)| {
                let mut stats = RequestStats {
                    alloc_new_blocks: new,
                    ..RequestStats::default()
                };
                for wp in &plan.windows {
                    stats.reused_blocks += wp.steps.len() as u64;
                    stats.missed_blocks += (wp.num_context_blocks - wp.steps.len()) as u64;
                    stats.alloc_total_blocks += wp.allocations as u64;
                }
                Admission {
                    prepopulated_prompt_len: plan.matched_tokens,
                    stats,
                }
            })
            .collect();
        for (mut req, admission) in reqs.into_iter().zip(&admissions) {
            let input = req.input_length;
            req.token_ids.truncate(input);
            if let Some(extra) = &mut req.extra_ids {
                extra.truncate(input);
            }
            self.sequences.insert(
                req.id,
                Sequence {
                    input_length: input,
                    beam_width: req.beam_width,
                    token_ids: req.token_ids,
                    extra_ids: req.extra_ids,
                    lora_task_id: req.lora_task_id,
                    cache_salt: req.cache_salt,
                    mm_items: req.mm_items,
                    retention: req.retention,
                    num_tokens: input,
                    admission: *admission,
                },
            );
        }
        Ok(admissions)
    }

    /// Admits one request (TensorRT-LLM `addSequence`): a batch of one. Reuses what the tree
    /// holds, onboards host blocks, copies partial matches and allocates the rest. Fails with
    /// `OutOfBlocks` (nothing changed) when any window lacks blocks.
    pub fn add_sequence(&mut self, req: &Request) -> KvResult<Admission> {
        self.add_sequence_owned(req.clone())
    }

    /// `add_sequence` taking the request by value (its tokens are not copied).
    pub fn add_sequence_owned(&mut self, req: Request) -> KvResult<Admission> {
        let mut admitted = self.add_sequence_batch_owned(vec![req], false)?;
        Ok(admitted.pop().expect("a batch of one admitted"))
    }

    /// Appends a generated token (TensorRT-LLM `addToken`): detaches out-of-window blocks and
    /// allocates a new block when the sequence crosses a block boundary.
    pub fn add_token(&mut self, id: u64, token_id: i32) -> KvResult<()> {
        let seq = self.sequence(id)?;
        let num_tokens = seq.num_tokens + 1;
        if num_tokens > self.cfg.max_sequence_length {
            return Err(KvError::SequenceTooLong {
                length: num_tokens,
                max: self.cfg.max_sequence_length,
            });
        }
        let max_len = self.cfg.max_sequence_length;
        for w in &self.windows {
            w.check_add_token(id, num_tokens, w.config().is_swa(max_len))?;
        }
        let now = self.now_ms();
        let seq = self.sequences.get_mut(&id).expect("checked");
        seq.num_tokens = num_tokens;
        seq.token_ids.push(token_id);
        if let Some(extra) = &mut seq.extra_ids {
            extra.push(0);
        }
        let decode = seq.retention.decode_retention();
        for w in &mut self.windows {
            let swa = w.config().is_swa(max_len);
            w.add_token(id, num_tokens, swa, decode, now);
            absorb(&mut self.events, w);
        }
        Ok(())
    }

    /// Removes the last `n` tokens (TensorRT-LLM `rewindKVCache`; `removeToken` is `n = 1`).
    /// Blocks no longer needed go to the front of their free queue. The new last block, which
    /// the sequence will write again, is copied first when other sequences share it and leaves
    /// the reuse tree when it was cached (TensorRT-LLM would overwrite cached KV in place).
    /// Beam width 1 only; the prompt cannot be rewound.
    pub fn rewind(&mut self, id: u64, n: usize) -> KvResult<()> {
        let seq = self.sequence(id)?;
        if seq.beam_width != 1 {
            return Err(KvError::Unsupported("rewinding needs beam width 1".into()));
        }
        if n > seq.num_tokens - seq.input_length {
            return Err(KvError::InvalidArgument(format!(
                "cannot rewind {n} tokens: only {} were generated",
                seq.num_tokens - seq.input_length
            )));
        }
        let target = seq.num_tokens - n;
        if let Some(w) = self.windows.iter().find(|w| !w.can_shrink_to(id, target)) {
            return Err(KvError::Unsupported(format!(
                "rewinding to {target} tokens would reach blocks window {} already detached",
                w.window_size()
            )));
        }
        for w in &self.windows {
            w.check_remove_tokens(id, target)?;
        }
        let now = self.now_ms();
        let decode = seq.retention.decode_retention();
        for w in &mut self.windows {
            w.remove_tokens(id, target, decode, now);
            absorb(&mut self.events, w);
        }
        let seq = self.sequences.get_mut(&id).expect("checked");
        seq.num_tokens = target;
        seq.token_ids.truncate(target);
        if let Some(extra) = &mut seq.extra_ids {
            extra.truncate(target);
        }
        Ok(())
    }

    /// Stores the full blocks of the prompt computed so far (`context_position` tokens, never
    /// the last prompt token) for reuse, after a context chunk. Windows are visited largest
    /// first; sequences with beam search or an invalidated window are skipped there.
    pub fn store_context_blocks(&mut self, id: u64, context_position: usize) -> KvResult<()> {
        let seq = self.sequence(id)?;
        if context_position > seq.input_length {
            return Err(KvError::InvalidArgument(format!(
                "context position {context_position} is beyond the input length {}",
                seq.input_length
            )));
        }
        if !self.cfg.enable_block_reuse {
            return Ok(());
        }
        let n = context_position.min(seq.input_length - 1);
        let seq = self.sequences.get(&id).expect("checked");
        let src = seq.key_source();
        for w in self.windows.iter_mut().rev() {
            if w.is_valid_for_store(id) {
                w.store_blocks(id, &src, n, false, false);
                absorb(&mut self.events, w);
            }
        }
        Ok(())
    }

    /// Stores a decode block that just became full (TensorRT-LLM `storeNewBlock`): a no-op unless
    /// the last token opened a new block. Skipped for beam search and sliding windows.
    pub fn store_new_block(&mut self, id: u64) -> KvResult<()> {
        let seq = self.sequence(id)?;
        let tpb = self.cfg.tokens_per_block;
        if !self.cfg.enable_block_reuse || seq.beam_width > 1 || (seq.num_tokens - 1) % tpb != 0 {
            return Ok(());
        }
        let max_len = self.cfg.max_sequence_length;
        let n = seq.num_tokens - 1;
        let seq = self.sequences.get(&id).expect("checked");
        let src = seq.key_source();
        for w in self.windows.iter_mut().rev() {
            if !w.config().is_swa(max_len) && w.is_valid_for_store(id) {
                w.store_blocks(id, &src, n, false, false);
                absorb(&mut self.events, w);
            }
        }
        Ok(())
    }

    /// Stores every computed token of the sequence (partial last block included) for reuse,
    /// optionally pinning the path; returns the pinned block ids of `pin_window` (the smallest
    /// window when `None`).
    pub fn store_blocks_for_reuse(
        &mut self,
        id: u64,
        pin: bool,
        pin_window: Option<usize>,
    ) -> KvResult<Vec<u32>> {
        let pin_window = match pin_window {
            Some(w) => self.window_index(w)?,
            None => 0,
        };
        let seq = self.sequence(id)?;
        if !self.cfg.enable_block_reuse || seq.beam_width > 1 {
            return Ok(Vec::new());
        }
        let n = seq.num_tokens - 1;
        let seq = self.sequences.get(&id).expect("checked");
        let src = seq.key_source();
        let mut out = Vec::new();
        for (i, w) in self.windows.iter_mut().enumerate().rev() {
            if w.is_valid_for_store(id) {
                let (_, pinned) = w.store_blocks(id, &src, n, true, pin);
                absorb(&mut self.events, w);
                if i == pin_window {
                    out = pinned;
                }
            }
        }
        Ok(out)
    }

    /// Releases a finished sequence (TensorRT-LLM `removeSequence`): stores it for reuse first
    /// when asked (beam 1, reuse on, still valid), then releases its blocks last to first.
    pub fn remove_sequence(&mut self, id: u64, store_for_reuse: bool) -> KvResult<()> {
        let seq = self.sequence(id)?;
        if store_for_reuse && self.cfg.enable_block_reuse && seq.beam_width == 1 {
            let all_valid = self.windows.iter().all(|w| w.is_valid_for_store(id));
            if all_valid {
                self.store_blocks_for_reuse(id, false, None)?;
            }
        }
        let now = self.now_ms();
        for w in &mut self.windows {
            w.release_sequence(id, now);
        }
        self.sequences.remove(&id);
        Ok(())
    }

    /// Pins every block of a sequence in every window so it survives `remove_sequence`.
    pub fn pin_blocks(&mut self, id: u64) -> KvResult<()> {
        self.sequence(id)?;
        for w in &mut self.windows {
            w.pin_sequence(id);
        }
        Ok(())
    }

    /// Drops one pin of each listed block of `window_size`.
    pub fn unpin_blocks_by_id(&mut self, window_size: usize, ids: &[u32]) -> KvResult<()> {
        let i = self.window_index(window_size)?;
        self.windows[i].check_unpin(ids)?;
        let now = self.now_ms();
        self.windows[i].unpin(ids, now);
        Ok(())
    }

    /// Block ids of one beam of a sequence in one window.
    pub fn cache_block_ids(&self, id: u64, window_size: usize, beam: usize) -> KvResult<Vec<u32>> {
        let seq = self.sequence(id)?;
        if beam >= seq.beam_width {
            return Err(KvError::InvalidArgument(format!(
                "beam {beam} of a sequence with beam width {}",
                seq.beam_width
            )));
        }
        let w = self.window(window_size)?;
        Ok(w.block_ids(id, beam).unwrap_or(&[]).to_vec())
    }

    /// `(max blocks per sequence over windows, number of pools)`: the last and first dimensions
    /// of an offset table `[pools][slots][2][max_blocks]`.
    pub fn offset_table_dimensions(&self) -> (usize, usize) {
        let max_blocks = self
            .windows
            .iter()
            .map(|w| w.config().max_blocks_per_seq)
            .max()
            .unwrap_or(0);
        (max_blocks, self.windows.len())
    }

    /// Writes a sequence's block offsets into `table`, laid out `[pool][slot][K|V][block]` with
    /// `num_slots` slots, at slots `slot_offset..slot_offset + beam_width` (one pool per window,
    /// ascending). The entry of block b is `memory_index(b) * 2 * layers + field`; unused entries
    /// of the written rows are `NO_BLOCK_OFFSET`. Returns the most blocks of any beam.
    pub fn copy_block_offsets(
        &self,
        table: &mut [i32],
        num_slots: usize,
        slot_offset: usize,
        id: u64,
    ) -> KvResult<usize> {
        let seq = self.sequence(id)?;
        let (max_blocks, num_pools) = self.offset_table_dimensions();
        let needed = num_pools * num_slots * 2 * max_blocks;
        if table.len() < needed {
            return Err(KvError::BufferTooSmall {
                needed,
                given: table.len(),
            });
        }
        if slot_offset + seq.beam_width > num_slots {
            return Err(KvError::InvalidArgument(format!(
                "slots {slot_offset}..{} exceed the table's {num_slots} slots",
                slot_offset + seq.beam_width
            )));
        }
        let mut max_count = 0;
        for (pool, w) in self.windows.iter().enumerate() {
            let layers = w.config().geometry.num_layers.max(1) as i64;
            for beam in 0..seq.beam_width {
                let ids = w.block_ids(id, beam).unwrap_or(&[]);
                max_count = max_count.max(ids.len());
                for field in 0..2 {
                    let base = ((pool * num_slots + slot_offset + beam) * 2 + field) * max_blocks;
                    let row = &mut table[base..base + max_blocks];
                    row.fill(NO_BLOCK_OFFSET);
                    for (slot, &b) in row.iter_mut().zip(ids) {
                        let mem = i64::from(w.arena().row(b).index);
                        *slot = (mem * layers * 2 + field as i64) as i32;
                    }
                }
            }
        }
        Ok(max_count)
    }

    /// Offsets of a batch: request `i` of `ids` goes to slots `i * beam_width ..`. (TensorRT-LLM
    /// takes a first slot index and treats `first + i` as a request id; this takes the ids.)
    pub fn block_offsets_of_batch(
        &self,
        table: &mut [i32],
        num_slots: usize,
        ids: &[u64],
        beam_width: usize,
    ) -> KvResult<()> {
        for &id in ids {
            let seq = self.sequence(id)?;
            if seq.beam_width > beam_width {
                return Err(KvError::InvalidArgument(format!(
                    "request {id} has beam width {} > {beam_width}",
                    seq.beam_width
                )));
            }
        }
        if ids.len() * beam_width > num_slots {
            return Err(KvError::InvalidArgument(format!(
                "{} requests × {beam_width} beams exceed {num_slots} slots",
                ids.len()
            )));
        }
        for (i, &id) in ids.iter().enumerate() {
            self.copy_block_offsets(table, num_slots, i * beam_width, id)?;
        }
        Ok(())
    }

    pub fn stats(&self) -> KvCacheStats {
        let mut s = KvCacheStats {
            tokens_per_block: self.cfg.tokens_per_block as u64,
            ..KvCacheStats::default()
        };
        for w in &self.windows {
            let c = w.config();
            let ws = w.stats();
            s.max_num_blocks += (c.num_primary + c.num_secondary) as u64;
            s.num_primary_blocks += c.num_primary as u64;
            s.num_secondary_blocks += c.num_secondary as u64;
            s.free_num_blocks += w.num_free(Level::Primary) as u64;
            s.free_secondary_blocks += w.num_free(Level::Secondary) as u64;
            s.alloc_total_blocks += ws.alloc_total;
            s.alloc_new_blocks += ws.alloc_new;
            s.reused_blocks += ws.reused;
            s.missed_blocks += ws.missed;
            s.offloaded_blocks += ws.offloaded;
            s.onboarded_blocks += ws.onboarded;
            s.evicted_blocks += ws.evicted_from_tree;
            s.allocated_bytes += (c.geometry.row_bytes() * c.num_primary) as u64;
        }
        s.used_num_blocks = s.max_num_blocks.saturating_sub(s.free_num_blocks);
        s.cache_hit_rate = RequestStats {
            reused_blocks: s.reused_blocks,
            missed_blocks: s.missed_blocks,
            ..RequestStats::default()
        }
        .hit_rate();
        s
    }

    /// Free primary blocks summed over windows.
    pub fn num_free_blocks(&self) -> usize {
        self.windows
            .iter()
            .map(|w| w.num_free(Level::Primary))
            .sum()
    }

    /// `(primary, secondary)` free blocks of one window.
    pub fn num_free_blocks_of_window(&self, window_size: usize) -> KvResult<(usize, usize)> {
        let w = self.window(window_size)?;
        Ok((w.num_free(Level::Primary), w.num_free(Level::Secondary)))
    }

    /// The admission result of a sequence (prepopulated length and per-request counters).
    pub fn admission(&self, id: u64) -> KvResult<Admission> {
        Ok(self.sequence(id)?.admission)
    }

    pub fn start_scheduling(&mut self) {
        for w in &mut self.windows {
            w.start_scheduling();
        }
    }

    pub fn scheduling_remove_sequence(&mut self, id: u64) -> KvResult<()> {
        self.sequence(id)?;
        for w in &mut self.windows {
            w.scheduling_remove_sequence(id);
        }
        Ok(())
    }

    pub fn scheduling_has_free_blocks(&self, n: usize, window_size: usize) -> KvResult<bool> {
        Ok(self.window(window_size)?.scheduling_free_blocks() >= n)
    }

    /// Blocks the next step of a request needs in one window (TensorRT-LLM
    /// `getNeededBlocksOneStep`). With reuse on and `request` given, a first context chunk does
    /// not count blocks already referenced by other sequences.
    pub fn needed_blocks_one_step(
        &mut self,
        state: &RequestState,
        request: Option<&Request>,
        two_steps_look_ahead: bool,
        window_size: usize,
    ) -> KvResult<usize> {
        let wi = self.window_index(window_size)?;
        let tpb = self.cfg.tokens_per_block;
        let beam = state.beam_width.max(1);
        match state.phase {
            RequestPhase::ContextInit => {
                let len = (state.prompt_len + state.num_draft_tokens)
                    .min(window_size.saturating_add(state.context_chunk_size));
                let shared = len / tpb;
                let unshared = usize::from(len % tpb != 0) * beam;
                let reusable = match request {
                    Some(r) if self.cfg.enable_block_reuse && self.windows.len() == 1 => {
                        let src = r.key_source();
                        self.windows[wi]
                            .count_reusable_blocks(&src, r.input_length, true)
                            .min(shared)
                    }
                    _ => 0,
                };
                Ok(shared + unshared - reusable)
            }
            RequestPhase::Generation => {
                let seq = self.sequence(state.request_id)?;
                let current = seq.num_tokens;
                let steps = if two_steps_look_ahead { 2 } else { 1 };
                let add = (steps * (state.num_draft_tokens + 1)).min(
                    state
                        .max_new_tokens
                        .saturating_sub(state.num_generated_tokens),
                );
                let max_token_num = self.windows[wi].config().max_token_num;
                if current + add > max_token_num {
                    return Ok(0);
                }
                Ok(((current + add).div_ceil(tpb) - current.div_ceil(tpb)) * beam)
            }
            _ => Ok(0),
        }
    }

    /// Blocks a request still needs in one window until it completes (TensorRT-LLM
    /// `getRemainingBlocksToCompletion`); reusable blocks already referenced by other
    /// sequences are not counted for a request not yet admitted.
    pub fn remaining_blocks_to_completion(
        &mut self,
        state: &RequestState,
        request: Option<&Request>,
        window_size: usize,
    ) -> KvResult<usize> {
        let wi = self.window_index(window_size)?;
        let tpb = self.cfg.tokens_per_block;
        let beam = state.beam_width.max(1);
        // Admission allocates the whole prompt, also in a sliding window (blocks that leave
        // the window are detached only while generating), so the prompt is never capped by
        // the window here (TensorRT-LLM caps it, which undercounts long prompts).
        let context_tokens = state.prompt_len;
        let context_blocks = context_tokens / tpb;
        let total_tokens = (state.prompt_len + state.max_new_tokens)
            .min(window_size)
            .max(state.prompt_len);
        let total_blocks = total_tokens.div_ceil(tpb);
        let generation_blocks = total_blocks - context_blocks;
        let extra = usize::from(state.prompt_len + state.max_new_tokens > window_size);
        let allocated = self.windows[wi]
            .block_ids(state.request_id, 0)
            .map_or(0, |ids| ids.len());
        let reusable = match request {
            Some(r) if allocated == 0 && self.cfg.enable_block_reuse => {
                let src = r.key_source();
                self.windows[wi]
                    .count_reusable_blocks(&src, r.input_length, true)
                    .min(context_blocks)
            }
            _ => 0,
        };
        if allocated < context_blocks {
            Ok(context_blocks - allocated - reusable + (generation_blocks + extra) * beam)
        } else {
            Ok((total_blocks.saturating_sub(allocated) + extra) * beam)
        }
    }

    /// Consecutive full prompt blocks of `request` found in one window's tree.
    pub fn count_reusable_blocks(
        &mut self,
        request: &Request,
        window_size: usize,
        only_allocated: bool,
    ) -> KvResult<usize> {
        let wi = self.window_index(window_size)?;
        if request.token_ids.len() < request.input_length {
            return Err(KvError::TooFewTokens {
                input_length: request.input_length,
                num_tokens: request.token_ids.len(),
            });
        }
        let src = request.key_source();
        Ok(self.windows[wi].count_reusable_blocks(&src, request.input_length, only_allocated))
    }

    /// Most requests of `input + output` tokens the primary pools can hold at once.
    pub fn max_capacity_batch_size(&self, input: usize, output: usize) -> usize {
        self.windows
            .iter()
            .map(|w| {
                let c = w.config();
                c.num_primary
                    / sizing::max_block_requirements(
                        input,
                        output,
                        c.window_size,
                        self.cfg.max_beam_width,
                        c.tokens_per_block,
                    )
                    .max(1)
            })
            .min()
            .unwrap_or(0)
    }

    /// Expires timed retentions and syncs transfers (once per iteration).
    pub fn refresh_blocks(&mut self) {
        let now = self.now_ms();
        for w in &mut self.windows {
            w.refresh(now);
            absorb(&mut self.events, w);
        }
    }

    /// Offloads a free primary block of one window to the host tier.
    pub fn offload_block(&mut self, window_size: usize, block: u32) -> KvResult<bool> {
        let now = self.now_ms();
        let i = self.window_index(window_size)?;
        let done = self.windows[i].offload_block(block, now)?;
        absorb(&mut self.events, &mut self.windows[i]);
        Ok(done)
    }

    /// Ends the iteration's events (TensorRT-LLM `flushIterationEvents`): commits every window's
    /// pending removals and hands the events to the delivery buffer. Returns how many.
    pub fn flush_iteration_events(&mut self) -> usize {
        let Some(q) = &mut self.events else {
            return 0;
        };
        let batch = q.flush();
        let n = batch.len();
        self.delivery.push(batch);
        n
    }

    /// The delivery buffer, drained by `EventDelivery::drain` from any thread.
    pub fn event_delivery(&self) -> Arc<EventDelivery> {
        self.delivery.clone()
    }

    /// Flushes and drains without waiting (single-threaded use and tests).
    pub fn take_flushed_events(&mut self) -> Vec<KvCacheEvent> {
        self.flush_iteration_events();
        self.delivery.drain(std::time::Duration::ZERO).events
    }

    /// Every block in one window's reuse tree as `(hash, parent hash (None = root), level,
    /// priority)`, for checking an event consumer's view.
    pub fn reuse_tree_snapshot(&self, window_size: usize) -> KvResult<Vec<TreeEntry>> {
        let w = self.window(window_size)?;
        let tree = w.tree();
        let mut out = Vec::with_capacity(tree.num_in_tree());
        for b in 0..w.num_blocks() as u32 {
            if let Some(parent) = tree.parent(b) {
                let parent_hash = (parent != tree.root()).then(|| tree.hash(parent));
                out.push((tree.hash(b), parent_hash, w.arena().level(b), w.priority(b)));
            }
        }
        Ok(out)
    }

    /// Priority of a block, or the default (35) for an invalid id.
    pub fn priority_by_block_id(&self, window_size: usize, block: i64) -> KvResult<u8> {
        let w = self.window(window_size)?;
        if block < 0 || block as usize >= w.num_blocks() {
            return Ok(DEFAULT_PRIORITY);
        }
        Ok(w.priority(block as u32))
    }

    /// Last block of beam 0 in the smallest window.
    pub fn last_block_id(&self, id: u64) -> KvResult<u32> {
        self.sequence(id)?;
        self.windows[0]
            .block_ids(id, 0)
            .and_then(|ids| ids.last().copied())
            .ok_or(KvError::UnknownRequest(id))
    }

    /// A snapshot of one block.
    pub fn block_info(&self, window_size: usize, block: u32) -> KvResult<BlockInfo> {
        let w = self.window(window_size)?;
        if block as usize >= w.num_blocks() {
            return Err(KvError::InvalidArgument(format!(
                "block id {block} out of range"
            )));
        }
        let row = w.arena().row(block);
        let tree = w.tree();
        Ok(BlockInfo {
            level: row.level,
            memory_index: row.index,
            ref_count: w.arena().ref_count(block),
            priority: w.priority(block),
            in_reuse_tree: tree.is_in_tree(block),
            is_leaf: tree.is_leaf(block),
            is_free: w.queues().is_queued(block),
            num_tokens: if tree.has_key(block) {
                tree.key(block).len()
            } else {
                0
            },
            hash: tree.hash(block),
            parent: tree
                .parent(block)
                .map(|p| if p == tree.root() { -1 } else { i64::from(p) }),
        })
    }

    /// Verifies the invariants of reference §10 in every window and per sequence; the error
    /// names the first violation.
    pub fn check_invariants(&self) -> KvResult<()> {
        let max_len = self.cfg.max_sequence_length;
        for w in &self.windows {
            w.verify(
                |id| {
                    self.sequences
                        .get(&id)
                        .map(|s| (s.num_tokens, s.input_length))
                },
                max_len,
            )
            .map_err(KvError::InvariantViolation)?;
            for &id in self.sequences.keys() {
                if !w.has_sequence(id) {
                    return Err(KvError::InvariantViolation(format!(
                        "sequence {id} has no blocks in window {}",
                        w.window_size()
                    )));
                }
            }
        }
        for (&id, s) in &self.sequences {
            if s.admission.prepopulated_prompt_len >= s.input_length {
                return Err(KvError::InvariantViolation(format!(
                    "sequence {id} reuses its whole prompt"
                )));
            }
            if s.token_ids.len() != s.num_tokens {
                return Err(KvError::InvariantViolation(format!(
                    "sequence {id} has {} tokens recorded for length {}",
                    s.token_ids.len(),
                    s.num_tokens
                )));
            }
        }
        Ok(())
    }
}
