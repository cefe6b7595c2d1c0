//! The interpreter's calls of TensorRT-LLM's 2026 surface (`src/ffi/reuse_tree.rs`,
//! `iteration_stats.rs`, `sequence_info.rs`, onboard, pin and store by block id, the
//! recurrent-state copy): fuzzed requests, windows, buffers and counts, null out-pointers and
//! buffers too small among them.

use std::ptr::{null, null_mut};

use kvblock::ffi::iteration_stats::*;
use kvblock::ffi::reuse_tree::*;
use kvblock::ffi::sequence_info::*;

use super::*;

/// A buffer of up to 15 elements, or (rarely) a null pointer with a non-zero capacity.
fn buffer<T: Clone>(inp: &mut Input, zero: T) -> (Vec<T>, bool) {
    let cap = usize::from(inp.u8() % 16);
    (vec![zero; cap], inp.u8() == 255)
}

pub(super) fn call(inp: &mut Input, m: &Managed) -> (kvb_status_t, &'static str) {
    let h = m.handle;
    let tpb = m.tpb;
    let mut i32_out = 0i32;
    let mut count = 0usize;
    match inp.u8() % 16 {
        0 => {
            let r = request(inp, tpb);
            let mut s = unsafe { std::mem::zeroed::<kvb_prefix_reuse_summary_t>() };
            let st = kvb_manager_analyze_prefix_reuse(h, &r.raw, window(inp, m), &mut s);
            if st == kvb_status_t::KVB_OK {
                non_negative(s.reusable_blocks_allocated.into(), "reusable blocks");
                assert!(s.reusable_blocks_allocated <= s.reusable_blocks_all);
                assert!(s.first_new_block_index >= -1);
            }
            (st, "analyze_prefix_reuse")
        }
        1 | 2 => {
            let state = request_state(inp);
            let summary = kvb_prefix_reuse_summary_t {
                reusable_blocks_allocated: inp.i32(),
                reusable_blocks_all: inp.i32(),
                first_new_block_index: inp.i32(),
            };
            let sp = if inp.u8() == 255 {
                null()
            } else {
                &summary as *const _
            };
            let w = window(inp, m);
            let st = if inp.bool() {
                kvb_manager_get_needed_blocks_one_step_cached(
                    h,
                    &state,
                    sp,
                    inp.bool(),
                    w,
                    &mut i32_out,
                )
            } else {
                kvb_manager_get_remaining_blocks_to_completion_cached(
                    h,
                    &state,
                    sp,
                    w,
                    &mut i32_out,
                )
            };
            if st == kvb_status_t::KVB_OK {
                non_negative(i32_out.into(), "cached estimate");
            }
            (st, "cached estimates")
        }
        3 => {
            let r = request(inp, tpb);
            let (mut ids, null_buf) = buffer(inp, 0i32);
            let ptr = if null_buf {
                null_mut()
            } else {
                ids.as_mut_ptr()
            };
            let st = kvb_manager_find_blocks_in_reuse_tree(
                h,
                &r.raw,
                inp.i32(),
                window(inp, m),
                inp.u8().is_multiple_of(4),
                ptr,
                ids.len(),
                &mut count,
            );
            (st, "find_blocks_in_reuse_tree")
        }
        4 => {
            let tokens: Vec<i32> = (0..inp.u8() % 24).map(|_| inp.i32()).collect();
            let ptr = if tokens.is_empty() && inp.bool() {
                null()
            } else {
                tokens.as_ptr()
            };
            let st = kvb_manager_truncate_blocks(h, ptr, tokens.len(), inp.i32(), &mut count);
            (st, "truncate_blocks")
        }
        5 => {
            if inp.u8().is_multiple_of(8) {
                (
                    kvb_manager_reset_reuse_state(h, &mut count),
                    "reset_reuse_state",
                )
            } else {
                (
                    kvb_manager_reset_reuse_state(h, null_mut()),
                    "reset_reuse_state (null)",
                )
            }
        }
        6 => {
            let (mut hashes, null_buf) = buffer(inp, 0u64);
            let ptr = if null_buf {
                null_mut()
            } else {
                hashes.as_mut_ptr()
            };
            let st = kvb_manager_commit_block_hashes(
                h,
                inp.request_id(),
                window(inp, m),
                ptr,
                hashes.len(),
                &mut count,
            );
            (st, "commit_block_hashes")
        }
        7 => {
            let (mut stats, null_buf) =
                buffer(inp, unsafe { std::mem::zeroed::<kvb_iteration_stats_t>() });
            let ptr = if null_buf {
                null_mut()
            } else {
                stats.as_mut_ptr()
            };
            let st = kvb_manager_get_iteration_stats(h, ptr, stats.len(), &mut count);
            (st, "get_iteration_stats")
        }
        8 => (
            kvb_manager_get_beam_width(h, inp.request_id(), &mut i32_out),
            "get_beam_width",
        ),
        9 => {
            let st = kvb_manager_get_num_front_blocks_removed(
                h,
                inp.request_id(),
                window(inp, m),
                &mut i32_out,
            );
            if st == kvb_status_t::KVB_OK {
                non_negative(i32_out.into(), "front blocks removed");
            }
            (st, "get_num_front_blocks_removed")
        }
        11 => {
            let mut moved = false;
            let st = kvb_manager_onboard_block(h, window(inp, m), inp.i32(), &mut moved);
            (st, "onboard_block")
        }
        12 => {
            let ids: Vec<i32> = (0..inp.u8() % 4).map(|_| inp.i32()).collect();
            let st = kvb_manager_pin_blocks_by_id(h, window(inp, m), ids.as_ptr(), ids.len());
            (st, "pin_blocks_by_id")
        }
        13 => {
            let n = usize::from(inp.u8() % 4);
            let ids: Vec<u64> = (0..n).map(|_| inp.request_id()).collect();
            let positions: Vec<i32> = (0..n).map(|_| inp.i32()).collect();
            let st = kvb_manager_copy_recurrent_state(
                h,
                ids.as_ptr(),
                positions.as_ptr(),
                n,
                &mut count,
            );
            (st, "copy_recurrent_state")
        }
        14 => {
            let r = request(inp, tpb);
            let ids: Vec<i32> = (0..inp.u8() % 4).map(|_| inp.i32()).collect();
            let pin = inp.bool();
            let (mut pinned, null_buffer) = buffer(inp, 0i32);
            let ptr = if null_buffer {
                null_mut()
            } else {
                pinned.as_mut_ptr()
            };
            let mut stored = 0i32;
            let st = kvb_manager_store_blocks(
                h,
                &r.raw,
                inp.i32(),
                window(inp, m),
                ids.as_ptr(),
                ids.len(),
                pin,
                ptr,
                pinned.len(),
                &mut count,
                &mut stored,
            );
            if st == kvb_status_t::KVB_OK {
                non_negative(stored.into(), "blocks stored");
                assert!(count <= ids.len());
            }
            (st, "store_blocks")
        }
        15 => {
            let priority = i32::from(inp.u8() % 112) - 5;
            let st = kvb_manager_set_block_priority(h, window(inp, m), inp.i32(), priority);
            if !(0..=100).contains(&priority) && st == kvb_status_t::KVB_OK {
                panic!("priority {priority} accepted");
            }
            (st, "set_block_priority")
        }
        _ => {
            let ids: Vec<i32> = (0..inp.u8() % 6).map(|_| inp.i32()).collect();
            let mut out = vec![0i32; ids.len()];
            let st = kvb_manager_get_memory_pool_block_indices(
                h,
                window(inp, m),
                ids.as_ptr(),
                ids.len(),
                out.as_mut_ptr(),
            );
            (st, "get_memory_pool_block_indices")
        }
    }
}
