//! C types and entry points of the pool model: the layers a manager is configured with
//! (`kvb_manager_config_t::layers`), its pools, the layer → (pool, index in pool) map, pool and
//! block-scale pool addresses, and the bytes per token of each window.

use std::ffi::c_void;

use super::handle::{
    copy_out, count_arg, guard, kvb_manager_t, require_out, slice_arg, slice_arg_mut, with_manager,
    write_out, FfiError, FfiResult,
};
use super::status::kvb_status_t;
use super::types::{check_struct_size, init_exact, level_arg};
use crate::pool_model::{window_bytes_per_token, CacheType, KvDataType, LayerSpec, PoolInfo};

/// What a layer caches per token (TensorRT-LLM `CacheType`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvb_cache_type_t {
    /// Self-attention K and V (the default).
    KVB_CACHE_TYPE_SELF = 0,
    /// One row per token and no V half: MLA's compressed latent (e.g. DeepSeek-V3's 512 + 64
    /// elements), an indexer's K cache.
    KVB_CACHE_TYPE_SELF_K_ONLY = 1,
    /// Cross-attention K and V: the encoder's output per request. A manager's layers are all
    /// cross or all self; a cross manager never reuses blocks across requests.
    KVB_CACHE_TYPE_CROSS = 2,
    /// A recurrent layer's state (Mamba, linear attention): `num_kv_heads × size_per_head`
    /// elements per block and no token dimension. Each block's row is the state snapshot after
    /// the block's last token, which the engine writes when the block becomes full; the
    /// window of such layers reuses exact full blocks only, in multiples of
    /// `recurrent_snapshot_interval_tokens`, so a reused prefix ends on a snapshot: the engine
    /// restores the state from the row of the last reused block.
    KVB_CACHE_TYPE_RECURRENT_STATE = 3,
    /// A sparse-attention indexer's K cache (DeepSeek-V3.2's DSA: one K row per token, e.g. 128
    /// FP8 elements and their FP32 scale, 132 bytes): K only like `KVB_CACHE_TYPE_SELF_K_ONLY`,
    /// but its pools come after every other data pool (TensorRT-LLM keeps the indexer K cache in
    /// a pool of its own after the KV pools), so the KV pools keep their indices.
    KVB_CACHE_TYPE_INDEXER_K = 4,
}

/// Element type of a layer's KV cache, which fixes the pool's element size.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvb_kv_data_type_t {
    /// The config's `bytes_per_element`.
    KVB_KV_DATA_TYPE_DEFAULT = 0,
    /// 4 bytes.
    KVB_KV_DATA_TYPE_FP32 = 1,
    /// 2 bytes.
    KVB_KV_DATA_TYPE_FP16 = 2,
    /// 2 bytes.
    KVB_KV_DATA_TYPE_BF16 = 3,
    /// 1 byte (E4M3 or E5M2: the manager only needs the size).
    KVB_KV_DATA_TYPE_FP8 = 4,
    /// 1 byte.
    KVB_KV_DATA_TYPE_INT8 = 5,
    /// NVFP4: two elements per byte, and a block-scale pool beside the data pool holding one
    /// FP8 scale per 16 elements. `size_per_head` must be a multiple of 16.
    KVB_KV_DATA_TYPE_NVFP4 = 6,
}

/// One attention layer of the model, in layer order (`kvb_manager_config_t::layers`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvb_layer_spec_t {
    /// The layer's attention window: one of the config's windows.
    pub window_size: i32,
    /// A `kvb_cache_type_t` value.
    pub cache_type: i32,
    /// KV heads of the layer (1 for MLA); positive.
    pub num_kv_heads: i32,
    /// Elements per head and token; positive.
    pub size_per_head: i32,
    /// A `kvb_kv_data_type_t` value.
    pub data_type: i32,
}

