//! Configuration, its validation, and construction of the manager and its windows.

use std::sync::Arc;
use std::time::Instant;

use super::{transfers, Clock, KvCacheManager};
use crate::cuda::CudaConfig;
use crate::error::{KvError, KvResult};
use crate::events::{EventDelivery, EventQueue};
use crate::eviction::DEFAULT_SECONDARY_OFFLOAD_MIN_PRIORITY;
use crate::pool::BlockLayout;
use crate::pool_model::{LayerSpec, PoolModel};
use crate::premixed::PremixedMap;
use crate::sizing::HostMemoryFigures;
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowSpec {
    pub window_size: usize,
    pub primary_blocks: usize,
    /// Host-tier blocks. With `auto_host_tier` it must be 0 and creation sets it to the size
    /// chosen (so `KvCacheManager::config` reports it).
    pub secondary_blocks: usize,
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub size_per_head: usize,
    /// Provision the host tier automatically (see `crate::sizing::auto_host_tier_blocks`):
    /// as many blocks as `primary_blocks`, capped by 50% of the available host memory and 80%
    /// of the locked-memory limit; several automatic windows split those budgets in proportion
    /// to their GPU pool bytes.
    pub auto_host_tier: bool,
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
    /// KV slots a sequence may hold beyond `max_sequence_length` for tokens that are not part
    /// of its text (e.g. the extra KV of some speculative-decoding heads). Default 0.
    pub num_extra_kv_tokens: usize,
    /// The most draft tokens one generation step reserves slots for (speculative decoding);
    /// a sequence at its maximum length may hold this many more slots. Default 0.
    pub max_draft_tokens: usize,
    /// The disk tier below the host tier (off unless it names a directory).
    pub disk: super::DiskTierConfig,
    /// The shared remote tier (off unless it names a store).
    pub remote: super::RemoteTierConfig,
    /// The model's layers (`crate::pool_model`): their windows, cache types, KV heads, head
    /// sizes and data types decide the pools. Empty (the default): one pool per window of its
    /// `num_layers × K|V × num_kv_heads × size_per_head` elements of `bytes_per_element`.
    /// Given, the windows' `num_layers`, `num_kv_heads` and `size_per_head` are not used.
    /// Cross-attention layers turn block reuse off.
    pub layers: Vec<LayerSpec>,
    /// Tokens between the recurrent-state snapshots that prefix reuse restores, a multiple of
    /// `tokens_per_block`; 0 (the default) = every block. A window with recurrent-state layers
    /// reuses a multiple of this many tokens, in exact full blocks.
    pub recurrent_snapshot_interval_tokens: usize,
    /// Allocation prefers runs of consecutive rows among equally ranked free blocks without
    /// cached content (`WindowConfig::contiguous_runs`): a request's rows become few runs, which
    /// a transfer moves in few descriptors. Off (the default): TensorRT-LLM's allocation order.
    pub contiguous_runs: bool,
    /// The most prompt tokens one context step computes (TensorRT-LLM's `maxNumTokens` with
    /// paged context attention); 0 (the default): not given. A sliding window then holds up to
    /// this many tokens past the window while a chunk is computed (TensorRT-LLM's temporary
    /// attention window), which `remaining_blocks_to_completion` counts.
    pub max_context_chunk_tokens: usize,
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
            num_extra_kv_tokens: 0,
            max_draft_tokens: 0,
            disk: super::DiskTierConfig::default(),
            remote: super::RemoteTierConfig::default(),
            layers: Vec::new(),
            recurrent_snapshot_interval_tokens: 0,
            contiguous_runs: false,
            max_context_chunk_tokens: 0,
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

/// The pools of a config whose windows are sorted: from its layers, or one pool per window of
/// `layers × K|V × heads × tokens per block × head size` elements.
pub(crate) fn pool_model(cfg: &ManagerConfig) -> KvResult<PoolModel> {
    if cfg.layers.is_empty() {
        let windows: Vec<_> = cfg
            .windows
            .iter()
            .map(|w| (w.window_size, w.num_layers, w.num_kv_heads, w.size_per_head))
            .collect();
        return Ok(PoolModel::uniform(
            &windows,
            cfg.tokens_per_block,
            cfg.bytes_per_element,
        ));
    }
    let sizes: Vec<usize> = cfg.windows.iter().map(|w| w.window_size).collect();
    PoolModel::from_layers(
        &cfg.layers,
        &sizes,
        cfg.tokens_per_block,
        cfg.bytes_per_element,
    )
}

/// An upper bound of the bytes each block costs in the window's bookkeeping.
const BOOKKEEPING_BYTES_PER_BLOCK: usize = 256;

/// Pool sizes come from products of the caller's numbers: each must fit, and all pools
/// together must stay below `isize::MAX` bytes (the most one process can address), so that no
/// size, offset or statistic derived from them wraps.
fn check_pool_sizes(cfg: &ManagerConfig, model: &PoolModel) -> KvResult<()> {
    let mut total: usize = 0;
    for (i, spec) in cfg.windows.iter().enumerate() {
        let window_bytes = model.window_layout(i).checked_row_bytes().and_then(|row| {
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
            _ if !cfg.layers.is_empty() => {
                return Err(KvError::InvalidConfig(format!(
                    "the pools of window {} overflow the address space (the bytes of its \
                     layers' pools x {} blocks)",
                    spec.window_size,
                    spec.primary_blocks.saturating_add(spec.secondary_blocks)
                )))
            }
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

/// Sizes the host tier of every window with `auto_host_tier` (`sizing::auto_host_tier_blocks`)
/// from the host memory figures. Several automatic windows split the memory and lock budgets
/// in proportion to their GPU pool bytes (one window gets all of them), so that together they
/// stay within the limits. Fails when such a window also gives `secondary_blocks`.
pub(crate) fn resolve_auto_host_tiers(
    cfg: &mut ManagerConfig,
    figures: HostMemoryFigures,
) -> KvResult<()> {
    let model = pool_model(cfg)?;
    let rows: Vec<u64> = (0..cfg.windows.len())
        .map(|i| {
            model
                .window_layout(i)
                .checked_row_bytes()
                .map_or(0, |r| r as u64)
        })
        .collect();
    let mut total_gpu_bytes: f64 = 0.0;
    for (i, spec) in cfg.windows.iter().enumerate() {
        if !spec.auto_host_tier {
            continue;
        }
        if spec.secondary_blocks != 0 {
            return Err(KvError::InvalidConfig(format!(
                "window {} asks for an automatic host tier and gives secondary_blocks {}: \
                 choose one",
                spec.window_size, spec.secondary_blocks
            )));
        }
        total_gpu_bytes += rows[i] as f64 * spec.primary_blocks as f64;
    }
    // A budget split by shares (floating point: the products may exceed any integer type, and
    // a byte more or less does not matter here). Unknown (0) and unlimited figures stay so.
    let share = |figure: u64, gpu_bytes: f64| -> u64 {
        if total_gpu_bytes <= 0.0 || figure == 0 || figure == u64::MAX {
            return figure;
        }
        ((figure as f64 * (gpu_bytes / total_gpu_bytes)) as u64).max(1)
    };
    let chosen: Vec<Option<usize>> = cfg
        .windows
        .iter()
        .zip(&rows)
        .map(|(spec, &row)| {
            spec.auto_host_tier.then(|| {
                let gpu_bytes = row as f64 * spec.primary_blocks as f64;
                crate::sizing::auto_host_tier_blocks(
                    spec.primary_blocks,
                    share(figures.available_bytes, gpu_bytes),
                    share(figures.memlock_limit_bytes, gpu_bytes),
                    row,
                )
            })
        })
        .collect();
    for (spec, blocks) in cfg.windows.iter_mut().zip(chosen) {
        if let Some(blocks) = blocks {
            spec.secondary_blocks = blocks;
        }
    }
    Ok(())
}

/// The most tokens a sequence may have KV slots for: `max_sequence_length` plus the extra KV
/// and draft tokens; `None` when that overflows.
pub(super) fn max_kv_tokens(cfg: &ManagerConfig) -> Option<usize> {
    cfg.max_sequence_length
        .checked_add(cfg.num_extra_kv_tokens)?
        .checked_add(cfg.max_draft_tokens)
}

/// Rows of a window's offset table, the most blocks one beam may list there:
/// `ceil((min(max_sequence_length, window_tokens) + beyond_length) / tokens_per_block)`, where
/// `window_tokens` is the window's own token limit and `beyond_length` the extra KV and draft
/// tokens a sequence may hold past its maximum length. The length is clamped first and the
/// extra slots added after, so that a sequence at its maximum length with a full draft fits.
fn max_blocks_per_seq(
    max_sequence_length: usize,
    window_tokens: usize,
    beyond_length: usize,
    tokens_per_block: usize,
) -> usize {
    max_sequence_length
        .min(window_tokens)
        .saturating_add(beyond_length)
        .div_ceil(tokens_per_block)
}

/// Makes the copy engine of a window instead of the config's backend (`None` = the backend's
/// own): fault-injection and other test backends.
pub type EngineFactory<'a> =
    dyn FnMut(&WindowSpec, &BlockLayout) -> Option<KvResult<Box<dyn CopyEngine>>> + 'a;

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
        let max_kv_tokens = max_kv_tokens(&cfg).ok_or_else(|| {
            KvError::InvalidConfig(format!(
                "max_sequence_length {} + num_extra_kv_tokens {} + max_draft_tokens {} overflows",
                cfg.max_sequence_length, cfg.num_extra_kv_tokens, cfg.max_draft_tokens
            ))
        })?;
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
        if cfg.windows.iter().any(|w| w.auto_host_tier) {
            resolve_auto_host_tiers(&mut cfg, HostMemoryFigures::read())?;
        }
        let model = pool_model(&cfg)?;
        let interval = cfg.recurrent_snapshot_interval_tokens;
        if !interval.is_multiple_of(cfg.tokens_per_block) {
            return Err(KvError::InvalidConfig(format!(
                "recurrent_snapshot_interval_tokens {interval} is not a multiple of \
                 tokens_per_block {}",
                cfg.tokens_per_block
            )));
        }
        let snapshot_blocks = (interval / cfg.tokens_per_block).max(1);
        if model.is_cross() {
            // The encoder's output is a request's own: nothing to share across requests.
            cfg.enable_block_reuse = false;
        }
        check_pool_sizes(&cfg, &model)?;
        let cuda = transfers::open_device(cfg.copy_backend, &cfg.cuda)?;
        let mut windows = Vec::with_capacity(cfg.windows.len());
        for (i, spec) in cfg.windows.iter().enumerate() {
            positive(spec.window_size, "window_size")?;
            positive(spec.primary_blocks, "primary_blocks")?;
            let layout = model.window_layout(i);
            let engine = match engines(spec, &layout) {
                Some(engine) => engine?,
                None => transfers::window_engine(
                    cfg.copy_backend,
                    cuda.as_ref(),
                    cfg.cuda.allocate_pools,
                    spec,
                    &layout,
                    !cfg.layers.is_empty(),
                )?,
            };
            // The window's own limit, then the slots past the maximum length that extra KV
            // and draft tokens may take (both fit: `max_kv_tokens` did not overflow).
            let window_tokens = spec.window_size.max(cfg.max_sequence_length);
            let beyond_length = max_kv_tokens - cfg.max_sequence_length;
            let wc = WindowConfig {
                window_size: spec.window_size,
                num_primary: spec.primary_blocks,
                num_secondary: spec.secondary_blocks,
                tokens_per_block: cfg.tokens_per_block,
                max_token_num: window_tokens.saturating_add(beyond_length),
                max_blocks_per_seq: max_blocks_per_seq(
                    cfg.max_sequence_length,
                    window_tokens,
                    beyond_length,
                    cfg.tokens_per_block,
                ),
                detach_slack_tokens: cfg.max_draft_tokens,
                enable_reuse: cfg.enable_block_reuse,
                enable_partial_reuse: cfg.enable_partial_reuse,
                copy_on_partial_reuse: cfg.copy_on_partial_reuse,
                onboard_blocks: cfg.onboard_blocks,
                offload_min_priority: cfg.secondary_offload_min_priority,
                layout,
                reuse_granularity_blocks: if model.window_has_recurrent_state(i) {
                    snapshot_blocks
                } else {
                    0
                },
                contiguous_runs: cfg.contiguous_runs,
            };
            windows.push(WindowBlockManager::new(wc, engine));
        }
        let disk_io =
            super::disk::attach_disk_tiers(&cfg.disk, cfg.enable_block_reuse, &mut windows)?;
        let remote_workers =
            super::remote::attach_remote_tiers(&cfg.remote, cfg.enable_block_reuse, &mut windows)?;
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
            transfers::pools_to_register(cfg.copy_backend, &cfg.cuda, &cfg.windows, &model);
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
            pool_model: model,
            stall: super::stall::StallDetector::default(),
            iteration_baseline: Vec::new(),
            iteration: 0,
            disk_io,
            remote_workers,
            disagg: Default::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{max_blocks_per_seq, resolve_auto_host_tiers, ManagerConfig, WindowSpec};
    use crate::error::KvError;
    use crate::sizing::HostMemoryFigures;

    /// A window whose block row is 1 x 2 x 1 x 32 tokens x 4 x 2 bytes = 512 bytes.
    fn spec(window_size: usize, primary_blocks: usize, auto_host_tier: bool) -> WindowSpec {
        WindowSpec {
            window_size,
            primary_blocks,
            num_layers: 1,
            num_kv_heads: 1,
            size_per_head: 4,
            auto_host_tier,
            ..WindowSpec::default()
        }
    }

    fn host_tiers(windows: Vec<WindowSpec>, available: u64, memlock: u64) -> Vec<usize> {
        let mut cfg = ManagerConfig {
            windows,
            max_sequence_length: 64,
            ..ManagerConfig::default()
        };
        let figures = HostMemoryFigures {
            available_bytes: available,
            memlock_limit_bytes: memlock,
        };
        resolve_auto_host_tiers(&mut cfg, figures).unwrap();
        cfg.windows.iter().map(|w| w.secondary_blocks).collect()
    }

    #[test]
    fn auto_host_tiers_follow_the_sizing_policy() {
        // One window: its GPU quota (100), 50% of 64 blocks' bytes (32), 80% of 50 blocks'
        // bytes (40).
        assert_eq!(host_tiers(vec![spec(64, 100, true)], 0, 0), vec![100]);
        assert_eq!(
            host_tiers(vec![spec(64, 100, true)], 64 * 512, u64::MAX),
            vec![32]
        );
        assert_eq!(host_tiers(vec![spec(64, 100, true)], 0, 50 * 512), vec![40]);
        // A window without the flag keeps its tier (here none).
        assert_eq!(
            host_tiers(vec![spec(32, 100, false), spec(64, 100, true)], 64 * 512, 0),
            vec![0, 32]
        );
    }

    #[test]
    fn automatic_windows_split_the_budgets_by_gpu_bytes() {
        // 100 and 300 GPU blocks of equal rows: a quarter and three quarters of 50% of 400
        // blocks' bytes, i.e. 50 and 150 blocks (both below their quotas).
        assert_eq!(
            host_tiers(
                vec![spec(32, 100, true), spec(64, 300, true)],
                400 * 512,
                u64::MAX
            ),
            vec![50, 150]
        );
        // Ample memory: each its own quota.
        assert_eq!(
            host_tiers(
                vec![spec(32, 100, true), spec(64, 300, true)],
                u64::MAX / 2,
                0
            ),
            vec![100, 300]
        );
    }

    #[test]
    fn an_automatic_tier_with_explicit_secondary_blocks_is_invalid() {
        let mut cfg = ManagerConfig {
            windows: vec![WindowSpec {
                secondary_blocks: 8,
                ..spec(64, 100, true)
            }],
            max_sequence_length: 64,
            ..ManagerConfig::default()
        };
        assert!(matches!(
            resolve_auto_host_tiers(&mut cfg, HostMemoryFigures::default()),
            Err(KvError::InvalidConfig(_))
        ));
    }

    #[test]
    fn max_blocks_per_seq_clamps_the_length_then_adds_extra_and_draft_tokens() {
        // 100 tokens at 16 per block: 7 blocks; 3 extra KV + 4 draft tokens: 107 -> 7 blocks;
        // 13 beyond the length: 113 -> 8 blocks.
        assert_eq!(max_blocks_per_seq(100, 100, 0, 16), 7);
        assert_eq!(max_blocks_per_seq(100, 100, 7, 16), 7);
        assert_eq!(max_blocks_per_seq(100, 100, 13, 16), 8);
        // A window wider than the maximum length: the length is the limit.
        assert_eq!(max_blocks_per_seq(96, 4096, 0, 32), 3);
        assert_eq!(max_blocks_per_seq(96, 4096, 1, 32), 4);
        // Exactly on a block boundary, and one past it.
        assert_eq!(max_blocks_per_seq(64, 64, 0, 8), 8);
        assert_eq!(max_blocks_per_seq(64, 64, 1, 8), 9);
    }
}
