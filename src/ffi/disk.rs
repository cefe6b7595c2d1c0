//! C entry points of the disk tier below the host tier: its configuration (an extension of the
//! manager config), the prefetch of waiting requests, their readiness, polling and statistics.
//!
//! Nothing here waits for the disk: reads and writes run on the manager's I/O threads, and
//! what they finished becomes visible in the next `kvb_manager_disk_poll` (which the prefetch
//! and readiness calls run first). Between two such calls the disk tier changes nothing that
//! `kvb_manager_estimate_batch` or admission sees.

use std::ffi::{c_char, CStr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use super::handle::{
    guard, kvb_manager_t, require_out, with_manager, write_out, FfiError, FfiResult,
};
use super::lower;
use super::status::kvb_status_t;
use super::types::{check_struct_size, init_exact, kvb_request_t};
use crate::manager::DiskTierConfig;
use crate::manager::KvCacheManager;
use crate::tier::{TierStats, WritePolicy};

/// Which blocks leaving the host tier are written to disk.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvb_disk_write_policy_t {
    /// Every cached block the host tier evicts (the default).
    KVB_DISK_WRITE_ALL = 0,
    /// Only blocks reused at least once while cached (fewer writes, less wear).
    KVB_DISK_WRITE_REUSED = 1,
}

/// The disk tier of a manager, pointed to by `kvb_manager_config_t::disk` (null: no disk
/// tier). Initialise with `kvb_disk_tier_config_init`, then set `directory`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvb_disk_tier_config_t {
    /// `sizeof(kvb_disk_tier_config_t)`.
    pub struct_size: u32,
    /// An existing, writable directory for the tier's files (one per window,
    /// `kvblock-window-<size>.slots`), kept after the manager: a new manager with the same
    /// geometry and budget recovers the blocks they hold (warm restart). Null: no disk tier.
    /// Copied at creation.
    pub directory: *const c_char,
    /// Bytes of each window's file; 0 = `free_space_share` of the directory's free space.
    pub bytes_per_window: u64,
    /// Share of the free space when `bytes_per_window` is 0, in (0, 1]; default 0.5. Free
    /// space is what the filesystem can give (`statvfs`), plus the blocks the tier's own files
    /// already take (allocated blocks, `st_blocks * 512`: a sparse file counts for what it
    /// holds, not its apparent size). The files are preallocated only while the filesystem
    /// keeps what the share leaves free (less 64 KiB of metadata); else they stay sparse. A
    /// preallocation that fails gives back the space it took.
    pub free_space_share: f64,
    /// A `kvb_disk_write_policy_t` (default `KVB_DISK_WRITE_ALL`).
    pub write_policy: i32,
    /// I/O worker threads (default 2, at least 1).
    pub io_threads: i32,
    /// Writes queued or in flight per window before stores are dropped and counted (default
    /// 64, at least 1).
    pub max_writes_queued: i32,
    /// Reads in flight per window (default 64, at least 1).
    pub max_reads_in_flight: i32,
}

/// Counters of the disk tier, summed over windows.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvb_disk_stats_t {
    /// `sizeof(kvb_disk_stats_t)`, set by the caller.
    pub struct_size: u32,
    /// The file uses O_DIRECT (buffered I/O otherwise; the probe at creation decides).
    pub direct_io: bool,
    /// Blocks read back, verified and placed in the host tier (disk hits).
    pub hits: u64,
    /// Reads started.
    pub reads: u64,
    /// Bytes read (whole slots).
    pub read_bytes: u64,
    /// Writes completed (published).
    pub writes: u64,
    /// Bytes written (whole slots).
    pub write_bytes: u64,
    /// Stores dropped because the write queue was full.
    pub write_drops: u64,
    /// Stores not written: already on disk or being written.
    pub write_skips: u64,
    /// Stores the write policy declined.
    pub policy_skips: u64,
    /// Failed writes (not published).
    pub write_errors: u64,
    /// Failed writes with ENOSPC (also in `write_errors`).
    pub enospc_errors: u64,
    /// Reads failed with an I/O error.
    pub read_errors: u64,
    /// Reads whose key, header or checksum did not verify (dropped; the request recomputes).
    pub verify_failures: u64,
    /// Verified reads not placed (their parent left the host tier meanwhile).
    pub reads_discarded: u64,
    /// Prefetches refused because the reads in flight were at their bound.
    pub read_drops: u64,
    /// Published blocks overwritten by newer ones (disk LRU).
    pub evictions: u64,
    /// Slots recovered at creation (warm restart).
    pub recovered: u64,
    /// Written slots ignored at creation (another geometry, a header that does not verify).
    pub ignored_at_restart: u64,
    /// Gauge: slots of the files.
    pub slots: u64,
    /// Gauge: slots holding a published block.
    pub slots_used: u64,
    /// Gauge: reads in flight.
    pub reads_in_flight: u64,
    /// Gauge: writes queued or in flight.
    pub writes_queued: u64,
    /// Bytes of one slot (header and row, each aligned to 4 KiB).
    pub slot_bytes: u64,
}

