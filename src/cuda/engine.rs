//! The CUDA copy engine of one window: its pools (primary in GPU memory, secondary in pinned,
//! device-mapped host memory, allocated here or registered by the engine) and the launches that
//! move its blocks, one batched kernel launch per operation (one per wave of dependent copies).
//!
//! Descriptors are written into pinned, device-mapped host buffers that the kernel reads
//! directly, so an operation costs no separate upload. A buffer is reused once the event
//! recorded after its launch has completed; while every buffer is still in flight a new one is
//! allocated, so submitting never waits for the GPU (up to `MAX_DESCRIPTOR_BUFFERS`). When no
//! buffer can be had, a launch waits for one and takes the descriptors in chunks, so it never
//! fails for want of pinned memory: the only failures left are a broken context.

use std::sync::Arc;

use cudarc::driver::sys::{
    self, CUdeviceptr, CUevent, CUmemorytype, CUpointer_attribute, CUresult,
};

use super::device::CudaDevice;
use super::driver::{check, guarded, ContextGuard, CudaError, CudaResult};
use super::plan::{CopyDescriptor, CopyPlan, PoolAddresses};
use crate::error::KvError;
use crate::pool::{BlockLayout, Level, MemRow};
use crate::transfer::{CopyEngine, CopyFailure, RowCopy};

const THREADS_PER_CTA: u32 = 256;
/// Resident CTAs per SM the grid asks for (the grid strides over the rest).
const CTAS_PER_SM: u32 = 16;
const MIN_DESCRIPTORS_PER_BUFFER: usize = 4096;
/// Beyond this many buffers in flight, the oldest is waited for (back pressure only).
const MAX_DESCRIPTOR_BUFFERS: usize = 64;

/// Memory of one pool level.
enum Pool {
    Missing,
    /// `cuMemAlloc`ed by kvblock.
    Device(CUdeviceptr),
    /// `cuMemHostAlloc`ed by kvblock (pinned, mapped): host pointer and its device address.
    Host(*mut std::ffi::c_void, CUdeviceptr),
    /// The engine's memory: its device-visible address and the address the engine gave (for
    /// the secondary level, its host pointer).
    Registered(CUdeviceptr, u64),
}

impl Pool {
    fn address(&self) -> Option<CUdeviceptr> {
        match *self {
            Pool::Missing => None,
            Pool::Device(p) | Pool::Host(_, p) | Pool::Registered(p, _) => Some(p),
        }
    }
}

struct DescriptorBuffer {
    host: *mut CopyDescriptor,
    device: CUdeviceptr,
    capacity: usize,
    /// Recorded after the launch that read this buffer.
    done: CUevent,
    in_flight: bool,
    /// The submission (`CudaCopyEngine::submissions`) whose launch last read this buffer.
    submission: u64,
}

/// Copy engine of one window on the GPU.
pub struct CudaCopyEngine {
    device: Arc<CudaDevice>,
    layout: BlockLayout,
    rows: [usize; 2],
    /// `[pool][level]`: the memory of every pool of the window.
    pools: Vec<[Pool; 2]>,
    /// Scratch: the addresses of every pool, rebuilt per launch.
    addresses: Vec<PoolAddresses>,
    plan: CopyPlan,
    buffers: Vec<DescriptorBuffer>,
    /// Next buffer to try first (round robin keeps the oldest launch next in line).
    next_buffer: usize,
    /// The first failure; once set no copy is launched (the bytes can no longer be trusted).
    failure: Option<String>,
    launches: u64,
    /// Submissions with copies so far; the first is 1.
    submissions: u64,
    /// Per host-tier row: the last submission whose copies read or wrote it (0: none), so the
    /// disk and remote tiers touch a pinned row only once the GPU is done with it.
    host_row_submission: Vec<u64>,
}

// SAFETY: the raw pointers are CUDA allocations owned by this engine, used only under the
// manager's lock with the device's context current.
unsafe impl Send for CudaCopyEngine {}

