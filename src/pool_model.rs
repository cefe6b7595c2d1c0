//! The pool model: which pools a manager's layers need and where each layer lives in them
//! (TensorRT-LLM's pool configurations, `getLayerToPoolMapping` and `getPoolLayerIdx`).
//!
//! Layers are grouped into pools per (attention window, cache type, KV heads, head size, data
//! type). A window's blocks span all of its pools: block `b` owns the same row in each, so a
//! block moves (offload, onboard, partial copy) as the rows of every pool together. A pool of
//! NVFP4 data has a block-scale pool beside it (one FP8 scale per 16 elements).
//!
//! Pool order, as in TensorRT-LLM: the data pools of each window (ascending window size),
//! inside a window ascending by (KV heads, head size, data type, cache type); then the
//! block-scale pools in the order of their data pools. Offset tables list the data pools only.

use crate::error::{KvError, KvResult};
use crate::pool::{BlockLayout, PoolGeometry, PoolShape};

/// What a layer caches per token (TensorRT-LLM `CacheType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(u8)]
pub enum CacheType {
    /// Self-attention K and V.
    #[default]
    SelfKv = 0,
    /// One row per token and no V half (MLA's compressed latent, an indexer's K cache).
    SelfKOnly = 1,
    /// Cross-attention K and V: the encoder's output per request, never reused across
    /// requests. A manager's layers are all cross or all self.
    Cross = 2,
    /// A recurrent layer's state (Mamba, linear attention): `heads × size_per_head` elements
    /// per block, no token dimension. A block's row holds the state snapshot after the block's
    /// last token (written by the engine when the block is full); its window reuses exact full
    /// blocks only (see `ManagerConfig::recurrent_snapshot_interval_tokens`).
    RecurrentState = 3,
    /// A sparse-attention indexer's K cache (DeepSeek-V3.2): K only, in pools placed after
    /// every other data pool, as TensorRT-LLM places its indexer K cache pool.
    IndexerK = 4,
}

impl CacheType {
    /// Rows per (layer, token): 2 for K and V, 1 for a K-only cache.
    pub fn kv_factor(self) -> usize {
        match self {
            CacheType::SelfKOnly | CacheType::RecurrentState | CacheType::IndexerK => 1,
            CacheType::SelfKv | CacheType::Cross => 2,
        }
    }
}

/// Element type of a pool, which fixes its element size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(u8)]
pub enum KvDataType {
    /// The manager's `bytes_per_element`.
    #[default]
    Default = 0,
    Fp32 = 1,
    Fp16 = 2,
    Bf16 = 3,
    Fp8 = 4,
    Int8 = 5,
    /// NVFP4: two 4-bit elements per byte, and a block-scale pool of one FP8 scale per
    /// `NVFP4_SCALE_BLOCK` elements.
    Nvfp4 = 6,
}

/// Elements of NVFP4 data that share one FP8 block scale.
pub const NVFP4_SCALE_BLOCK: usize = 16;

impl KvDataType {
    /// Bytes of one storage unit (`default` for `Default`); an NVFP4 unit holds 2 elements.
    pub fn container_bytes(self, default: usize) -> usize {
        match self {
            KvDataType::Default => default,
            KvDataType::Fp32 => 4,
            KvDataType::Fp16 | KvDataType::Bf16 => 2,
            KvDataType::Fp8 | KvDataType::Int8 | KvDataType::Nvfp4 => 1,
        }
    }

    /// Elements per storage unit.
    pub fn elements_per_container(self) -> usize {
        if self == KvDataType::Nvfp4 {
            2
        } else {
            1
        }
    }
}

/// One attention layer of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LayerSpec {
    /// The layer's attention window; one of the manager's windows.
    pub window_size: usize,
    pub cache_type: CacheType,
    pub num_kv_heads: usize,
    /// Elements per head and token (MLA: latent + RoPE part, e.g. 512 + 64).
    pub size_per_head: usize,
    pub data_type: KvDataType,
}

/// One pool of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolInfo {
    pub window_size: usize,
    /// Index of the window (ascending window size) and of this pool among its window's pools.
    pub window_index: usize,
    pub index_in_window: usize,
    pub cache_type: CacheType,
    pub data_type: KvDataType,
    pub num_kv_heads: usize,
    /// Elements per head and token of the layers (for a scale pool: of its data pool).
    pub size_per_head: usize,
    /// Rows of one block in storage units: `[layers][kv_factor][heads][tokens][units]`.
    pub geometry: PoolGeometry,
    /// For a block-scale pool, the index of the data pool whose scales it holds.
    pub scales_of: Option<usize>,
}

