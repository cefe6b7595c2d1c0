//! Interprets bytes as a sequence of calls to the kvblock C ABI, valid and invalid alike, and
//! checks after every call: a documented status (never `KVB_STATUS_INTERNAL`), the last-error
//! message set on failure, `kvb_manager_check_invariants` clean, the statistics unchanged after a
//! failed call, and no negative count or size written by a successful one. Any violation panics
//! (a libFuzzer crash; `tests/fuzz_regressions.rs` replays the corpus and the saved crashes).
//!
//! Shared by `fuzz/fuzz_targets/c_abi.rs` and `tests/fuzz_regressions.rs` (`#[path]` include).

use std::ffi::CStr;
use std::ptr::{null, null_mut};

use kvblock::ffi::cuda::*;
use kvblock::ffi::disk::*;
use kvblock::ffi::events::*;
use kvblock::ffi::handle::kvb_manager_t;
use kvblock::ffi::lifecycle::*;
use kvblock::ffi::manager::*;
use kvblock::ffi::multimodal::kvb_multimodal_digest;
use kvblock::ffi::publisher::*;
use kvblock::ffi::sizing::*;
use kvblock::ffi::status::*;
use kvblock::ffi::types::*;

/// Highest status value the header documents.
const MAX_STATUS: i32 = kvb_status_t::KVB_STATUS_STALLED as i32;
/// Calls interpreted per input, so one input stays fast.
const MAX_CALLS: usize = 400;
/// Publishers created per input (each binds loopback sockets and starts two threads).
const MAX_PUBLISHER_CREATES: usize = 3;

/// The bytes of the input, read front to back; zeros once exhausted.
struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Input<'_> {
    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
    /// Mostly small values, sometimes the edges of the type.
    fn i32(&mut self) -> i32 {
        match self.u8() {
            b @ 0..=199 => i32::from(b % 48),
            200..=209 => -1,
            210..=219 => i32::MAX,
            220..=224 => i32::MIN,
            225..=229 => i32::MAX - i32::from(self.u8() % 4),
            230..=239 => -i32::from(self.u8()),
            _ => self.u32() as i32,
        }
    }
    fn i64(&mut self) -> i64 {
        match self.u8() {
            b @ 0..=219 => i64::from(b % 64),
            220..=229 => -1,
            230..=239 => i64::MAX,
            240..=244 => i64::MIN,
            _ => self.u64() as i64,
        }
    }
    /// A request id: a small pool, so that duplicates and unknown ids both happen.
    fn request_id(&mut self) -> u64 {
        match self.u8() {
            b @ 0..=239 => u64::from(b % 8),
            _ => self.u64(),
        }
    }
}

/// Owned storage of a C request and the arrays it points into.
struct RequestBuf {
    tokens: Vec<i32>,
    extra: Vec<u64>,
    mm: Vec<kvb_multimodal_item_t>,
    ranges: Vec<kvb_token_range_retention_t>,
    retention: kvb_retention_config_t,
    has_retention: bool,
    raw: kvb_request_t,
}

/// The array's address, or null when it is empty (as a C caller would pass it).
fn ptr_or_null<T>(v: &[T]) -> *const T {
    if v.is_empty() {
        null()
    } else {
        v.as_ptr()
    }
}

impl RequestBuf {
    /// Fixes the pointers after the buffer stops moving.
    fn fix(&mut self) {
        self.raw.tokens = ptr_or_null(&self.tokens);
        self.raw.token_extra_ids = ptr_or_null(&self.extra);
        self.raw.mm_items = ptr_or_null(&self.mm);
        self.retention.ranges = ptr_or_null(&self.ranges);
        self.retention.num_ranges = self.ranges.len();
        self.raw.retention = if self.has_retention {
            &self.retention
        } else {
            null()
        };
    }
}

fn request(inp: &mut Input, tpb: usize) -> Box<RequestBuf> {
    let mut raw = unsafe { std::mem::zeroed::<kvb_request_t>() };
    check_ok(kvb_request_init(&mut raw));
    raw.request_id = inp.request_id();
    // Tokens from a small alphabet in runs of whole blocks, so that prefixes repeat.
    let blocks = usize::from(inp.u8() % 6);
    let extra_tokens = usize::from(inp.u8()) % (tpb + 1);
    let base = i32::from(inp.u8() % 3);
    let mut tokens = Vec::new();
    for b in 0..blocks {
        let seed = if inp.u8().is_multiple_of(4) {
            i32::from(inp.u8() % 5)
        } else {
            base + b as i32
        };
        tokens.extend((0..tpb).map(|t| seed * 100 + t as i32));
    }
    tokens.extend((0..extra_tokens).map(|t| 7_000 + t as i32));
    let flags = inp.u8();
    raw.input_length = if flags & 1 == 0 {
        tokens.len() as i32
    } else {
        inp.i32()
    };
    raw.beam_width = if flags & 2 == 0 { 1 } else { inp.i32() };
    raw.num_tokens = tokens.len();
    let extra = if flags & 4 != 0 {
        (0..tokens.len())
            .map(|i| u64::from(inp.u8() % 2) * i as u64)
            .collect()
    } else {
        Vec::new()
    };
    if flags & 8 != 0 {
        raw.has_lora_task_id = true;
        raw.lora_task_id = u64::from(inp.u8() % 3);
    }
    if flags & 16 != 0 {
        raw.has_cache_salt = true;
        raw.cache_salt = u64::from(inp.u8() % 3);
    }
    let mut mm = Vec::new();
    if flags & 32 != 0 {
        for _ in 0..1 + inp.u8() % 2 {
            let mut digest = [0u8; 32];
            digest[0] = inp.u8() % 3;
            mm.push(kvb_multimodal_item_t {
                digest,
                position: inp.i32(),
                length: inp.i32(),
            });
        }
    }
    raw.num_mm_items = mm.len();
    let mut ranges = Vec::new();
    let has_retention = flags & 64 != 0;
    let mut retention = kvb_retention_config_t {
        ranges: null(),
        num_ranges: 0,
        decode_priority: 35,
        decode_duration_ms: -1,
    };
    if has_retention {
        for _ in 0..inp.u8() % 3 {
            ranges.push(kvb_token_range_retention_t {
                token_start: inp.i32(),
                token_end: inp.i32(),
                priority: inp.i32(),
                duration_ms: inp.i64(),
            });
        }
        retention.decode_priority = inp.i32();
        retention.decode_duration_ms = inp.i64();
    }
    let mut buf = Box::new(RequestBuf {
        tokens,
        extra,
        mm,
        ranges,
        retention,
        has_retention,
        raw,
    });
    buf.fix();
    if flags & 128 != 0 {
        // Broken descriptors: a wrong struct size, a null array with a length, a lying count.
        match inp.u8() % 4 {
            0 => buf.raw.struct_size = buf.raw.struct_size.wrapping_add(8),
            1 => buf.raw.tokens = null(),
            2 => buf.raw.mm_items = null(),
            _ => buf.raw.num_tokens = buf.tokens.len().saturating_sub(1),
        }
        if buf.raw.num_tokens == 0 {
            buf.raw.tokens = null();
        }
    }
    buf
}