impl CudaCopyEngine {
    /// An engine for a window of `num_primary` + `num_secondary` rows of every pool of
    /// `layout`; allocates the pools of both levels when `allocate_pools`, else leaves them to
    /// `register_pool`. A driver function missing from the loaded library is an `Unavailable`
    /// error naming it.
    pub fn new(
        device: Arc<CudaDevice>,
        layout: impl Into<BlockLayout>,
        num_primary: usize,
        num_secondary: usize,
        allocate_pools: bool,
    ) -> CudaResult<CudaCopyEngine> {
        guarded("creating the CUDA copy engine", || {
            Self::new_unguarded(
                device,
                layout.into(),
                num_primary,
                num_secondary,
                allocate_pools,
            )
        })
    }

    fn new_unguarded(
        device: Arc<CudaDevice>,
        layout: BlockLayout,
        num_primary: usize,
        num_secondary: usize,
        allocate_pools: bool,
    ) -> CudaResult<CudaCopyEngine> {
        let mut engine = CudaCopyEngine {
            device,
            pools: layout
                .pools()
                .iter()
                .map(|_| [Pool::Missing, Pool::Missing])
                .collect(),
            addresses: Vec::new(),
            layout,
            rows: [num_primary, num_secondary],
            plan: CopyPlan::default(),
            buffers: Vec::new(),
            next_buffer: 0,
            failure: None,
            launches: 0,
            submissions: 0,
            host_row_submission: vec![0; num_secondary],
        };
        if allocate_pools {
            // On failure `engine` drops and frees what was allocated.
            engine.allocate_pools()?;
        }
        // One descriptor buffer from the start: a launch can then always fall back on it.
        let _ctx = ContextGuard::enter(engine.device.context())?;
        let first = new_buffer(MIN_DESCRIPTORS_PER_BUFFER)?;
        engine.buffers.push(first);
        Ok(engine)
    }

    fn pool_bytes(&self, level: Level, pool: usize) -> usize {
        self.rows[level as usize] * self.layout.pools()[pool].geometry.row_bytes()
    }

    fn allocate_pools(&mut self) -> CudaResult<()> {
        let _ctx = ContextGuard::enter(self.device.context())?;
        for pool in 0..self.pools.len() {
            let primary = self.pool_bytes(Level::Primary, pool);
            if primary > 0 {
                let mut p: CUdeviceptr = 0;
                // SAFETY: out-pointer to a local.
                check(
                    unsafe { sys::cuMemAlloc_v2(&mut p, primary) },
                    "cuMemAlloc (primary pool)",
                )
                .map_err(|e| CudaError::Call(format!("{e} ({primary} bytes)")))?;
                self.pools[pool][0] = Pool::Device(p);
            }
            let secondary = self.pool_bytes(Level::Secondary, pool);
            if secondary > 0 {
                let (host, device) = alloc_mapped_host(secondary).map_err(|e| {
                    CudaError::Call(format!("{e} (secondary pool, {secondary} bytes)"))
                })?;
                self.pools[pool][1] = Pool::Host(host, device);
            }
        }
        Ok(())
    }

    fn pools_present(&self) -> bool {
        self.pools.iter().enumerate().all(|(p, levels)| {
            (0..2).all(|l| {
                self.rows[l] == 0
                    || self.layout.pools()[p].geometry.row_bytes() == 0
                    || levels[l].address().is_some()
            })
        })
    }