/// One pool of a manager (`kvb_manager_get_pool_info`). Pools are ordered as TensorRT-LLM
/// orders them: the data pools of each window (ascending window size; inside a window
/// ascending by KV heads, head size, data type, cache type), then the block-scale pools. A
/// block owns row `memory_index` in every pool of its window.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvb_pool_info_t {
    /// `sizeof(kvb_pool_info_t)`, set by `kvb_pool_info_init`.
    pub struct_size: u32,
    /// The attention window of the pool's layers.
    pub window_size: i32,
    /// A `kvb_cache_type_t` value.
    pub cache_type: i32,
    /// A `kvb_kv_data_type_t` value (of the data, for a block-scale pool too).
    pub data_type: i32,
    /// Layers in the pool.
    pub num_layers: i32,
    /// 2 (K and V) or 1 (K only).
    pub kv_factor: i32,
    /// KV heads of the pool's layers.
    pub num_kv_heads: i32,
    /// Elements per head and token of the layers.
    pub size_per_head: i32,
    /// Bytes per head and token in this pool (NVFP4 data: `size_per_head / 2`; its scales:
    /// `size_per_head / 16`).
    pub bytes_per_head_token: i32,
    /// Tokens per row: the manager's tokens per block; 1 for a recurrent-state pool (a
    /// snapshot has no token dimension).
    pub tokens_per_block: i32,
    /// For a block-scale pool, the index of its data pool; -1 otherwise.
    pub scales_of: i32,
    /// Bytes of one block's row: `layers × kv_factor × heads × tokens × bytes_per_head_token`,
    /// laid out `[layer][K|V][head][token][bytes]`.
    pub row_bytes: u64,
    /// Bytes one token takes in this pool over its layers.
    pub bytes_per_token: u64,
}

fn invalid(msg: String) -> FfiError {
    FfiError(kvb_status_t::KVB_STATUS_INVALID_CONFIG, msg)
}

fn cache_type_arg(v: i32) -> FfiResult<CacheType> {
    Ok(match v {
        0 => CacheType::SelfKv,
        1 => CacheType::SelfKOnly,
        2 => CacheType::Cross,
        3 => CacheType::RecurrentState,
        4 => CacheType::IndexerK,
        v => return Err(invalid(format!("unknown cache_type {v}"))),
    })
}

fn data_type_arg(v: i32) -> FfiResult<KvDataType> {
    Ok(match v {
        0 => KvDataType::Default,
        1 => KvDataType::Fp32,
        2 => KvDataType::Fp16,
        3 => KvDataType::Bf16,
        4 => KvDataType::Fp8,
        5 => KvDataType::Int8,
        6 => KvDataType::Nvfp4,
        v => return Err(invalid(format!("unknown data_type {v}"))),
    })
}

fn positive_field(v: i32, what: &str, layer: usize) -> FfiResult<usize> {
    if v <= 0 {
        return Err(invalid(format!(
            "layer {layer}: {what} must be positive ({v})"
        )));
    }
    Ok(v as usize)
}

/// The layers of a config (`layers`, `num_layers`), checked field by field.
pub(crate) fn layer_specs(
    layers: *const kvb_layer_spec_t,
    num_layers: usize,
) -> FfiResult<Vec<LayerSpec>> {
    slice_arg(layers, num_layers, "layers")?
        .iter()
        .enumerate()
        .map(|(i, l)| {
            Ok(LayerSpec {
                window_size: positive_field(l.window_size, "window_size", i)?,
                cache_type: cache_type_arg(l.cache_type)?,
                num_kv_heads: positive_field(l.num_kv_heads, "num_kv_heads", i)?,
                size_per_head: positive_field(l.size_per_head, "size_per_head", i)?,
                data_type: data_type_arg(l.data_type)?,
            })
        })
        .collect()
}

fn pool_info(p: &PoolInfo) -> kvb_pool_info_t {
    let g = &p.geometry;
    kvb_pool_info_t {
        struct_size: std::mem::size_of::<kvb_pool_info_t>() as u32,
        window_size: p.window_size as i32,
        cache_type: p.cache_type as i32,
        data_type: p.data_type as i32,
        num_layers: g.num_layers as i32,
        kv_factor: g.kv_factor as i32,
        num_kv_heads: p.num_kv_heads as i32,
        size_per_head: p.size_per_head as i32,
        bytes_per_head_token: g.token_bytes() as i32,
        tokens_per_block: g.tokens_per_block as i32,
        scales_of: p.scales_of.map_or(-1, |d| d as i32),
        row_bytes: g.row_bytes() as u64,
        bytes_per_token: p.bytes_per_token() as u64,
    }
}

/// Zeroes `info` and sets its `struct_size`.
#[no_mangle]
pub extern "C" fn kvb_pool_info_init(info: *mut kvb_pool_info_t) -> kvb_status_t {
    guard(|| write_out(info, pool_info_empty(), "info"))
}

