//! One manager's view of its GPU: the device's primary context (shared with the CUDA runtime,
//! PyTorch and TensorRT-LLM, so pointers mean the same thing on both sides), the loaded
//! block-copy kernel, and the stream ordering of copies against the engine's stream.
//!
//! Two orderings, as TensorRT-LLM's transfer manager offers:
//! - `EngineStream` (default): copies are enqueued on the engine's stream, so the engine's later
//!   kernels see their bytes and a block freed by an offload is rewritten only after the offload
//!   read it, with no synchronization at all.
//! - `CopyStream`: copies run on kvblock's own stream after waiting for the work the engine had
//!   enqueued when the copy was submitted; `sync_transfers` makes the engine stream wait for
//!   every copy submitted so far (TensorRT-LLM's `syncTransfers`). The engine calls it before it
//!   launches work that reads or writes blocks the manager handed out since the last sync.
//!
//! No call here waits on the host for the GPU, except `wait_idle` (destroy, pool replacement).

use std::sync::Mutex;

use cudarc::driver::sys::{
    self, CUcontext, CUdevice, CUdevice_attribute, CUevent, CUfunction, CUmodule, CUstream,
};

use super::driver::{attribute, check, device, guarded, ContextGuard, CudaResult};
use super::nvrtc::{block_copy_cubin, BLOCK_COPY_KERNEL};

/// Where copies execute relative to the engine's stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TransferMode {
    #[default]
    EngineStream,
    CopyStream,
}

/// What a manager asks of the GPU at creation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaConfig {
    /// Device ordinal.
    pub device: i32,
    /// The engine's `CUstream`/`cudaStream_t` as an integer (0 = the legacy default stream).
    pub stream: usize,
    pub mode: TransferMode,
    /// Allocate the pools (true), or wait for the engine to register its own.
    pub allocate_pools: bool,
}

struct Streams {
    engine: CUstream,
    /// kvblock's copy stream (`CopyStream` mode only).
    copy: CUstream,
    /// Recorded on the engine stream before a copy, waited on by the copy stream.
    engine_ready: CUevent,
    /// Recorded on the copy stream after each launch, waited on by `sync_transfers`.
    copies_done: CUevent,
    unsynced_copies: bool,
}

/// The GPU side shared by every window of one manager.
pub struct CudaDevice {
    dev: CUdevice,
    ctx: CUcontext,
    module: CUmodule,
    kernel: CUfunction,
    sm_count: u32,
    mode: TransferMode,
    streams: Mutex<Streams>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("device", &self.dev)
            .field("sm_count", &self.sm_count)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

// SAFETY: CUDA handles may be used from any thread once the context is current (every use
// enters it through `ContextGuard`); the mutable stream state is behind a mutex.
unsafe impl Send for CudaDevice {}
unsafe impl Sync for CudaDevice {}

impl CudaDevice {
    /// Retains the primary context of `cfg.device`, compiles (or takes from the process cache)
    /// and loads the block-copy kernel, and sets up the streams of `cfg.mode`. A driver function
    /// missing from the loaded library is an `Unavailable` error naming it.
    pub fn open(cfg: &CudaConfig) -> CudaResult<CudaDevice> {
        guarded("opening the CUDA device", || Self::open_unguarded(cfg))
    }

