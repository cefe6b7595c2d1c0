//! The disk tier seen from the manager: its configuration and creation (one file per window
//! pool, one I/O worker pool per manager), prefetch and readiness of waiting requests, and
//! statistics.
//!
//! Blocks read from disk become reusable only in `disk_poll` (which `disk_prefetch` and
//! `disk_blocks_in_flight` run first): between two such calls the disk tier changes nothing an
//! estimate or an admission sees, so an estimate equals what admission then delivers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::lower::LowerKind;
use super::{KvCacheManager, RequestRef};
use crate::error::{KvError, KvResult};
use crate::pool::BlockLayout;
use crate::tier::io::IoPool;
use crate::tier::prealloc::{allocated_bytes, fs_free_bytes};
use crate::tier::{DiskTier, SlotLayout, TierLimits, TierStats, WritePolicy};
use crate::window::{DiskPrefetch, KeySource, WindowBlockManager, WindowDisk};

/// Default `DiskTierConfig::free_space_share`.
pub const DEFAULT_DISK_FREE_SPACE_SHARE: f64 = 0.5;

/// The disk tier of a manager.
#[derive(Clone, Debug, PartialEq)]
pub struct DiskTierConfig {
    /// Directory of the tier's files (`kvblock-window-<size>.slots`), kept across runs: a new
    /// manager with the same geometry and budget recovers their blocks. `None`: no disk tier.
    pub directory: Option<PathBuf>,
    /// Bytes of each window's file; 0 = `free_space_share` of the directory's free space,
    /// split over the windows in proportion to their row bytes.
    pub bytes_per_window: u64,
    /// Share of the directory's free space used when `bytes_per_window` is 0, in (0, 1]. Free
    /// space counts the blocks the tier's own files take (allocated, not apparent, sizes);
    /// preallocation never takes the filesystem past the share (`slots_per_window`).
    pub free_space_share: f64,
    pub write_policy: WritePolicy,
    /// I/O worker threads (at least 1).
    pub io_threads: usize,
    /// Writes queued or in flight per window before stores are dropped (at least 1).
    pub max_writes_queued: usize,
    /// Reads in flight per window (at least 1).
    pub max_reads_in_flight: usize,
}

impl Default for DiskTierConfig {
    fn default() -> Self {
        DiskTierConfig {
            directory: None,
            bytes_per_window: 0,
            free_space_share: DEFAULT_DISK_FREE_SPACE_SHARE,
            write_policy: WritePolicy::All,
            io_threads: 2,
            max_writes_queued: 64,
            max_reads_in_flight: 64,
        }
    }
}

/// The file of a window's disk tier.
pub fn disk_file_name(window_size: usize) -> String {
    format!("kvblock-window-{window_size}.slots")
}

/// The slot layout of a window: the block's rows in every pool of the window, each pool's
/// geometry in the fingerprint.
pub fn slot_layout(window_size: usize, layout: &BlockLayout) -> SlotLayout {
    let mut words = Vec::with_capacity(7 * layout.pools().len());
    for p in layout.pools() {
        let g = &p.geometry;
        words.extend([
            g.num_layers,
            g.kv_factor,
            g.num_kv_heads,
            g.size_per_head,
            g.tokens_per_block,
            g.bytes_per_element,
        ]);
        if layout.pools().len() > 1 {
            words.push(usize::from(p.partial_copies));
        }
    }
    let tokens_per_block = layout.first().map_or(0, |g| g.tokens_per_block);
    SlotLayout::with_row_bytes(window_size, tokens_per_block, &words, layout.row_bytes())
}

fn invalid(msg: String) -> KvError {
    KvError::InvalidConfig(msg)
}

/// Checks that `dir` is a writable directory.
fn check_directory(dir: &Path) -> KvResult<()> {
    let meta = std::fs::metadata(dir).map_err(|e| {
        invalid(format!(
            "disk tier directory {} cannot be used: {e}",
            dir.display()
        ))
    })?;
    if !meta.is_dir() {
        return Err(invalid(format!(
            "disk tier directory {} is not a directory",
            dir.display()
        )));
    }
    let probe = dir.join(format!(".kvblock-write-probe-{}", std::process::id()));
    match std::fs::write(&probe, b"") {
        Ok(()) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(invalid(format!(
            "disk tier directory {} is not writable: {e}",
            dir.display()
        ))),
    }
}