/// `kvb_pool_info_init` of a struct of the caller's `size` (its `sizeof`, which the header's
/// `kvb_pool_info_init` macro passes): writes nothing past it. `KVB_STATUS_STRUCT_SIZE` for a
/// size that is no layout of this struct.
#[no_mangle]
pub extern "C" fn kvb_pool_info_init_sized(
    info: *mut kvb_pool_info_t,
    size: usize,
) -> kvb_status_t {
    init_exact(info, size, "info", pool_info_empty())
}

fn pool_info_empty() -> kvb_pool_info_t {
    kvb_pool_info_t {
        struct_size: std::mem::size_of::<kvb_pool_info_t>() as u32,
        window_size: 0,
        cache_type: 0,
        data_type: 0,
        num_layers: 0,
        kv_factor: 0,
        num_kv_heads: 0,
        size_per_head: 0,
        bytes_per_head_token: 0,
        tokens_per_block: 0,
        scales_of: -1,
        row_bytes: 0,
        bytes_per_token: 0,
    }
}

/// Number of pools (TensorRT-LLM `getNumPools`): with `include_block_scale_pools` false, the
/// data pools, which are the first dimension of offset tables.
#[no_mangle]
pub extern "C" fn kvb_manager_get_num_pools(
    manager: *mut kvb_manager_t,
    include_block_scale_pools: bool,
    out: *mut i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        let model = m.pool_model();
        let n = if include_block_scale_pools {
            model.pools().len()
        } else {
            model.data_pools().len()
        };
        write_out(out, n as i32, "out")
    })
}

/// Describes pool `pool` (`0 ≤ pool < kvb_manager_get_num_pools(.., true, ..)`) into `*out`,
/// whose `struct_size` must be set (`kvb_pool_info_init`).
#[no_mangle]
pub extern "C" fn kvb_manager_get_pool_info(
    manager: *mut kvb_manager_t,
    pool: i32,
    out: *mut kvb_pool_info_t,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        // SAFETY: non-null (checked); the caller provides a writable struct.
        let size = unsafe { (*out).struct_size };
        check_struct_size(
            size,
            std::mem::size_of::<kvb_pool_info_t>(),
            "kvb_pool_info_t",
        )?;
        let p = count_arg(pool, "pool")?;
        let info = m.pool_model().pools().get(p).ok_or_else(|| {
            FfiError(
                kvb_status_t::KVB_STATUS_INVALID_ARGUMENT,
                format!("pool {p} of {}", m.pool_model().pools().len()),
            )
        })?;
        write_out(out, pool_info(info), "out")
    })
}

/// The pool of each layer and the layer's index in it (TensorRT-LLM `getLayerToPoolMapping`
/// and `getPoolLayerIdx`): `out_pools[l]`, `out_layer_in_pool[l]` for layer l, in the order of
/// the config's `layers` (without layers: the windows' layers, window after window).
/// `*out_count` = the number of layers; `KVB_STATUS_BUFFER_TOO_SMALL` when above `capacity`.
#[no_mangle]
pub extern "C" fn kvb_manager_get_layer_to_pool_mapping(
    manager: *mut kvb_manager_t,
    out_pools: *mut i32,
    out_layer_in_pool: *mut i32,
    capacity: usize,
    out_count: *mut usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        let model = m.pool_model();
        let n = model.num_layers();
        write_out(out_count, n, "out_count")?;
        if n > capacity {
            return Err(crate::error::KvError::BufferTooSmall {
                needed: n,
                given: capacity,
            }
            .into());
        }
        let pools = slice_arg_mut(out_pools, n, "out_pools")?;
        let index = slice_arg_mut(out_layer_in_pool, n, "out_layer_in_pool")?;
        for (layer, (p, i)) in pools.iter_mut().zip(index.iter_mut()).enumerate() {
            let (pool, in_pool) = model.layer_to_pool(layer).unwrap_or((0, 0));
            *p = pool as i32;
            *i = in_pool as i32;
        }
        Ok(())
    })
}

