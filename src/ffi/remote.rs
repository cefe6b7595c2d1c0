//! C entry points of the shared remote tier (Redis / Valkey, standalone or a Redis Cluster):
//! its configuration (an extension of the manager config), the prefetch of waiting requests,
//! their readiness, polling and statistics.
//!
//! Nothing here waits on the network: lookups, fetches and writes run on the manager's remote
//! worker threads, and what they finished becomes visible in the next
//! `kvb_manager_remote_poll` (which the prefetch and readiness calls run first). The one
//! exception is `kvb_manager_create`, which makes one attempt bounded by `connect_timeout_ms`
//! to connect and authenticate: credentials the server refuses fail creation with
//! `KVB_STATUS_INVALID_CONFIG` and a message naming them; a server that cannot be reached is
//! not an error (its lookups and writes fail, counted in `kvb_remote_stats_t`, and the client
//! reconnects with a bounded backoff once it answers).

use std::ffi::{c_char, CStr};
use std::time::Duration;

use super::handle::{
    guard, kvb_manager_t, require_out, with_manager, write_out, FfiError, FfiResult,
};
use super::lower;
use super::status::kvb_status_t;
use super::types::{check_struct_size, init_exact, kvb_request_t};
use crate::manager::KvCacheManager;
use crate::manager::RemoteTierConfig;
use crate::remote::{RedisConfig, RemoteLimits, RemoteStats};
use crate::window::RemoteWritePolicy;

/// When blocks are written to the remote store.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvb_remote_write_policy_t {
    /// When a block is stored for reuse (the default: other instances can reuse a prefix as
    /// soon as it is computed).
    KVB_REMOTE_WRITE_ON_STORE = 0,
    /// When the host tier evicts a block (fewer writes).
    KVB_REMOTE_WRITE_ON_HOST_EVICT = 1,
}

/// The remote tier of a manager, pointed to by `kvb_manager_config_t::remote` (null: no remote
/// tier). Initialise with `kvb_remote_tier_config_init`, then set `urls` and `model_id`.
/// Strings are copied at creation.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvb_remote_tier_config_t {
    /// `sizeof(kvb_remote_tier_config_t)`.
    pub struct_size: u32,
    /// Comma-separated `redis://[user:password@]host:port` URLs: one standalone server, or
    /// the seed nodes of a cluster; `rediss://` for TLS (every URL; needs a library built with
    /// TLS, the cargo feature `tls`, else `KVB_STATUS_INVALID_CONFIG` says so). Null: no remote
    /// tier.
    pub urls: *const c_char,
    /// Speak the Redis Cluster protocol.
    pub cluster: bool,
    /// ACL user (null: the URL's, else the default user).
    pub username: *const c_char,
    /// Password (null: the URL's, else none).
    pub password: *const c_char,
    /// What makes two engines' KV interchangeable (model name and revision, quantisation,
    /// tensor-parallel rank...): part of every key, checked in every value. Required.
    pub model_id: *const c_char,
    /// A `kvb_remote_write_policy_t` (default `KVB_REMOTE_WRITE_ON_STORE`).
    pub write_policy: i32,
    /// Worker threads (default 2, at least 1).
    pub threads: i32,
    /// Bound of a connection attempt, milliseconds (default 500, at least 1).
    pub connect_timeout_ms: i32,
    /// Deadline of one batch, milliseconds (default 2000, at least 1). It bounds the whole
    /// pipeline (writing every command, reading every reply) whatever the server does:
    /// silence, a byte at a time, endless lines. A batch (one request's lookup or fetch) that a
    /// worker starts therefore resolves (hit, miss, error or timeout, counted) within
    /// `connect_timeout_ms + io_timeout_ms`, on a cluster too (every node and a slot map
    /// refresh included); a store batch (EXISTS then SET) within twice that. After a failure
    /// the connections are dropped and the batches queued behind fail at once while the
    /// client backs off. A reply longer than a value of the window (its header and row) is
    /// refused at its first bytes, so a connection holds at most one value and a 16 KiB
    /// buffer.
    pub io_timeout_ms: i32,
    /// First reconnection backoff, milliseconds (default 100, at least 1); it doubles after
    /// each failed attempt up to `backoff_max_ms`.
    pub backoff_min_ms: i32,
    /// Longest reconnection backoff, milliseconds (default 5000, at least 1).
    pub backoff_max_ms: i32,
    /// Blocks queued or being written per window before stores are dropped and counted
    /// (default 256, at least 1).
    pub max_writes_queued: i32,
    /// Blocks being fetched per window (default 256, at least 1).
    pub max_reads_in_flight: i32,
    /// `rediss://` only: PEM file of the certificate authorities the server's certificate must
    /// chain to (null: the system's trust store). Added after `max_reads_in_flight`: callers
    /// built before it pass the smaller `struct_size` and get null here.
    pub tls_ca_file: *const c_char,
    /// `rediss://` only: PEM file of a client certificate, for servers that authenticate
    /// clients (null: none); set together with `tls_key_file`.
    pub tls_cert_file: *const c_char,
    /// `rediss://` only: PEM file of the client certificate's private key (null: none).
    pub tls_key_file: *const c_char,
}

