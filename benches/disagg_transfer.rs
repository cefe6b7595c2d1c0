//! A lease's transfer over NIXL against NIXL moving the same bytes in one descriptor, in the
//! same run: two managers (a prefill and a decode engine, host-memory pools) with NIXL agents
//! in this process (UCX between them), blocks of 16 KiB to 4 MiB, 32 MiB a request.
//!
//! Three pools per block size: fresh (a request's rows are one run on both sides), fragmented
//! (released in an interleaved order before the request), and fragmented with the
//! contiguous-run allocation policy on. For each: descriptors before and after merging, the
//! median of `KVB_DISAGG_BENCH_RUNS` (default 7) transfers (post to completion), and the ratio
//! to one descriptor of the same bytes between the same registered pools.
//!
//!   source scripts/nixl_env.sh && cargo bench --bench disagg_transfer

use std::time::{Duration, Instant};

use kvblock::disagg::nixl::{NixlBackend, NixlConfig};
use kvblock::disagg::{Desc, Layout, MemKind, Region, TransferBackend, XferOp, XferState};
use kvblock::manager::{
    CopyBackend, KvCacheManager, ManagerConfig, Request, TransferOutcome, WindowSpec,
};
use kvblock::pool::Level;

const TPB: usize = 16;
const REQUEST_BYTES: usize = 32 << 20;
const POOL_BYTES: usize = 96 << 20;

fn manager(block_bytes: usize, contiguous: bool) -> KvCacheManager {
    let blocks = POOL_BYTES / block_bytes;
    let mut m = KvCacheManager::new(ManagerConfig {
        windows: vec![WindowSpec {
            window_size: 1 << 20,
            primary_blocks: blocks,
            secondary_blocks: 0,
            num_layers: 1,
            num_kv_heads: 1,
            size_per_head: block_bytes / (2 * TPB),
            auto_host_tier: false,
        }],
        tokens_per_block: TPB,
        max_sequence_length: 1 << 20,
        manual_clock: true,
        copy_backend: CopyBackend::HostMemory,
        bytes_per_element: 1,
        enable_block_reuse: false,
        ..ManagerConfig::default()
    })
    .expect("manager");
    m.set_contiguous_runs(contiguous);
    m
}

