//! The interpreter's calls on one live manager: admission, tokens, stores, release, pins,
//! queries, iteration, tiers and pools, with fuzzed (valid and invalid) arguments.

use super::*;

/// One call on `m`; returns the status and whether the call is one that must not change the
/// statistics when it fails.
pub(super) fn call(inp: &mut Input, m: &mut Managed) -> (kvb_status_t, &'static str) {
    let h = m.handle;
    let tpb = m.tpb;
    let op = inp.u8() % 48;
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
        47 => trtllm::call(inp, m),
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