/// `struct_size` of a `kvb_remote_tier_config_t` from before the TLS files.
const REMOTE_CONFIG_V1_SIZE: usize = std::mem::offset_of!(kvb_remote_tier_config_t, tls_ca_file);

/// Counters of the remote tier, summed over windows.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvb_remote_stats_t {
    /// `sizeof(kvb_remote_stats_t)`, set by the caller.
    pub struct_size: u32,
    /// Keys looked up (pipelined EXISTS).
    pub lookups: u64,
    /// Looked-up keys that were present.
    pub lookup_hits: u64,
    /// Lookups refused because too many keys were being looked up.
    pub lookup_drops: u64,
    /// Blocks fetched (pipelined GET).
    pub fetches: u64,
    /// Fetched blocks whose value verified.
    pub fetched: u64,
    /// Bytes of the verified values.
    pub fetch_bytes: u64,
    /// Blocks fetched, verified and placed in the host tier (remote hits).
    pub hits: u64,
    /// Verified blocks not placed (their parent left meanwhile).
    pub fetches_discarded: u64,
    /// Fetches refused because the fetches in flight were at their bound.
    pub fetch_drops: u64,
    /// Fetched keys that were absent (evicted since the lookup).
    pub fetch_misses: u64,
    /// Values read back and refused (never used): any reason (the sum of the next five).
    pub verify_failures: u64,
    /// Refused: not the length of a value of this namespace (truncated, another geometry).
    pub refused_length: u64,
    /// Refused: no header of ours (garbage).
    pub refused_garbage: u64,
    /// Refused: a value of another namespace (model, geometry).
    pub refused_namespace: u64,
    /// Refused: header, prefix digest or row checksum does not verify.
    pub refused_corrupt: u64,
    /// Refused: a valid value of another block.
    pub refused_key: u64,
    /// Blocks written.
    pub writes: u64,
    /// Bytes of the values written.
    pub write_bytes: u64,
    /// Stores not sent: written, being written or known present here.
    pub write_skips: u64,
    /// Stores not sent: another instance had written them (found by the batch's EXISTS).
    pub write_dedup_remote: u64,
    /// Stores dropped because the write queue was full.
    pub write_drops: u64,
    /// Stores declined (a key too large for a value header, a row that cannot be read).
    pub policy_skips: u64,
    /// Keys whose operation failed because the store was unreachable, closed the connection
    /// (mid-reply too), or the client was backing off after a failure.
    pub errors_unavailable: u64,
    /// Keys whose batch did not finish by its deadline (`io_timeout_ms` for the whole
    /// pipeline on a standalone server: a silent server, or one that sends a byte at a time).
    pub errors_timeout: u64,
    /// Keys whose operation the store refused for credentials or permissions.
    pub errors_auth: u64,
    /// Keys whose operation failed otherwise.
    pub errors_other: u64,
    /// Gauge: keys being looked up.
    pub lookups_in_flight: u64,
    /// Gauge: blocks being fetched.
    pub fetches_in_flight: u64,
    /// Gauge: blocks queued or being written.
    pub writes_queued: u64,
    /// Median round trip of the lookup batches, microseconds (latencies are over the last
    /// 1024 batches of each kind; the largest over windows).
    pub lookup_p50_us: u64,
    /// 99th percentile of the lookup batches' round trip, microseconds.
    pub lookup_p99_us: u64,
    /// Median round trip of the fetch batches, microseconds.
    pub fetch_p50_us: u64,
    /// 99th percentile of the fetch batches' round trip, microseconds.
    pub fetch_p99_us: u64,
    /// Median round trip of the store batches (EXISTS then SET), microseconds.
    pub store_p50_us: u64,
    /// 99th percentile of the store batches' round trip, microseconds.
    pub store_p99_us: u64,
    /// Keys whose reply was malformed: not a RESP reply, an integer that is not one, EXISTS
    /// answering other than 0 or 1, a line longer than 4 KiB (an endless simple string), a
    /// bulk string longer than its length. The connection is dropped. Added after
    /// `store_p99_us` (see `kvb_manager_get_remote_stats`).
    pub errors_protocol: u64,
    /// Keys whose reply was longer than any value of the window's namespace (its header and
    /// row): refused at the reply's length line, before its bytes are read; the connection is
    /// dropped.
    pub errors_oversized: u64,
}