/// Free bytes of the filesystem holding `dir` for an unprivileged writer (what it can really
/// give: `statvfs`'s available blocks).
pub fn free_bytes(dir: &Path) -> KvResult<u64> {
    fs_free_bytes(dir).map_err(|e| invalid(format!("statvfs({}): {e}", dir.display())))
}

/// Filesystem metadata a preallocation may take beyond the share (extent blocks).
const METADATA_ALLOWANCE: u64 = 64 << 10;

/// Slots of each window: the explicit budget, or the share of free space (the space the
/// tier's own files take counts as free: they are reused) split in proportion to the windows'
/// slot bytes. Also the bytes the filesystem must keep free when the files are preallocated
/// (share only: what the share leaves, less `METADATA_ALLOWANCE`). What a file takes is its
/// allocated blocks, not its apparent size: a sparse file takes nothing, so it adds nothing to
/// the free space.
fn slots_per_window(
    cfg: &DiskTierConfig,
    dir: &Path,
    windows: &[(usize, SlotLayout)],
) -> KvResult<(Vec<u64>, Option<u64>)> {
    let mut keep_free = None;
    let budgets: Vec<u64> = if cfg.bytes_per_window > 0 {
        vec![cfg.bytes_per_window; windows.len()]
    } else {
        let own: u64 = windows
            .iter()
            .map(|(w, _)| allocated_bytes(&dir.join(disk_file_name(*w))))
            .sum();
        let usable = free_bytes(dir)?.saturating_add(own);
        let total = (usable as f64 * cfg.free_space_share) as u64;
        keep_free = Some((usable - total.min(usable)).saturating_sub(METADATA_ALLOWANCE));
        let weight: f64 = windows.iter().map(|(_, l)| l.slot_bytes() as f64).sum();
        windows
            .iter()
            .map(|(_, l)| (total as f64 * l.slot_bytes() as f64 / weight) as u64)
            .collect()
    };
    let slots = windows
        .iter()
        .zip(budgets)
        .map(|((w, l), bytes)| {
            let slots = bytes / l.slot_bytes() as u64;
            if slots == 0 {
                Err(invalid(format!(
                    "the disk budget of window {w} ({bytes} bytes) is below one slot ({} bytes)",
                    l.slot_bytes()
                )))
            } else {
                Ok(slots)
            }
        })
        .collect::<KvResult<Vec<u64>>>()?;
    Ok((slots, keep_free))
}

/// Validates the disk tier's configuration and opens one tier per window.
pub(super) fn attach_disk_tiers(
    cfg: &DiskTierConfig,
    enable_reuse: bool,
    windows: &mut [WindowBlockManager],
) -> KvResult<Option<Arc<IoPool>>> {
    let Some(dir) = &cfg.directory else {
        return Ok(None);
    };
    if !enable_reuse {
        return Err(invalid("the disk tier needs block reuse".into()));
    }
    if cfg.io_threads == 0 || cfg.max_writes_queued == 0 || cfg.max_reads_in_flight == 0 {
        return Err(invalid(
            "disk io_threads, max_writes_queued and max_reads_in_flight must be positive".into(),
        ));
    }
    if cfg.bytes_per_window == 0 && !(cfg.free_space_share > 0.0 && cfg.free_space_share <= 1.0) {
        return Err(invalid(format!(
            "disk free_space_share must be in (0, 1], got {}",
            cfg.free_space_share
        )));
    }
    check_directory(dir)?;
    for w in windows.iter() {
        if w.config().num_secondary == 0 {
            return Err(invalid(format!(
                "window {}: the disk tier sits below the host tier, which has no blocks",
                w.window_size()
            )));
        }
        if !w.engine().host_rows_visible() {
            return Err(KvError::Unsupported(
                "the disk tier needs a copy backend whose host rows it can read (host memory \
                 or none)"
                    .into(),
            ));
        }
    }
    let layouts: Vec<(usize, SlotLayout)> = windows
        .iter()
        .map(|w| {
            (
                w.window_size(),
                slot_layout(w.window_size(), &w.config().layout),
            )
        })
        .collect();
    let (slots, keep_free) = slots_per_window(cfg, dir, &layouts)?;
    let pool = Arc::new(
        IoPool::new(cfg.io_threads)
            .map_err(|e| KvError::OutOfMemory(format!("disk I/O threads: {e}")))?,
    );
    let limits = TierLimits {
        max_writes_queued: cfg.max_writes_queued,
        max_reads_in_flight: cfg.max_reads_in_flight,
    };
    let mut tiers = Vec::with_capacity(windows.len());
    for ((w, layout), n) in layouts.iter().zip(slots) {
        let name = disk_file_name(*w);
        let tier = DiskTier::open_within(dir, &name, *layout, n, limits, pool.clone(), keep_free)
            .map_err(|e| {
            invalid(format!(
                "disk tier file of window {w} in {}: {e}",
                dir.display()
            ))
        })?;
        tiers.push(tier);
    }
    for (w, tier) in windows.iter_mut().zip(tiers) {
        let n = w.num_blocks();
        w.attach_disk(WindowDisk::new(tier, cfg.write_policy, n));
    }
    Ok(Some(pool))
}

