//! Disk-tier throughput of whole blocks against the same directory's raw sequential O_DIRECT
//! throughput, measured in the same run (a benchmark, not a test).
//!
//! `cargo run --release --example disk_throughput -- DIR [MiB per size] [io threads]`
//!
//! For each row size (64 KiB, 256 KiB, 1 MiB, 4 MiB): a raw loop writes then reads a file of
//! that many MiB sequentially with O_DIRECT in row-sized chunks (one thread, no checksum); the
//! disk tier then stores the same bytes as sealed blocks (the caller copies each row and its key
//! into a slot buffer, the I/O threads checksum and write it) and reads them all back (the I/O
//! threads read and verify key and checksum). Throughput counts row bytes only.

use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvblock::key::BlockKeyRef;
use kvblock::tier::io::IoPool;
use kvblock::tier::sealed::{seal_key, SlotLayout, ROOT_DIGEST};
use kvblock::tier::store::AlignedBuf;
use kvblock::tier::{DiskTier, TierLimits};

const SIZES: [usize; 4] = [64 << 10, 256 << 10, 1 << 20, 4 << 20];

fn raw_direct(dir: &Path, row: usize, total: usize) -> io::Result<(f64, f64)> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("kvblock-raw-direct.bench");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)?;
    let mut buf = AlignedBuf::new(row).expect("memory");
    buf.as_mut_slice().fill(0x5a);
    let n = total / row;
    let start = Instant::now();
    for i in 0..n {
        // SAFETY: an aligned buffer of `row` bytes.
        let w = unsafe {
            libc::pwrite(
                f.as_raw_fd(),
                buf.as_slice().as_ptr().cast(),
                row,
                (i * row) as libc::off_t,
            )
        };
        if w != row as isize {
            return Err(io::Error::last_os_error());
        }
    }
    f.sync_all()?;
    let write = (n * row) as f64 / start.elapsed().as_secs_f64();
    let start = Instant::now();
    for i in 0..n {
        // SAFETY: as above.
        let r = unsafe {
            libc::pread(
                f.as_raw_fd(),
                buf.as_mut_slice().as_mut_ptr().cast(),
                row,
                (i * row) as libc::off_t,
            )
        };
        if r != row as isize {
            return Err(io::Error::last_os_error());
        }
    }
    let read = (n * row) as f64 / start.elapsed().as_secs_f64();
    drop(f);
    std::fs::remove_file(&path)?;
    Ok((write, read))
}

fn wait(tier: &mut DiskTier, mut done: impl FnMut(&DiskTier) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while !done(tier) {
        for r in tier.harvest() {
            if let Some((_, buf)) = r.data {
                tier.release_buffer(buf);
            }
        }
        assert!(Instant::now() < deadline, "disk I/O hangs");
        std::thread::sleep(Duration::from_micros(50));
    }
}

fn tier_throughput(dir: &Path, row: usize, total: usize, threads: usize) -> (f64, f64, bool) {
    let n = (total / row) as u64;
    let layout = SlotLayout::new(1, 32, &[row]);
    let pool = Arc::new(IoPool::new(threads).expect("threads"));
    let limits = TierLimits {
        max_writes_queued: 64,
        max_reads_in_flight: 64,
    };
    let name = format!("kvblock-tier-{row}.bench");
    let _ = std::fs::remove_file(dir.join(&name));
    let mut tier = DiskTier::open(dir, &name, layout, n, limits, pool).expect("tier");
    let direct = tier.mode().direct;
    let row_bytes: Vec<u8> = (0..row).map(|i| i as u8).collect();
    let tokens: Vec<Vec<i32>> = (0..n as i32)
        .map(|b| (0..32).map(|t| b * 32 + t).collect())
        .collect();
    let mut digests = Vec::with_capacity(n as usize);
    let start = Instant::now();
    let hb = layout.header_bytes();
    for t in &tokens {
        let key = BlockKeyRef::plain(t);
        let digest = kvblock::tier::prefix_digest(&ROOT_DIGEST, &key);
        let (slot, mut buf) = loop {
            if let Some(p) = tier.prepare_write(&digest) {
                break p;
            }
            // The queue is full: collect finished writes (a benchmark stores every block; the
            // manager would drop it instead).
            tier.stats_mut().write_drops -= 1;
            for r in tier.harvest() {
                if let Some((_, b)) = r.data {
                    tier.release_buffer(b);
                }
            }
            std::thread::sleep(Duration::from_micros(20));
        };
        buf.as_mut_slice()[hb..hb + row].copy_from_slice(&row_bytes);
        seal_key(&layout, buf.as_mut_slice(), &ROOT_DIGEST, &key);
        tier.submit_write(slot, buf);
        digests.push(digest);
    }
    wait(&mut tier, |t| t.stats().writes_queued == 0);
    let write = (n as usize * row) as f64 / start.elapsed().as_secs_f64();
    assert_eq!(tier.stats().writes, n, "every block written");
    let start = Instant::now();
    let mut hits = 0u64;
    let mut next = 0;
    while hits < n {
        while next < digests.len() && tier.start_read(&digests[next]) {
            next += 1;
        }
        for r in tier.harvest() {
            let (_, buf) = r.data.expect("every block verifies");
            hits += 1;
            tier.release_buffer(buf);
        }
        if next == digests.len() {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
    let read = (n as usize * row) as f64 / start.elapsed().as_secs_f64();
    drop(tier);
    let _ = std::fs::remove_file(dir.join(&name));
    (write, read, direct)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = Path::new(args.get(1).map_or("/tmp", String::as_str));
    std::fs::create_dir_all(dir).expect("the benchmark directory");
    let mib: usize = args.get(2).map_or(256, |s| s.parse().expect("MiB"));
    let threads: usize = args.get(3).map_or(4, |s| s.parse().expect("threads"));
    let gib = |b: f64| b / (1u64 << 30) as f64;
    println!(
        "disk tier vs raw sequential O_DIRECT in {} ({mib} MiB per size, {threads} I/O threads)",
        dir.display()
    );
    println!(
        "| row | raw write GiB/s | tier write GiB/s | ratio | raw read GiB/s | tier read GiB/s | ratio | tier I/O |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for row in SIZES {
        let total = (mib << 20).max(row * 8);
        let (rw, rr) = raw_direct(dir, row, total).expect("raw O_DIRECT I/O");
        let (tw, tr, direct) = tier_throughput(dir, row, total, threads);
        println!(
            "| {} KiB | {:.2} | {:.2} | {:.0}% | {:.2} | {:.2} | {:.0}% | {} |",
            row >> 10,
            gib(rw),
            gib(tw),
            100.0 * tw / rw,
            gib(rr),
            gib(tr),
            100.0 * tr / rr,
            if direct { "O_DIRECT" } else { "buffered" }
        );
    }
}