fn request_state(inp: &mut Input) -> kvb_request_state_t {
    let mut s = unsafe { std::mem::zeroed::<kvb_request_state_t>() };
    check_ok(kvb_request_state_init(&mut s));
    s.request_id = inp.request_id();
    s.phase = inp.i32() % 5;
    s.prompt_len = inp.i32();
    s.beam_width = inp.i32();
    s.context_chunk_size = inp.i32();
    s.num_draft_tokens = inp.i32();
    s.max_new_tokens = inp.i32();
    s.num_generated_tokens = inp.i32();
    if inp.u8() == 255 {
        s.struct_size = 3;
    }
    s
}

fn check_ok(st: kvb_status_t) {
    assert_eq!(st, kvb_status_t::KVB_OK, "{}", last_error());
}

fn last_error() -> String {
    // SAFETY: the library returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(kvb_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

/// A status every call may return: documented, never a caught panic, with a message on failure.
fn check_status(st: kvb_status_t, what: &str) {
    let v = st as i32;
    assert!(
        (0..=MAX_STATUS).contains(&v),
        "{what}: undocumented status {v}"
    );
    assert_ne!(
        st,
        kvb_status_t::KVB_STATUS_INTERNAL,
        "{what}: internal error: {}",
        last_error()
    );
    if st != kvb_status_t::KVB_OK {
        assert!(
            !last_error().is_empty(),
            "{what}: failed with status {v} but no message"
        );
    } else {
        assert!(
            last_error().is_empty(),
            "{what}: succeeded but left a message"
        );
    }
    // SAFETY: never null, static.
    let name = unsafe { CStr::from_ptr(kvb_status_string(v)) };
    assert_ne!(
        name.to_bytes(),
        b"unknown status",
        "{what}: status {v} has no name"
    );
}

/// A live manager under test and what the interpreter knows of it.
struct Managed {
    handle: *mut kvb_manager_t,
    windows: Vec<i32>,
    tpb: usize,
    poisoned: bool,
}

fn stats(h: *mut kvb_manager_t) -> Option<(kvb_kv_cache_stats_t, i64)> {
    let mut s = unsafe { std::mem::zeroed::<kvb_kv_cache_stats_t>() };
    if kvb_manager_get_kv_cache_stats(h, &mut s) != kvb_status_t::KVB_OK {
        return None;
    }
    let mut free = 0i64;
    check_ok(kvb_manager_get_num_free_blocks(h, &mut free));
    Some((s, free))
}

fn same_stats(a: &(kvb_kv_cache_stats_t, i64), b: &(kvb_kv_cache_stats_t, i64)) -> bool {
    let (x, y) = (&a.0, &b.0);
    a.1 == b.1
        && x.max_num_blocks == y.max_num_blocks
        && x.free_num_blocks == y.free_num_blocks
        && x.used_num_blocks == y.used_num_blocks
        && x.alloc_total_blocks == y.alloc_total_blocks
        && x.alloc_new_blocks == y.alloc_new_blocks
        && x.reused_blocks == y.reused_blocks
        && x.missed_blocks == y.missed_blocks
        && x.cache_hit_rate.to_bits() == y.cache_hit_rate.to_bits()
        && x.num_secondary_blocks == y.num_secondary_blocks
        && x.free_secondary_blocks == y.free_secondary_blocks
        && x.offloaded_blocks == y.offloaded_blocks
        && x.onboarded_blocks == y.onboarded_blocks
        && x.evicted_blocks == y.evicted_blocks
        && x.allocated_bytes == y.allocated_bytes
}

/// A directory for a fuzzed manager's disk tier: one of four per process, in turn (a directory
/// still used by the other live manager makes creation fail, a documented status).
fn fuzz_disk_dir() -> std::ffi::CString {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed) % 4;
    let dir = std::env::temp_dir().join(format!("kvblock-fuzz-disk-{}-{n}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    std::ffi::CString::new(dir.to_string_lossy().as_bytes()).expect("no NUL")
}

/// Calls of the disk tier (poll, prefetch, readiness, statistics; valid without a disk tier).
fn disk_call(inp: &mut Input, m: &Managed) -> (kvb_status_t, &'static str) {
    let h = m.handle;
    match inp.u8() % 4 {
        0 => {
            let mut placed = 0i64;
            let st = kvb_manager_disk_poll(h, &mut placed);
            non_negative(placed, "disk_poll");
            (st, "disk_poll")
        }
        1 => {
            let reqs: Vec<Box<RequestBuf>> =
                (0..1 + inp.u8() % 3).map(|_| request(inp, m.tpb)).collect();
            let raw: Vec<kvb_request_t> = reqs.iter().map(|r| r.raw).collect();
            let mut out = vec![kvb_disk_prefetch_t::default(); raw.len()];
            let st = kvb_manager_disk_prefetch(h, raw.as_ptr(), raw.len(), out.as_mut_ptr());
            for p in &out {
                non_negative(p.started, "disk_prefetch");
                non_negative(p.in_flight, "disk_prefetch");
            }
            (st, "disk_prefetch")
        }
        2 => {
            let r = request(inp, m.tpb);
            let mut n = 0i64;
            let st = kvb_manager_disk_blocks_in_flight(h, &r.raw, &mut n);
            non_negative(n, "disk_blocks_in_flight");
            (st, "disk_blocks_in_flight")
        }
        _ => {
            let mut s = kvb_disk_stats_t {
                struct_size: if inp.u8().is_multiple_of(8) {
                    1
                } else {
                    std::mem::size_of::<kvb_disk_stats_t>() as u32
                },
                ..kvb_disk_stats_t::default()
            };
            (kvb_manager_get_disk_stats(h, &mut s), "get_disk_stats")
        }
    }
}

/// Creates a manager from the input; `None` when the config was (rightly) rejected.
fn create(inp: &mut Input) -> Option<Managed> {
    let mut cfg = unsafe { std::mem::zeroed::<kvb_manager_config_t>() };
    check_ok(kvb_manager_config_init(&mut cfg));
    let wild = inp.u8().is_multiple_of(8);
    let tpb = match inp.u8() % 5 {
        0 => 1,
        1 => 2,
        2 => 4,
        3 => 8,
        _ => 3,
    };
    cfg.tokens_per_block = if wild { inp.i32() } else { tpb };
    cfg.max_beam_width = 1 + i32::from(inp.u8() % 3);
    cfg.max_sequence_length = if wild {
        inp.i32()
    } else {
        4 + i32::from(inp.u8() % 64)
    };
    let num_windows = 1 + usize::from(inp.u8() % 2);
    let mut windows = Vec::new();
    for i in 0..num_windows {
        let mut w = kvb_window_config_t {
            window_size: if i == 0 {
                cfg.max_sequence_length
            } else {
                2 + i32::from(inp.u8() % 16)
            },
            primary_blocks: 1 + i32::from(inp.u8() % 12),
            secondary_blocks: i32::from(inp.u8() % 6),
            num_layers: 1 + i32::from(inp.u8() % 2),
            num_kv_heads: 1,
            size_per_head: 1 + i32::from(inp.u8() % 4),
            auto_host_tier: false,
        };
        if wild {
            // Raw geometry: only bookkeeping-only managers, so no pool of that size exists.
            w.window_size = inp.i32();
            w.num_layers = inp.i32();
            w.num_kv_heads = inp.i32();
            w.size_per_head = inp.i32();
            if inp.bool() {
                // Negative and zero counts; large ones only as far as this process can hold
                // (tests/bad_input.rs covers counts whose bookkeeping cannot be allocated).
                w.primary_blocks = inp.i32().min(4096);
                w.secondary_blocks = inp.i32().min(4096);
            }
        }
        windows.push(w);
    }
    cfg.windows = windows.as_ptr();
    cfg.num_windows = windows.len();
    if inp.u8().is_multiple_of(16) {
        cfg.num_windows = 0;
    }
    let flags = inp.u8();
    cfg.enable_block_reuse = flags & 1 == 0;
    cfg.enable_partial_reuse = flags & 2 == 0;
    cfg.copy_on_partial_reuse = flags & 4 == 0;
    cfg.onboard_blocks = flags & 8 == 0;
    cfg.secondary_offload_min_priority = if flags & 16 == 0 { 30 } else { inp.i32() };
    cfg.manual_clock = flags & 32 == 0;
    cfg.max_kv_event_entries = if flags & 64 == 0 { 64 } else { inp.i32() % 8 };
    cfg.bytes_per_element = if wild {
        inp.i32()
    } else {
        1 + i32::from(inp.u8() % 2)
    };
    let backend = inp.u8() % 8;
    // The host backend only with the small geometry above; CUDA is refused without a GPU.
    cfg.copy_backend = match backend {
        0..=3 if !wild => 1,
        7 => 2,
        6 => inp.i32(),
        _ => 0,
    };
    if cfg.copy_backend == 2 || (wild && cfg.copy_backend == 1) {
        cfg.copy_backend = 0;
    }
    cfg.attention_dp_rank = if inp.bool() { -1 } else { inp.i32() };
    // Draft tokens: a sliding window then keeps that many tokens of blocks for rewinds.
    if !wild && inp.bool() {
        cfg.max_draft_tokens = i32::from(inp.u8() % 4);
    }
    // A disk tier where the bytes already read say so (no byte is read for it, so saved inputs
    // keep their meaning): small rows, a few slots, so its LRU turns over.
    let mut disk = unsafe { std::mem::zeroed::<kvb_disk_tier_config_t>() };
    check_ok(kvb_disk_tier_config_init(&mut disk));
    let disk_dir;
    if !wild && cfg.tokens_per_block == 4 && cfg.max_sequence_length % 3 == 0 {
        disk_dir = fuzz_disk_dir();
        disk.directory = disk_dir.as_ptr();
        disk.bytes_per_window = 16 * 4096;
        disk.max_writes_queued = 4;
        disk.max_reads_in_flight = 2;
        cfg.disk = &disk;
    }
    let mut handle = null_mut();
    let st = kvb_manager_create(&cfg, &mut handle);
    check_status(st, "create");
    if st != kvb_status_t::KVB_OK {
        assert!(handle.is_null(), "a failed create left a handle");
        return None;
    }
    assert!(!handle.is_null());
    let sizes = windows.iter().map(|w| w.window_size).collect();
    let mut tpb_out = 0;
    check_ok(kvb_manager_get_tokens_per_block(handle, &mut tpb_out));
    assert_eq!(tpb_out, cfg.tokens_per_block);
    Some(Managed {
        handle,
        windows: sizes,
        tpb: (tpb_out as usize).clamp(1, 16),
        poisoned: false,
    })
}

fn window(inp: &mut Input, m: &Managed) -> i32 {
    match inp.u8() % 8 {
        0 => inp.i32(),
        b => m.windows[usize::from(b) % m.windows.len()],
    }
}

fn non_negative(v: i64, what: &str) {
    assert!(v >= 0, "{what} wrote a negative result {v}");
}

/// One call on `m`; returns the status and whether the call is one that must not change the
/// statistics when it fails.
fn call(inp: &mut Input, m: &mut Managed) -> (kvb_status_t, &'static str) {
    let h = m.handle;
    let tpb = m.tpb;
    let op = inp.u8() % 47;
    let mut i32_out = 0i32;
    let mut bool_out = false;
    let mut count = 0usize;
    match op {
        0..=5 => {
            let mut r = request(inp, tpb);
            let mut out = unsafe { std::mem::zeroed::<kvb_admission_t>() };
            let out_ptr = if inp.u8().is_multiple_of(8) {
                null_mut()
            } else {
                &mut out as *mut _
            };
            let st = kvb_manager_add_sequence(h, &r.raw, out_ptr);
            if st == kvb_status_t::KVB_OK {
                non_negative(out.prepopulated_prompt_len.into(), "add_sequence");
            }
            r.fix();
            (st, "add_sequence")
        }
        6..=7 => {
            let n = usize::from(inp.u8() % 4);
            let bufs: Vec<Box<RequestBuf>> = (0..n).map(|_| request(inp, tpb)).collect();
            let raws: Vec<kvb_request_t> = bufs.iter().map(|b| b.raw).collect();
            let mut results = vec![unsafe { std::mem::zeroed::<kvb_admission_t>() }; n];
            let mut admitted = 0usize;
            let longest = inp.bool();
            let reqs = if raws.is_empty() && inp.bool() {
                null()
            } else {
                raws.as_ptr()
            };
            let st = kvb_manager_add_sequence_batch(
                h,
                reqs,
                n,
                longest,
                results.as_mut_ptr(),
                &mut admitted,
            );
            if st == kvb_status_t::KVB_OK {
                assert!(admitted <= n);
            }
            (st, "add_sequence_batch")
        }
        8 => {
            let n = usize::from(inp.u8() % 4);
            let bufs: Vec<Box<RequestBuf>> = (0..n).map(|_| request(inp, tpb)).collect();
            let raws: Vec<kvb_request_t> = bufs.iter().map(|b| b.raw).collect();
            let mut out = vec![unsafe { std::mem::zeroed::<kvb_batch_estimate_t>() }; n];
            let st = kvb_manager_estimate_batch(h, raws.as_ptr(), n, out.as_mut_ptr());
            if st == kvb_status_t::KVB_OK {
                for e in &out {
                    for v in [
                        e.reusable_tokens,
                        e.allocated_blocks,
                        e.free_blocks_consumed,
                    ] {
                        non_negative(v.into(), "estimate_batch");
                    }
                    non_negative(e.reused_blocks.into(), "estimate_batch");
                    non_negative(e.missed_blocks.into(), "estimate_batch");
                }
            }
            (st, "estimate_batch")
        }
        9..=14 => (
            kvb_manager_add_token(h, inp.request_id(), inp.i32()),
            "add_token",
        ),
        15 => (
            kvb_manager_remove_token(h, inp.request_id()),
            "remove_token",
        ),
        16 => (
            kvb_manager_rewind_kv_cache(h, inp.request_id(), inp.i32()),
            "rewind_kv_cache",
        ),
        17 => (
            kvb_manager_store_context_blocks(h, inp.request_id(), inp.i32()),
            "store_context_blocks",
        ),
        18 => (
            kvb_manager_store_new_block(h, inp.request_id()),
            "store_new_block",
        ),
        19 => {
            let pin = inp.bool();
            let cap = usize::from(inp.u8() % 12);
            let mut ids = vec![0i32; cap];
            let ptr = if cap == 0 {
                null_mut()
            } else {
                ids.as_mut_ptr()
            };
            let st = kvb_manager_store_blocks_for_reuse(
                h,
                inp.request_id(),
                pin,
                window(inp, m),
                ptr,
                cap,
                &mut count,
            );
            (st, "store_blocks_for_reuse")
        }
        20..=23 => (
            kvb_manager_remove_sequence(h, inp.request_id(), inp.bool()),
            "remove_sequence",
        ),
        24 => (kvb_manager_pin_blocks(h, inp.request_id()), "pin_blocks"),
        25 => {
            let ids: Vec<i32> = (0..inp.u8() % 4).map(|_| inp.i32()).collect();
            let ptr = if ids.is_empty() && inp.bool() {
                null()
            } else {
                ids.as_ptr()
            };
            (
                kvb_manager_unpin_blocks_by_id(h, window(inp, m), ptr, ids.len()),
                "unpin_blocks_by_id",
            )
        }
        26 => {
            let cap = usize::from(inp.u8() % 12);
            let mut ids = vec![0i32; cap];
            let st = kvb_manager_get_cache_block_ids(
                h,
                inp.request_id(),
                window(inp, m),
                inp.i32(),
                ids.as_mut_ptr(),
                cap,
                &mut count,
            );
            (st, "get_cache_block_ids")
        }
        27 => {
            let mut pools = 0;
            let st = kvb_manager_get_offset_table_dimensions(h, &mut i32_out, &mut pools);
            if st == kvb_status_t::KVB_OK {
                non_negative(i32_out.into(), "offset dims");
                non_negative(pools.into(), "offset dims");
            }
            (st, "get_offset_table_dimensions")
        }
        28 => {
            let len = usize::from(inp.u8()) * 4;
            let mut table = vec![0i32; len];
            let st = kvb_manager_copy_block_offsets(
                h,
                table.as_mut_ptr(),
                len,
                inp.i32(),
                inp.i32(),
                inp.request_id(),
                &mut i32_out,
            );
            (st, "copy_block_offsets")
        }
        29 => {
            let len = usize::from(inp.u8()) * 4;
            let mut table = vec![0i32; len];
            let ids: Vec<u64> = (0..inp.u8() % 3).map(|_| inp.request_id()).collect();
            let st = kvb_manager_get_block_offsets_of_batch(
                h,
                table.as_mut_ptr(),
                len,
                inp.i32(),
                ids.as_ptr(),
                ids.len(),
                inp.i32(),
            );
            (st, "get_block_offsets_of_batch")
        }
        30 => {
            let (mut p, mut s) = (0i64, 0i64);
            let st =
                kvb_manager_get_num_free_blocks_per_window_size(h, window(inp, m), &mut p, &mut s);
            if st == kvb_status_t::KVB_OK {
                non_negative(p, "free per window");
                non_negative(s, "free per window");
            }
            (st, "get_num_free_blocks_per_window_size")
        }
        31 => {
            let mut out = unsafe { std::mem::zeroed::<kvb_admission_t>() };
            (
                kvb_manager_get_request_stats(h, inp.request_id(), &mut out),
                "get_request_stats",
            )
        }
        32 => (
            kvb_manager_get_num_tokens(h, inp.request_id(), &mut i32_out),
            "get_num_tokens",
        ),
        33 => (kvb_manager_start_scheduling(h), "start_scheduling"),
        34 => (
            kvb_manager_scheduling_remove_sequence(h, inp.request_id()),
            "scheduling_remove_sequence",
        ),
        35 => (
            kvb_manager_scheduling_has_free_blocks(h, inp.i32(), window(inp, m), &mut bool_out),
            "scheduling_has_free_blocks",
        ),
        36 | 37 => {
            let state = request_state(inp);
            let r = if inp.bool() {
                Some(request(inp, tpb))
            } else {
                None
            };
            let rp = r.as_ref().map_or(null(), |r| &r.raw as *const _);
            let w = window(inp, m);
            let st = if op == 36 {
                kvb_manager_get_needed_blocks_one_step(h, &state, rp, inp.bool(), w, &mut i32_out)
            } else {
                kvb_manager_get_remaining_blocks_to_completion(h, &state, rp, w, &mut i32_out)
            };
            if st == kvb_status_t::KVB_OK {
                non_negative(i32_out.into(), "estimate");
            }
            (st, "needed/remaining blocks")
        }
        38 => {
            let r = request(inp, tpb);
            let st = kvb_manager_count_reusable_blocks(
                h,
                &r.raw,
                window(inp, m),
                inp.bool(),
                &mut i32_out,
            );
            if st == kvb_status_t::KVB_OK {
                non_negative(i32_out.into(), "count_reusable_blocks");
            }
            (st, "count_reusable_blocks")
        }
        39 => {
            let st = kvb_manager_get_max_capacity_batch_size(h, inp.i32(), inp.i32(), &mut i32_out);
            if st == kvb_status_t::KVB_OK {
                non_negative(i32_out.into(), "max_capacity_batch_size");
            }
            (st, "get_max_capacity_batch_size")
        }
        40 => (kvb_manager_refresh_blocks(h), "refresh_blocks"),
        41 => (kvb_manager_advance_time(h, inp.i64()), "advance_time"),
        42 => {
            let mut base = null_mut();
            let mut row = 0usize;
            let st =
                kvb_manager_get_pool_pointer(h, window(inp, m), inp.i32(), &mut base, &mut row);
            (st, "get_pool_pointer")
        }
        43 => {
            let mut info = unsafe { std::mem::zeroed::<kvb_block_info_t>() };
            let st = kvb_manager_get_block_info(h, window(inp, m), inp.i32(), &mut info);
            (st, "get_block_info")
        }
        44 => {
            let st = kvb_manager_offload_block(h, window(inp, m), inp.i32(), &mut bool_out);
            (st, "offload_block")
        }
        45 => disk_call(inp, m),
        46 => lifecycle_call(inp, m),
        _ => match inp.u8() % 9 {
            0 => (
                kvb_manager_get_priority_by_block_id(h, window(inp, m), inp.i64(), &mut i32_out),
                "get_priority_by_block_id",
            ),
            1 => (
                kvb_manager_get_last_block_id(h, inp.request_id(), &mut i32_out),
                "get_last_block_id",
            ),
            2 => (
                kvb_manager_flush_iteration_events(h),
                "flush_iteration_events",
            ),
            3 => {
                let mut batch = null_mut();
                let st = kvb_manager_get_latest_events(h, 0, &mut batch);
                if st == kvb_status_t::KVB_OK {
                    read_batch(batch, inp);
                }
                check_status(kvb_event_batch_free(batch), "event_batch_free");
                (st, "get_latest_events")
            }
            4 => (kvb_manager_sync_transfers(h), "sync_transfers"),
            5 => (kvb_manager_set_stream(h, null_mut()), "set_stream"),
            6 => {
                let mut launches = 0u64;
                (kvb_manager_copy_launches(h, &mut launches), "copy_launches")
            }
            7 => {
                let mut mem = [0u8; 64];
                let st = kvb_manager_register_pool(
                    h,
                    window(inp, m),
                    inp.i32(),
                    mem.as_mut_ptr().cast(),
                    mem.len(),
                );
                (st, "register_pool")
            }
            _ => {
                // Null out-pointers and a null handle: rejected before anything is done.
                let st = match inp.u8() % 4 {
                    0 => kvb_manager_get_num_tokens(h, 0, null_mut()),
                    1 => kvb_manager_get_kv_cache_stats(h, null_mut()),
                    2 => kvb_manager_add_sequence(h, null(), null_mut()),
                    _ => kvb_manager_add_token(null_mut(), 0, 1),
                };
                assert!(
                    st == kvb_status_t::KVB_STATUS_NULL_POINTER || m.poisoned,
                    "{st:?}"
                );
                (st, "null pointers")
            }
        },
    }
}

/// A scheduler capacity lifecycle call with fuzzed ids and sizes (small sizes mostly, so that
/// grows and shrinks both succeed often).
fn lifecycle_call(inp: &mut Input, m: &Managed) -> (kvb_status_t, &'static str) {
    let h = m.handle;
    let mut done = false;
    let size = |inp: &mut Input| match inp.u8() {
        b @ 0..=239 => usize::from(b % 80),
        _ => inp.u64() as usize,
    };
    // Draft and padding counts: small, or next to usize::MAX (a sum that would overflow must be
    // SEQUENCE_TOO_LONG, never a wrapped capacity or a caught overflow panic).
    let draft = |inp: &mut Input| match inp.u8() {
        b @ 0..=223 => usize::from(b % 8),
        b => usize::MAX - usize::from(b % 4),
    };
    match inp.u8() % 14 {
        0 => {
            let mut l = unsafe { std::mem::zeroed::<kvb_sequence_lengths_t>() };
            let st = kvb_manager_get_sequence_lengths(h, inp.request_id(), &mut l);
            if st == kvb_status_t::KVB_OK {
                assert!(l.committed <= l.history && l.history <= l.capacity, "{l:?}");
            }
            (st, "get_sequence_lengths")
        }
        1 | 2 => {
            let (id, n) = (inp.request_id(), size(inp));
            (kvb_manager_resize(h, id, n, &mut done), "resize")
        }
        3 => {
            let (id, n) = (inp.request_id(), draft(inp));
            let st = kvb_manager_allocate_generation(h, id, n, &mut done);
            if n > usize::MAX / 2 {
                assert_ne!(
                    st,
                    kvb_status_t::KVB_OK,
                    "allocate_generation({n}) overflowed"
                );
            }
            (st, "allocate_generation")
        }
        4 => (
            kvb_manager_revert_allocate_generation(h, inp.request_id(), &mut done),
            "revert_allocate_generation",
        ),
        5 => {
            let (id, n) = (inp.request_id(), draft(inp));
            let st = kvb_manager_extend_capacity_for_tokens(h, id, n, &mut done);
            if n > usize::MAX / 2 {
                assert_ne!(st, kvb_status_t::KVB_OK, "extend_capacity({n}) overflowed");
            }
            (st, "extend_capacity")
        }
        6 => {
            let (id, n) = (inp.request_id(), size(inp));
            (
                kvb_manager_allocate_context(h, id, n, &mut done),
                "allocate_context",
            )
        }
        7 => {
            let mut outcome = kvb_context_revert_t::KVB_CONTEXT_REVERT_NOTHING;
            let st = kvb_manager_revert_allocate_context(h, inp.request_id(), &mut outcome);
            (st, "revert_allocate_context")
        }
        8 => {
            let (id, n) = (inp.request_id(), size(inp));
            (kvb_manager_advance_history(h, id, n), "advance_history")
        }
        9 => (kvb_manager_suspend(h, inp.request_id()), "suspend"),
        10 => (kvb_manager_resume(h, inp.request_id(), &mut done), "resume"),
        11 => {
            let mut n = 0i32;
            let st = kvb_manager_get_max_blocks_per_seq(h, window(inp, m), &mut n);
            if st == kvb_status_t::KVB_OK {
                assert!(n > 0, "max blocks per sequence {n}");
            }
            (st, "get_max_blocks_per_seq")
        }
        12 => {
            let mut n = 0i64;
            let st = kvb_manager_get_host_tier_blocks(h, window(inp, m), &mut n);
            if st == kvb_status_t::KVB_OK {
                non_negative(n, "get_host_tier_blocks");
            }
            (st, "get_host_tier_blocks")
        }
        _ => {
            let mut u = 0.0;
            let st = kvb_manager_get_gpu_utilization(h, &mut u);
            if st == kvb_status_t::KVB_OK {
                assert!((0.0..=1.0).contains(&u), "utilization {u}");
            }
            (st, "get_gpu_utilization")
        }
    }
}

fn read_batch(batch: *mut kvb_event_batch_t, inp: &mut Input) {
    let mut n = 0usize;
    check_ok(kvb_event_batch_size(batch, &mut n));
    let mut dropped = 0u64;
    check_ok(kvb_event_batch_num_dropped(batch, &mut dropped));
    for i in 0..n + usize::from(inp.bool()) {
        let mut e = unsafe { std::mem::zeroed::<kvb_event_t>() };
        let st = kvb_event_batch_get(batch, i, &mut e);
        check_status(st, "event_batch_get");
        assert_eq!(st == kvb_status_t::KVB_OK, i < n, "event index {i} of {n}");
        if st != kvb_status_t::KVB_OK {
            continue;
        }
        if e.num_removed_hashes > 0 {
            // SAFETY: valid until the batch is freed.
            let hashes =
                unsafe { std::slice::from_raw_parts(e.removed_hashes, e.num_removed_hashes) };
            std::hint::black_box(hashes.iter().fold(0u64, |a, &h| a.wrapping_add(h)));
        }
        for b in 0..e.num_stored_blocks + usize::from(inp.bool()) {
            let mut sb = unsafe { std::mem::zeroed::<kvb_stored_block_t>() };
            let st = kvb_event_batch_get_stored_block(batch, i, b, &mut sb);
            check_status(st, "event_batch_get_stored_block");
            if st == kvb_status_t::KVB_OK && sb.num_tokens > 0 {
                // SAFETY: valid until the batch is freed.
                let t = unsafe { std::slice::from_raw_parts(sb.tokens, sb.num_tokens) };
                std::hint::black_box(t.iter().map(|&x| i64::from(x)).sum::<i64>());
            }
        }
    }
}

/// Calls that need no manager: sizing helpers, status strings, init functions.
fn free_call(inp: &mut Input) {
    let mut out = 0i32;
    let st = match inp.u8() % 10 {
        0 => {
            kvb_calculate_max_block_requirements_per_beam(inp.i32(), inp.i32(), inp.i32(), &mut out)
        }
        1 => kvb_calculate_max_block_requirements(
            inp.i32(),
            inp.i32(),
            inp.i32(),
            inp.i32(),
            inp.i32(),
            &mut out,
        ),
        2 => kvb_calculate_max_attention_window(
            inp.i32(),
            inp.i32(),
            inp.i32(),
            inp.i32(),
            inp.i32(),
            &mut out,
        ),
        3 => {
            let n = usize::from(inp.u8() % 4);
            let w: Vec<i32> = (0..n).map(|_| inp.i32()).collect();
            let c: Vec<i32> = (0..n).map(|_| inp.i32()).collect();
            let mut shares = vec![0f64; n];
            let st =
                kvb_calculate_window_size_to_share(w.as_ptr(), c.as_ptr(), n, shares.as_mut_ptr());
            if st == kvb_status_t::KVB_OK {
                for s in &shares {
                    assert!(s.is_finite() && *s >= 0.0, "window share {s}");
                }
            }
            st
        }
        4 => {
            let n = usize::from(inp.u8() % 4);
            let bpt: Vec<u64> = (0..n).map(|_| inp.i64() as u64).collect();
            let shares: Vec<f64> = (0..n).map(|_| f64::from(inp.i32())).collect();
            let sp = if inp.bool() { null() } else { shares.as_ptr() };
            let (mut p, mut s) = (vec![0u64; n], vec![0u64; n]);
            kvb_calculate_max_num_blocks(
                bpt.as_ptr(),
                sp,
                n,
                inp.u64(),
                inp.u64(),
                inp.u64(),
                inp.i64(),
                inp.i32(),
                p.as_mut_ptr(),
                s.as_mut_ptr(),
            )
        }
        5 => {
            let v = inp.i32();
            // SAFETY: never null, static.
            assert!(!unsafe { CStr::from_ptr(kvb_status_string(v)) }
                .to_bytes()
                .is_empty());
            // Not a status-returning call: the last error of an earlier call stays.
            return;
        }
        6 => {
            let mut b = false;
            kvb_cuda_libraries_available(&mut b)
        }
        7 => {
            let bytes: Vec<u8> = (0..inp.u8() % 64).map(|_| inp.u8()).collect();
            let mut digest = [0u8; 32];
            let data = if inp.u8().is_multiple_of(8) {
                null()
            } else {
                bytes.as_ptr()
            };
            let out = if inp.u8().is_multiple_of(8) {
                null_mut()
            } else {
                digest.as_mut_ptr()
            };
            kvb_multimodal_digest(data, bytes.len(), out)
        }
        8 => {
            let mut blocks = 0i64;
            let st = kvb_calculate_auto_host_tier_blocks(
                inp.i64(),
                inp.u64(),
                inp.u64(),
                inp.u64(),
                &mut blocks,
            );
            if st == kvb_status_t::KVB_OK {
                non_negative(blocks, "calculate_auto_host_tier_blocks");
            }
            st
        }
        _ => {
            let mut batch_out = 0usize;
            check_status(kvb_event_batch_free(null_mut()), "event_batch_free(null)");
            let st = kvb_event_batch_size(null(), &mut batch_out);
            assert_eq!(st, kvb_status_t::KVB_STATUS_NULL_POINTER);
            st
        }
    };
    check_status(st, "sizing helper");
    if st == kvb_status_t::KVB_OK {
        non_negative(out.into(), "sizing helper");
    }
}

/// A live publisher under test and the manager it drains.
struct Published {
    handle: *mut kvb_event_publisher_t,
    manager: *mut kvb_manager_t,
    start_sequence: u64,
}

/// What the interpreter tracks of publishers.
#[derive(Default)]
struct Publishers {
    live: Vec<Published>,
    destroyed: Vec<*mut kvb_event_publisher_t>,
    creates: usize,
}

/// Loopback and refused endpoints only: nothing leaves the machine.
const ENDPOINTS: [&CStr; 9] = [
    c"tcp://127.0.0.1:*",
    c"tcp://127.0.0.1:*",
    c"tcp://127.0.0.1:70000",
    c"tcp://127.0.0.1:abc",
    c"tcp://127.0.0.1:0",
    c"tcp://127.0.0.1:-1",
    c"inproc://kvb-fuzz",
    c"udp://127.0.0.1:5557",
    c"not-an-endpoint",
];

fn endpoint_is_good(e: &CStr) -> bool {
    e == c"tcp://127.0.0.1:*"
}

/// Publisher lifecycle calls: create with a fuzzed config (bad endpoints and start sequences,
/// limits, struct sizes), stats, endpoints, destroy, a second destroy and calls after destroy.
fn publisher_call(
    inp: &mut Input,
    managers: &[Managed],
    destroyed_managers: &[*mut kvb_manager_t],
    pubs: &mut Publishers,
) {
    let destroyed_status = kvb_status_t::KVB_STATUS_DESTROYED;
    match inp.u8() % 6 {
        0 => {
            if pubs.creates >= MAX_PUBLISHER_CREATES || pubs.live.len() >= 2 {
                return;
            }
            pubs.creates += 1;
            let target = match inp.u8() % 8 {
                0 => destroyed_managers.last().copied().unwrap_or(null_mut()),
                1 => null_mut(),
                b => managers
                    .get(usize::from(b) % managers.len().max(1))
                    .map_or(null_mut(), |m| m.handle),
            };
            let mut c = unsafe { std::mem::zeroed::<kvb_event_publisher_config_t>() };
            check_ok(kvb_event_publisher_config_init(&mut c));
            let ep = ENDPOINTS[usize::from(inp.u8()) % ENDPOINTS.len()];
            c.endpoint = if inp.u8().is_multiple_of(16) {
                null()
            } else {
                ep.as_ptr()
            };
            let replay = match inp.u8() % 4 {
                0 => Some(ENDPOINTS[usize::from(inp.u8()) % ENDPOINTS.len()]),
                1 => Some(c"tcp://127.0.0.1:*"),
                _ => None,
            };
            c.replay_endpoint = replay.map_or(null(), |r| r.as_ptr());
            c.start_sequence = match inp.u8() % 8 {
                0 => u64::MAX,
                1 => u64::MAX - 1,
                2 => 1 << 63,
                3 => (1 << 63) - 1,
                4 => inp.u64(),
                b => u64::from(b),
            };
            c.linger_ms = 0;
            let flags = inp.u8();
            if flags & 1 != 0 {
                c.window_size = inp.i32();
            }
            if flags & 2 != 0 {
                c.send_hwm = inp.i32();
            }
            if flags & 4 != 0 {
                c.replay_buffer_steps = inp.i32() % 4096;
            }
            if flags & 8 != 0 {
                c.max_queued_bytes = inp.u64();
                c.replay_peer_max_bytes = inp.u64();
            }
            if flags & 16 != 0 {
                c.replay_requests_per_second_per_peer = inp.i32();
                c.replay_requests_per_second = inp.i32();
                c.max_replay_peers = inp.i32();
            }
            if flags & 32 != 0 {
                c.max_incoming_message_bytes = inp.i32();
                c.slow_peer_timeout_ms = inp.i32();
            }
            if flags & 64 != 0 {
                c.struct_size = match inp.u8() % 3 {
                    0 => {
                        std::mem::offset_of!(kvb_event_publisher_config_t, max_queued_bytes) as u32
                    }
                    1 => 3,
                    _ => c.struct_size + 8,
                };
            }
            let mut out = null_mut();
            let st = kvb_event_publisher_create(target, &c, &mut out);
            check_status(st, "event_publisher_create");
            if st != kvb_status_t::KVB_OK {
                assert!(out.is_null(), "a failed create left a handle");
                return;
            }
            assert!(!out.is_null());
            assert!(
                c.start_sequence < 1 << 63,
                "start_sequence {:#x} was accepted",
                c.start_sequence
            );
            assert!(
                endpoint_is_good(ep) && replay.is_none_or(endpoint_is_good),
                "a bad endpoint was accepted"
            );
            assert!(
                !pubs.live.iter().any(|p| p.manager == target),
                "a second publisher on one manager was accepted"
            );
            pubs.live.push(Published {
                handle: out,
                manager: target,
                start_sequence: c.start_sequence,
            });
        }
        1 => {
            let Some(p) = pubs.live.last() else { return };
            let mut s = kvb_event_publisher_stats_t::default();
            check_ok(kvb_event_publisher_get_stats(p.handle, &mut s));
            assert!(s.next_sequence >= p.start_sequence, "{s:?}");
            assert!(s.gaps <= s.next_sequence - p.start_sequence, "{s:?}");
            let mut v = kvb_event_publisher_service_stats_t {
                struct_size: std::mem::size_of::<kvb_event_publisher_service_stats_t>() as u32,
                ..Default::default()
            };
            if inp.u8().is_multiple_of(4) {
                v.struct_size = inp.u32();
            }
            let st = kvb_event_publisher_get_service_stats(p.handle, &mut v);
            check_status(st, "event_publisher_get_service_stats");
            if st == kvb_status_t::KVB_OK {
                assert!(v.queued_bytes <= v.queued_bytes_peak || v.queued_bytes_peak == 0);
            }
        }
        2 => {
            if pubs.live.is_empty() {
                return;
            }
            let i = usize::from(inp.u8()) % pubs.live.len();
            let p = pubs.live.remove(i);
            check_ok(kvb_event_publisher_destroy(p.handle));
            pubs.destroyed.push(p.handle);
        }
        3 => {
            // A second destroy and every call after destroy: DESTROYED, never freed memory.
            let Some(&h) = pubs.destroyed.last() else {
                return;
            };
            assert_eq!(kvb_event_publisher_destroy(h), destroyed_status);
            let mut s = kvb_event_publisher_stats_t::default();
            assert_eq!(kvb_event_publisher_get_stats(h, &mut s), destroyed_status);
            let mut n = 0u64;
            assert_eq!(
                kvb_event_publisher_wait_for_subscribers(h, 1, 0, &mut n),
                destroyed_status
            );
            let mut buf = [0 as std::ffi::c_char; 16];
            let mut len = 0usize;
            assert_eq!(
                kvb_event_publisher_get_endpoint(h, inp.bool(), buf.as_mut_ptr(), 16, &mut len),
                destroyed_status
            );
            check_status(destroyed_status, "calls after publisher destroy");
        }
        4 => {
            let Some(p) = pubs.live.last() else { return };
            let cap = usize::from(inp.u8() % 64);
            let mut buf = vec![0 as std::ffi::c_char; cap];
            let mut len = 0usize;
            let ptr = if cap == 0 {
                null_mut()
            } else {
                buf.as_mut_ptr()
            };
            let st = kvb_event_publisher_get_endpoint(p.handle, inp.bool(), ptr, cap, &mut len);
            check_status(st, "event_publisher_get_endpoint");
            let mut n = 0u64;
            let timeout = match inp.u8() % 4 {
                0 => -2,
                1 => i64::MIN,
                _ => 0,
            };
            let st = kvb_event_publisher_wait_for_subscribers(p.handle, 1, timeout, &mut n);
            check_status(st, "event_publisher_wait_for_subscribers");
            assert_eq!(st == kvb_status_t::KVB_OK, timeout == 0);
        }
        _ => {
            let mut s = kvb_event_publisher_stats_t::default();
            assert_eq!(
                kvb_event_publisher_get_stats(null(), &mut s),
                kvb_status_t::KVB_STATUS_NULL_POINTER
            );
            check_ok(kvb_event_publisher_destroy(null_mut()));
            let mut out = null_mut();
            assert_eq!(
                kvb_event_publisher_create(null_mut(), null(), &mut out),
                kvb_status_t::KVB_STATUS_NULL_POINTER
            );
        }
    }
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut inp = Input { data, pos: 0 };
    let mut managers: Vec<Managed> = Vec::new();
    let mut destroyed: Vec<*mut kvb_manager_t> = Vec::new();
    let mut publishers = Publishers::default();
    for _ in 0..MAX_CALLS {
        if inp.done() {
            break;
        }
        match inp.u8() {
            0..=7 => {
                if managers.len() < 2 {
                    managers.extend(create(&mut inp));
                }
            }
            8..=11 => free_call(&mut inp),
            12 => {
                if let Some(m) = (!managers.is_empty()).then(|| managers.remove(0)) {
                    check_ok(kvb_manager_destroy(m.handle));
                    destroyed.push(m.handle);
                }
            }
            13 => {
                // Calls on a destroyed handle (shells stay valid) and a second destroy.
                if let Some(&h) = destroyed.last() {
                    assert_eq!(kvb_manager_destroy(h), kvb_status_t::KVB_STATUS_DESTROYED);
                    let mut n = 0i32;
                    assert_eq!(
                        kvb_manager_get_tokens_per_block(h, &mut n),
                        kvb_status_t::KVB_STATUS_DESTROYED
                    );
                    let mut batch = null_mut();
                    assert_eq!(
                        kvb_manager_get_latest_events(h, 0, &mut batch),
                        kvb_status_t::KVB_STATUS_DESTROYED
                    );
                }
            }
            15 => publisher_call(&mut inp, &managers, &destroyed, &mut publishers),
            14 => {
                if let Some(m) = managers.last_mut() {
                    if inp.u8().is_multiple_of(8) && !m.poisoned {
                        let st = kvb_manager_debug_trigger_panic(m.handle);
                        assert_eq!(st, kvb_status_t::KVB_STATUS_INTERNAL);
                        m.poisoned = true;
                    }
                }
            }
            b => {
                if managers.is_empty() {
                    continue;
                }
                let i = usize::from(b) % managers.len();
                let m = &mut managers[i];
                let before = if m.poisoned { None } else { stats(m.handle) };
                let (st, what) = call(&mut inp, m);
                if m.poisoned {
                    assert!(
                        st == kvb_status_t::KVB_STATUS_POISONED
                            || st == kvb_status_t::KVB_STATUS_NULL_POINTER,
                        "{what} on a poisoned handle returned {st:?}"
                    );
                    continue;
                }
                check_status(st, what);
                let inv = kvb_manager_check_invariants(m.handle);
                assert_eq!(inv, kvb_status_t::KVB_OK, "after {what}: {}", last_error());
                if st != kvb_status_t::KVB_OK {
                    let after = stats(m.handle).expect("stats of a live manager");
                    let before = before.expect("stats of a live manager");
                    assert!(
                        same_stats(&before, &after),
                        "{what} failed with {st:?} but changed the statistics"
                    );
                }
            }
        }
    }
    for p in publishers.live {
        check_ok(kvb_event_publisher_destroy(p.handle));
    }
    for m in managers {
        if !m.poisoned {
            assert_eq!(kvb_manager_check_invariants(m.handle), kvb_status_t::KVB_OK);
        }
        check_ok(kvb_manager_destroy(m.handle));
    }
}
