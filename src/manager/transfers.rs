//! The data path seen from the manager: the copy engine of each window (chosen by the config's
//! backend), the CUDA stream, pools registered by the engine, pool addresses and backend
//! failures.

use std::sync::Arc;

use super::{CopyBackend, KvCacheManager, WindowSpec};
use crate::cuda::{CudaConfig, CudaCopyEngine, CudaDevice};
use crate::error::{KvError, KvResult};
use crate::pool::{BlockLayout, Level};
use crate::pool_model::{PoolInfo, PoolModel};
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
/// the engine registers its own. `from_layers`: the layout comes from the config's layers
/// (already checked), not from the window's uniform sizes.
pub(super) fn window_engine(
    backend: CopyBackend,
    device: Option<&Arc<CudaDevice>>,
    allocate_pools: bool,
    spec: &WindowSpec,
    layout: &BlockLayout,
    from_layers: bool,
) -> KvResult<Box<dyn CopyEngine>> {
    let bytes_per_element = layout.first().map_or(0, |g| g.bytes_per_element);
    let needs_geometry = |what: &str| {
        if from_layers {
            return Ok(());
        }
        let fields = [
            (spec.num_layers, "num_layers"),
            (spec.num_kv_heads, "num_kv_heads"),
            (spec.size_per_head, "size_per_head"),
            (bytes_per_element, "bytes_per_element"),
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
                layout,
                spec.primary_blocks,
                spec.secondary_blocks,
            )?)
        }
        (CopyBackend::Cuda, Some(device)) => {
            needs_geometry("CUDA")?;
            Box::new(CudaCopyEngine::new(
                device.clone(),
                layout,
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

    /// Replaces the pool of (`window_size`, `level`) with the engine's memory (a window of one
    /// pool). Only while the manager holds no data: no sequence, no cached block.
    pub fn register_pool(
        &mut self,
        window_size: usize,
        level: Level,
        address: u64,
        bytes: usize,
    ) -> KvResult<()> {
        let i = self.window_index(window_size)?;
        let pools = self.pool_model.window_pools(i).count();
        if pools != 1 {
            return Err(KvError::InvalidArgument(format!(
                "window {window_size} has {pools} pools: register each with \
                 kvb_manager_register_pool_of"
            )));
        }
        let pool = self.pool_model.pool_index(i, 0).unwrap_or(0);
        self.register_model_pool(pool, level, address, bytes)
    }

    /// Replaces pool `pool` (an index of `pool_model().pools()`) at `level` with the engine's
    /// memory. Only while the manager holds no data: no sequence, no cached block.
    pub fn register_model_pool(
        &mut self,
        pool: usize,
        level: Level,
        address: u64,
        bytes: usize,
    ) -> KvResult<()> {
        self.cuda_device("register_pool")?;
        let info = *self.model_pool(pool)?;
        let (i, window_size) = (info.window_index, info.window_size);
        if !self.sequences.is_empty() || self.windows.iter().any(|w| w.num_in_tree() > 0) {
            return Err(KvError::Unsupported(
                "pools can be registered only while the manager holds no data (no sequence, \
                 no cached block)"
                    .into(),
            ));
        }
        self.windows[i]
            .engine_mut()
            .register_pool(level, info.index_in_window, address, bytes)
            .map_err(KvError::Cuda)?;
        self.unregistered_pools
            .retain(|&(w, p, l)| (w, p, l) != (window_size, info.index_in_window, level));
        Ok(())
    }

    /// The pools of the model and its layer → (pool, index in pool) map.
    pub fn pool_model(&self) -> &PoolModel {
        &self.pool_model
    }

    fn model_pool(&self, pool: usize) -> KvResult<&PoolInfo> {
        self.pool_model.pools().get(pool).ok_or_else(|| {
            KvError::InvalidArgument(format!(
                "pool {pool} of a model with {} pools",
                self.pool_model.pools().len()
            ))
        })
    }

    /// Address of pool `pool` (an index of `pool_model().pools()`) at `level` and the bytes of
    /// one block's row in it.
    pub fn model_pool_pointer(&mut self, pool: usize, level: Level) -> KvResult<(*mut u8, usize)> {
        let info = *self.model_pool(pool)?;
        let w = &mut self.windows[info.window_index];
        let row_bytes = info.geometry.row_bytes();
        match w.engine_mut().pool_base(level, info.index_in_window) {
            Some(p) => Ok((p, row_bytes)),
            None => Err(no_memory()),
        }
    }

    /// Fails while a pool the engine must register is missing (admission would copy into it).
    pub(super) fn require_pools(&self) -> KvResult<()> {
        match self.unregistered_pools.first() {
            None => Ok(()),
            Some((w, p, l)) => Err(KvError::Unsupported(format!(
                "the {l:?} pool {p} of window {w} is not registered yet (cuda_allocate_pools is \
                 false): call kvb_manager_register_pool first"
            ))),
        }
    }

    /// Waits on the host until every copy submitted so far has finished, so that the host may
    /// read or write pool rows (e.g. copy an offloaded block's host row to a file). Never on the
    /// hot path: an engine orders its GPU work after the copies with `sync_transfers`. A
    /// backend's sticky copy failure is reported (`CopyFailed`).
    pub fn wait_for_copies_on_host(&mut self) -> KvResult<()> {
        for w in &mut self.windows {
            w.wait_for_copies_on_host();
        }
        match self.copy_failure() {
            Some(e) => Err(KvError::CopyFailed(e)),
            None => Ok(()),
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

    /// Address of a window's (first) pool at `level` and its row size: host memory for the
    /// host backend, the device-visible address for the CUDA backend.
    pub fn pool_pointer(&mut self, window_size: usize, level: Level) -> KvResult<(*mut u8, usize)> {
        let i = self.window_index(window_size)?;
        let pools = self.pool_model.window_pools(i).count();
        if pools != 1 {
            return Err(KvError::InvalidArgument(format!(
                "window {window_size} has {pools} pools: address each with \
                 kvb_manager_get_model_pool_pointer"
            )));
        }
        let w = self.window_mut(window_size)?;
        let row_bytes = w.config().layout.first().map_or(0, |g| g.row_bytes());
        match w.engine_mut().pool_base(level, 0) {
            Some(p) => Ok((p, row_bytes)),
            None => Err(no_memory()),
        }
    }
}

fn no_memory() -> KvError {
    KvError::Unsupported(
        "this pool has no memory (bookkeeping-only backend, an empty level, or a pool not \
         registered yet)"
            .into(),
    )
}

/// The pools a CUDA manager that does not allocate them waits for.
pub(super) fn pools_to_register(
    backend: CopyBackend,
    cuda: &CudaConfig,
    windows: &[WindowSpec],
    model: &PoolModel,
) -> Vec<(usize, usize, Level)> {
    if backend != CopyBackend::Cuda || cuda.allocate_pools {
        return Vec::new();
    }
    windows
        .iter()
        .enumerate()
        .flat_map(|(i, w)| {
            model.window_pools(i).flat_map(move |(_, p)| {
                let p = p.index_in_window;
                [
                    (w.primary_blocks > 0).then_some((w.window_size, p, Level::Primary)),
                    (w.secondary_blocks > 0).then_some((w.window_size, p, Level::Secondary)),
                ]
            })
        })
        .flatten()
        .collect()
}