impl From<TierStats> for kvb_disk_stats_t {
    fn from(s: TierStats) -> Self {
        kvb_disk_stats_t {
            struct_size: std::mem::size_of::<Self>() as u32,
            direct_io: s.direct_io,
            hits: s.hits,
            reads: s.reads,
            read_bytes: s.read_bytes,
            writes: s.writes,
            write_bytes: s.write_bytes,
            write_drops: s.write_drops,
            write_skips: s.write_skips,
            policy_skips: s.policy_skips,
            write_errors: s.write_errors,
            enospc_errors: s.enospc_errors,
            read_errors: s.read_errors,
            verify_failures: s.verify_failures,
            reads_discarded: s.reads_discarded,
            read_drops: s.read_drops,
            evictions: s.evictions,
            recovered: s.recovered,
            ignored_at_restart: s.ignored_at_restart,
            slots: s.slots,
            slots_used: s.slots_used,
            reads_in_flight: s.reads_in_flight,
            writes_queued: s.writes_queued,
            slot_bytes: s.slot_bytes,
        }
    }
}

/// What a prefetch did for one request.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvb_disk_prefetch_t {
    /// Reads of its prefix blocks started by this call.
    pub started: i64,
    /// Prefix blocks already being read (started earlier).
    pub in_flight: i64,
}

fn disk_config_default() -> kvb_disk_tier_config_t {
    let d = DiskTierConfig::default();
    kvb_disk_tier_config_t {
        struct_size: std::mem::size_of::<kvb_disk_tier_config_t>() as u32,
        directory: std::ptr::null(),
        bytes_per_window: d.bytes_per_window,
        free_space_share: d.free_space_share,
        write_policy: kvb_disk_write_policy_t::KVB_DISK_WRITE_ALL as i32,
        io_threads: d.io_threads as i32,
        max_writes_queued: d.max_writes_queued as i32,
        max_reads_in_flight: d.max_reads_in_flight as i32,
    }
}

/// Initialises a disk tier config with the defaults (no directory: no disk tier) and sets
/// `struct_size`.
#[no_mangle]
pub extern "C" fn kvb_disk_tier_config_init(config: *mut kvb_disk_tier_config_t) -> kvb_status_t {
    guard(|| write_out(config, disk_config_default(), "config"))
}

/// `kvb_disk_tier_config_init` of a struct of the caller's `size` (its `sizeof`, which the
/// header's `kvb_disk_tier_config_init` macro passes): writes nothing past it.
/// `KVB_STATUS_STRUCT_SIZE` for a size that is no layout of this struct.
#[no_mangle]
pub extern "C" fn kvb_disk_tier_config_init_sized(
    config: *mut kvb_disk_tier_config_t,
    size: usize,
) -> kvb_status_t {
    init_exact(config, size, "config", disk_config_default())
}

fn count(v: i32, what: &str) -> FfiResult<usize> {
    usize::try_from(v).ok().filter(|&n| n > 0).ok_or_else(|| {
        FfiError(
            kvb_status_t::KVB_STATUS_INVALID_CONFIG,
            format!("disk {what} must be positive, got {v}"),
        )
    })
}

