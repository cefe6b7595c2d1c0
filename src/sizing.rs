//! Static sizing helpers of TensorRT-LLM's `KVCacheManager` (`calculateMaxNumBlocks` and its
//! helpers, and `calculateFreeMemBytes`'s arithmetic). Sink tokens are not supported, so the
//! sink bubble is always 0 and is not a parameter.

use crate::error::{KvError, KvResult};

/// Extra block per beam budgeted when a sequence outgrows a sliding window.
pub const SWA_EXTRA_BLOCK: usize = 1;

/// Blocks one beam needs for `sequence_length` tokens under `window`:
/// `ceil(min(len, window) / tpb) + (len > window)`.
pub fn max_block_requirements_per_beam(sequence_length: usize, window: usize, tpb: usize) -> usize {
    let extra = if sequence_length > window {
        SWA_EXTRA_BLOCK
    } else {
        0
    };
    sequence_length.min(window).div_ceil(tpb) + extra
}

/// Blocks a request of `input` prompt and `output` generated tokens needs with `beam_width`
/// beams (context blocks shared among beams where they are full).
pub fn max_block_requirements(
    input: usize,
    output: usize,
    window: usize,
    beam_width: usize,
    tpb: usize,
) -> usize {
    if beam_width == 1 {
        return max_block_requirements_per_beam(input + output, window, tpb);
    }
    if window <= output {
        return max_block_requirements_per_beam(output, window, tpb) * beam_width;
    }
    let effective = window.min(input + output);
    let context_tokens = effective - output;
    let context_blocks = context_tokens / tpb;
    let left_over = context_tokens - context_blocks * tpb;
    let extra = if input + output > window {
        SWA_EXTRA_BLOCK
    } else {
        0
    };
    let output_blocks = (output + left_over).div_ceil(tpb) + extra;
    context_blocks + output_blocks * beam_width
}

/// The largest attention window that fits `capacity_blocks` for one request of `input` +
/// `output` tokens.
pub fn max_attention_window(
    input: usize,
    output: usize,
    capacity_blocks: usize,
    beam_width: usize,
    tpb: usize,
) -> usize {
    let needed = max_block_requirements(0, output, output, beam_width, tpb);
    if needed > capacity_blocks {
        return (capacity_blocks / beam_width) * tpb;
    }
    (output + (capacity_blocks - needed) * tpb).min(input + output)
}

/// Share of memory each window gets: proportional to `window × cache bytes per token`
/// (a single window gets 1.0).
pub fn window_size_to_share(windows: &[usize], cache_size_per_token: &[usize]) -> Vec<f64> {
    if windows.len() == 1 {
        return vec![1.0];
    }
    let total_size: f64 = cache_size_per_token.iter().map(|&c| c as f64).sum();
    let weights: Vec<f64> = windows
        .iter()
        .zip(cache_size_per_token)
        .map(|(&w, &c)| c as f64 / total_size * w as f64)
        .collect();
    let total_weight: f64 = weights.iter().sum();
    weights.iter().map(|w| w / total_weight).collect()
}

/// Blocks per window that memory budgets allow (TensorRT-LLM `calculateMaxNumBlocks`, without
/// the multi-rank reduction): window w gets `share[w]` of each budget (equal shares when `None`,
/// otherwise normalised); primary blocks = `ceil(tokens / tpb)` with `tokens = (primary_bytes -
/// extra_cost) × share / bytes_per_token[w]`, capped by `max_tokens` for a single window only;
/// secondary blocks = `floor(secondary_bytes × share / bytes_per_token[w]) / tpb`.
/// Shares are normalised through their largest, so finite shares whose sum would overflow to
/// infinity keep their proportions (callers reject non-finite or non-positive shares).
pub fn max_num_blocks(
    bytes_per_token: &[u64],
    shares: Option<&[f64]>,
    primary_bytes: u64,
    secondary_bytes: u64,
    extra_cost_bytes: u64,
    max_tokens: Option<u64>,
    tpb: usize,
) -> Vec<(u64, u64)> {
    let n = bytes_per_token.len();
    let largest = shares.map_or(1.0, |s| s.iter().copied().fold(0.0, f64::max));
    let total_share: f64 = shares.map_or(n as f64, |s| s.iter().map(|x| x / largest).sum());
    let primary_budget = primary_bytes.saturating_sub(extra_cost_bytes) as f64;
    let tpb = tpb as u64;
    bytes_per_token
        .iter()
        .enumerate()
        .map(|(w, &per_token)| {
            let share = shares.map_or(1.0, |s| s[w] / largest) / total_share;
            let mut tokens = (primary_budget * share / per_token as f64) as u64;
            if n == 1 {
                if let Some(cap) = max_tokens {
                    tokens = tokens.min(cap);
                }
            }
            let secondary_tokens = (secondary_bytes as f64 * share / per_token as f64) as u64;
            (tokens.div_ceil(tpb), secondary_tokens / tpb)
        })
        .collect()
}