impl PoolInfo {
    /// Bytes one token takes in this pool (all its layers, K and V).
    pub fn bytes_per_token(&self) -> usize {
        let g = &self.geometry;
        g.num_layers * g.kv_factor * g.num_kv_heads * g.token_bytes()
    }

    fn shape(&self) -> PoolShape {
        PoolShape {
            geometry: self.geometry,
            partial_copies: self.data_type != KvDataType::Nvfp4
                && self.cache_type != CacheType::RecurrentState,
            recurrent_state: self.cache_type == CacheType::RecurrentState,
        }
    }
}

/// The pools of a manager and its layer → (pool, index in pool) map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolModel {
    pools: Vec<PoolInfo>,
    /// The layer map of a model from layers; empty for a uniform model, whose map follows
    /// from its pools' layer counts (which may be huge for a bookkeeping-only manager).
    layer_to_pool: Vec<(usize, usize)>,
    num_layers: usize,
    num_data_pools: usize,
    num_windows: usize,
    cross: bool,
}

fn invalid(msg: String) -> KvError {
    KvError::InvalidConfig(msg)
}

impl PoolModel {
    /// One pool per window of `(window_size, num_layers, num_kv_heads, size_per_head)`,
    /// ascending window size, K and V of `bytes_per_element` elements: the model of a config
    /// without layers. Its layers are numbered window after window.
    pub fn uniform(
        windows: &[(usize, usize, usize, usize)],
        tokens_per_block: usize,
        bytes_per_element: usize,
    ) -> PoolModel {
        let mut pools = Vec::with_capacity(windows.len());
        let mut total_layers = 0usize;
        for (i, &(window_size, num_layers, heads, head)) in windows.iter().enumerate() {
            pools.push(PoolInfo {
                window_size,
                window_index: i,
                index_in_window: 0,
                cache_type: CacheType::SelfKv,
                data_type: KvDataType::Default,
                num_kv_heads: heads,
                size_per_head: head,
                geometry: PoolGeometry {
                    num_layers,
                    kv_factor: 2,
                    num_kv_heads: heads,
                    size_per_head: head,
                    tokens_per_block,
                    bytes_per_element,
                },
                scales_of: None,
            });
            total_layers = total_layers.saturating_add(num_layers);
        }
        PoolModel {
            num_data_pools: pools.len(),
            num_windows: windows.len(),
            pools,
            layer_to_pool: Vec::new(),
            num_layers: total_layers,
            cross: false,
        }
    }