/// Interleaves the free queue: one-block requests over the whole pool, released even ids
/// first, then odd ones.
fn fragment(m: &mut KvCacheManager) {
    let n = m.num_free_blocks() as u64;
    for id in 0..n {
        m.add_sequence(&Request::new(1_000_000 + id, vec![id as i32; TPB - 1]))
            .unwrap();
    }
    for id in (0..n).step_by(2).chain((1..n).step_by(2)) {
        m.remove_sequence(1_000_000 + id, false).unwrap();
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn wait(be: &mut dyn TransferBackend, x: kvblock::disagg::XferId) {
    let t = Instant::now();
    while be.state(x) == XferState::InProgress {
        assert!(t.elapsed() < Duration::from_secs(30), "transfer stuck");
        std::hint::spin_loop();
    }
    assert_eq!(be.state(x), XferState::Done);
    be.release(x).unwrap();
}

struct Row {
    pool: &'static str,
    block: usize,
    unmerged: u64,
    posted: u64,
    lease_gbs: f64,
    single_gbs: f64,
}

fn measure(block: usize, pool: &'static str, runs: usize, agents: &mut u32) -> Row {
    let (fragmented, contiguous) = match pool {
        "fresh" => (false, false),
        "fragmented" => (true, false),
        _ => (true, true),
    };
    *agents += 1;
    let (pn, dn) = (format!("prefill{agents}"), format!("decode{agents}"));
    let mut p = manager(block, contiguous);
    let mut d = manager(block, contiguous);
    if fragmented {
        fragment(&mut p);
        fragment(&mut d);
    }
    // Touch every page of both pools first: a first write faults pages in, which would be
    // charged to whichever transfer wrote there first.
    for m in [&mut p, &mut d] {
        let (base, row) = m.model_pool_pointer(0, Level::Primary).unwrap();
        // SAFETY: the pool is `blocks` rows of `row` bytes of host memory the manager owns.
        unsafe { std::ptr::write_bytes(base, 1, row * (POOL_BYTES / block)) };
    }
    // The same two agents move the same bytes in one descriptor first, then carry the leases.
    let (pb, pool_len) = {
        let (base, row) = p.model_pool_pointer(0, Level::Primary).unwrap();
        (base as u64, (row * (POOL_BYTES / block)) as u64)
    };
    let db = d.model_pool_pointer(0, Level::Primary).unwrap().0 as u64;
    let region = |addr| Region {
        addr,
        len: pool_len,
        kind: MemKind::Dram,
    };
    let mut src = NixlBackend::new(&NixlConfig::new(&pn)).expect("NIXL");
    let mut dst = NixlBackend::new(&NixlConfig::new(&dn)).expect("NIXL");
    src.register(&region(pb)).unwrap();
    dst.register(&region(db)).unwrap();
    src.add_peer(&dst.local_metadata().unwrap()).unwrap();
    dst.add_peer(&src.local_metadata().unwrap()).unwrap();
    let mut single_s = Vec::new();
    for _ in 0..runs {
        let l = [Desc {
            addr: pb,
            len: REQUEST_BYTES as u64,
        }];
        let r = [Desc {
            addr: db,
            len: REQUEST_BYTES as u64,
        }];
        let t = Instant::now();
        let x = src.post(XferOp::Write, &l, &dn, &r, b"").unwrap();
        wait(&mut src, x);
        single_s.push(t.elapsed().as_secs_f64());
    }
    // Attaching registers the same regions again: a no-op.
    p.attach_transfer_backend(Box::new(src), 0, 1, 60_000)
        .unwrap();
    d.attach_transfer_backend(Box::new(dst), 0, 1, 60_000)
        .unwrap();
    let layout = Layout::decode(&d.export_layout().unwrap().encode()).unwrap();
    let tokens = (REQUEST_BYTES / block) * TPB;
    let mut lease_s = Vec::new();
    let (mut unmerged, mut posted) = (0, 0);
    for run in 0..runs as u64 {
        let prompt: Vec<i32> = (0..tokens as i32).map(|t| t ^ run as i32).collect();
        d.add_sequence_receiving(&Request::new(run, prompt.clone()))
            .unwrap();
        let ticket = d.receive_ticket(run).unwrap();
        p.add_sequence(&Request::new(run, prompt)).unwrap();
        let lease = p.begin_send(run, 0, tokens).unwrap();
        p.remove_sequence(run, false).unwrap();
        let before = p.transfer_stats();
        let t = Instant::now();
        p.post_send(lease, &dn, &layout, &ticket, b"").unwrap();
        loop {
            if let Some(&(_, o)) = p.poll_transfers().first() {
                assert_eq!(o, TransferOutcome::Done);
                break;
            }
            std::hint::spin_loop();
        }
        lease_s.push(t.elapsed().as_secs_f64());
        let after = p.transfer_stats();
        unmerged = after.descriptors_unmerged - before.descriptors_unmerged;
        posted = after.descriptors_posted - before.descriptors_posted;
        d.complete_receive(run).unwrap();
        d.remove_sequence(run, false).unwrap();
    }
    let gbs = |s: f64| REQUEST_BYTES as f64 / s / 1e9;
    Row {
        pool,
        block,
        unmerged,
        posted,
        lease_gbs: gbs(median(lease_s)),
        single_gbs: gbs(median(single_s)),
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let runs: usize = std::env::var("KVB_DISAGG_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    println!(
        "| block | pool | descriptors (unmerged → posted) | lease GB/s | one descriptor GB/s | ratio |"
    );
    println!("|---|---|---|---|---|---|");
    let mut agents = 0;
    for block in [16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20] {
        for pool in ["fresh", "fragmented", "fragmented+runs"] {
            let r = measure(block, pool, runs, &mut agents);
            println!(
                "| {} KiB | {} | {} → {} | {:.2} | {:.2} | {:.0}% |",
                r.block >> 10,
                r.pool,
                r.unmerged,
                r.posted,
                r.lease_gbs,
                r.single_gbs,
                100.0 * r.lease_gbs / r.single_gbs
            );
        }
    }
}
