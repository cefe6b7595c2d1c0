//! The data path seen from the manager: the copy engine of each window (chosen by the config's
//! backend), the CUDA stream, pools registered by the engine, pool addresses and backend
//! failures.

use std::sync::Arc;

use super::{CopyBackend, KvCacheManager, WindowSpec};
use crate::cuda::{CudaConfig, CudaCopyEngine, CudaDevice};
use crate::error::{KvError, KvResult};
use crate::pool::{Level, PoolGeometry};
use crate::transfer::{CopyEngine, HostMemoryEngine, NullEngine};

/// The GPU of a CUDA manager, opened once and shared by its windows' engines.
pub(super) fn open_device(
    backend: CopyBackend,
    cuda: &CudaConfig,
) -> KvResult<Option<Arc<CudaDevice>>> {
    match backend {
        CopyBackend::Cuda => Ok(Some(Arc::new(CudaDevice::open(cuda)?))),
        CopyBackend::None | CopyBackend::HostMemory => Ok(None),
    }
}

/// The copy engine of one window; with the CUDA backend its pools are allocated here unless
/// the engine registers its own.
pub(super) fn window_engine(
    backend: CopyBackend,
    device: Option<&Arc<CudaDevice>>,
    allocate_pools: bool,
    spec: &WindowSpec,
    geometry: PoolGeometry,
) -> KvResult<Box<dyn CopyEngine>> {
    let needs_geometry = |what: &str| {
        let fields = [
            (spec.num_layers, "num_layers"),
            (spec.num_kv_heads, "num_kv_heads"),
            (spec.size_per_head, "size_per_head"),
            (geometry.bytes_per_element, "bytes_per_element"),
        ];
        match fields.iter().find(|(v, _)| *v == 0) {
            Some((_, name)) => Err(KvError::InvalidConfig(format!(
                "{name} must be positive with the {what} backend"
            ))),
            None => Ok(()),
        }
    };
    Ok(match (backend, device) {
        (CopyBackend::HostMemory, _) => {
            needs_geometry("host-memory")?;
            Box::new(HostMemoryEngine::try_new(
                geometry,
                spec.primary_blocks,
                spec.secondary_blocks,
            )?)
        }
        (CopyBackend::Cuda, Some(device)) => {
            needs_geometry("CUDA")?;
            Box::new(CudaCopyEngine::new(
                device.clone(),
                geometry,
                spec.primary_blocks,
                spec.secondary_blocks,
                allocate_pools,
            )?)
        }
        _ => Box::new(NullEngine::default()),
    })
}

impl KvCacheManager {
    fn cuda_device(&self, what: &str) -> KvResult<&Arc<CudaDevice>> {
        self.cuda
            .as_ref()
            .ok_or_else(|| KvError::Unsupported(format!("{what} needs the CUDA copy backend")))
    }

    /// Orders later copies with the engine stream `stream` (a `CUstream` as an integer).
    pub fn set_stream(&mut self, stream: usize) -> KvResult<()> {
        Ok(self.cuda_device("set_stream")?.set_stream(stream)?)
    }

    /// Makes the engine stream wait (on the GPU) for every copy submitted so far; a no-op for
    /// the engine-stream ordering and the host backends.
    pub fn sync_transfers(&mut self) -> KvResult<()> {
        match &self.cuda {
            Some(device) => Ok(device.sync_transfers()?),
            None => Ok(()),
        }
    }

    /// Replaces the pool of (`window_size`, `level`) with the engine's memory. Only while the
    /// manager holds no data: no sequence, no cached block.
    pub fn register_pool(
        &mut self,
        window_size: usize,
        level: Level,
        address: u64,
        bytes: usize,
    ) -> KvResult<()> {
        self.cuda_device("register_pool")?;
        let i = self.window_index(window_size)?;
        if !self.sequences.is_empty() || self.windows.iter().any(|w| w.num_in_tree() > 0) {
            return Err(KvError::Unsupported(
                "pools can be registered only while the manager holds no data (no sequence, \
                 no cached block)"
                    .into(),
            ));
        }
        self.windows[i]
            .engine_mut()
            .register_pool(level, address, bytes)
            .map_err(KvError::Cuda)?;
        self.unregistered_pools
            .retain(|&(w, l)| (w, l) != (window_size, level));
        Ok(())
    }

    /// Fails while a pool the engine must register is missing (admission would copy into it).
    pub(super) fn require_pools(&self) -> KvResult<()> {
        match self.unregistered_pools.first() {
            None => Ok(()),
            Some((w, l)) => Err(KvError::Unsupported(format!(
                "the {l:?} pool of window {w} is not registered yet (cuda_allocate_pools is \
                 false): call kvb_manager_register_pool first"
            ))),
        }
    }

    /// The first copy failure of any window's backend (sticky).
    pub fn copy_failure(&self) -> Option<String> {
        self.windows
            .iter()
            .find_map(|w| w.engine().failure().map(str::to_owned))
    }

    /// Batched copy submissions so far over all windows (CUDA kernel launches).
    pub fn copy_launches(&self) -> u64 {
        self.windows.iter().map(|w| w.engine().launches()).sum()
    }

    /// Address of a window's pool at `level` and its row size: host memory for the host
    /// backend, the device-visible address for the CUDA backend.
    pub fn pool_pointer(&mut self, window_size: usize, level: Level) -> KvResult<(*mut u8, usize)> {
        let w = self.window_mut(window_size)?;
        let row_bytes = w.config().geometry.row_bytes();
        match w.engine_mut().pool_base(level) {
            Some(p) => Ok((p, row_bytes)),
            None => Err(KvError::Unsupported(
                "this pool has no memory (bookkeeping-only backend, an empty level, or a pool \
                 not registered yet)"
                    .into(),
            )),
        }
    }
}

/// The pools a CUDA manager that does not allocate them waits for.
pub(super) fn pools_to_register(
    backend: CopyBackend,
    cuda: &CudaConfig,
    windows: &[WindowSpec],
) -> Vec<(usize, Level)> {
    if backend != CopyBackend::Cuda || cuda.allocate_pools {
        return Vec::new();
    }
    windows
        .iter()
        .flat_map(|w| {
            [
                (w.primary_blocks > 0).then_some((w.window_size, Level::Primary)),
                (w.secondary_blocks > 0).then_some((w.window_size, Level::Secondary)),
            ]
        })
        .flatten()
        .collect()
}