/// Share of available host memory an automatic host tier may take (50%).
pub const AUTO_HOST_TIER_MEMORY_PERCENT: u64 = 50;
/// Share of the locked-memory limit (`RLIMIT_MEMLOCK`) an automatic host tier may take (80%).
pub const AUTO_HOST_TIER_MEMLOCK_PERCENT: u64 = 80;

/// The memory budgets of a KV cache (TensorRT-LLM `calculateFreeMemBytes`): GPU bytes =
/// `(device_free + memory_pool_free) × free_gpu_memory_fraction` (rounded down), host bytes =
/// `host_cache_bytes`. `memory_pool_free` is what the engine's stream-ordered allocator holds
/// free (TensorRT-LLM adds `BufferManager::memoryPoolFree()`): it is returned to the device on
/// demand. The fraction must be in (0, 1), and the free figures cannot exceed `device_total`.
pub fn free_mem_bytes(
    device_free: u64,
    device_total: u64,
    memory_pool_free: u64,
    free_gpu_memory_fraction: f64,
    host_cache_bytes: u64,
) -> KvResult<(u64, u64)> {
    check_free_gpu_memory_fraction(free_gpu_memory_fraction)?;
    let free = device_free.saturating_add(memory_pool_free);
    if free > device_total {
        return Err(KvError::InvalidArgument(format!(
            "free device memory ({device_free}) plus the memory pool's free bytes \
             ({memory_pool_free}) exceed the device's {device_total} bytes"
        )));
    }
    Ok((
        (free as f64 * free_gpu_memory_fraction) as u64,
        host_cache_bytes,
    ))
}

/// The share of free GPU memory a KV cache may take must be in (0, 1).
pub fn check_free_gpu_memory_fraction(fraction: f64) -> KvResult<()> {
    if fraction > 0.0 && fraction < 1.0 {
        Ok(())
    } else {
        Err(KvError::InvalidArgument(format!(
            "free_gpu_memory_fraction {fraction} is not in (0, 1)"
        )))
    }
}

/// Host blocks of an automatic host tier (a window config's `auto_host_tier`): as many blocks as
/// the window has GPU blocks (`gpu_quota_blocks`), at most 50% of `available_host_bytes` and at
/// most 80% of `memlock_limit_bytes`, each divided by `row_bytes` (the bytes of one block row)
/// and rounded down:
///
/// `min(gpu_quota_blocks, 50% × available_host_bytes / row_bytes, 80% × memlock_limit_bytes /
/// row_bytes)`.
///
/// A figure of 0 means "unknown" and caps nothing; an unlimited figure is `u64::MAX` (it then
/// never caps either). A `row_bytes` of 0 (a pool without bytes) leaves only the quota. If the
/// caps round down to 0 blocks the tier falls back to the GPU quota, so that suspended sequences
/// always have somewhere to go.
pub fn auto_host_tier_blocks(
    gpu_quota_blocks: usize,
    available_host_bytes: u64,
    memlock_limit_bytes: u64,
    row_bytes: u64,
) -> usize {
    if row_bytes == 0 {
        return gpu_quota_blocks;
    }
    let cap = |figure: u64, percent: u64| -> Option<u64> {
        // u128: a figure near u64::MAX times 100 must not wrap. Unknown (0) and unlimited
        // (u64::MAX) figures cap nothing, however large the quota.
        (figure > 0 && figure != u64::MAX).then(|| {
            let bytes = u128::from(figure) * u128::from(percent) / 100;
            u64::try_from(bytes / u128::from(row_bytes)).unwrap_or(u64::MAX)
        })
    };
    let blocks = [
        cap(available_host_bytes, AUTO_HOST_TIER_MEMORY_PERCENT),
        cap(memlock_limit_bytes, AUTO_HOST_TIER_MEMLOCK_PERCENT),
    ]
    .into_iter()
    .flatten()
    .fold(gpu_quota_blocks, |n, c| {
        n.min(usize::try_from(c).unwrap_or(usize::MAX))
    });
    if blocks == 0 {
        gpu_quota_blocks
    } else {
        blocks
    }
}

/// What this machine says about host memory, for `auto_host_tier_blocks`: bytes available
/// (`sysinfo(2)`: free plus buffer memory; the page cache is not counted, so the figure errs
/// low) and the soft `RLIMIT_MEMLOCK` in bytes (`u64::MAX` when unlimited). A figure the system
/// does not give is 0 (unknown).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostMemoryFigures {
    pub available_bytes: u64,
    pub memlock_limit_bytes: u64,
}

