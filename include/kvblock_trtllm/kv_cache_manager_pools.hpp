// kvblock_trtllm/kv_cache_manager_pools.hpp: KVCacheManager's pools — the pool pointer and
// layer-to-pool tables, the pools as TensorRT-LLM's tensors, and the indexer K cache's layers
// and pool. Part of kvblock_trtllm.hpp; include that.
#ifndef KVBLOCK_TRTLLM_KV_CACHE_MANAGER_POOLS_HPP
#define KVBLOCK_TRTLLM_KV_CACHE_MANAGER_POOLS_HPP

#include <array>
#include <memory>
#include <vector>

#include "kvblock_trtllm/buffer_manager.hpp"
#include "kvblock_trtllm/kv_cache_manager.hpp"

namespace kvb::trtllm {

namespace detail {
/// A `[rows, 2]` host tensor of addresses, as TensorRT-LLM's pool pointer tables are.
inline ITensor::SharedPtr addressTable(std::vector<std::array<void*, 2>> const& rows) {
    auto t =
        BufferManager::cpu(ITensor::makeShape({static_cast<ITensor::DimType64>(rows.size()), 2}),
                           TRTDataType<void*>::value);
    auto* out = bufferCast<void*>(*t);
    for (size_t r = 0; r < rows.size(); ++r) {
        out[2 * r] = rows[r][0];
        out[2 * r + 1] = rows[r][1];
    }
    return t;
}
}  // namespace detail

inline ITensor::SharedPtr KVCacheManager::getBlockPoolPointers() const {
    SizeType32 n = getBlockManager().getNumPools(false);
    std::vector<std::array<void*, 2>> rows(static_cast<size_t>(n));
    for (SizeType32 p = 0; p < n; ++p)
        rows[static_cast<size_t>(p)] = {poolBase(p, KVB_CACHE_LEVEL_PRIMARY),
                                        poolBase(p, KVB_CACHE_LEVEL_SECONDARY)};
    return detail::addressTable(rows);
}

inline ITensor::SharedPtr KVCacheManager::getBlockScalePoolPointers() const {
    auto primary = impl().getBlockScalePoolPointers(KVB_CACHE_LEVEL_PRIMARY);
    auto secondary = impl().getBlockScalePoolPointers(KVB_CACHE_LEVEL_SECONDARY);
    std::vector<std::array<void*, 2>> rows;
    for (size_t p = 0; p < primary.size(); ++p) {
        if (!primary[p]) continue;  // a data pool without a block-scale pool
        rows.push_back({primary[p], p < secondary.size() ? secondary[p] : nullptr});
    }
    return detail::addressTable(rows);
}

inline std::vector<std::array<SizeType32, 2>> KVCacheManager::layerToPoolTable() const {
    std::vector<std::array<SizeType32, 2>> out;
    for (auto const& [pool, index] : impl().getLayerToPoolMapping()) {
        if (numModelLayers_ && out.size() == static_cast<size_t>(numModelLayers_))
            break;  // the indexer's layers come after the model's
        out.push_back({pool, index});
    }
    return out;
}

inline ITensor::SharedPtr KVCacheManager::getLayerToPoolMapping() const {
    auto table = layerToPoolTable();
    auto t =
        BufferManager::cpu(ITensor::makeShape({static_cast<ITensor::DimType64>(table.size()), 2}),
                           nvinfer1::DataType::kINT32);
    auto* out = bufferCast<int32_t>(*t);
    for (size_t l = 0; l < table.size(); ++l) {
        out[2 * l] = table[l][0];
        out[2 * l + 1] = table[l][1];
    }
    return t;
}

inline ITensor::SharedPtr KVCacheManager::getIndexerKCachePool() const {
    return getBlockManager().getPrimaryPool(indexerPoolIdx());
}

inline PoolView KVCacheManager::getIndexerKCachePoolView() const {
    return getBlockManager().getPrimaryPoolView(indexerPoolIdx());
}

inline SizeType32 KVCacheManager::getPoolLayerIdx(SizeType32 layerIdx) const {
    return layerToPoolTable().at(static_cast<size_t>(layerIdx))[1];
}

inline bool KVCacheManager::isPoolLayerFirst(SizeType32 layerIdx) const {
    return getPoolLayerIdx(layerIdx) == 0;
}

inline ITensor::SharedPtr KVCacheManager::getUniquePrimaryPool() const {
    if (getBlockManager().getNumPools(false) != 1)
        throw Error(KVB_STATUS_UNSUPPORTED, "getUniquePrimaryPool needs exactly one pool");
    return getBlockManager().getPrimaryPool(0);
}

inline ITensor::SharedPtr KVCacheManager::getPrimaryPool(SizeType32 layerIdx) const {
    return getBlockManager().getPrimaryPool(getBlockManager().getLayerPoolIdx(layerIdx));
}

inline PoolView KVCacheManager::getPrimaryPoolView(SizeType32 layerIdx) const {
    return getBlockManager().getPrimaryPoolView(getBlockManager().getLayerPoolIdx(layerIdx));
}

inline void KVCacheManager::addIndexerLayers(KvblockOptions const& o,
                                             std::vector<SizeType32> const& windows) {
    if (o.indexerKCacheIndexHeadDim <= 0 || o.indexerKCacheQuantBlockSize <= 0 ||
        o.indexerKCacheIndexHeadDim % o.indexerKCacheQuantBlockSize != 0)
        throw Error(KVB_STATUS_INVALID_CONFIG,
                    "the indexer K cache needs a positive head dim that is a multiple of its "
                    "quant block size");
    if (o.indexerKCacheUseFp4 && o.indexerKCacheQuantBlockSize != 16)
        throw Error(KVB_STATUS_UNSUPPORTED,
                    "an FP4 indexer K cache takes kvblock's NVFP4 layout: quant blocks of 16");
    if (!o.indexerKCacheLayerMask.empty() &&
        o.indexerKCacheLayerMask.size() != static_cast<size_t>(numModelLayers_))
        throw Error(KVB_STATUS_INVALID_CONFIG, "indexerKCacheLayerMask needs one per layer");
    SizeType32 const headDim = o.indexerKCacheIndexHeadDim;
    // FP8: the elements, then one FP32 scale per quant block, as bytes of an FP8 row.
    SizeType32 const fp8Bytes = headDim + headDim / o.indexerKCacheQuantBlockSize * 4;
    for (SizeType32 l = 0; l < numModelLayers_; ++l) {
        if (!o.indexerKCacheLayerMask.empty() && !o.indexerKCacheLayerMask[l]) continue;
        config_.layers.push_back(kvb_layer_spec_t{
            windows[static_cast<size_t>(l) % windows.size()], KVB_CACHE_TYPE_INDEXER_K, 1,
            o.indexerKCacheUseFp4 ? headDim : fp8Bytes,
            o.indexerKCacheUseFp4 ? KVB_KV_DATA_TYPE_NVFP4 : KVB_KV_DATA_TYPE_FP8});
    }
    indexer_ = {true, headDim, o.indexerKCacheQuantBlockSize, o.indexerKCacheUseFp4};
}

inline SizeType32 KVCacheManager::indexerPoolIdx() const {
    SizeType32 n = impl().getNumPools(false);
    for (SizeType32 p = 0; p < n; ++p)
        if (impl().getPoolInfo(p).cache_type == KVB_CACHE_TYPE_INDEXER_K) return p;
    throw Error(KVB_STATUS_UNSUPPORTED, "this manager has no indexer K cache");
}

inline ITensor::SharedPtr KVCacheManager::poolTensor(PoolView const& v,
                                                     kvb_cache_level_t level) const {
    kvb_pool_info_t info = impl().getPoolInfo(v.poolIdx);
    nvinfer1::DataType type = nvinfer1::DataType::kUINT8;
    if (trtDataType_ && info.cache_type != KVB_CACHE_TYPE_INDEXER_K) {
        auto [bytes, kind] = kvDataTypeOf(static_cast<int32_t>(*trtDataType_));
        if (kind == static_cast<kvb_kv_data_type_t>(info.data_type) &&
            kind != KVB_KV_DATA_TYPE_NVFP4 && bytes > 0 &&
            info.bytes_per_head_token == info.size_per_head * bytes)
            type = *trtDataType_;
    }
    // A row that is not layers x K|V x field (none today) is shown as bytes, one row a block.
    bool whole = v.rowBytes == static_cast<SizeType64>(v.numLayers) * v.kvFactor * v.bytesPerField;
    if (!whole) type = nvinfer1::DataType::kUINT8;
    auto elem = static_cast<SizeType64>(dataTypeSize(type));
    ITensor::Shape shape =
        whole ? ITensor::makeShape({v.numBlocks, v.numLayers, v.kvFactor, v.bytesPerField / elem})
              : ITensor::makeShape({v.numBlocks, v.rowBytes});
    // The host backend keeps both levels in host memory; the CUDA backend's secondary pools
    // are pinned mapped host memory, its primary pools device memory.
    bool host =
        config_.raw.copy_backend == KVB_COPY_BACKEND_HOST ||
        (config_.raw.copy_backend == KVB_COPY_BACKEND_CUDA && level == KVB_CACHE_LEVEL_SECONDARY);
    return std::make_shared<ITensor>(
        v.data, shape, type,
        level == KVB_CACHE_LEVEL_PRIMARY ? MemoryType::kGPU : MemoryType::kPINNED,
        host && v.data != nullptr);
}

inline void* KVCacheManager::poolBase(SizeType32 pool, kvb_cache_level_t level) const {
    uint8_t* base = nullptr;
    size_t rowBytes = 0;
    kvb_status_t s = kvb_manager_get_model_pool_pointer(
        impl().get(), pool, static_cast<int32_t>(level), &base, &rowBytes);
    if (s == KVB_STATUS_UNSUPPORTED) return nullptr;
    check(s);
    return base;
}

}  // namespace kvb::trtllm

#endif  // KVBLOCK_TRTLLM_KV_CACHE_MANAGER_POOLS_HPP
