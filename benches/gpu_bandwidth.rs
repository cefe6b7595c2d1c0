//! GPU bandwidth of the CUDA copy engine against plain copies, measured in one run.
//!
//! For block sizes from 16 KiB to 4 MiB, one operation moves 256 MiB of blocks at scattered
//! rows, in one batched submission (what one admission, offload or release hands the engine):
//! onboard (pinned host → GPU), offload (GPU → pinned host), and partial copies GPU → GPU (the
//! first half of the tokens of every slab). The references are one contiguous copy of the same
//! bytes with `cuMemcpyAsync` (host → GPU, GPU → host, GPU → GPU). Times are CUDA event times on
//! one stream behind a busy GPU→GPU copy (so the host's planning is not counted as copy time; the
//! host's time per submitted copy is its own column), medians of `ROUNDS` after a warm-up.
//! Without a GPU it prints why and exits 0.
//!
//! Run: `cargo bench --bench gpu_bandwidth` (NVRTC on the loader path, e.g.
//! `source scripts/nvrtc_env.sh`).

use std::sync::Arc;

use cudarc::driver::sys::{self, CUevent, CUresult, CUstream};
use kvblock::cuda::{CudaConfig, CudaCopyEngine, CudaDevice, TransferMode};
use kvblock::pool::{Level, MemRow, PoolGeometry};
use kvblock::transfer::{CopyEngine, RowCopy};

const BLOCK_SIZES: [usize; 5] = [16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];
const BYTES_PER_OP: usize = 256 << 20;
const ROUNDS: usize = 9;
const TOKENS_PER_BLOCK: usize = 32;
/// 4 layers × K|V × 4 heads: 32 slabs per row, as a small model's block.
const LAYERS: usize = 4;
const HEADS: usize = 4;

fn ok(r: CUresult, what: &str) {
    assert_eq!(r, CUresult::CUDA_SUCCESS, "{what}");
}

/// A GPU→GPU copy enqueued before each timed operation keeps the stream busy while the host
/// plans and launches it, so the event times measure the copies on the GPU alone, as on an
/// engine stream that is busy with the model (the host time is measured apart, on the clock).
const BUSY_BYTES: usize = 4 << 30;

/// Medians of `op` over `ROUNDS` after a warm-up: milliseconds between two events on `stream`
/// (the GPU's time), and milliseconds of the host inside `op` (planning and launching).
fn time_ms(stream: CUstream, busy: &dyn Fn(), mut op: impl FnMut()) -> (f64, f64) {
    let mut times = Vec::with_capacity(ROUNDS);
    let mut host = Vec::with_capacity(ROUNDS);
    // SAFETY: events created, recorded and destroyed here; the context is current.
    unsafe {
        let (mut start, mut end): (CUevent, CUevent) = (std::ptr::null_mut(), std::ptr::null_mut());
        ok(sys::cuEventCreate(&mut start, 0), "cuEventCreate");
        ok(sys::cuEventCreate(&mut end, 0), "cuEventCreate");
        op(); // warm-up
        for _ in 0..ROUNDS {
            busy();
            ok(sys::cuEventRecord(start, stream), "cuEventRecord");
            let t0 = std::time::Instant::now();
            op();
            host.push(t0.elapsed().as_secs_f64() * 1e3);
            ok(sys::cuEventRecord(end, stream), "cuEventRecord");
            ok(sys::cuEventSynchronize(end), "cuEventSynchronize");
            times.push(f64::from(elapsed_ms(start, end)));
        }
        sys::cuEventDestroy_v2(start);
        sys::cuEventDestroy_v2(end);
    }
    times.sort_by(f64::total_cmp);
    host.sort_by(f64::total_cmp);
    (times[ROUNDS / 2], host[ROUNDS / 2])
}