/// Address of pool `pool` at `cache_level` (a `kvb_cache_level_t`) and the bytes of one block's
/// row in it, as `kvb_manager_get_pool_pointer` gives them for a window's single pool: a
/// block's bytes in this pool start at `*out_base + memory_index × *out_row_bytes`.
/// `KVB_STATUS_UNSUPPORTED` where the pool has no memory.
#[no_mangle]
pub extern "C" fn kvb_manager_get_model_pool_pointer(
    manager: *mut kvb_manager_t,
    pool: i32,
    cache_level: i32,
    out_base: *mut *mut u8,
    out_row_bytes: *mut usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out_base, "out_base")?;
        require_out(out_row_bytes, "out_row_bytes")?;
        let level = level_arg(cache_level)?;
        let (p, row) = m.model_pool_pointer(count_arg(pool, "pool")?, level)?;
        write_out(out_base, p, "out_base")?;
        write_out(out_row_bytes, row, "out_row_bytes")
    })
}

/// The block-scale pool of each data pool at `cache_level` (TensorRT-LLM
/// `getBlockScalePoolPointers`): `out[d]` for data pool d, null where the pool has no scales
/// (not NVFP4) or no memory. Block-scale pools share their data pool's offsets.
/// `*out_count` = the number of data pools.
#[no_mangle]
pub extern "C" fn kvb_manager_get_block_scale_pool_pointers(
    manager: *mut kvb_manager_t,
    cache_level: i32,
    out: *mut *mut u8,
    capacity: usize,
    out_count: *mut usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        let level = level_arg(cache_level)?;
        let model = m.pool_model();
        let scales: Vec<Option<usize>> = (0..model.data_pools().len())
            .map(|d| model.scale_pool_of(d))
            .collect();
        let pointers: Vec<*mut u8> = scales
            .into_iter()
            .map(|s| {
                s.and_then(|s| m.model_pool_pointer(s, level).ok())
                    .map_or(std::ptr::null_mut(), |(p, _)| p)
            })
            .collect();
        copy_out(&pointers, out, capacity, out_count)
    })
}

/// Registers the engine's memory as pool `pool` at `cache_level` (as
/// `kvb_manager_register_pool` does for a window of one pool): `bytes` must cover the pool's
/// rows (`blocks × row_bytes` of `kvb_manager_get_pool_info`). Only with the CUDA backend and
/// while the manager holds no data.
#[no_mangle]
pub extern "C" fn kvb_manager_register_model_pool(
    manager: *mut kvb_manager_t,
    pool: i32,
    cache_level: i32,
    pointer: *mut c_void,
    bytes: usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        let level = level_arg(cache_level)?;
        Ok(m.register_model_pool(count_arg(pool, "pool")?, level, pointer as u64, bytes)?)
    })
}

/// Bytes one token takes in each window of a model, over all its pools (block scales
/// included): the `cache_size_per_token` that `kvb_calculate_window_size_to_share` and
/// `kvb_calculate_max_num_blocks` take: a block's bytes over the window's pools divided by
/// `tokens_per_block`, rounded up (exact for attention pools; a recurrent-state snapshot's
/// bytes are spread over its block). Windows ascending; `*out_count` = the number of
/// distinct windows; `KVB_STATUS_BUFFER_TOO_SMALL` when above `capacity`.
/// `default_bytes_per_element` is the element size of layers of `KVB_KV_DATA_TYPE_DEFAULT`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn kvb_calculate_window_bytes_per_token(
    layers: *const kvb_layer_spec_t,
    num_layers: usize,
    default_bytes_per_element: i32,
    tokens_per_block: i32,
    out_window_sizes: *mut i32,
    out_bytes_per_token: *mut u64,
    capacity: usize,
    out_count: *mut usize,
) -> kvb_status_t {
    guard(|| {
        require_out(out_count, "out_count")?;
        let specs = layer_specs(layers, num_layers)?;
        let default = usize::try_from(default_bytes_per_element)
            .map_err(|_| invalid("default_bytes_per_element is negative".into()))?;
        let tpb = usize::try_from(tokens_per_block)
            .map_err(|_| invalid("tokens_per_block is negative".into()))?;
        let windows = window_bytes_per_token(&specs, default, tpb)?;
        let sizes: Vec<i32> = windows.iter().map(|&(w, _)| w as i32).collect();
        let bytes: Vec<u64> = windows.iter().map(|&(_, b)| b as u64).collect();
        if windows.len() <= capacity {
            copy_out(&sizes, out_window_sizes, capacity, out_count)?;
        }
        copy_out(&bytes, out_bytes_per_token, capacity, out_count)
    })
}