    fn launch(&mut self, copies: &[RowCopy]) -> CudaResult<()> {
        if !self.pools_present() {
            return Err(CudaError::Call(
                "a pool of this window is not registered yet (cuda_allocate_pools is false)".into(),
            ));
        }
        self.addresses.clear();
        self.addresses.extend(self.pools.iter().map(|levels| {
            PoolAddresses([
                levels[0].address().unwrap_or(0),
                levels[1].address().unwrap_or(0),
            ])
        }));
        self.plan.build(copies, &self.layout, &self.addresses);
        let count = self.plan.descriptors.len();
        if count == 0 {
            return Ok(());
        }
        self.submissions += 1;
        for c in copies {
            for row in [c.src, c.dst] {
                if row.level == Level::Secondary {
                    if let Some(s) = self.host_row_submission.get_mut(row.index as usize) {
                        *s = self.submissions;
                    }
                }
            }
        }
        let _ctx = ContextGuard::enter(self.device.context())?;
        let stream = self.device.launch_stream()?;
        let mut slices = self.plan.slices_per_copy();
        let max_ctas = self.device.sm_count() * CTAS_PER_SM;
        // Usually one buffer takes every descriptor; under pinned-memory pressure a smaller one
        // takes them in chunks, launched in order on the same stream.
        let mut next = 0;
        while next < count {
            let (index, capacity) = self.descriptor_buffer(count - next)?;
            let end = count.min(next + capacity);
            let buffer = &mut self.buffers[index];
            // SAFETY: the buffer holds `capacity >= end - next` descriptors; no launch reads it.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.plan.descriptors[next..].as_ptr(),
                    buffer.host,
                    end - next,
                );
            }
            // The kernel reads the descriptors from host memory: make the writes visible first.
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            // In flight from its first launch on: a failure after it must not free it early.
            buffer.in_flight = true;
            buffer.submission = self.submissions;
            // One launch per wave (or the part of it in this chunk).
            for wave in &self.plan.waves {
                let (lo, hi) = (wave.start.max(next), wave.end.min(end));
                if lo >= hi {
                    continue;
                }
                let mut descriptors =
                    buffer.device + ((lo - next) * std::mem::size_of::<CopyDescriptor>()) as u64;
                let mut num = (hi - lo) as u32;
                let units = u64::from(num) * u64::from(slices);
                let grid = units.min(u64::from(max_ctas)).max(1) as u32;
                let mut params = [
                    (&mut descriptors as *mut CUdeviceptr).cast::<std::ffi::c_void>(),
                    (&mut num as *mut u32).cast(),
                    (&mut slices as *mut u32).cast(),
                ];
                // SAFETY: the kernel's three parameters, in order, point at live locals.
                check(
                    unsafe {
                        sys::cuLaunchKernel(
                            self.device.kernel(),
                            grid,
                            1,
                            1,
                            THREADS_PER_CTA,
                            1,
                            1,
                            0,
                            stream,
                            params.as_mut_ptr(),
                            std::ptr::null_mut(),
                        )
                    },
                    "cuLaunchKernel (block copy)",
                )?;
                self.launches += 1;
            }
            // SAFETY: event created with the buffer; recorded on the stream that read it.
            check(
                unsafe { sys::cuEventRecord(buffer.done, stream) },
                "cuEventRecord",
            )?;
            next = end;
        }
        self.device.copies_launched()
    }

    /// A descriptor buffer no launch is reading, and its capacity: one of at least `wanted`
    /// entries when one is free or can be allocated; otherwise (back pressure, or pinned memory
    /// exhausted) the largest buffer once its launch has finished, and the caller takes the
    /// descriptors in chunks. Allocation pressure therefore never fails a launch.
    fn descriptor_buffer(&mut self, wanted: usize) -> CudaResult<(usize, usize)> {
        let n = self.buffers.len();
        for k in 0..n {
            let i = (self.next_buffer + k) % n;
            let b = &mut self.buffers[i];
            if b.capacity < wanted {
                continue;
            }
            if b.in_flight {
                // SAFETY: querying an event this engine created.
                match unsafe { sys::cuEventQuery(b.done) } {
                    CUresult::CUDA_SUCCESS => b.in_flight = false,
                    CUresult::CUDA_ERROR_NOT_READY => continue,
                    e => check(e, "cuEventQuery")?,
                }
            }
            self.next_buffer = (i + 1) % n;
            return Ok((i, b.capacity));
        }
        if n < MAX_DESCRIPTOR_BUFFERS {
            if let Ok(b) = new_buffer(wanted.max(MIN_DESCRIPTORS_PER_BUFFER)) {
                let capacity = b.capacity;
                self.buffers.push(b);
                return Ok((n, capacity));
            }
        }
        // Wait for the largest buffer (the GPU is far behind, or pinned memory ran out).
        let i = (0..n)
            .max_by_key(|&i| self.buffers[i].capacity)
            .ok_or_else(|| CudaError::Call("no descriptor buffer".into()))?;
        // SAFETY: waiting on an event this engine created.
        check(
            unsafe { sys::cuEventSynchronize(self.buffers[i].done) },
            "cuEventSynchronize",
        )?;
        self.buffers[i].in_flight = false;
        Ok((i, self.buffers[i].capacity))
    }

    /// Whether every launch that read or wrote host-tier row `index` has finished (queried,
    /// never waited for): only then may the host read or rewrite the pinned row.
    fn host_row_settled(&mut self, index: usize) -> CudaResult<bool> {
        let last = self.host_row_submission.get(index).copied().unwrap_or(0);
        if last == 0 {
            return Ok(true);
        }
        let _ctx = ContextGuard::enter(self.device.context())?;
        // A submission is done once no buffer it used is in flight: a buffer is reused only
        // after its launch finished, so one that moved on to a later submission is done too.
        for b in &mut self.buffers {
            if b.in_flight && b.submission == last {
                // SAFETY: querying an event this engine created.
                match unsafe { sys::cuEventQuery(b.done) } {
                    CUresult::CUDA_SUCCESS => b.in_flight = false,
                    CUresult::CUDA_ERROR_NOT_READY => return Ok(false),
                    e => check(e, "cuEventQuery")?,
                }
            }
        }
        Ok(true)
    }

    /// Host pointers of host-tier row `index` in every pool, with their lengths; `None` when a
    /// pool is missing or was registered without a host address.
    fn host_row_parts(&self, index: usize) -> Option<Vec<(*mut u8, usize)>> {
        if index >= self.rows[Level::Secondary as usize] {
            return None;
        }
        self.pools
            .iter()
            .zip(self.layout.pools())
            .map(|(levels, shape)| {
                let n = shape.geometry.row_bytes();
                let base = match levels[Level::Secondary as usize] {
                    Pool::Host(h, _) => h as *mut u8,
                    Pool::Registered(_, host) => host as *mut u8,
                    Pool::Missing | Pool::Device(_) => return None,
                };
                // SAFETY: `index` < the level's rows, so the row lies inside the pool.
                Some((unsafe { base.add(index * n) }, n))
            })
            .collect()
    }

    /// The pinned bytes of host-tier row `index` (every pool, in pool order), once the GPU is
    /// done with it: `Err` while a copy may still touch it (the caller drops the work).
    fn visit_host_row(
        &mut self,
        row: MemRow,
        mut each: impl FnMut(*mut u8, usize, usize),
    ) -> Result<(), String> {
        if row.level != Level::Secondary {
            return Err("only host-tier rows are visible to the host".into());
        }
        let index = row.index as usize;
        if !self.host_row_settled(index).map_err(|e| e.to_string())? {
            return Err("a copy of this host row is still in flight".into());
        }
        let parts = self
            .host_row_parts(index)
            .ok_or_else(|| "a host pool of this window is not registered".to_string())?;
        let mut at = 0;
        for (p, n) in parts {
            each(p, n, at);
            at += n;
        }
        Ok(())
    }

    /// Waits on the host until every copy this engine launched has finished (destroy and pool
    /// replacement only, never on the hot path).
    fn wait_idle(&mut self) {
        for b in &mut self.buffers {
            if b.in_flight {
                // SAFETY: waiting on an event this engine created.
                unsafe { sys::cuEventSynchronize(b.done) };
                b.in_flight = false;
            }
        }
    }

    fn free_pool(&mut self, level: Level, pool: usize) {
        // SAFETY: frees memory this engine allocated, once (the pool is reset to Missing).
        unsafe {
            match std::mem::replace(&mut self.pools[pool][level as usize], Pool::Missing) {
                Pool::Device(p) => {
                    sys::cuMemFree_v2(p);
                }
                Pool::Host(h, _) => {
                    sys::cuMemFreeHost(h);
                }
                Pool::Missing | Pool::Registered(..) => {}
            }
        }
    }

    /// Replaces pool `pool` (in `BlockLayout` order) of `level` with the engine's memory at
    /// `address` (`bytes` long): GPU memory for the primary level, pinned host memory for the
    /// secondary one. Waits for this window's copies in flight, then frees kvblock's own pool.
    pub fn register(
        &mut self,
        level: Level,
        pool: usize,
        address: u64,
        bytes: usize,
    ) -> CudaResult<()> {
        if pool >= self.pools.len() {
            return Err(CudaError::Call(format!(
                "pool {pool} of a window with {} pools",
                self.pools.len()
            )));
        }
        let needed = self.pool_bytes(level, pool);
        if bytes < needed {
            return Err(CudaError::Call(format!(
                "the pool needs {needed} bytes ({} rows of {} bytes), {bytes} given",
                self.rows[level as usize],
                self.layout.pools()[pool].geometry.row_bytes()
            )));
        }
        let _ctx = ContextGuard::enter(self.device.context())?;
        let device_address = device_visible(level, address)?;
        self.wait_idle();
        self.free_pool(level, pool);
        self.pools[pool][level as usize] = Pool::Registered(device_address, address);
        Ok(())
    }
}