/// Milliseconds between two completed events. `cuEventElapsedTime_v2` exists from CUDA 12.8 on
/// (cudarc's 13.x bindings have only it); older drivers, down to the 12.4 kvblock supports,
/// export only `cuEventElapsedTime`, with the same signature, looked up here in the loaded driver.
fn elapsed_ms(start: CUevent, end: CUevent) -> f32 {
    type ElapsedFn = unsafe extern "C" fn(*mut f32, CUevent, CUevent) -> CUresult;
    static V1: std::sync::OnceLock<ElapsedFn> = std::sync::OnceLock::new();
    let mut driver = 0;
    let mut ms = 0f32;
    // SAFETY: out-pointers to locals; the v1 symbol, when used, has the v2 signature; the
    // library handle is leaked so the function stays mapped.
    unsafe {
        ok(sys::cuDriverGetVersion(&mut driver), "cuDriverGetVersion");
        if driver >= 12080 {
            ok(
                sys::cuEventElapsedTime_v2(&mut ms, start, end),
                "cuEventElapsedTime_v2",
            );
        } else {
            let v1 = V1.get_or_init(|| {
                let lib = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY);
                assert!(!lib.is_null(), "libcuda.so.1 cannot be opened");
                let f = libc::dlsym(lib, c"cuEventElapsedTime".as_ptr());
                assert!(!f.is_null(), "the driver lacks cuEventElapsedTime");
                std::mem::transmute::<*mut libc::c_void, ElapsedFn>(f)
            });
            ok(v1(&mut ms, start, end), "cuEventElapsedTime");
        }
    }
    ms
}

fn gbps(bytes: usize, ms: f64) -> f64 {
    bytes as f64 / (ms * 1e6)
}

/// A deterministic shuffle of `0..n` (rows scattered as a long-running cache leaves them).
fn scattered(n: usize, seed: u64) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n as u32).collect();
    let mut s = seed;
    for i in (1..n).rev() {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        v.swap(i, (s >> 33) as usize % (i + 1));
    }
    v
}

fn row(level: Level, index: u32) -> MemRow {
    MemRow { level, index }
}

fn describe_device() -> String {
    let mut name = [0i8; 256];
    let (mut driver, mut dev) = (0, 0);
    // SAFETY: out-pointers to locals of the sizes the calls expect.
    unsafe {
        sys::cuDeviceGet(&mut dev, 0);
        sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev);
        sys::cuDriverGetVersion(&mut driver);
    }
    // SAFETY: the driver wrote a NUL-terminated name.
    let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }.to_string_lossy();
    format!(
        "{name}, CUDA driver API {}.{}",
        driver / 1000,
        (driver % 1000) / 10
    )
}