/// `struct_size` of a `kvb_remote_stats_t` from before `errors_protocol`.
const REMOTE_STATS_V1_SIZE: usize = std::mem::offset_of!(kvb_remote_stats_t, errors_protocol);

impl From<RemoteStats> for kvb_remote_stats_t {
    fn from(s: RemoteStats) -> Self {
        kvb_remote_stats_t {
            struct_size: std::mem::size_of::<Self>() as u32,
            lookups: s.lookups,
            lookup_hits: s.lookup_hits,
            lookup_drops: s.lookup_drops,
            fetches: s.fetches,
            fetched: s.fetched,
            fetch_bytes: s.fetch_bytes,
            hits: s.hits,
            fetches_discarded: s.fetches_discarded,
            fetch_drops: s.fetch_drops,
            fetch_misses: s.fetch_misses,
            verify_failures: s.verify_failures(),
            refused_length: s.refused_length,
            refused_garbage: s.refused_garbage,
            refused_namespace: s.refused_namespace,
            refused_corrupt: s.refused_corrupt,
            refused_key: s.refused_key,
            writes: s.writes,
            write_bytes: s.write_bytes,
            write_skips: s.write_skips,
            write_dedup_remote: s.write_dedup_remote,
            write_drops: s.write_drops,
            policy_skips: s.policy_skips,
            errors_unavailable: s.errors_unavailable,
            errors_timeout: s.errors_timeout,
            errors_auth: s.errors_auth,
            errors_other: s.errors_other,
            lookups_in_flight: s.lookups_in_flight,
            fetches_in_flight: s.fetches_in_flight,
            writes_queued: s.writes_queued,
            lookup_p50_us: s.lookup_p50_us,
            lookup_p99_us: s.lookup_p99_us,
            fetch_p50_us: s.fetch_p50_us,
            fetch_p99_us: s.fetch_p99_us,
            store_p50_us: s.store_p50_us,
            store_p99_us: s.store_p99_us,
            errors_protocol: s.errors_protocol,
            errors_oversized: s.errors_oversized,
        }
    }
}

/// What a remote prefetch did for one request.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvb_remote_prefetch_t {
    /// Prefix blocks whose lookup this call queued.
    pub looked_up: i64,
    /// Fetches of prefix blocks this call started.
    pub started: i64,
    /// Prefix blocks being looked up or fetched (this call's included): not ready yet.
    pub pending: i64,
}

