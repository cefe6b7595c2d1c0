//! The disk tier below the host tier: bytes survive a disk round trip, reads are claimed,
//! estimates equal admission, faults leave the manager working with exact counters, bad
//! configuration fails at creation, and a restarted manager reuses the files.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

#[path = "common/multi_pool.rs"]
mod multi_pool;

use kvblock::manager::{
    CopyBackend, DiskTierConfig, KvCacheManager, ManagerConfig, Request, WindowSpec,
};
use kvblock::pool::Level;
use kvblock::tier::store::FaultPlan;
use kvblock::tier::{TierStats, WritePolicy};

const TPB: usize = 4;
const WINDOW: usize = 64;
/// 1 layer x K|V x 1 head x 4 tokens x 2 elements x 1 byte.
const ROW: usize = 16;

/// A fresh directory under the target dir (removed first).
fn scratch_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("disk-tier-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn config(dir: Option<&Path>, primary: usize, secondary: usize, slots: u64) -> ManagerConfig {
    ManagerConfig {
        windows: vec![WindowSpec {
            window_size: WINDOW,
            primary_blocks: primary,
            secondary_blocks: secondary,
            num_layers: 1,
            num_kv_heads: 1,
            size_per_head: 2,
            ..WindowSpec::default()
        }],
        tokens_per_block: TPB,
        max_sequence_length: WINDOW,
        bytes_per_element: 1,
        copy_backend: CopyBackend::HostMemory,
        manual_clock: true,
        disk: DiskTierConfig {
            directory: dir.map(Path::to_path_buf),
            bytes_per_window: slots * 4096,
            max_writes_queued: 8,
            max_reads_in_flight: 8,
            ..DiskTierConfig::default()
        },
        ..ManagerConfig::default()
    }
}

fn manager(dir: &Path, primary: usize, secondary: usize, slots: u64) -> KvCacheManager {
    KvCacheManager::new(config(Some(dir), primary, secondary, slots)).expect("manager")
}

/// The KV byte of a token at one (K|V, element) position: never 0.
fn kv_of(token: i32, field: usize) -> u8 {
    ((token.rem_euclid(97) as usize * 4 + field) % 251 + 1) as u8
}

fn row_of(m: &mut KvCacheManager, block: u32) -> *mut u8 {
    let w = m.window_mut(WINDOW).unwrap();
    let row = w.arena().row(block);
    assert_eq!(row.level, Level::Primary);
    let base = w.engine_mut().pool_base(Level::Primary, 0).unwrap();
    // SAFETY: the host backend's primary pool holds `primary` rows of ROW bytes.
    unsafe { base.add(row.index as usize * ROW) }
}

/// "Computes" a sequence's KV: writes each token's pattern into its primary rows. Row layout:
/// [K|V][head][token][element].
fn compute(m: &mut KvCacheManager, id: u64, tokens: &[i32]) {
    let blocks = m.cache_block_ids(id, WINDOW, 0).unwrap();
    for (bi, &b) in blocks.iter().enumerate() {
        let row = row_of(m, b);
        for kv in 0..2 {
            for t in 0..TPB {
                let Some(&tok) = tokens.get(bi * TPB + t) else {
                    continue;
                };
                for e in 0..2 {
                    let field = kv * 2 + e;
                    // SAFETY: inside the row.
                    unsafe { *row.add(kv * TPB * 2 + t * 2 + e) = kv_of(tok, field) };
                }
            }
        }
    }
}

/// Checks that the reused blocks of a sequence hold the pattern of its tokens.
fn check(m: &mut KvCacheManager, id: u64, tokens: &[i32], reused_tokens: usize) {
    let blocks = m.cache_block_ids(id, WINDOW, 0).unwrap();
    for pos in 0..reused_tokens {
        let row = row_of(m, blocks[pos / TPB]);
        let t = pos % TPB;
        for kv in 0..2 {
            for e in 0..2 {
                // SAFETY: inside the row.
                let got = unsafe { *row.add(kv * TPB * 2 + t * 2 + e) };
                assert_eq!(got, kv_of(tokens[pos], kv * 2 + e), "token {pos}");
            }
        }
    }
}