impl HostMemoryFigures {
    /// Reads the figures of this process and machine.
    pub fn read() -> Self {
        HostMemoryFigures {
            available_bytes: available_host_bytes(),
            memlock_limit_bytes: memlock_limit_bytes(),
        }
    }
}

#[cfg(target_os = "linux")]
fn available_host_bytes() -> u64 {
    // SAFETY: sysinfo only writes the struct it is given; all-zero is a valid value of it.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    if unsafe { libc::sysinfo(&mut info) } != 0 {
        return 0;
    }
    let unit = u64::from(info.mem_unit).max(1);
    (info.freeram as u64)
        .saturating_add(info.bufferram as u64)
        .saturating_mul(unit)
}

#[cfg(not(target_os = "linux"))]
fn available_host_bytes() -> u64 {
    0
}

#[cfg(unix)]
fn memlock_limit_bytes() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 {
        return 0;
    }
    if limit.rlim_cur == libc::RLIM_INFINITY {
        u64::MAX
    } else {
        // `rlim_t` is 32 bits on some targets.
        #[allow(clippy::unnecessary_cast)]
        let bytes = limit.rlim_cur as u64;
        bytes
    }
}

#[cfg(not(unix))]
fn memlock_limit_bytes() -> u64 {
    0
}

/// The disk tier's sizing: bytes of one block's slot on disk (its whole row, every pool of the
/// window, behind a header with the block's key and checksums, aligned to 4 KiB for O_DIRECT)
/// and the blocks a budget of `disk_bytes` holds, as a manager with `bytes_per_window =
/// disk_bytes` sizes the window's tier. `row_bytes`: the window's bytes per block (every pool;
/// `kvb_calculate_window_bytes_per_token` times the tokens per block).
pub fn disk_tier_blocks(tokens_per_block: usize, row_bytes: u64, disk_bytes: u64) -> (u64, u64) {
    let slot = crate::tier::sealed::slot_bytes_for(tokens_per_block, row_bytes);
    (disk_bytes / slot, slot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_memory_budgets_take_the_fraction_of_device_and_pool_free_bytes() {
        assert_eq!(
            free_mem_bytes(6_000, 10_000, 1_000, 0.5, 77).unwrap(),
            (3_500, 77)
        );
        assert_eq!(free_mem_bytes(1_000, 1_000, 0, 0.9, 0).unwrap(), (900, 0));
        for bad in [0.0, 1.0, 1.5, -0.1, f64::NAN] {
            assert!(matches!(
                free_mem_bytes(1_000, 1_000, 0, bad, 0),
                Err(KvError::InvalidArgument(_))
            ));
        }
        assert!(matches!(
            free_mem_bytes(900, 1_000, 200, 0.5, 0),
            Err(KvError::InvalidArgument(m)) if m.contains("exceed")
        ));
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn auto_host_tier_is_the_smallest_of_quota_memory_and_memlock() {
        // 1 MiB rows, 100 GPU blocks.
        // Plenty of memory and no lock limit: the GPU quota.
        assert_eq!(auto_host_tier_blocks(100, 1024 * MIB, u64::MAX, MIB), 100);
        // 50% of 64 MiB available = 32 blocks.
        assert_eq!(auto_host_tier_blocks(100, 64 * MIB, u64::MAX, MIB), 32);
        // 80% of 50 MiB locked = 40 blocks (memory would allow 512).
        assert_eq!(auto_host_tier_blocks(100, 1024 * MIB, 50 * MIB, MIB), 40);
        // Both cap: the smaller wins (50% of 70 MiB = 35 < 80% of 50 MiB = 40).
        assert_eq!(auto_host_tier_blocks(100, 70 * MIB, 50 * MIB, MIB), 35);
        // Rounded down: 50% of 3 MiB = 1.5 blocks -> 1.
        assert_eq!(auto_host_tier_blocks(100, 3 * MIB, u64::MAX, MIB), 1);
    }

    #[test]
    fn auto_host_tier_falls_back_to_the_gpu_quota() {
        // Unknown figures (0) cap nothing.
        assert_eq!(auto_host_tier_blocks(100, 0, 0, MIB), 100);
        assert_eq!(auto_host_tier_blocks(100, 0, 50 * MIB, MIB), 40);
        assert_eq!(auto_host_tier_blocks(100, 64 * MIB, 0, MIB), 32);
        // Caps that round down to no block at all: the GPU quota.
        assert_eq!(auto_host_tier_blocks(100, MIB, u64::MAX, MIB), 100);
        assert_eq!(auto_host_tier_blocks(100, 1024 * MIB, 64 * 1024, MIB), 100);
        // A row without bytes: only the quota.
        assert_eq!(auto_host_tier_blocks(7, 64 * MIB, 50 * MIB, 0), 7);
        // Extreme figures do not overflow.
        assert_eq!(auto_host_tier_blocks(5, u64::MAX, u64::MAX, 1), 5);
        // Unlimited figures cap nothing, however large the quota (was 50% of u64::MAX).
        assert_eq!(
            auto_host_tier_blocks(usize::MAX, u64::MAX, u64::MAX, 1),
            usize::MAX
        );
        assert_eq!(
            auto_host_tier_blocks(usize::MAX, 0, u64::MAX, 1),
            usize::MAX
        );
    }

    #[test]
    fn host_memory_figures_are_read() {
        // Linux always answers sysinfo and getrlimit.
        let f = HostMemoryFigures::read();
        if cfg!(target_os = "linux") {
            assert!(f.available_bytes > 0);
        }
    }

    #[test]
    fn per_beam_requirements() {
        assert_eq!(max_block_requirements_per_beam(100, 1000, 16), 7);
        assert_eq!(
            max_block_requirements_per_beam(100, 64, 16),
            5,
            "window blocks + 1"
        );
        assert_eq!(max_block_requirements_per_beam(64, 64, 16), 4);
    }

    #[test]
    fn beam_one_equals_per_beam_and_window_fits_output() {
        assert_eq!(max_block_requirements(100, 20, 1000, 1, 16), 8);
        // window <= output: every beam needs the window's blocks.
        assert_eq!(max_block_requirements(100, 200, 128, 4, 16), (8 + 1) * 4);
    }

    #[test]
    fn window_overlapping_input_and_output() {
        // window 96 over 100 + 20 tokens, beam 2, tpb 16: effective 96, context 76 tokens
        // = 4 full blocks + 12 left over; output blocks ceil(32/16) + 1 = 3 per beam.
        assert_eq!(max_block_requirements(100, 20, 96, 2, 16), 4 + 3 * 2);
    }

    #[test]
    fn attention_window_from_capacity() {
        // output 128 at tpb 64, beam 1: needs 2 blocks; capacity 2 → window 128 (but capped at in+out).
        assert_eq!(max_attention_window(1000, 128, 2, 1, 64), 128);
        assert_eq!(
            max_attention_window(1000, 128, 1, 1, 64),
            64,
            "too small: capacity/beam blocks"
        );
        assert_eq!(
            max_attention_window(10, 20, 100, 1, 16),
            30,
            "enough for the whole sequence"
        );
    }

    #[test]
    fn blocks_from_memory_budgets() {
        // One window, 1 KiB per token, tpb 16: (1 MiB - 64 KiB) / 1 KiB = 960 tokens = 60 blocks;
        // 2 MiB of host memory = 2048 tokens = 128 blocks.
        let one = max_num_blocks(&[1024], None, 1 << 20, 2 << 20, 64 << 10, None, 16);
        assert_eq!(one, vec![(60, 128)]);
        assert_eq!(
            max_num_blocks(&[1024], None, 1 << 20, 0, 0, Some(100), 16),
            vec![(7, 0)],
            "capped at 100 tokens"
        );
        // Two windows with equal shares; the cap does not apply with several windows.
        let two = max_num_blocks(&[1024, 512], None, 1 << 20, 0, 0, Some(10), 16);
        assert_eq!(two, vec![(32, 0), (64, 0)]);
        // Explicit shares 1:3 are normalised.
        let weighted = max_num_blocks(&[1024, 1024], Some(&[1.0, 3.0]), 1 << 20, 0, 0, None, 16);
        assert_eq!(weighted, vec![(16, 0), (48, 0)]);
        // Shares whose sum overflows keep their proportions (they gave zero blocks).
        let huge = max_num_blocks(
            &[1024, 1024],
            Some(&[0.5e308, 1.5e308]),
            1 << 20,
            0,
            0,
            None,
            16,
        );
        assert_eq!(huge, weighted);
    }

    #[test]
    fn shares_are_proportional_to_window_times_size() {
        assert_eq!(window_size_to_share(&[128], &[4]), vec![1.0]);
        let s = window_size_to_share(&[100, 200, 300], &[1, 1, 1]);
        assert!((s[0] - 1.0 / 6.0).abs() < 1e-12);
        assert!((s[2] - 0.5).abs() < 1e-12);
        let equal = window_size_to_share(&[100, 200, 400], &[4, 2, 1]);
        assert!(equal.iter().all(|x| (x - 1.0 / 3.0).abs() < 1e-12));
    }
}
