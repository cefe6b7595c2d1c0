//! Regression tests of the weak spots of the C ABI found by fuzzing, sanitizers and review:
//! wrapped or negative results of caller-sized arithmetic, a multimodal digest dropped from the
//! block keys, allocation failure aborting instead of failing, destroyed managers keeping their
//! undrained events, and caught panics printed on the host's stderr.

use std::ffi::CStr;
use std::ptr::null_mut;

use kvblock::events::{EventData, EventDelivery, KvCacheEvent};
use kvblock::ffi::events::*;
use kvblock::ffi::handle::kvb_manager_t;
use kvblock::ffi::manager::*;
use kvblock::ffi::sizing::*;
use kvblock::ffi::status::*;
use kvblock::ffi::types::*;
use kvblock::key::{multimodal_keys_for_range, MultimodalItem};

use kvb_status_t::*;

fn last_error() -> String {
    // SAFETY: NUL-terminated, valid until the next call on this thread.
    unsafe { CStr::from_ptr(kvb_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

fn config(windows: &[kvb_window_config_t], backend: kvb_copy_backend_t) -> kvb_manager_config_t {
    // SAFETY: plain C struct, filled by config_init.
    let mut c = unsafe { std::mem::zeroed::<kvb_manager_config_t>() };
    assert_eq!(kvb_manager_config_init(&mut c), KVB_OK);
    c.windows = windows.as_ptr();
    c.num_windows = windows.len();
    c.max_sequence_length = 64;
    c.tokens_per_block = 4;
    c.copy_backend = backend as i32;
    c
}

fn window(primary: i32, secondary: i32) -> kvb_window_config_t {
    kvb_window_config_t {
        window_size: 64,
        primary_blocks: primary,
        secondary_blocks: secondary,
        num_layers: 1,
        num_kv_heads: 1,
        size_per_head: 4,
        auto_host_tier: false,
    }
}

fn create(c: &kvb_manager_config_t) -> (kvb_status_t, *mut kvb_manager_t) {
    let mut h = null_mut();
    let st = kvb_manager_create(c, &mut h);
    (st, h)
}

fn request(id: u64, tokens: &[i32]) -> kvb_request_t {
    // SAFETY: plain C struct, filled by request_init.
    let mut r = unsafe { std::mem::zeroed::<kvb_request_t>() };
    assert_eq!(kvb_request_init(&mut r), KVB_OK);
    r.request_id = id;
    r.tokens = tokens.as_ptr();
    r.num_tokens = tokens.len();
    r.input_length = tokens.len() as i32;
    r
}

// ---- sizing helpers and estimates: no wrapped or negative result --------------------------

#[test]
fn sizing_results_beyond_int32_are_rejected_not_wrapped() {
    let mut out = -7;
    // 2^31 - 1 tokens of output with 64 beams: ~2^37 blocks, which int32_t cannot hold.
    let st = kvb_calculate_max_block_requirements(1, i32::MAX, i32::MAX, 64, 1, &mut out);
    assert_eq!(st, KVB_STATUS_INVALID_ARGUMENT, "{}", last_error());
    assert_eq!(out, -7, "nothing is written on failure");
    // In range: the exact value.
    assert_eq!(
        kvb_calculate_max_block_requirements_per_beam(100, 1000, 16, &mut out),
        KVB_OK
    );
    assert_eq!(out, 7);
}

#[test]
fn estimates_of_a_request_with_too_few_tokens_fail_without_poisoning() {
    let w = [window(8, 0)];
    let (st, h) = create(&config(&w, kvb_copy_backend_t::KVB_COPY_BACKEND_NONE));
    assert_eq!(st, KVB_OK);
    let tokens = [1, 2, 3, 4, 5];
    let mut r = request(1, &tokens);
    r.input_length = 9; // more than the 5 tokens: the last block's key would read past them
                        // SAFETY: plain C struct, filled by request_state_init.
    let mut state = unsafe { std::mem::zeroed::<kvb_request_state_t>() };
    assert_eq!(kvb_request_state_init(&mut state), KVB_OK);
    state.prompt_len = 9;
    let mut out = 0;
    assert_eq!(
        kvb_manager_get_needed_blocks_one_step(h, &state, &r, false, 64, &mut out),
        KVB_STATUS_TOO_FEW_TOKENS
    );
    assert_eq!(
        kvb_manager_get_remaining_blocks_to_completion(h, &state, &r, 64, &mut out),
        KVB_STATUS_TOO_FEW_TOKENS
    );
    assert_eq!(kvb_manager_check_invariants(h), KVB_OK, "not poisoned");
    assert_eq!(kvb_manager_destroy(h), KVB_OK);
}

// ---- multimodal items ----------------------------------------------------------------------

#[test]
fn multimodal_item_whose_end_overflows_is_rejected_everywhere() {
    let w = [window(8, 0)];
    let (_, h) = create(&config(&w, kvb_copy_backend_t::KVB_COPY_BACKEND_NONE));
    let tokens: Vec<i32> = (0..12).collect();
    let item = kvb_multimodal_item_t {
        digest: [7; 32],
        position: 2,
        length: i32::MAX, // 2 + INT32_MAX wraps to a negative end
    };
    let mut r = request(1, &tokens);
    r.mm_items = &item;
    r.num_mm_items = 1;
    assert_eq!(
        kvb_manager_add_sequence(h, &r, null_mut()),
        KVB_STATUS_INVALID_ARGUMENT
    );
    let mut out = 0;
    assert_eq!(
        kvb_manager_count_reusable_blocks(h, &r, 64, false, &mut out),
        KVB_STATUS_INVALID_ARGUMENT
    );
    assert!(last_error().contains("multimodal"), "{}", last_error());
    assert_eq!(kvb_manager_destroy(h), KVB_OK);
}

#[test]
fn multimodal_digest_reaching_past_int32_max_stays_in_the_keys() {
    // Through the Rust API (not validated by the C layer): the item covers every block after
    // its position, so each of those blocks keeps the digest.
    let items = [MultimodalItem {
        digest: [9; 32],
        position: 4,
        length: i32::MAX - 1,
    }];
    let mut keys = Vec::new();
    multimodal_keys_for_range(&items, 8, 12, &mut keys);
    assert_eq!(keys.len(), 1, "the digest was dropped");
    assert_eq!(keys[0].start_offset, 4);
}

// ---- pool geometry and allocation ------------------------------------------------------------

#[test]
fn pool_geometry_whose_size_overflows_is_an_invalid_config() {
    for backend in [
        kvb_copy_backend_t::KVB_COPY_BACKEND_NONE,
        kvb_copy_backend_t::KVB_COPY_BACKEND_HOST,
    ] {
        let mut w = [window(8, 0)];
        w[0].num_layers = i32::MAX;
        w[0].num_kv_heads = i32::MAX;
        w[0].size_per_head = i32::MAX;
        let (st, h) = create(&config(&w, backend));
        assert_eq!(st, KVB_STATUS_INVALID_CONFIG, "{}", last_error());
        assert!(h.is_null());
    }
}

#[test]
fn host_pools_that_cannot_be_allocated_fail_with_out_of_memory() {
    // 2^31 - 1 rows of 2^30 bytes: far beyond any machine, but no size overflows.
    let mut w = [window(i32::MAX / 2, i32::MAX / 2)];
    w[0].size_per_head = 1 << 26;
    let mut c = config(&w, kvb_copy_backend_t::KVB_COPY_BACKEND_HOST);
    c.tokens_per_block = 4;
    let (st, h) = create(&c);
    assert!(
        st == KVB_STATUS_OUT_OF_MEMORY || st == KVB_STATUS_INVALID_CONFIG,
        "{st:?}: {}",
        last_error()
    );
    assert!(h.is_null());
}

#[test]
fn block_counts_whose_bookkeeping_cannot_be_allocated_fail_with_out_of_memory() {
    let w = [window(i32::MAX, 0), {
        let mut v = window(i32::MAX, 0);
        v.window_size = 32;
        v
    }];
    let (st, h) = create(&config(&w, kvb_copy_backend_t::KVB_COPY_BACKEND_NONE));
    assert!(
        st == KVB_STATUS_OUT_OF_MEMORY || st == KVB_STATUS_INVALID_CONFIG,
        "{st:?}: {}",
        last_error()
    );
    assert!(h.is_null());
    // Ids must fit int32_t: more blocks than that in one window is refused.
    let w = [window(i32::MAX, 1)];
    let (st, _) = create(&config(&w, kvb_copy_backend_t::KVB_COPY_BACKEND_NONE));
    assert_eq!(st, KVB_STATUS_INVALID_CONFIG);
}

// ---- destroyed managers ----------------------------------------------------------------------

#[test]
fn destroying_a_manager_frees_its_undrained_events() {
    let delivery = EventDelivery::new(1000);
    let w = [window(4, 0)];
    let mut c = config(&w, kvb_copy_backend_t::KVB_COPY_BACKEND_NONE);
    c.max_kv_event_entries = 1000;
    let (_, h) = create(&c);
    let tokens: Vec<i32> = (0..9).collect();
    assert_eq!(
        kvb_manager_add_sequence(h, &request(1, &tokens), null_mut()),
        KVB_OK
    );
    assert_eq!(kvb_manager_remove_sequence(h, 1, true), KVB_OK);
    assert_eq!(kvb_manager_flush_iteration_events(h), KVB_OK);
    assert_eq!(kvb_manager_destroy(h), KVB_OK);
    // The shell stays (calls return DESTROYED), its buffer is empty.
    let mut batch = null_mut();
    assert_eq!(
        kvb_manager_get_latest_events(h, 0, &mut batch),
        KVB_STATUS_DESTROYED
    );
    // The same at the delivery level, where the count is visible.
    let event = |id| KvCacheEvent {
        event_id: id,
        window_size: 64,
        attention_dp_rank: None,
        data: EventData::Removed {
            block_hashes: vec![id],
        },
    };
    delivery.push((0..3).map(event).collect());
    assert_eq!(delivery.num_pending(), 3);
    delivery.shutdown();
    assert_eq!(delivery.num_pending(), 0, "shutdown keeps undrained events");
}

// ---- panics -----------------------------------------------------------------------------------

const CHILD_ENV: &str = "KVBLOCK_PANIC_CHILD";

/// Run in a child process by `caught_panics_print_nothing_on_stderr`.
#[test]
fn panic_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let w = [window(4, 0)];
    let (_, h) = create(&config(&w, kvb_copy_backend_t::KVB_COPY_BACKEND_NONE));
    assert_eq!(kvb_manager_debug_trigger_panic(h), KVB_STATUS_INTERNAL);
    let message = last_error();
    assert!(
        message.contains("kvb_manager_debug_trigger_panic") && message.contains(".rs:"),
        "the message names the panic and its location: {message}"
    );
    assert_eq!(kvb_manager_destroy(h), KVB_OK);
    // The host's own panics still reach the hook that was there before kvblock's.
    assert!(std::panic::catch_unwind(|| panic!("host-panic-after-kvblock")).is_err());
    println!("CHILD-DONE");
}

#[test]
fn caught_panics_print_nothing_on_stderr() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "panic_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("CHILD-DONE"), "{stdout}");
    assert!(
        !stderr.contains("debug_trigger_panic") && !stdout.contains("debug_trigger_panic"),
        "a caught panic reached the host's output:\n{stderr}"
    );
    assert!(
        stderr.contains("host-panic-after-kvblock"),
        "the host's own panic was swallowed:\n{stderr}"
    );
}

#[test]
fn window_shares_that_overflow_when_summed_are_rejected_not_zero_blocks() {
    // Two windows of 1 KiB per token sharing 1 MiB; the outputs must stay untouched on failure.
    let blocks_for = |shares: [f64; 2]| {
        let per_token = [1024u64, 1024];
        let (mut primary, mut secondary) = ([7u64; 2], [7u64; 2]);
        let status = kvb_calculate_max_num_blocks(
            per_token.as_ptr(),
            shares.as_ptr(),
            2,
            1 << 20,
            0,
            0,
            -1,
            16,
            primary.as_mut_ptr(),
            secondary.as_mut_ptr(),
        );
        assert_eq!((primary, secondary), ([7; 2], [7; 2]), "outputs untouched");
        status
    };
    for shares in [[f64::MAX, f64::MAX], [1e308, 1e308]] {
        assert_eq!(blocks_for(shares), KVB_STATUS_INVALID_ARGUMENT);
        assert!(last_error().contains("overflow"), "{}", last_error());
    }
    for shares in [
        [f64::INFINITY, 1.0],
        [f64::NAN, 1.0],
        [0.0, 1.0],
        [-1.0, 1.0],
    ] {
        assert_eq!(
            blocks_for(shares),
            KVB_STATUS_INVALID_ARGUMENT,
            "{shares:?}"
        );
    }
}

#[test]
fn unlimited_locked_memory_caps_nothing_in_the_automatic_host_tier() {
    let mut blocks = 0i64;
    assert_eq!(
        kvb_calculate_auto_host_tier_blocks(i64::MAX, 0, u64::MAX, 1, &mut blocks),
        KVB_OK
    );
    assert_eq!(blocks, i64::MAX);
}
