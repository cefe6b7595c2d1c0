//! The interpreter's calls that need no manager (sizing helpers, status strings, init
//! functions) and the reading of event batches.

use super::*;

pub(super) fn read_batch(batch: *mut kvb_event_batch_t, inp: &mut Input) {
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
pub(super) fn free_call(inp: &mut Input) {
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