/// Pinned host memory mapped into the device's address space (not write-combined: the host
/// tier is read back).
fn alloc_mapped_host(bytes: usize) -> CudaResult<(*mut std::ffi::c_void, CUdeviceptr)> {
    let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
    let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
    // SAFETY: out-pointers to locals; freed by the caller (or here on failure).
    unsafe {
        check(
            sys::cuMemHostAlloc(&mut host, bytes, flags),
            "cuMemHostAlloc",
        )?;
        let mut device: CUdeviceptr = 0;
        if let Err(e) = check(
            sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0),
            "cuMemHostGetDevicePointer",
        ) {
            sys::cuMemFreeHost(host);
            return Err(e);
        }
        Ok((host, device))
    }
}

/// The device-visible address of engine memory registered as a pool of `level`, checked to be
/// of the right kind.
fn device_visible(level: Level, address: u64) -> CudaResult<CUdeviceptr> {
    if address == 0 {
        return Err(CudaError::Call("the pool pointer is null".into()));
    }
    let mut kind: u32 = 0;
    // SAFETY: out-pointer to a local of the attribute's size.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut kind as *mut u32).cast(),
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            address,
        )
    };
    let expected = match level {
        Level::Primary => CUmemorytype::CU_MEMORYTYPE_DEVICE,
        Level::Secondary => CUmemorytype::CU_MEMORYTYPE_HOST,
    };
    if r != CUresult::CUDA_SUCCESS || kind != expected as u32 {
        return Err(CudaError::Call(match level {
            Level::Primary => {
                "the primary pool must be GPU memory of this device (cudaMalloc)".into()
            }
            Level::Secondary => "the secondary pool must be pinned host memory (cudaHostAlloc or \
                                 cudaHostRegister, mapped)"
                .into(),
        }));
    }
    if level == Level::Primary {
        return Ok(address);
    }
    let mut device: CUdeviceptr = 0;
    // SAFETY: out-pointer to a local; `address` is pinned host memory (checked above).
    check(
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, address as *mut _, 0) },
        "cuMemHostGetDevicePointer (the secondary pool must be mapped)",
    )?;
    Ok(device)
}

