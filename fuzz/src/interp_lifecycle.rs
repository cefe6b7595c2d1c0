//! The interpreter's scheduler capacity lifecycle calls (resize, allocations and their
//! reverts, suspend and resume, slots reserved without a token) with fuzzed ids and sizes.

use super::*;

/// A scheduler capacity lifecycle call with fuzzed ids and sizes (small sizes mostly, so that
/// grows and shrinks both succeed often).
pub(super) fn lifecycle_call(inp: &mut Input, m: &Managed) -> (kvb_status_t, &'static str) {
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
    match inp.u8() % 15 {
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
        13 => (
            kvb_manager_add_slot(h, inp.request_id(), &mut done),
            "add_slot",
        ),
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
