//! Shared by the randomized integration tests: a small deterministic generator (splitmix64), so
//! every failure names a seed that reproduces it.
#![allow(dead_code)]

pub mod fault;
pub mod hostile;

pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `0..n` as `u64` (`n > 0`).
    pub fn below_u(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    pub fn percent(&mut self, p: usize) -> bool {
        self.below(100) < p
    }
}

/// Loads the simulated CUDA driver (cpp_tests/sim_cuda, built by CMake) when
/// `KVB_SIM_CUDA_LIBRARY` names it, before any driver call: its SONAME is `libcuda.so`, the first
/// name cudarc asks the loader for, so kvblock and these tests get the simulator. True when the
/// tests run on it (then a CUDA test that cannot run fails instead of skipping).
pub fn load_simulated_cuda_driver() -> bool {
    static LOADED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LOADED.get_or_init(|| {
        let Some(path) = std::env::var_os("KVB_SIM_CUDA_LIBRARY").filter(|p| !p.is_empty()) else {
            return false;
        };
        let c = std::ffi::CString::new(path.to_string_lossy().as_bytes()).expect("no NUL");
        // SAFETY: loads a shared library by path; the handle is kept for the process.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        assert!(
            !handle.is_null(),
            "KVB_SIM_CUDA_LIBRARY={path:?} cannot be loaded"
        );
        true
    })
}

/// Makes device 0's primary context current on this thread; false (skip the test) where no
/// supported CUDA driver (12.4 or newer) or no device exists (on the simulated driver that is a
/// failure instead).
pub fn cuda_context_current() -> bool {
    use cudarc::driver::sys;
    let simulated = load_simulated_cuda_driver();
    if !kvblock::cuda::driver_library_supported() {
        assert!(
            !simulated,
            "the simulated CUDA driver was loaded but kvblock cannot use it"
        );
        return false;
    }
    // SAFETY: plain driver calls with out-pointers to locals; the context stays retained for
    // the rest of the test process.
    unsafe {
        if sys::cuInit(0) != sys::CUresult::CUDA_SUCCESS {
            return false;
        }
        let mut dev = 0;
        let mut ctx = std::ptr::null_mut();
        sys::cuDeviceGet(&mut dev, 0) == sys::CUresult::CUDA_SUCCESS
            && sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) == sys::CUresult::CUDA_SUCCESS
            && sys::cuCtxSetCurrent(ctx) == sys::CUresult::CUDA_SUCCESS
    }
}

/// Copies `len` bytes at device-visible address `address` to the host (synchronously: ordered
/// after everything enqueued on the legacy default stream).
pub fn cuda_read(address: u64, len: usize) -> Vec<u8> {
    use cudarc::driver::sys;
    let mut out = vec![0u8; len];
    // SAFETY: `address` is `len` bytes of a pool; `out` has `len` bytes.
    let r = unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), address, len) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "cuMemcpyDtoH");
    out
}

/// Copies `bytes` to device-visible address `address` (synchronously).
pub fn cuda_write(address: u64, bytes: &[u8]) {
    use cudarc::driver::sys;
    // SAFETY: `address` is `bytes.len()` bytes of a pool.
    let r = unsafe { sys::cuMemcpyHtoD_v2(address, bytes.as_ptr().cast(), bytes.len()) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "cuMemcpyHtoD");
}

/// A window of `window_size` tokens with these pools and the smallest geometry (one layer, one
/// head, one element per token): for tests of the bookkeeping, not of the bytes.
pub fn window(
    window_size: usize,
    primary_blocks: usize,
    secondary_blocks: usize,
) -> kvblock::manager::WindowSpec {
    kvblock::manager::WindowSpec {
        window_size,
        primary_blocks,
        secondary_blocks,
        num_layers: 1,
        num_kv_heads: 1,
        size_per_head: 1,
        auto_host_tier: false,
    }
}

/// Tells the manager that sequence `id`'s known tokens are computed (its whole prompt, or what
/// its capacity covers), as an engine does after its prefill (`store_context_blocks` after each
/// chunk, or `advance_history`): storing for reuse stops at what was computed.
pub fn prefill_done(m: &mut kvblock::manager::KvCacheManager, id: u64) {
    let l = m.sequence_lengths(id).unwrap();
    m.advance_history(id, l.num_tokens.min(l.capacity)).unwrap();
}
