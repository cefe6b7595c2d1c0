//! Resident memory per block of an empty manager (no requests): one window, no host tier, events
//! off, bookkeeping only. Prints the growth of the process's resident set (VmRSS) when a manager
//! of N blocks is created, per block, for N = 30,000 and 1,200,000 (or the sizes given), and
//! what the reuse tree reserves for cached keys' tokens (tokens_per_block x 4 bytes per block),
//! reported apart.
//!
//!     cargo run --release --example memory_per_block [-- N ...]

use kvblock::manager::{KvCacheManager, ManagerConfig, WindowSpec};

/// VmRSS of this process in bytes (Linux).
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS line");
    kb * 1024
}

fn main() {
    let mut sizes: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("block counts"))
        .collect();
    if sizes.is_empty() {
        sizes = vec![30_000, 1_200_000];
    }
    let tpb = 32;
    println!("   blocks  RSS growth  bytes/block  key token slots (reserved, resident as keys are written)");
    for n in sizes {
        let before = rss_bytes();
        let m = KvCacheManager::new(ManagerConfig {
            windows: vec![WindowSpec {
                window_size: 1 << 20,
                primary_blocks: n,
                secondary_blocks: 0,
                num_layers: 1,
                num_kv_heads: 1,
                size_per_head: 1,
                auto_host_tier: false,
            }],
            tokens_per_block: tpb,
            max_sequence_length: 1 << 20,
            ..ManagerConfig::default()
        })
        .expect("manager");
        let grown = rss_bytes().saturating_sub(before);
        println!(
            "{n:>9}  {:>6.1} MiB  {:>11.1}  {} B per block",
            grown as f64 / (1 << 20) as f64,
            grown as f64 / n as f64,
            tpb * 4
        );
        drop(m);
    }
}
