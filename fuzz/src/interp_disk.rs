//! The interpreter's disk-tier calls: poll, prefetch, readiness and statistics on a fuzzed
//! manager's disk tier, in one of four directories per process.

use super::*;

/// A directory for a fuzzed manager's disk tier: one of four per process, in turn (a directory
/// still used by the other live manager makes creation fail, a documented status).
pub(super) fn fuzz_disk_dir() -> std::ffi::CString {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed) % 4;
    let dir = std::env::temp_dir().join(format!("kvblock-fuzz-disk-{}-{n}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    std::ffi::CString::new(dir.to_string_lossy().as_bytes()).expect("no NUL")
}

/// Calls of the disk tier (poll, prefetch, readiness, statistics; valid without a disk tier).
pub(super) fn disk_call(inp: &mut Input, m: &Managed) -> (kvb_status_t, &'static str) {
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
