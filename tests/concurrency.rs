//! The concurrent uses the header allows, through the C ABI: two executor threads calling one
//! handle (serialized by its lock), a drainer waiting in `kvb_manager_get_latest_events` beside
//! them, and a destroy while a drain waits. Run under ThreadSanitizer by scripts/sanitize.sh.

use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kvblock::ffi::events::*;
use kvblock::ffi::handle::kvb_manager_t;
use kvblock::ffi::manager::*;
use kvblock::ffi::status::kvb_status_t::{self, *};
use kvblock::ffi::types::*;

/// A handle shared between threads (the header allows calls from any thread).
#[derive(Clone, Copy)]
struct Shared(*mut kvb_manager_t);
// SAFETY: the C ABI serializes calls on one handle with its internal lock.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

fn create() -> Shared {
    let windows = [kvb_window_config_t {
        window_size: 64,
        primary_blocks: 24,
        secondary_blocks: 8,
        num_layers: 1,
        num_kv_heads: 1,
        size_per_head: 2,
        auto_host_tier: false,
    }];
    // SAFETY: plain C struct, filled by config_init.
    let mut c = unsafe { std::mem::zeroed::<kvb_manager_config_t>() };
    assert_eq!(kvb_manager_config_init(&mut c), KVB_OK);
    c.windows = windows.as_ptr();
    c.num_windows = 1;
    c.tokens_per_block = 4;
    c.max_sequence_length = 64;
    c.max_kv_event_entries = 4096;
    c.copy_backend = kvb_copy_backend_t::KVB_COPY_BACKEND_HOST as i32;
    c.bytes_per_element = 1;
    let mut h = null_mut();
    assert_eq!(kvb_manager_create(&c, &mut h), KVB_OK);
    Shared(h)
}

/// Drains until `stop`, counting events; every batch is read and freed.
fn drain(h: Shared, stop: &AtomicBool) -> usize {
    let mut total = 0;
    loop {
        let done = stop.load(Ordering::Acquire);
        let mut batch = null_mut();
        let st = kvb_manager_get_latest_events(h.0, 5, &mut batch);
        if st == KVB_STATUS_DESTROYED {
            return total;
        }
        assert_eq!(st, KVB_OK);
        let mut n = 0;
        assert_eq!(kvb_event_batch_size(batch, &mut n), KVB_OK);
        for i in 0..n {
            // SAFETY: plain C struct written by the call.
            let mut e = unsafe { std::mem::zeroed::<kvb_event_t>() };
            assert_eq!(kvb_event_batch_get(batch, i, &mut e), KVB_OK);
        }
        total += n;
        assert_eq!(kvb_event_batch_free(batch), KVB_OK);
        if done {
            return total;
        }
    }
}

fn executor(h: Shared, base: u64, rounds: usize) {
    for r in 0..rounds {
        let id = base + r as u64;
        let tokens: Vec<i32> = (0..9).map(|t| (r % 3) as i32 * 10 + t).collect();
        // SAFETY: plain C struct, filled by request_init.
        let mut req = unsafe { std::mem::zeroed::<kvb_request_t>() };
        assert_eq!(kvb_request_init(&mut req), KVB_OK);
        req.request_id = id;
        req.tokens = tokens.as_ptr();
        req.num_tokens = tokens.len();
        req.input_length = tokens.len() as i32;
        let st = kvb_manager_add_sequence(h.0, &req, null_mut());
        assert!(st == KVB_OK || st == KVB_STATUS_OUT_OF_BLOCKS, "{st:?}");
        if st == KVB_OK {
            let st = kvb_manager_add_token(h.0, id, 5);
            assert!(st == KVB_OK || st == KVB_STATUS_OUT_OF_BLOCKS, "{st:?}");
            assert_eq!(kvb_manager_remove_sequence(h.0, id, true), KVB_OK);
        }
        assert_eq!(kvb_manager_flush_iteration_events(h.0), KVB_OK);
    }
}

#[test]
fn executors_and_a_drainer_share_one_handle() {
    let h = create();
    let stop = Arc::new(AtomicBool::new(false));
    let drainer = {
        let stop = stop.clone();
        std::thread::spawn(move || drain(h, &stop))
    };
    let workers: Vec<_> = (0..2)
        .map(|i| std::thread::spawn(move || executor(h, 1_000 * (i + 1), 200)))
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Release);
    let drained = drainer.join().unwrap();
    assert!(drained > 0, "the drainer saw no event");
    assert_eq!(kvb_manager_check_invariants(h.0), KVB_OK);
    assert_eq!(kvb_manager_destroy(h.0), KVB_OK);
}

#[test]
fn destroy_while_a_drain_waits() {
    let h = create();
    let waiting = std::thread::spawn(move || {
        let h: Shared = h;
        let mut batch = null_mut();
        // Long timeout: the destroy wakes it with an empty batch (or it started after).
        let st: kvb_status_t = kvb_manager_get_latest_events(h.0, 10_000, &mut batch);
        if st == KVB_OK {
            let mut n = 1;
            assert_eq!(kvb_event_batch_size(batch, &mut n), KVB_OK);
            assert_eq!(kvb_event_batch_free(batch), KVB_OK);
            // The Created event may have been taken; nothing else exists.
            assert!(n <= 1);
        } else {
            assert_eq!(st, KVB_STATUS_DESTROYED);
        }
    });
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(kvb_manager_destroy(h.0), KVB_OK);
    waiting.join().unwrap();
}