fn remote_config_default() -> kvb_remote_tier_config_t {
    let r = RedisConfig::default();
    let l = RemoteLimits::default();
    let ms = |d: Duration| d.as_millis() as i32;
    kvb_remote_tier_config_t {
        struct_size: std::mem::size_of::<kvb_remote_tier_config_t>() as u32,
        urls: std::ptr::null(),
        cluster: false,
        username: std::ptr::null(),
        password: std::ptr::null(),
        model_id: std::ptr::null(),
        write_policy: kvb_remote_write_policy_t::KVB_REMOTE_WRITE_ON_STORE as i32,
        threads: 2,
        connect_timeout_ms: ms(r.connect_timeout),
        io_timeout_ms: ms(r.io_timeout),
        backoff_min_ms: ms(r.backoff_min),
        backoff_max_ms: ms(r.backoff_max),
        max_writes_queued: l.max_writes_queued as i32,
        max_reads_in_flight: l.max_reads_in_flight as i32,
        tls_ca_file: std::ptr::null(),
        tls_cert_file: std::ptr::null(),
        tls_key_file: std::ptr::null(),
    }
}

/// Initialises a remote tier config with the defaults (no URL: no remote tier) and sets
/// `struct_size`.
#[no_mangle]
pub extern "C" fn kvb_remote_tier_config_init(
    config: *mut kvb_remote_tier_config_t,
) -> kvb_status_t {
    guard(|| write_out(config, remote_config_default(), "config"))
}

/// `kvb_remote_tier_config_init` of a struct of the caller's `size` (its `sizeof`, which the
/// header's `kvb_remote_tier_config_init` macro passes): writes nothing past it.
/// `KVB_STATUS_STRUCT_SIZE` for a size that is no layout of this struct.
#[no_mangle]
pub extern "C" fn kvb_remote_tier_config_init_sized(
    config: *mut kvb_remote_tier_config_t,
    size: usize,
) -> kvb_status_t {
    init_exact(config, size, "config", remote_config_default())
}

fn invalid(msg: String) -> FfiError {
    FfiError(kvb_status_t::KVB_STATUS_INVALID_CONFIG, msg)
}

fn positive(v: i32, what: &str) -> FfiResult<u32> {
    u32::try_from(v)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| invalid(format!("remote {what} must be positive, got {v}")))
}

fn string(p: *const c_char, what: &str) -> FfiResult<Option<String>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: a NUL-terminated string (caller contract; null checked).
    let s = unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| invalid(format!("remote {what} is not UTF-8")))?;
    Ok(Some(s.to_string()))
}

/// Converts the caller's remote tier config (null, or null `urls`: none).
pub(crate) fn remote_config(c: *const kvb_remote_tier_config_t) -> FfiResult<RemoteTierConfig> {
    // SAFETY: valid pointer or null (caller contract).
    let Some(c) = (unsafe { c.as_ref() }) else {
        return Ok(RemoteTierConfig::default());
    };
    let full = std::mem::size_of::<kvb_remote_tier_config_t>();
    if c.struct_size as usize != REMOTE_CONFIG_V1_SIZE {
        check_struct_size(c.struct_size, full, "kvb_remote_tier_config_t")?;
    }
    let has_tls_files = c.struct_size as usize == full;
    let tls_file = |p: *const c_char, what: &str| -> FfiResult<Option<std::path::PathBuf>> {
        Ok(if has_tls_files {
            string(p, what)?.map(std::path::PathBuf::from)
        } else {
            None
        })
    };
    let Some(urls) = string(c.urls, "urls")? else {
        return Ok(RemoteTierConfig::default());
    };
    let write_policy = match c.write_policy {
        0 => RemoteWritePolicy::OnStore,
        1 => RemoteWritePolicy::OnHostEvict,
        p => return Err(invalid(format!("unknown remote write_policy {p}"))),
    };
    let ms = |v: i32, what: &str| positive(v, what).map(|n| Duration::from_millis(n as u64));
    let redis = RedisConfig {
        urls: urls
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(String::from)
            .collect(),
        cluster: c.cluster,
        username: string(c.username, "username")?,
        password: string(c.password, "password")?,
        connect_timeout: ms(c.connect_timeout_ms, "connect_timeout_ms")?,
        io_timeout: ms(c.io_timeout_ms, "io_timeout_ms")?,
        backoff_min: ms(c.backoff_min_ms, "backoff_min_ms")?,
        backoff_max: ms(c.backoff_max_ms, "backoff_max_ms")?,
        tls_ca_file: tls_file(c.tls_ca_file, "tls_ca_file")?,
        tls_cert_file: tls_file(c.tls_cert_file, "tls_cert_file")?,
        tls_key_file: tls_file(c.tls_key_file, "tls_key_file")?,
        ..RedisConfig::default()
    };
    Ok(RemoteTierConfig {
        redis: Some(redis),
        model_id: string(c.model_id, "model_id")?.unwrap_or_default(),
        write_policy,
        threads: positive(c.threads, "threads")? as usize,
        limits: RemoteLimits {
            max_writes_queued: positive(c.max_writes_queued, "max_writes_queued")? as usize,
            max_reads_in_flight: positive(c.max_reads_in_flight, "max_reads_in_flight")? as usize,
            ..RemoteLimits::default()
        },
    })
}