/// A descriptor buffer of `capacity` entries in pinned, device-mapped memory, with its event.
fn new_buffer(capacity: usize) -> CudaResult<DescriptorBuffer> {
    let (host, device) = alloc_mapped_host(capacity * std::mem::size_of::<CopyDescriptor>())?;
    let mut done: CUevent = std::ptr::null_mut();
    let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
    // SAFETY: out-pointer to a local.
    if let Err(e) = check(
        unsafe { sys::cuEventCreate(&mut done, flags) },
        "cuEventCreate",
    ) {
        // SAFETY: frees the allocation just made.
        unsafe { sys::cuMemFreeHost(host) };
        return Err(e);
    }
    Ok(DescriptorBuffer {
        host: host.cast(),
        device,
        capacity,
        done,
        in_flight: false,
        submission: 0,
    })
}

fn free_buffer(b: DescriptorBuffer) {
    // SAFETY: frees a buffer and event this engine created; no launch reads it any more.
    unsafe {
        sys::cuEventDestroy_v2(b.done);
        sys::cuMemFreeHost(b.host.cast());
    }
}

impl CopyEngine for CudaCopyEngine {
    /// A launch that fails before any kernel of the batch was enqueued is reported as a
    /// `CopyFailure`; one that fails after is sticky. Either poisons the handle (`can_fail`).
    fn submit(&mut self, copies: &[RowCopy]) -> Result<(), CopyFailure> {
        if self.failure.is_some() || copies.is_empty() {
            return Ok(());
        }
        let launches_before = self.launches;
        if let Err(e) = self.launch(copies) {
            if self.launches == launches_before {
                return Err(CopyFailure {
                    completed: 0,
                    error: KvError::Cuda(e.to_string()),
                });
            }
            self.failure = Some(e.to_string());
        }
        Ok(())
    }