/// Converts the caller's disk tier config (null: none).
pub(crate) fn disk_config(c: *const kvb_disk_tier_config_t) -> FfiResult<DiskTierConfig> {
    // SAFETY: valid pointer or null (caller contract).
    let Some(c) = (unsafe { c.as_ref() }) else {
        return Ok(DiskTierConfig::default());
    };
    check_struct_size(
        c.struct_size,
        std::mem::size_of::<kvb_disk_tier_config_t>(),
        "kvb_disk_tier_config_t",
    )?;
    let directory = if c.directory.is_null() {
        None
    } else {
        // SAFETY: a NUL-terminated string (caller contract; null checked).
        let bytes = unsafe { CStr::from_ptr(c.directory) }.to_bytes();
        Some(PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
    };
    let write_policy = match c.write_policy {
        0 => WritePolicy::All,
        1 => WritePolicy::Reused,
        p => {
            return Err(FfiError(
                kvb_status_t::KVB_STATUS_INVALID_CONFIG,
                format!("unknown disk write_policy {p}"),
            ))
        }
    };
    Ok(DiskTierConfig {
        directory,
        bytes_per_window: c.bytes_per_window,
        free_space_share: c.free_space_share,
        write_policy,
        io_threads: count(c.io_threads, "io_threads")?,
        max_writes_queued: count(c.max_writes_queued, "max_writes_queued")?,
        max_reads_in_flight: count(c.max_reads_in_flight, "max_reads_in_flight")?,
    })
}

/// Collects finished disk I/O: completed writes become readable, finished reads become free,
/// reusable host blocks (or are dropped and counted when they failed or did not verify).
/// `out_placed` (may be null) receives the blocks placed. Never waits for the disk.
#[no_mangle]
pub extern "C" fn kvb_manager_disk_poll(
    manager: *mut kvb_manager_t,
    out_placed: *mut i64,
) -> kvb_status_t {
    lower::poll(manager, out_placed, KvCacheManager::disk_poll)
}

/// Starts reading the disk-resident part of each waiting request's reusable prefix into the
/// host tier (after a poll), as far as free host blocks and the read bound allow; each block
/// read is claimed (never evicted under the read). `out` (may be null) receives
/// `num_requests` entries. Never waits: query `kvb_manager_disk_blocks_in_flight` later, and
/// admit once it is 0 to reuse the whole prefix.
#[no_mangle]
pub extern "C" fn kvb_manager_disk_prefetch(
    manager: *mut kvb_manager_t,
    requests_ptr: *const kvb_request_t,
    num_requests: usize,
    out: *mut kvb_disk_prefetch_t,
) -> kvb_status_t {
    lower::prefetch(
        manager,
        requests_ptr,
        num_requests,
        out,
        |m, reqs| m.disk_prefetch(reqs),
        |p| kvb_disk_prefetch_t {
            started: p.started as i64,
            in_flight: p.in_flight as i64,
        },
    )
}

/// Blocks of a request's reusable prefix still being read from disk (after a poll); 0 means
/// the request is ready: admitting it now reuses everything the disk held of its prefix.
#[no_mangle]
pub extern "C" fn kvb_manager_disk_blocks_in_flight(
    manager: *mut kvb_manager_t,
    request_ptr: *const kvb_request_t,
    out_blocks: *mut i64,
) -> kvb_status_t {
    lower::pending(manager, request_ptr, out_blocks, |m, req| {
        m.disk_blocks_in_flight(req)
    })
}

/// The disk tier's counters, summed over windows (zeros without a disk tier). Set
/// `out->struct_size` to `sizeof(kvb_disk_stats_t)` first.
#[no_mangle]
pub extern "C" fn kvb_manager_get_disk_stats(
    manager: *mut kvb_manager_t,
    out: *mut kvb_disk_stats_t,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        // SAFETY: non-null (checked); struct_size comes first.
        let size = unsafe { out.cast::<u32>().read_unaligned() };
        check_struct_size(
            size,
            std::mem::size_of::<kvb_disk_stats_t>(),
            "kvb_disk_stats_t",
        )?;
        write_out(out, m.disk_stats().into(), "out")
    })
}

/// Benchmarks: every later disk read sleeps `microseconds` on its I/O thread before it starts
/// (a slow device), to show that no call waits for the disk. 0 turns it off.
#[no_mangle]
pub extern "C" fn kvb_manager_disk_inject_read_latency(
    manager: *mut kvb_manager_t,
    microseconds: u64,
) -> kvb_status_t {
    with_manager(manager, |m| {
        m.disk_inject_read_latency_us(microseconds);
        Ok(())
    })
}

/// Whether the manager has a disk tier.
#[no_mangle]
pub extern "C" fn kvb_manager_has_disk_tier(
    manager: *mut kvb_manager_t,
    out: *mut bool,
) -> kvb_status_t {
    with_manager(manager, |m| write_out(out, m.has_disk_tier(), "out"))
}