    /// The pools of `layers` over `window_sizes` (ascending, distinct). Every layer's window
    /// must be listed and every window must have a layer; heads and head sizes are positive;
    /// NVFP4 head sizes are multiples of `NVFP4_SCALE_BLOCK`; cross layers are not mixed with
    /// self-attention ones.
    pub fn from_layers(
        layers: &[LayerSpec],
        window_sizes: &[usize],
        tokens_per_block: usize,
        default_bytes_per_element: usize,
    ) -> KvResult<PoolModel> {
        if layers.len() > i32::MAX as usize {
            return Err(invalid("more than INT32_MAX layers".into()));
        }
        let mut window_of = Vec::with_capacity(layers.len());
        for (i, l) in layers.iter().enumerate() {
            let w = window_sizes.binary_search(&l.window_size).map_err(|_| {
                invalid(format!(
                    "layer {i} has window {}, which is not one of the windows",
                    l.window_size
                ))
            })?;
            if l.num_kv_heads == 0 || l.size_per_head == 0 {
                return Err(invalid(format!(
                    "layer {i}: num_kv_heads and size_per_head must be positive"
                )));
            }
            if l.data_type == KvDataType::Nvfp4 && l.cache_type == CacheType::RecurrentState {
                return Err(invalid(format!(
                    "layer {i}: a recurrent state cannot be NVFP4"
                )));
            }
            if l.data_type == KvDataType::Nvfp4 && l.size_per_head % NVFP4_SCALE_BLOCK != 0 {
                return Err(invalid(format!(
                    "layer {i}: an NVFP4 head size must be a multiple of {NVFP4_SCALE_BLOCK}, \
                     got {}",
                    l.size_per_head
                )));
            }
            if l.data_type == KvDataType::Default && default_bytes_per_element == 0 {
                return Err(invalid(format!(
                    "layer {i} takes the default element size, and bytes_per_element is 0"
                )));
            }
            window_of.push(w);
        }
        let cross = layers.iter().any(|l| l.cache_type == CacheType::Cross);
        if cross && layers.iter().any(|l| l.cache_type != CacheType::Cross) {
            return Err(invalid(
                "cross-attention layers need a manager of their own (their blocks hold the \
                 encoder's output, sized by the encoder's length)"
                    .into(),
            ));
        }
        if let Some(w) = (0..window_sizes.len()).find(|w| !window_of.contains(w)) {
            return Err(invalid(format!("window {} has no layer", window_sizes[w])));
        }
        let key = |l: &LayerSpec| (l.num_kv_heads, l.size_per_head, l.data_type, l.cache_type);
        let mut pools: Vec<PoolInfo> = Vec::new();
        let mut layer_to_pool = vec![(0, 0); layers.len()];
        // Indexer K pools after all the others (window by window in both passes), so adding an
        // indexer leaves the indices of the KV pools as they were.
        let passes = [false, true].into_iter().flat_map(|indexer| {
            window_sizes
                .iter()
                .enumerate()
                .map(move |(w, &size)| (indexer, w, size))
        });
        for (indexer, w, window_size) in passes {
            let mut keys: Vec<_> = (0..layers.len())
                .filter(|&i| window_of[i] == w)
                .filter(|&i| (layers[i].cache_type == CacheType::IndexerK) == indexer)
                .map(|i| key(&layers[i]))
                .collect();
            keys.sort_unstable();
            keys.dedup();
            for k in keys {
                let index_in_window = pools.iter().filter(|p| p.window_index == w).count();
                let (heads, head, data_type, cache_type) = k;
                let pool = pools.len();
                let mut num_layers = 0;
                for (i, l) in layers.iter().enumerate() {
                    if window_of[i] == w && key(l) == k {
                        layer_to_pool[i] = (pool, num_layers);
                        num_layers += 1;
                    }
                }
                let units = head / data_type.elements_per_container();
                pools.push(PoolInfo {
                    window_size,
                    window_index: w,
                    index_in_window,
                    cache_type,
                    data_type,
                    num_kv_heads: heads,
                    size_per_head: head,
                    geometry: PoolGeometry {
                        num_layers,
                        kv_factor: cache_type.kv_factor(),
                        num_kv_heads: heads,
                        size_per_head: units,
                        // A state snapshot has no token dimension.
                        tokens_per_block: if cache_type == CacheType::RecurrentState {
                            1
                        } else {
                            tokens_per_block
                        },
                        bytes_per_element: data_type.container_bytes(default_bytes_per_element),
                    },
                    scales_of: None,
                });
            }
        }
        let num_data_pools = pools.len();
        for data in 0..num_data_pools {
            let d = pools[data];
            if d.data_type != KvDataType::Nvfp4 {
                continue;
            }
            let in_window = pools
                .iter()
                .filter(|p| p.window_index == d.window_index)
                .count();
            pools.push(PoolInfo {
                index_in_window: in_window,
                geometry: PoolGeometry {
                    size_per_head: d.size_per_head / NVFP4_SCALE_BLOCK,
                    bytes_per_element: 1,
                    ..d.geometry
                },
                scales_of: Some(data),
                ..d
            });
        }
        Ok(PoolModel {
            pools,
            num_layers: layers.len(),
            layer_to_pool,
            num_data_pools,
            num_windows: window_sizes.len(),
            cross,
        })
    }

    /// Every pool: the data pools, then the block-scale pools.
    pub fn pools(&self) -> &[PoolInfo] {
        &self.pools
    }

    /// The pools offset tables list (all but the block-scale pools).
    pub fn data_pools(&self) -> &[PoolInfo] {
        &self.pools[..self.num_data_pools]
    }

    /// Number of layers (of a uniform model: the windows' layers, window after window).
    pub fn num_layers(&self) -> usize {
        self.num_layers
    }

    /// `(pool, index of the layer in the pool)` of layer `layer`.
    pub fn layer_to_pool(&self, layer: usize) -> Option<(usize, usize)> {
        if layer >= self.num_layers {
            return None;
        }
        if let Some(&entry) = self.layer_to_pool.get(layer) {
            return Some(entry);
        }
        let mut first = 0;
        for (p, info) in self.data_pools().iter().enumerate() {
            let n = info.geometry.num_layers;
            if layer < first + n {
                return Some((p, layer - first));
            }
            first += n;
        }
        None
    }

    /// The block-scale pool of data pool `data_pool`, if it has one.
    pub fn scale_pool_of(&self, data_pool: usize) -> Option<usize> {
        self.pools[self.num_data_pools..]
            .iter()
            .position(|p| p.scales_of == Some(data_pool))
            .map(|i| i + self.num_data_pools)
    }

    /// Whether the layers are cross-attention layers.
    pub fn is_cross(&self) -> bool {
        self.cross
    }