fn tokens(seed: i32, n: usize) -> Vec<i32> {
    (0..n as i32).map(|i| seed * 1000 + i).collect()
}

/// Runs a request to completion: admit, compute, store for reuse, release.
fn serve(m: &mut KvCacheManager, id: u64, toks: &[i32]) -> usize {
    let a = m.add_sequence(&Request::new(id, toks.to_vec())).unwrap();
    compute(m, id, toks);
    m.store_context_blocks(id, toks.len()).unwrap();
    m.remove_sequence(id, true).unwrap();
    a.prepopulated_prompt_len
}

/// Polls until no disk I/O is pending (bounded: the test fails instead of hanging).
fn settle(m: &mut KvCacheManager) -> TierStats {
    let start = Instant::now();
    loop {
        m.disk_poll();
        let s = m.disk_stats();
        if s.writes_queued == 0 && s.reads_in_flight == 0 {
            return s;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "disk I/O hangs");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Serves `n` unrelated requests of 17 tokens: pushes earlier blocks through host to disk.
fn churn(m: &mut KvCacheManager, first_id: u64, n: usize) {
    for i in 0..n {
        serve(m, first_id + i as u64, &tokens(500 + i as i32, 17));
        settle(m);
    }
}

/// Prefetches a request until its prefix is in; returns the reads started.
fn prefetch_until_ready(m: &mut KvCacheManager, req: &Request) -> usize {
    let started = m.disk_prefetch(&[req.as_ref()]).unwrap()[0].started;
    let start = Instant::now();
    while m.disk_blocks_in_flight(&req.as_ref()).unwrap() > 0 {
        assert!(start.elapsed() < Duration::from_secs(20), "disk reads hang");
        std::thread::sleep(Duration::from_millis(1));
    }
    started
}

#[test]
fn bytes_survive_a_disk_round_trip_and_the_estimate_equals_admission() {
    let dir = scratch_dir("round-trip");
    let mut m = manager(&dir, 8, 4, 64);
    let a = tokens(1, 17);
    assert_eq!(serve(&mut m, 1, &a), 0);
    churn(&mut m, 100, 6);
    let s = settle(&mut m);
    assert!(s.writes >= 4, "A's 4 blocks reached disk: {s:?}");
    // A's blocks are gone from GPU and host: without the disk tier A would recompute.
    let req = Request::new(2, a.clone());
    assert_eq!(
        m.estimate_batch(std::slice::from_ref(&req)).unwrap()[0].reused_blocks,
        0
    );
    assert_eq!(prefetch_until_ready(&mut m, &req), 4);
    let s = m.disk_stats();
    assert_eq!((s.hits, s.verify_failures, s.read_errors), (4, 0, 0));
    let est = m.estimate_batch(std::slice::from_ref(&req)).unwrap()[0];
    let adm = m.add_sequence(&req).unwrap();
    assert_eq!(est.reusable_tokens, adm.prepopulated_prompt_len);
    assert_eq!(adm.prepopulated_prompt_len, 16);
    check(&mut m, 2, &a, 16);
    m.check_invariants().unwrap();
}

#[test]
fn a_request_that_opts_out_of_reuse_reads_nothing_from_disk() {
    let dir = scratch_dir("opt-out");
    let mut m = manager(&dir, 8, 4, 64);
    let a = tokens(3, 17);
    serve(&mut m, 1, &a);
    churn(&mut m, 100, 6);
    assert!(settle(&mut m).writes >= 4, "A's blocks reached disk");
    let out = Request {
        disable_reuse: true,
        ..Request::new(2, a.clone())
    };
    assert_eq!(m.disk_prefetch(&[out.as_ref()]).unwrap()[0].started, 0);
    assert_eq!(m.disk_blocks_in_flight(&out.as_ref()).unwrap(), 0);
    assert_eq!(m.disk_stats().hits, 0);
    // The same prompt taking part in reuse finds its 4 blocks there.
    assert_eq!(prefetch_until_ready(&mut m, &Request::new(3, a)), 4);
    m.check_invariants().unwrap();
}

#[test]
fn a_block_being_read_is_claimed_and_not_evicted_under_the_read() {
    let dir = scratch_dir("claimed");
    let mut m = manager(&dir, 8, 4, 64);
    let a = tokens(2, 17);
    serve(&mut m, 1, &a);
    churn(&mut m, 100, 6);
    settle(&mut m);
    // Slow reads: the claim must hold while other requests allocate and evict.
    let faults = m.disk_tier(WINDOW).unwrap().unwrap().faults().clone();
    faults.read_latency_us.store(20_000, Ordering::Relaxed);
    let req = Request::new(2, a.clone());
    let free_host_before = m.num_free_blocks_of_window(WINDOW).unwrap().1;
    assert_eq!(m.disk_prefetch(&[req.as_ref()]).unwrap()[0].started, 4);
    let (_, free_host) = m.num_free_blocks_of_window(WINDOW).unwrap();
    assert_eq!(free_host, free_host_before - 4, "destinations are claimed");
    // Churn while the reads are in flight: nothing takes the claimed host blocks.
    for i in 0..4 {
        serve(&mut m, 300 + i, &tokens(700 + i as i32, 17));
        m.check_invariants().unwrap();
    }
    faults.read_latency_us.store(0, Ordering::Relaxed);
    prefetch_until_ready(&mut m, &req);
    let adm = m.add_sequence(&req).unwrap();
    assert_eq!(adm.prepopulated_prompt_len, 16);
    check(&mut m, 2, &a, 16);
    m.check_invariants().unwrap();
}

/// The workload of the fault tests: A, then churn that pushes A and most churn blocks to disk.
fn workload(m: &mut KvCacheManager) -> Vec<i32> {
    let a = tokens(3, 17);
    serve(m, 1, &a);
    churn(m, 100, 6);
    a
}

/// Writes of the fault-free workload (it is deterministic: write results change no block).
fn clean_writes(name: &str) -> u64 {
    let dir = scratch_dir(&format!("clean-{name}"));
    let mut m = manager(&dir, 8, 4, 64);
    workload(&mut m);
    settle(&mut m).writes
}

/// After a fault, the manager still serves A with whatever verified blocks the disk has, with
/// the right bytes.
fn serve_a_again(m: &mut KvCacheManager, a: &[i32]) -> usize {
    let req = Request::new(2, a.to_vec());
    prefetch_until_ready(m, &req);
    let est = m.estimate_batch(std::slice::from_ref(&req)).unwrap()[0];
    let adm = m.add_sequence(&req).unwrap();
    assert_eq!(est.reusable_tokens, adm.prepopulated_prompt_len);
    check(m, 2, a, adm.prepopulated_prompt_len);
    m.check_invariants().unwrap();
    adm.prepopulated_prompt_len
}

#[test]
fn injected_short_writes_are_not_published_and_are_counted() {
    let dir = scratch_dir("short");
    let mut m = manager(&dir, 8, 4, 64);
    let faults = m.disk_tier(WINDOW).unwrap().unwrap().faults().clone();
    faults.short_writes.store(3, Ordering::Relaxed);
    let a = workload(&mut m);
    let s = settle(&mut m);
    assert_eq!(s.write_errors, 3);
    assert_eq!(s.writes + 3, clean_writes("short"));
    assert_eq!(s.slots_used, s.writes);
    serve_a_again(&mut m, &a);
}

/// Two writes fail with `errno` (`fault` picks the injection counter): both are counted (as
/// ENOSPC or not), publish no slot, and the manager serves A with what reached the disk.
fn two_failed_writes_are_counted_and_harmless(
    name: &str,
    fault: fn(&FaultPlan) -> &AtomicU32,
    enospc: u64,
) {
    let dir = scratch_dir(name);
    let mut m = manager(&dir, 8, 4, 64);
    let faults = m.disk_tier(WINDOW).unwrap().unwrap().faults().clone();
    fault(&faults).store(2, Ordering::Relaxed);
    let a = workload(&mut m);
    let s = settle(&mut m);
    assert_eq!((s.write_errors, s.enospc_errors), (2, enospc));
    assert_eq!(s.writes + 2, clean_writes(name));
    assert_eq!(s.slots_used, s.writes, "a failed write publishes no slot");
    serve_a_again(&mut m, &a);
}

#[test]
fn enospc_on_writes_is_counted_and_harmless() {
    two_failed_writes_are_counted_and_harmless("enospc", |f| &f.enospc_writes, 2);
}

#[test]
fn eio_on_writes_is_counted_and_harmless() {
    two_failed_writes_are_counted_and_harmless("eio-write", |f| &f.eio_writes, 0);
}

#[test]
fn a_full_directory_stops_writes_but_not_the_manager() {
    let dir = scratch_dir("full");
    // One I/O thread: writes are attempted in the order they were queued, so the first four are
    // A's blocks. (With two, a worker still sealing A's first block can let a later block take
    // one of the four writes, and then nothing of A is on disk.)
    let mut cfg = config(Some(&dir), 8, 4, 64);
    cfg.disk.io_threads = 1;
    let mut m = KvCacheManager::new(cfg).expect("manager");
    let faults = m.disk_tier(WINDOW).unwrap().unwrap().faults().clone();
    // A's four blocks are the first written; then the directory is full.
    faults.writes_until_full.store(4, Ordering::Relaxed);
    let a = workload(&mut m);
    let s = settle(&mut m);
    assert_eq!(s.writes, 4);
    assert_eq!(s.enospc_errors, clean_writes("full") - 4);
    assert_eq!(s.write_errors, s.enospc_errors);
    assert_eq!(serve_a_again(&mut m, &a), 16);
}

#[test]
fn writes_behind_the_disk_are_dropped_and_counted() {
    let dir = scratch_dir("write-drops");
    let mut m = manager(&dir, 8, 4, 64);
    let faults = m.disk_tier(WINDOW).unwrap().unwrap().faults().clone();
    // A slow device and no polling while the requests run: the queue of 8 writes fills up.
    faults.write_latency_us.store(50_000, Ordering::Relaxed);
    let a = tokens(3, 17);
    serve(&mut m, 1, &a);
    for i in 0..6 {
        serve(&mut m, 100 + i, &tokens(500 + i as i32, 17));
    }
    faults.write_latency_us.store(0, Ordering::Relaxed);
    let s = settle(&mut m);
    assert!(s.write_drops > 0, "{s:?}");
    // Every block the host tier evicted was written, dropped or already being written.
    let clean = {
        let dir = scratch_dir("write-drops-clean");
        let mut c = manager(&dir, 8, 4, 64);
        workload(&mut c);
        settle(&mut c)
    };
    assert_eq!(
        s.writes + s.write_drops + s.write_skips,
        clean.writes + clean.write_drops + clean.write_skips
    );
    assert_eq!((s.write_errors, s.slots_used), (0, s.writes));
    // Whatever reached the disk is served with the right bytes.
    serve_a_again(&mut m, &a);
}

#[test]
fn reads_beyond_the_bound_are_refused_counted_and_started_later() {
    let dir = scratch_dir("read-drops");
    let mut cfg = config(Some(&dir), 8, 4, 64);
    cfg.disk.max_reads_in_flight = 2;
    let mut m = KvCacheManager::new(cfg).expect("manager");
    let a = workload(&mut m);
    settle(&mut m);
    let faults = m.disk_tier(WINDOW).unwrap().unwrap().faults().clone();
    faults.read_latency_us.store(20_000, Ordering::Relaxed);
    let req = Request::new(2, a.clone());
    // A's four blocks are on disk: two reads start, the rest are refused by the bound.
    assert_eq!(m.disk_prefetch(&[req.as_ref()]).unwrap()[0].started, 2);
    let s = m.disk_stats();
    assert_eq!((s.reads_in_flight, s.read_drops), (2, 1));
    faults.read_latency_us.store(0, Ordering::Relaxed);
    // Prefetching again once they land brings the rest in: the whole prefix is reused.
    let mut rounds = 0;
    while m.estimate_batch(std::slice::from_ref(&req)).unwrap()[0].reusable_tokens < 16 {
        prefetch_until_ready(&mut m, &req);
        m.disk_poll();
        rounds += 1;
        assert!(rounds < 10, "the prefix never comes back");
    }
    let adm = m.add_sequence(&req).unwrap();
    assert_eq!(adm.prepopulated_prompt_len, 16);
    check(&mut m, 2, &a, 16);
    m.check_invariants().unwrap();
}

#[test]
fn eio_on_a_read_drops_that_block_and_the_request_recomputes_it() {
    let dir = scratch_dir("eio");
    let mut m = manager(&dir, 8, 4, 64);
    let a = workload(&mut m);
    let before = settle(&mut m);
    let faults = m.disk_tier(WINDOW).unwrap().unwrap().faults().clone();
    faults.eio_reads.store(1, Ordering::Relaxed);
    let reused = serve_a_again(&mut m, &a);
    // The reads after the failed block finish later and are discarded (their parent is gone).
    let s = settle(&mut m);
    assert_eq!(s.read_errors, 1);
    assert_eq!(s.reads, 4);
    assert_eq!(s.hits + s.reads_discarded + s.read_errors, 4);
    assert_eq!(
        reused,
        s.hits as usize * TPB,
        "the prefix up to the failed block"
    );
    assert_eq!(s.evictions, 0);
    assert_eq!(s.slots_used, s.writes - 1, "the failed slot is dropped");
    assert!(before.slots_used == before.writes);
}

#[test]
fn flipped_bits_on_disk_never_reach_the_engine() {
    let dir = scratch_dir("flip");
    let mut m = manager(&dir, 8, 4, 64);
    let a = workload(&mut m);
    settle(&mut m);
    // Flip one row byte in every slot of the file.
    let path = dir.join(kvblock::manager::disk_file_name(WINDOW));
    let tier = m.disk_tier(WINDOW).unwrap().unwrap();
    let (slot_bytes, header_bytes) = (tier.layout().slot_bytes(), tier.layout().header_bytes());
    let mut bytes = std::fs::read(&path).unwrap();
    for slot in 0..bytes.len() / slot_bytes {
        bytes[slot * slot_bytes + header_bytes + 5] ^= 0x40;
    }
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(serve_a_again(&mut m, &a), 0);
    // Every read fails its verification, or finishes after the failed block's and is discarded
    // unverified (its parent is gone): which, depends on the I/O threads' timing.
    let s = settle(&mut m);
    assert!(s.verify_failures >= 1);
    assert_eq!(s.verify_failures + s.reads_discarded, 4);
    assert_eq!(s.hits, 0);
}

#[test]
fn bad_configuration_fails_at_creation() {
    let dir = scratch_dir("config");
    let missing = dir.join("missing");
    let err = |cfg: ManagerConfig| KvCacheManager::new(cfg).unwrap_err().to_string();
    assert!(err(config(Some(&missing), 8, 4, 64)).contains("cannot be used"));
    let file = dir.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    assert!(err(config(Some(&file), 8, 4, 64)).contains("not a directory"));
    // A directory nobody can write to (root writes anywhere it may: /proc refuses it too).
    let read_only = Path::new("/proc/self");
    assert!(err(config(Some(read_only), 8, 4, 64)).contains("not writable"));
    let mut small = config(Some(&dir), 8, 4, 64);
    small.disk.bytes_per_window = 4095;
    assert!(err(small).contains("below one slot"));
    assert!(err(config(Some(&dir), 8, 0, 64)).contains("host tier"));
    // Without a directory there is no disk tier.
    let m = KvCacheManager::new(config(None, 8, 4, 64)).unwrap();
    assert!(!m.has_disk_tier());
}

#[test]
fn two_managers_cannot_share_a_directory() {
    let dir = scratch_dir("shared");
    let _first = manager(&dir, 8, 4, 64);
    let second = KvCacheManager::new(config(Some(&dir), 8, 4, 64));
    assert!(second.unwrap_err().to_string().contains("in use"));
}

#[test]
fn a_restarted_manager_reuses_the_disk_cache() {
    let dir = scratch_dir("restart");
    let a = {
        let mut m = manager(&dir, 8, 4, 64);
        let a = workload(&mut m);
        settle(&mut m);
        a
    };
    let written = clean_writes("restart");
    let mut m = manager(&dir, 8, 4, 64);
    let s = m.disk_stats();
    assert_eq!((s.recovered, s.ignored_at_restart), (written, 0));
    assert_eq!(serve_a_again(&mut m, &a), 16);
    assert_eq!(m.disk_stats().hits, 4);
}

#[test]
fn a_restart_with_another_geometry_ignores_the_old_slots() {
    let dir = scratch_dir("restart-geometry");
    {
        let mut m = manager(&dir, 8, 4, 64);
        workload(&mut m);
        settle(&mut m);
    }
    let mut cfg = config(Some(&dir), 8, 4, 64);
    cfg.windows[0].size_per_head = 4;
    let m = KvCacheManager::new(cfg).unwrap();
    let s = m.disk_stats();
    assert_eq!(s.recovered, 0);
    assert_eq!(s.ignored_at_restart, clean_writes("geometry"));
}

#[test]
fn the_reused_policy_writes_only_blocks_reused_at_least_once() {
    let dir = scratch_dir("policy");
    let mut cfg = config(Some(&dir), 8, 4, 64);
    cfg.disk.write_policy = WritePolicy::Reused;
    let mut m = KvCacheManager::new(cfg).unwrap();
    let a = tokens(4, 17);
    serve(&mut m, 1, &a);
    // A is reused once (its 4 full blocks), then pushed out.
    assert_eq!(serve(&mut m, 2, &a), 16);
    churn(&mut m, 100, 6);
    let s = settle(&mut m);
    assert_eq!(s.writes, 4, "only A's reused blocks: {s:?}");
    assert!(s.policy_skips > 0);
    assert_eq!(serve_a_again(&mut m, &a), 16);
}

#[test]
fn the_sizing_helper_gives_the_slots_a_manager_gets_for_a_budget() {
    // A small row (one aligned unit with its header) and one past a unit boundary.
    for (heads, size_per_head) in [(1usize, 2usize), (8, 128)] {
        let dir = scratch_dir(&format!("sizing-{heads}"));
        let mut cfg = config(Some(&dir), 8, 4, 0);
        cfg.windows[0].num_kv_heads = heads;
        cfg.windows[0].size_per_head = size_per_head;
        cfg.disk.bytes_per_window = 10 * 4096 * 3 + 4095; // not a multiple of any slot
        let row = (2 * heads * TPB * size_per_head) as u64;
        let (blocks, slot) = kvblock::sizing::disk_tier_blocks(TPB, row, cfg.disk.bytes_per_window);
        let m = KvCacheManager::new(cfg).expect("manager");
        let s = m.disk_stats();
        assert_eq!(
            (s.slots, s.slot_bytes),
            (blocks, slot),
            "row of {row} bytes"
        );
        assert_eq!(slot % 4096, 0);
        assert!(slot >= row + 64, "the header is part of the slot");
    }
}

#[test]
fn every_pool_of_a_block_survives_a_disk_round_trip() {
    let dir = scratch_dir("multi-pool");
    let mut cfg = config(Some(&dir), 8, 4, 64);
    cfg.layers = multi_pool::layers(WINDOW);
    let mut m = KvCacheManager::new(cfg).expect("manager");
    assert_eq!(m.pool_model().pools().len(), multi_pool::POOLS);
    let a = tokens(4, 17);
    m.add_sequence(&Request::new(1, a.clone())).unwrap();
    multi_pool::write_pattern(&mut m, 1, WINDOW, &a, TPB);
    m.store_context_blocks(1, a.len()).unwrap();
    m.remove_sequence(1, true).unwrap();
    // Other requests push A through the host tier to disk (their bytes are not checked, and
    // `compute` writes the single-pool layout, so they write none).
    for i in 0..6u64 {
        let other = tokens(500 + i as i32, 17);
        m.add_sequence(&Request::new(100 + i, other.clone()))
            .unwrap();
        m.store_context_blocks(100 + i, other.len()).unwrap();
        m.remove_sequence(100 + i, true).unwrap();
        settle(&mut m);
    }
    let s = settle(&mut m);
    assert!(s.writes >= 4, "{s:?}");
    let req = Request::new(2, a.clone());
    assert_eq!(prefetch_until_ready(&mut m, &req), 4);
    assert_eq!(m.add_sequence(&req).unwrap().prepopulated_prompt_len, 16);
    multi_pool::check_pattern(&mut m, 2, WINDOW, &a, TPB, 4);
    m.check_invariants().unwrap();
}