    fn open_unguarded(cfg: &CudaConfig) -> CudaResult<CudaDevice> {
        let dev = device(cfg.device)?;
        let major = attribute(
            dev,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        )?;
        let minor = attribute(
            dev,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        )?;
        let sm_count = attribute(
            dev,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )?;
        let cubin = block_copy_cubin((major * 10 + minor) as u32)?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; released in Drop (or below on failure).
        check(
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) },
            "cuDevicePrimaryCtxRetain",
        )?;
        let mut partial = CudaDevice {
            dev,
            ctx,
            module: std::ptr::null_mut(),
            kernel: std::ptr::null_mut(),
            sm_count: sm_count.max(1) as u32,
            mode: cfg.mode,
            streams: Mutex::new(Streams {
                engine: cfg.stream as CUstream,
                copy: std::ptr::null_mut(),
                engine_ready: std::ptr::null_mut(),
                copies_done: std::ptr::null_mut(),
                unsynced_copies: false,
            }),
        };
        // From here on, Drop releases whatever was created.
        partial.load(&cubin)?;
        Ok(partial)
    }

    fn load(&mut self, cubin: &[u8]) -> CudaResult<()> {
        let _ctx = ContextGuard::enter(self.ctx)?;
        let s = self.streams.get_mut().unwrap_or_else(|p| p.into_inner());
        // SAFETY: driver calls with out-pointers into `self`; the CUBIN outlives the load.
        unsafe {
            check(
                sys::cuModuleLoadData(&mut self.module, cubin.as_ptr().cast()),
                "cuModuleLoadData",
            )?;
            check(
                sys::cuModuleGetFunction(&mut self.kernel, self.module, BLOCK_COPY_KERNEL.as_ptr()),
                "cuModuleGetFunction",
            )?;
            let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
            check(
                sys::cuEventCreate(&mut s.engine_ready, flags),
                "cuEventCreate",
            )?;
            check(
                sys::cuEventCreate(&mut s.copies_done, flags),
                "cuEventCreate",
            )?;
            if self.mode == TransferMode::CopyStream {
                let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
                check(sys::cuStreamCreate(&mut s.copy, flags), "cuStreamCreate")?;
            }
        }
        Ok(())
    }

    pub fn context(&self) -> CUcontext {
        self.ctx
    }

    pub fn kernel(&self) -> CUfunction {
        self.kernel
    }

    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    pub fn mode(&self) -> TransferMode {
        self.mode
    }

    /// The stream the next copy launches on, ordered after the engine's enqueued work.
    /// Call with the context current.
    pub fn launch_stream(&self) -> CudaResult<CUstream> {
        let s = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if self.mode == TransferMode::EngineStream {
            return Ok(s.engine);
        }
        order_after(s.engine_ready, s.engine, s.copy)?;
        Ok(s.copy)
    }

    /// Notes that copies were launched on `launch_stream` (`CopyStream`: records the event the
    /// engine stream will wait on).
    pub fn copies_launched(&self) -> CudaResult<()> {
        if self.mode == TransferMode::EngineStream {
            return Ok(());
        }
        let mut s = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: as in `launch_stream`.
        check(
            unsafe { sys::cuEventRecord(s.copies_done, s.copy) },
            "cuEventRecord",
        )?;
        s.unsynced_copies = true;
        Ok(())
    }

    /// Makes the engine stream wait (on the GPU) for every copy submitted so far. A no-op with
    /// `EngineStream`, where copies are on the engine stream already.
    pub fn sync_transfers(&self) -> CudaResult<()> {
        let mut s = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if !s.unsynced_copies {
            return Ok(());
        }
        let _ctx = ContextGuard::enter(self.ctx)?;
        // SAFETY: as in `launch_stream`.
        check(
            unsafe { sys::cuStreamWaitEvent(s.engine, s.copies_done, 0) },
            "cuStreamWaitEvent",
        )?;
        s.unsynced_copies = false;
        Ok(())
    }

    /// Switches to the engine stream `stream`. Copies already submitted stay ordered before
    /// the new stream's later work: the new stream waits for the old one's enqueued work.
    pub fn set_stream(&self, stream: usize) -> CudaResult<()> {
        let mut s = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        let new = stream as CUstream;
        if new == s.engine {
            return Ok(());
        }
        let _ctx = ContextGuard::enter(self.ctx)?;
        order_after(s.engine_ready, s.engine, new)?;
        if s.unsynced_copies {
            // SAFETY: our event; `new` is the caller's stream.
            check(
                unsafe { sys::cuStreamWaitEvent(new, s.copies_done, 0) },
                "cuStreamWaitEvent",
            )?;
            s.unsynced_copies = false;
        }
        s.engine = new;
        Ok(())
    }

    /// The engine stream as an integer.
    pub fn stream(&self) -> usize {
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .engine as usize
    }
}

/// Makes `later` wait (on the GPU) for the work enqueued on `earlier` so far, through `event`.
fn order_after(event: CUevent, earlier: CUstream, later: CUstream) -> CudaResult<()> {
    // SAFETY: an event of this device and two streams of its context (the caller's or ours).
    unsafe {
        check(sys::cuEventRecord(event, earlier), "cuEventRecord")?;
        check(sys::cuStreamWaitEvent(later, event, 0), "cuStreamWaitEvent")
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // Tried twice (teardown must not leak over one failed call); a context that cannot be
        // entered at all is dead, and releasing the primary context frees what it held.
        let Ok(_ctx) = ContextGuard::enter(self.ctx).or_else(|_| ContextGuard::enter(self.ctx))
        else {
            // SAFETY: balances the retain in `open`.
            unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
            return;
        };
        let s = self.streams.get_mut().unwrap_or_else(|p| p.into_inner());
        // SAFETY: destroys what `open`/`load` created (null handles are skipped) and releases
        // the retained primary context once. The windows' engines (which hold an Arc to this
        // device) have already waited for their copies.
        unsafe {
            if !s.copy.is_null() {
                sys::cuStreamSynchronize(s.copy);
                sys::cuStreamDestroy_v2(s.copy);
            }
            for e in [s.engine_ready, s.copies_done] {
                if !e.is_null() {
                    sys::cuEventDestroy_v2(e);
                }
            }
            if !self.module.is_null() {
                sys::cuModuleUnload(self.module);
            }
        }
        drop(_ctx);
        // SAFETY: balances the retain in `open`.
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

/// Free and total bytes of device `ordinal`'s memory as the driver reports them
/// (`cuMemGetInfo`), after the device's work has finished (`cuCtxSynchronize`, so memory freed
/// by queued work counts as free). Runs in the device's primary context, retained for the call.
pub fn memory_info(ordinal: i32) -> CudaResult<(u64, u64)> {
    guarded("querying the CUDA device's memory", || {
        let dev = device(ordinal)?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; released below.
        check(
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) },
            "cuDevicePrimaryCtxRetain",
        )?;
        let result = (|| {
            let _current = ContextGuard::enter(ctx)?;
            let (mut free, mut total) = (0usize, 0usize);
            // SAFETY: the context is current; out-pointers to locals.
            unsafe {
                check(sys::cuCtxSynchronize(), "cuCtxSynchronize")?;
                check(sys::cuMemGetInfo_v2(&mut free, &mut total), "cuMemGetInfo")?;
            }
            Ok((free as u64, total as u64))
        })();
        // SAFETY: balances the retain above.
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(dev) };
        result
    })
}
