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

// One module per family of calls; each reads the input and the checks above through `super`.
#[path = "interp_calls.rs"]
mod calls;
#[path = "interp_disagg.rs"]
mod disagg;
#[path = "interp_disk.rs"]
mod disk;
#[path = "interp_free.rs"]
mod free;
#[path = "interp_lifecycle.rs"]
mod lifecycle;
#[path = "interp_publisher.rs"]
mod publisher;
// TensorRT-LLM's 2026 calls (the facade's C functions).
#[path = "interp_trtllm.rs"]
mod trtllm;

use calls::call;
use disk::{disk_call, fuzz_disk_dir};
use free::{free_call, read_batch};
use lifecycle::lifecycle_call;
use publisher::{publisher_call, Publishers};

/// Highest status value the header documents.
const MAX_STATUS: i32 = kvb_status_t::KVB_STATUS_SEQUENCE_RECEIVING as i32;
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
    check_ok(kvb_request_init_sized(
        &mut raw,
        std::mem::size_of::<kvb_request_t>(),
    ));
    raw.request_id = inp.request_id();
    // Tokens from a small alphabet in runs of whole blocks, so that prefixes repeat.
    let blocks = usize::from(inp.u8() % 6);
    let extra_byte = inp.u8();
    let extra_tokens = usize::from(extra_byte) % (tpb + 1);
    // The byte's top bits opt one request in eight out of reuse (no byte more is read, so the
    // corpus keeps its meaning otherwise).
    raw.disable_reuse = extra_byte >= 224;
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

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut inp = Input { data, pos: 0 };
    let mut managers: Vec<Managed> = Vec::new();
    let mut destroyed: Vec<*mut kvb_manager_t> = Vec::new();
    let mut publishers = Publishers::default();
    let mut transfers = disagg::Disagg::default();
    for _ in 0..MAX_CALLS {
        if inp.done() {
            break;
        }
        match inp.u8() {
            0..=7 => {
                if managers.len() < 2 {
                    managers.extend(create(&mut inp));
                } else if managers.iter().all(|m| !m.poisoned) {
                    // With both managers live: a disaggregation call between them.
                    let before: Vec<_> = managers.iter().map(|m| stats(m.handle)).collect();
                    let (st, what, acted) = disagg::call(&mut inp, &mut transfers, &managers);
                    check_status(st, what);
                    for m in &managers {
                        let inv = kvb_manager_check_invariants(m.handle);
                        assert_eq!(inv, kvb_status_t::KVB_OK, "after {what}: {}", last_error());
                    }
                    if st != kvb_status_t::KVB_OK {
                        let after = stats(managers[acted].handle);
                        let same = match (&before[acted], &after) {
                            (Some(b), Some(a)) => same_stats(b, a),
                            _ => true,
                        };
                        assert!(same, "{what} failed with {st:?} but changed the statistics");
                    }
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