    /// The pools of window `window_index` in their order inside the window.
    pub fn window_pools(&self, window_index: usize) -> impl Iterator<Item = (usize, &PoolInfo)> {
        let mut v: Vec<(usize, &PoolInfo)> = self
            .pools
            .iter()
            .enumerate()
            .filter(|(_, p)| p.window_index == window_index)
            .collect();
        v.sort_by_key(|(_, p)| p.index_in_window);
        v.into_iter()
    }

    /// The pool index of (window, pool inside the window).
    pub fn pool_index(&self, window_index: usize, index_in_window: usize) -> Option<usize> {
        self.pools
            .iter()
            .position(|p| p.window_index == window_index && p.index_in_window == index_in_window)
    }

    /// What the copy engines of window `window_index` move for one block.
    pub fn window_layout(&self, window_index: usize) -> BlockLayout {
        BlockLayout::new(
            self.window_pools(window_index)
                .map(|(_, p)| p.shape())
                .collect(),
        )
    }

    /// Whether window `window_index` holds recurrent-state pools.
    pub fn window_has_recurrent_state(&self, window_index: usize) -> bool {
        self.pools
            .iter()
            .any(|p| p.window_index == window_index && p.cache_type == CacheType::RecurrentState)
    }

    /// Number of windows the model covers.
    pub fn num_windows(&self) -> usize {
        self.num_windows
    }
}