fn main() {
    if !kvblock::cuda::driver_library_present() {
        println!("skipped: no CUDA driver library on this machine; GPU bandwidth not measured");
        return;
    }
    let mut stream: CUstream = std::ptr::null_mut();
    let cfg = |stream: CUstream| CudaConfig {
        device: 0,
        stream: stream as usize,
        mode: TransferMode::EngineStream,
        allocate_pools: true,
    };
    // Opening the device first also makes sure a GPU and NVRTC are there.
    let probe = match CudaDevice::open(&cfg(std::ptr::null_mut())) {
        Ok(d) => d,
        Err(e) => {
            println!("skipped: {e}; GPU bandwidth not measured");
            return;
        }
    };
    // SAFETY: the primary context (retained by `probe`) made current for this thread.
    unsafe {
        let mut ctx = std::ptr::null_mut();
        let mut dev = 0;
        ok(sys::cuDeviceGet(&mut dev, 0), "cuDeviceGet");
        ok(sys::cuDevicePrimaryCtxRetain(&mut ctx, dev), "retain");
        ok(sys::cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
        ok(sys::cuStreamCreate(&mut stream, 1), "cuStreamCreate");
    }
    drop(probe);
    let device = Arc::new(CudaDevice::open(&cfg(stream)).expect("device"));
    println!("device: {}", describe_device());
    println!(
        "{BYTES_PER_OP} bytes per operation at scattered rows, one submission behind a busy stream; median of \
         {ROUNDS}; GB/s (ratio to the contiguous copy of the same bytes)"
    );
    println!(
        "| block | contiguous H→D | onboard | contiguous D→H | offload | contiguous D→D | partial D→D (½ tokens) | host ns per copy |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut scratch: sys::CUdeviceptr = 0;
    // SAFETY: out-pointer to a local; the context is current.
    ok(
        unsafe { sys::cuMemAlloc_v2(&mut scratch, 2 * BUSY_BYTES) },
        "cuMemAlloc (busy copy)",
    );
    let busy = || {
        // SAFETY: both halves of the scratch allocation.
        ok(
            unsafe { sys::cuMemcpyAsync(scratch + BUSY_BYTES as u64, scratch, BUSY_BYTES, stream) },
            "cuMemcpyAsync (busy)",
        )
    };
    for &block in &BLOCK_SIZES {
        let n = BYTES_PER_OP / block;
        let geometry = PoolGeometry {
            num_layers: LAYERS,
            kv_factor: 2,
            num_kv_heads: HEADS,
            size_per_head: block / (LAYERS * 2 * HEADS * TOKENS_PER_BLOCK),
            tokens_per_block: TOKENS_PER_BLOCK,
            bytes_per_element: 1,
        };
        assert_eq!(geometry.row_bytes(), block);
        let mut engine = CudaCopyEngine::new(device.clone(), geometry, 2 * n, n, true)
            .expect("pools (lower BYTES_PER_OP if the GPU is small)");
        let primary = engine.pool_base(Level::Primary, 0).unwrap() as u64;
        let host = engine.pool_base(Level::Secondary, 0).unwrap() as u64;
        let (src, dst) = (
            scattered(n, block as u64),
            scattered(2 * n, !(block as u64)),
        );
        let onboard: Vec<RowCopy> = (0..n)
            .map(|i| RowCopy {
                src: row(Level::Secondary, src[i]),
                dst: row(Level::Primary, dst[i]),
                num_tokens: 0,
            })
            .collect();
        let offload: Vec<RowCopy> = onboard
            .iter()
            .map(|c| RowCopy {
                src: c.dst,
                dst: c.src,
                num_tokens: 0,
            })
            .collect();
        // Partial copies read the first n primary rows' halves into the other n (scattered).
        let partial: Vec<RowCopy> = (0..n)
            .map(|i| RowCopy {
                src: row(Level::Primary, dst[i]),
                dst: row(Level::Primary, dst[n + i]),
                num_tokens: (TOKENS_PER_BLOCK / 2) as u32,
            })
            .collect();
        let bytes = n * block;
        let copy = |dst: u64, src: u64, len: usize| {
            // SAFETY: both ranges lie inside the engine's pools (unified addressing).
            ok(
                unsafe { sys::cuMemcpyAsync(dst, src, len, stream) },
                "cuMemcpyAsync",
            )
        };
        let (h2d, _) = time_ms(stream, &busy, || copy(primary, host, bytes));
        let (on, on_host) = time_ms(stream, &busy, || {
            engine.submit(&onboard).expect("copy launch")
        });
        let (d2h, _) = time_ms(stream, &busy, || copy(host, primary, bytes));
        let (off, off_host) = time_ms(stream, &busy, || {
            engine.submit(&offload).expect("copy launch")
        });
        let (d2d, _) = time_ms(stream, &busy, || {
            copy(primary + bytes as u64, primary, bytes / 2)
        });
        let (part, part_host) = time_ms(stream, &busy, || {
            engine.submit(&partial).expect("copy launch")
        });
        assert!(engine.failure().is_none(), "{:?}", engine.failure());
        let cell = |b: usize, ms: f64, reference: Option<f64>| match reference {
            None => format!("{:.1}", gbps(b, ms)),
            Some(r) => format!("{:.1} ({:.0}%)", gbps(b, ms), 100.0 * gbps(b, ms) / r),
        };
        let (h2d_bw, d2h_bw, d2d_bw) = (gbps(bytes, h2d), gbps(bytes, d2h), gbps(bytes / 2, d2d));
        // The host's planning and launch time per copy, the largest of the three kinds.
        let host_ns = on_host.max(off_host).max(part_host) * 1e6 / n as f64;
        println!(
            "| {} KiB | {} | {} | {} | {} | {} | {} | {:.0} |",
            block >> 10,
            cell(bytes, h2d, None),
            cell(bytes, on, Some(h2d_bw)),
            cell(bytes, d2h, None),
            cell(bytes, off, Some(d2h_bw)),
            cell(bytes / 2, d2d, None),
            cell(bytes / 2, part, Some(d2d_bw)),
            host_ns,
        );
    }
    // SAFETY: every engine (and its work on the stream) is gone.
    unsafe {
        sys::cuStreamSynchronize(stream);
        sys::cuMemFree_v2(scratch);
        sys::cuStreamDestroy_v2(stream);
    }
}
