//! Configuration, its validation, and construction of the manager and its windows.

use std::sync::Arc;
use std::time::Instant;

use super::{transfers, Clock, KvCacheManager};
use crate::cuda::CudaConfig;
use crate::error::{KvError, KvResult};
use crate::events::{EventDelivery, EventQueue};
use crate::eviction::DEFAULT_SECONDARY_OFFLOAD_MIN_PRIORITY;
use crate::pool::PoolGeometry;
use crate::premixed::PremixedMap;
use crate::transfer::CopyEngine;
use crate::window::{WindowBlockManager, WindowConfig};

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
    /// `resume` is refused while the GPU utilization (the maximum over windows of (total −
    /// free − movable) / total) is above this, in (0, 1].
    pub max_utilization_for_resume: f64,
    /// Consecutive scheduling passes without progress after which `end_scheduling_pass`
    /// reports a stall; at least 1.
    pub stall_pass_threshold: u32,
}

/// Default of `ManagerConfig::max_utilization_for_resume`: headroom for running sequences to
/// grow without thrashing suspend and resume.
pub const DEFAULT_MAX_UTILIZATION_FOR_RESUME: f64 = 0.97;
/// Default of `ManagerConfig::stall_pass_threshold`.
pub const DEFAULT_STALL_PASS_THRESHOLD: u32 = 1000;

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
            max_utilization_for_resume: DEFAULT_MAX_UTILIZATION_FOR_RESUME,
            stall_pass_threshold: DEFAULT_STALL_PASS_THRESHOLD,
        }
    }
}

fn positive(v: usize, what: &str) -> KvResult<()> {
    if v == 0 {
        Err(KvError::InvalidConfig(format!("{what} must be positive")))
    } else {
        Ok(())
    }
}

/// The pool geometry of a window: one row per block of `layers × K|V × heads × tokens per block
/// × head size` elements.
fn pool_geometry(cfg: &ManagerConfig, spec: &WindowSpec) -> PoolGeometry {
    PoolGeometry {
        num_layers: spec.num_layers,
        kv_factor: 2,
        num_kv_heads: spec.num_kv_heads,
        size_per_head: spec.size_per_head,
        tokens_per_block: cfg.tokens_per_block,
        bytes_per_element: cfg.bytes_per_element,
    }
}

/// An upper bound of the bytes each block costs in the window's bookkeeping.
const BOOKKEEPING_BYTES_PER_BLOCK: usize = 256;

/// Pool sizes come from products of the caller's numbers: each must fit, and all pools
/// together must stay below `isize::MAX` bytes (the most one process can address), so that no
/// size, offset or statistic derived from them wraps.
fn check_pool_sizes(cfg: &ManagerConfig) -> KvResult<()> {
    let mut total: usize = 0;
    for spec in &cfg.windows {
        let geometry = pool_geometry(cfg, spec);
        let window_bytes = geometry.checked_row_bytes().and_then(|row| {
            let blocks = spec.primary_blocks.checked_add(spec.secondary_blocks)?;
            row.checked_mul(blocks)
        });
        // The bookkeeping of the blocks (arena, queues, tree): refuse what the allocator
        // cannot give instead of aborting the process half-way through construction.
        let blocks = spec.primary_blocks.saturating_add(spec.secondary_blocks);
        if blocks > i32::MAX as usize {
            // Block ids are int32_t in the C ABI.
            return Err(KvError::InvalidConfig(
                "too many blocks in one window (at most INT32_MAX)".into(),
            ));
        }
        let bookkeeping = blocks.saturating_mul(BOOKKEEPING_BYTES_PER_BLOCK);
        if Vec::<u8>::new().try_reserve_exact(bookkeeping).is_err() {
            return Err(KvError::OutOfMemory(format!(
                "the bookkeeping of {blocks} blocks in window {} cannot be allocated",
                spec.window_size
            )));
        }
        total = match window_bytes.and_then(|b| total.checked_add(b)) {
            Some(t) if t <= isize::MAX as usize => t,
            _ => {
                return Err(KvError::InvalidConfig(format!(
                    "the pools of window {} overflow the address space (layers {} x 2 x heads \
                     {} x tokens per block {} x head size {} x {} bytes x {} blocks)",
                    spec.window_size,
                    spec.num_layers,
                    spec.num_kv_heads,
                    cfg.tokens_per_block,
                    spec.size_per_head,
                    cfg.bytes_per_element,
                    spec.primary_blocks.saturating_add(spec.secondary_blocks)
                )))
            }
        };
    }
    Ok(())
}

/// Makes the copy engine of a window instead of the config's backend (`None` = the backend's
/// own): fault-injection and other test backends.
pub type EngineFactory<'a> =
    dyn FnMut(&WindowSpec, PoolGeometry) -> Option<KvResult<Box<dyn CopyEngine>>> + 'a;

impl KvCacheManager {
    /// Creates a manager; validates the config.
    pub fn new(cfg: ManagerConfig) -> KvResult<Self> {
        Self::with_engines(cfg, &mut |_, _| None)
    }

    /// Creates a manager whose windows' copy engines come from `engines` where it returns one
    /// (its error fails the creation, nothing leaks); the others use the config's backend.
    pub fn with_engines(mut cfg: ManagerConfig, engines: &mut EngineFactory<'_>) -> KvResult<Self> {
        positive(cfg.tokens_per_block, "tokens_per_block")?;
        positive(cfg.max_beam_width, "max_beam_width")?;
        positive(cfg.max_sequence_length, "max_sequence_length")?;
        let u = cfg.max_utilization_for_resume;
        if !(u > 0.0 && u <= 1.0) {
            return Err(KvError::InvalidConfig(format!(
                "max_utilization_for_resume must be in (0, 1], got {u}"
            )));
        }
        positive(cfg.stall_pass_threshold as usize, "stall_pass_threshold")?;
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
        check_pool_sizes(&cfg)?;
        let cuda = transfers::open_device(cfg.copy_backend, &cfg.cuda)?;
        let mut windows = Vec::with_capacity(cfg.windows.len());
        for spec in &cfg.windows {
            positive(spec.window_size, "window_size")?;
            positive(spec.primary_blocks, "primary_blocks")?;
            let geometry = pool_geometry(&cfg, spec);
            let engine = match engines(spec, geometry) {
                Some(engine) => engine?,
                None => transfers::window_engine(
                    cfg.copy_backend,
                    cuda.as_ref(),
                    cfg.cuda.allocate_pools,
                    spec,
                    geometry,
                )?,
            };
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
            timed_retention: false,
            plans: Vec::new(),
            events,
            delivery,
            cuda,
            unregistered_pools,
            stall: super::stall::StallDetector::default(),
        })
    }
}