/// The disk tier behind the manager's lower-tier calls.
pub(super) struct Disk;

impl LowerKind for Disk {
    type Prefetch = DiskPrefetch;
    type Stats = TierStats;
    fn has(w: &WindowBlockManager) -> bool {
        w.has_disk()
    }
    fn poll(w: &mut WindowBlockManager, now_ms: u64) -> usize {
        w.disk_poll(now_ms)
    }
    fn prefetch(w: &mut WindowBlockManager, src: &KeySource<'_>, len: usize) -> DiskPrefetch {
        w.disk_prefetch(src, len)
    }
    fn pending(w: &mut WindowBlockManager, src: &KeySource<'_>, len: usize) -> usize {
        w.disk_blocks_in_flight(src, len)
    }
    fn stats(w: &WindowBlockManager) -> TierStats {
        w.disk_stats()
    }
    fn add(a: &mut TierStats, b: &TierStats) {
        a.add(b);
    }
}

impl KvCacheManager {
    /// Whether the manager has a disk tier.
    pub fn has_disk_tier(&self) -> bool {
        self.has_lower::<Disk>()
    }

    /// Collects finished disk I/O: completed writes become readable, finished reads become
    /// free host blocks of the reuse tree (or are dropped, counted). Returns the blocks placed.
    pub fn disk_poll(&mut self) -> usize {
        self.poll_lower::<Disk>()
    }

    /// Starts reading the disk-resident part of each waiting request's reusable prefix into
    /// the host tier (after a `disk_poll`). Returns, per request, the reads started and those
    /// already in flight, summed over windows. Never waits for the disk.
    pub fn disk_prefetch(&mut self, reqs: &[RequestRef<'_>]) -> KvResult<Vec<DiskPrefetch>> {
        self.prefetch_lower::<Disk>(reqs)
    }

    /// Blocks of a request's reusable prefix still being read from disk, summed over windows
    /// (after a `disk_poll`); 0 means what the disk held of its prefix is in the host tier (or
    /// was dropped) and admitting it now reuses all of that.
    pub fn disk_blocks_in_flight(&mut self, req: &RequestRef<'_>) -> KvResult<usize> {
        self.pending_lower::<Disk>(req)
    }

    /// Threads of the disk tier's I/O pool (0 without a disk tier).
    pub fn disk_io_threads(&self) -> usize {
        self.disk_io.as_ref().map_or(0, |p| p.num_threads())
    }

    /// The disk tier's counters summed over windows (zeros without a disk tier).
    pub fn disk_stats(&self) -> TierStats {
        self.lower_stats::<Disk>()
    }

    /// Makes every disk read sleep `us` microseconds on its I/O thread first (benchmarks: a
    /// slow device). No C call waits for it.
    pub fn disk_inject_read_latency_us(&mut self, us: u64) {
        for w in &self.windows {
            if let Some(t) = w.disk_tier() {
                t.faults()
                    .read_latency_us
                    .store(us, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// The disk tier of one window (fault injection in tests, file mode).
    pub fn disk_tier(&self, window_size: usize) -> KvResult<Option<&DiskTier>> {
        Ok(self.window(window_size)?.disk_tier())
    }
}