/// Bytes one token takes in each window: the bytes of one block over all the window's pools
/// (block scales and recurrent-state snapshots included) divided by `tokens_per_block`,
/// rounded up (exact for attention pools; a snapshot's bytes are spread over its block's
/// tokens). The `cache_size_per_token` of `crate::sizing::max_num_blocks` and
/// `window_size_to_share`. Returns `(window_size, bytes)` ascending by window.
pub fn window_bytes_per_token(
    layers: &[LayerSpec],
    default_bytes_per_element: usize,
    tokens_per_block: usize,
) -> KvResult<Vec<(usize, usize)>> {
    if tokens_per_block == 0 {
        return Err(invalid("tokens_per_block must be positive".into()));
    }
    let mut windows: Vec<usize> = layers.iter().map(|l| l.window_size).collect();
    windows.sort_unstable();
    windows.dedup();
    let model = PoolModel::from_layers(
        layers,
        &windows,
        tokens_per_block,
        default_bytes_per_element,
    )?;
    windows
        .iter()
        .enumerate()
        .map(|(w, &size)| {
            let bytes = model
                .window_layout(w)
                .checked_row_bytes()
                .ok_or_else(|| invalid(format!("the bytes per block of window {size} overflow")))?;
            Ok((size, bytes.div_ceil(tokens_per_block)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(window: usize, ct: CacheType, heads: usize, head: usize, dt: KvDataType) -> LayerSpec {
        LayerSpec {
            window_size: window,
            cache_type: ct,
            num_kv_heads: heads,
            size_per_head: head,
            data_type: dt,
        }
    }

    #[test]
    fn layers_group_into_pools_by_window_and_shape() {
        // Window 4096 alternates 8 and 2 heads; window 128 has one layer.
        let layers = [
            layer(4096, CacheType::SelfKv, 8, 128, KvDataType::Default),
            layer(4096, CacheType::SelfKv, 2, 128, KvDataType::Default),
            layer(128, CacheType::SelfKv, 8, 128, KvDataType::Default),
            layer(4096, CacheType::SelfKv, 8, 128, KvDataType::Default),
        ];
        let m = PoolModel::from_layers(&layers, &[128, 4096], 32, 2).unwrap();
        let heads: Vec<_> = m
            .pools()
            .iter()
            .map(|p| (p.window_size, p.num_kv_heads))
            .collect();
        assert_eq!(heads, vec![(128, 8), (4096, 2), (4096, 8)]);
        let map: Vec<_> = (0..4).filter_map(|l| m.layer_to_pool(l)).collect();
        assert_eq!(map, vec![(2, 0), (1, 0), (0, 0), (2, 1)]);
        let uniform = PoolModel::uniform(&[(8, 2, 1, 4), (64, 3, 1, 4)], 4, 2);
        assert_eq!(uniform.num_layers(), 5);
        assert_eq!(uniform.layer_to_pool(1), Some((0, 1)));
        assert_eq!(uniform.layer_to_pool(4), Some((1, 2)));
        assert_eq!(uniform.layer_to_pool(5), None);
        assert_eq!(m.pools()[2].geometry.num_layers, 2);
        assert_eq!(m.window_layout(1).pools().len(), 2);
    }

    #[test]
    fn indexer_pools_come_after_the_kv_pools_which_keep_their_indices() {
        // Two windows of MLA latents; an FP8 indexer (128 + a 4-byte scale) on every layer.
        let latent = |w| layer(w, CacheType::SelfKOnly, 1, 576, KvDataType::Bf16);
        let indexer = |w| layer(w, CacheType::IndexerK, 1, 132, KvDataType::Fp8);
        let kv = [latent(128), latent(4096), latent(4096)];
        let with: Vec<_> = kv
            .iter()
            .copied()
            .chain([indexer(128), indexer(4096), indexer(4096)])
            .collect();
        let base = PoolModel::from_layers(&kv, &[128, 4096], 64, 2).unwrap();
        let m = PoolModel::from_layers(&with, &[128, 4096], 64, 2).unwrap();
        assert_eq!(&m.pools()[..2], base.pools());
        for l in 0..3 {
            assert_eq!(m.layer_to_pool(l), base.layer_to_pool(l));
        }
        let tail: Vec<_> = m.pools()[2..]
            .iter()
            .map(|p| {
                (
                    p.window_size,
                    p.cache_type,
                    p.index_in_window,
                    p.geometry.kv_factor,
                )
            })
            .collect();
        assert_eq!(
            tail,
            vec![
                (128, CacheType::IndexerK, 1, 1),
                (4096, CacheType::IndexerK, 1, 1)
            ]
        );
        assert_eq!(m.layer_to_pool(5), Some((3, 1)));
        // A window's copy layout lists its pools in their order inside the window.
        assert_eq!(m.window_layout(1).pools().len(), 2);
        assert_eq!(m.window_layout(1).row_bytes(), 2 * 64 * (576 * 2 + 132));
    }

    #[test]
    fn mla_is_one_k_only_row_per_token() {
        // DeepSeek-V3: 61 layers, latent 512 + RoPE 64, one "head", BF16.
        let layers = vec![layer(8192, CacheType::SelfKOnly, 1, 576, KvDataType::Bf16); 61];
        let m = PoolModel::from_layers(&layers, &[8192], 64, 2).unwrap();
        assert_eq!(m.pools().len(), 1);
        assert_eq!(m.pools()[0].bytes_per_token(), 61 * 576 * 2);
        assert_eq!(
            window_bytes_per_token(&layers, 2, 64).unwrap(),
            vec![(8192, 70_272)]
        );
    }

    #[test]
    fn nvfp4_pools_get_block_scale_pools() {
        let layers = vec![layer(64, CacheType::SelfKv, 4, 128, KvDataType::Nvfp4); 3];
        let m = PoolModel::from_layers(&layers, &[64], 16, 2).unwrap();
        assert_eq!(m.data_pools().len(), 1);
        assert_eq!(m.scale_pool_of(0), Some(1));
        let (data, scales) = (&m.pools()[0], &m.pools()[1]);
        assert_eq!(
            data.geometry.size_per_head * data.geometry.bytes_per_element,
            64
        );
        assert_eq!(scales.geometry.size_per_head, 8);
        assert_eq!(scales.scales_of, Some(0));
        // Per token: 3 layers x K|V x 4 heads x (64 data bytes + 8 scale bytes).
        assert_eq!(
            window_bytes_per_token(&layers, 2, 16).unwrap(),
            vec![(64, 3 * 2 * 4 * 72)]
        );
        assert!(!m.window_layout(0).pools()[0].partial_copies);
    }

    #[test]
    fn invalid_layer_sets_are_refused() {
        let ok = layer(64, CacheType::SelfKv, 1, 16, KvDataType::Default);
        let refuse = |layers: &[LayerSpec], windows: &[usize]| {
            matches!(
                PoolModel::from_layers(layers, windows, 4, 2),
                Err(KvError::InvalidConfig(_))
            )
        };
        assert!(refuse(&[ok], &[32, 64]), "window 32 has no layer");
        assert!(refuse(
            &[layer(16, CacheType::SelfKv, 1, 16, KvDataType::Default)],
            &[64]
        ));
        assert!(refuse(
            &[layer(64, CacheType::SelfKv, 0, 16, KvDataType::Default)],
            &[64]
        ));
        assert!(refuse(
            &[layer(64, CacheType::SelfKv, 1, 24, KvDataType::Nvfp4)],
            &[64]
        ));
        assert!(refuse(
            &[ok, layer(64, CacheType::Cross, 1, 16, KvDataType::Default)],
            &[64]
        ));
        assert!(PoolModel::from_layers(&[ok], &[64], 4, 2).is_ok());
    }
}