    /// False: a launch does not fail for want of resources (descriptor buffers degrade to
    /// waiting and chunking), so what is left is a broken context, which no rollback repairs;
    /// and the rollback path snapshots every window before each call that may copy, a cost
    /// proportional to the pool on the GPU hot path. A failed launch poisons the handle.
    fn can_fail(&self) -> bool {
        false
    }

    /// Orders the copies before the engine's next work on the GPU (no host wait).
    fn sync(&mut self) {
        if self.failure.is_none() {
            if let Err(e) = self.device.sync_transfers() {
                self.failure = Some(e.to_string());
            }
        }
    }

    fn wait_on_host(&mut self) {
        self.wait_idle();
    }

    fn pool_base(&mut self, level: Level, pool: usize) -> Option<*mut u8> {
        self.pools.get(pool)?[level as usize]
            .address()
            .map(|a| a as *mut u8)
    }

    fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    fn register_pool(
        &mut self,
        level: Level,
        pool: usize,
        address: u64,
        bytes: usize,
    ) -> Result<(), String> {
        self.register(level, pool, address, bytes)
            .map_err(|e| e.to_string())
    }

    fn launches(&self) -> u64 {
        self.launches
    }

    /// True: the host tier is pinned host memory. Its rows are read and written only once no
    /// copy touches them (`read_row` / `write_row` refuse otherwise, without waiting).
    fn host_rows_visible(&self) -> bool {
        true
    }

    /// False: GPU memory is read back only by copies.
    fn primary_rows_visible(&self) -> bool {
        false
    }

    fn host_row_ready(&mut self, row: MemRow) -> bool {
        row.level == Level::Secondary && self.host_row_settled(row.index as usize).unwrap_or(false)
    }

    fn read_row(&mut self, row: MemRow, out: &mut [u8]) -> Result<(), String> {
        self.visit_host_row(row, |p, n, at| {
            // SAFETY: `p` points at `n` bytes of a pinned row no copy touches (settled).
            out[at..at + n].copy_from_slice(unsafe { std::slice::from_raw_parts(p, n) });
        })
    }

    fn write_row(&mut self, row: MemRow, data: &[u8]) -> Result<(), String> {
        self.visit_host_row(row, |p, n, at| {
            // SAFETY: as in `read_row`; the next launch that reads the row comes after this.
            unsafe { std::ptr::copy_nonoverlapping(data[at..at + n].as_ptr(), p, n) };
        })
    }
}

impl Drop for CudaCopyEngine {
    fn drop(&mut self) {
        // Tried twice: teardown must not leak the pools over one failed call. A context that
        // cannot be entered at all is dead; releasing it (the device's drop) frees everything.
        let ctx = self.device.context();
        let Ok(_ctx) = ContextGuard::enter(ctx).or_else(|_| ContextGuard::enter(ctx)) else {
            return;
        };
        self.wait_idle();
        if self.failure.is_some() {
            // A launch may have been enqueued without its completion event: wait for the device.
            // SAFETY: plain call with the context current.
            unsafe { sys::cuCtxSynchronize() };
        }
        for b in std::mem::take(&mut self.buffers) {
            free_buffer(b);
        }
        for pool in 0..self.pools.len() {
            self.free_pool(Level::Primary, pool);
            self.free_pool(Level::Secondary, pool);
        }
    }
}