/// Collects finished remote batches: lookups and writes update what the tier knows, verified
/// fetches become free, reusable host blocks (refused or failed ones are dropped and
/// counted). `out_placed` (may be null) receives the blocks placed. Never waits.
#[no_mangle]
pub extern "C" fn kvb_manager_remote_poll(
    manager: *mut kvb_manager_t,
    out_placed: *mut i64,
) -> kvb_status_t {
    lower::poll(manager, out_placed, KvCacheManager::remote_poll)
}

/// For each waiting request (after a poll): queues one pipelined lookup of the part of its
/// reusable prefix past the tree and the disk tier, and one pipelined fetch of the leading
/// blocks found present, into claimed host blocks. `out` (may be null) receives
/// `num_requests` entries. Never waits: call again (or `kvb_manager_remote_blocks_pending`)
/// in later scheduling passes; a request whose lookup finished gets its fetch started by the
/// next call, and is ready when `pending` is 0.
#[no_mangle]
pub extern "C" fn kvb_manager_remote_prefetch(
    manager: *mut kvb_manager_t,
    requests_ptr: *const kvb_request_t,
    num_requests: usize,
    out: *mut kvb_remote_prefetch_t,
) -> kvb_status_t {
    lower::prefetch(
        manager,
        requests_ptr,
        num_requests,
        out,
        |m, reqs| m.remote_prefetch(reqs),
        |p| kvb_remote_prefetch_t {
            looked_up: p.looked_up as i64,
            started: p.started as i64,
            pending: p.pending as i64,
        },
    )
}

/// Blocks of a request's reusable prefix still being looked up or fetched (after a poll).
#[no_mangle]
pub extern "C" fn kvb_manager_remote_blocks_pending(
    manager: *mut kvb_manager_t,
    request_ptr: *const kvb_request_t,
    out_blocks: *mut i64,
) -> kvb_status_t {
    lower::pending(manager, request_ptr, out_blocks, |m, req| {
        m.remote_blocks_pending(req)
    })
}

/// The remote tier's counters, summed over windows (zeros without a remote tier). Set
/// `out->struct_size` to `sizeof(kvb_remote_stats_t)` first (a caller built before
/// `errors_protocol` passes its smaller size and gets the fields it has).
#[no_mangle]
pub extern "C" fn kvb_manager_get_remote_stats(
    manager: *mut kvb_manager_t,
    out: *mut kvb_remote_stats_t,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        // SAFETY: non-null (checked); struct_size comes first.
        let size = unsafe { out.cast::<u32>().read_unaligned() };
        let full = std::mem::size_of::<kvb_remote_stats_t>();
        if size as usize == REMOTE_STATS_V1_SIZE {
            // A caller built before the protocol / oversized counters: its fields only.
            let mut s: kvb_remote_stats_t = m.remote_stats().into();
            s.struct_size = size;
            // SAFETY: the caller's struct has `size` bytes; `s` has more.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (&s as *const kvb_remote_stats_t).cast::<u8>(),
                    out.cast::<u8>(),
                    REMOTE_STATS_V1_SIZE,
                )
            };
            return Ok(());
        }
        check_struct_size(size, full, "kvb_remote_stats_t")?;
        write_out(out, m.remote_stats().into(), "out")
    })
}

/// Whether the manager has a remote tier.
#[no_mangle]
pub extern "C" fn kvb_manager_has_remote_tier(
    manager: *mut kvb_manager_t,
    out: *mut bool,
) -> kvb_status_t {
    with_manager(manager, |m| write_out(out, m.has_remote_tier(), "out"))
}
