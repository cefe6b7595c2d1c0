// The TensorRT-LLM facade over kvblock's pool model: per-layer KV heads, K-only, cross and
// quantized caches, pool pointers, layer maps and sizing helpers (docs/trtllm-parity.md rows
// 1, 25-27, 48, 51-52, 58, 61, 82, 84, 86-89), each checked against kvblock's own pool calls on
// the same manager.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <stdexcept>

#include "kvblock_trtllm.hpp"
#include "test_support.hpp"

namespace {

using kvb::trtllm::CacheType;
using kvb::trtllm::KVCacheManager;
using kvb_test::statusOf;

constexpr int32_t kTpb = 4;
constexpr int32_t kSliding = 8;
constexpr int32_t kFull = 64;
// Layers alternate sliding and full windows; heads per layer differ inside each window.
const std::vector<int32_t> kHeads{4, 2, 4, 1, 2};
const std::vector<int32_t> kWindows{kSliding, kFull};

std::unique_ptr<KVCacheManager> makeFacade(std::vector<int32_t> heads, int32_t sizePerHead,
                                           CacheType cacheType = CacheType::kSELF,
                                           kvb_kv_data_type_t dataType = KVB_KV_DATA_TYPE_DEFAULT,
                                           bool reuse = true) {
    kvb::trtllm::KvblockOptions options;
    options.copyBackend = KVB_COPY_BACKEND_HOST;
    options.kvDataType = dataType;
    auto m = std::make_unique<KVCacheManager>(
        heads, sizePerHead, kTpb,
        KVCacheManager::BlocksPerWindow{{kSliding, {6, 2}}, {kFull, {12, 4}}}, 8, 1, kWindows, 2, 0,
        nullptr, kFull, 0, reuse, cacheType, std::nullopt, nullptr, true, true, options);
    m->allocatePools(false);
    return m;
}

std::unique_ptr<KVCacheManager> makeMixedHeads() {
    return makeFacade(kHeads, 16);
}

// Row 1: per-layer heads inside a window are accepted and grouped into pools as kvblock's own
// layer specs group them.
TEST(TrtllmFacade, PerLayerHeadsGroupIntoPoolsAsKvblockDoes) {
    auto f = makeMixedHeads();
    kvb::Config c;
    c.addWindow(kSliding, 6, 2).addWindow(kFull, 12, 4);
    for (size_t l = 0; l < kHeads.size(); ++l)
        c.addLayers(1, kWindows[l % 2], KVB_CACHE_TYPE_SELF, kHeads[l], 16);
    c.raw.tokens_per_block = kTpb;
    c.raw.max_sequence_length = kFull;
    c.raw.bytes_per_element = 2;
    kvb::Manager twin(c);
    auto const& bm = f->getBlockManager();
    // Sliding window: heads 2 and 4; full window: heads 1 and 2.
    ASSERT_EQ(bm.getNumPools(), 4);
    EXPECT_EQ(bm.getNumPools(), twin.getNumPools());
    auto configs = bm.getPoolConfigurations();
    ASSERT_EQ(configs.size(), 4u);
    for (int32_t p = 0; p < 4; ++p) {
        kvb_pool_info_t mine = configs[static_cast<size_t>(p)], theirs = twin.getPoolInfo(p);
        EXPECT_EQ(mine.window_size, theirs.window_size);
        EXPECT_EQ(mine.num_kv_heads, theirs.num_kv_heads);
        EXPECT_EQ(mine.num_layers, theirs.num_layers);
        EXPECT_EQ(mine.row_bytes, theirs.row_bytes);
        EXPECT_EQ(bm.getPoolWindowSize(p), theirs.window_size);
    }
    EXPECT_EQ(bm.getPoolWindowSize(1), kSliding);
    EXPECT_EQ(bm.getPoolWindowSize(2), kFull);
    // TensorRT-LLM's [numLayers, 2] int32 tensor: the layer's pool, its index in the pool.
    auto mappingTensor = f->getLayerToPoolMapping();
    ASSERT_EQ(mappingTensor->getDataType(), kvb::trtllm::nvinfer1::DataType::kINT32);
    ASSERT_EQ(mappingTensor->getShape().nbDims, 2);
    EXPECT_EQ(mappingTensor->getShape().d[1], 2);
    auto const* mapping = kvb::trtllm::bufferCast<int32_t>(*mappingTensor);
    auto expected = twin.getLayerToPoolMapping();
    ASSERT_EQ(mappingTensor->getShape().d[0], static_cast<int64_t>(kHeads.size()));
    for (int32_t l = 0; l < static_cast<int32_t>(kHeads.size()); ++l) {
        auto const& e = expected[static_cast<size_t>(l)];
        EXPECT_EQ(mapping[2 * l], e.first);
        EXPECT_EQ(mapping[2 * l + 1], e.second);
        EXPECT_EQ(bm.getLayerPoolIdx(l), e.first);
        EXPECT_EQ(f->getPoolLayerIdx(l), e.second);
        EXPECT_EQ(f->isPoolLayerFirst(l), e.second == 0);
    }
    // Layers 0 and 2 (4 heads, sliding) share a pool; layer 2 is its second layer.
    EXPECT_EQ(bm.getLayerPoolIdx(0), bm.getLayerPoolIdx(2));
    EXPECT_TRUE(f->isPoolLayerFirst(0));
    EXPECT_FALSE(f->isPoolLayerFirst(2));
    EXPECT_THROW((void)f->getPoolLayerIdx(5), std::out_of_range);
}

// Rows 25, 48, 49, 86: pool pointers and views are kvblock's model pool pointers.
TEST(TrtllmFacade, PoolPointersAndViewsAreKvblockModelPools) {
    auto f = makeMixedHeads();
    auto const& bm = f->getBlockManager();
    // TensorRT-LLM's [numKVPools, 2] tensor of addresses, read as its kernels' callers do.
    auto pointerTensor = f->getBlockPoolPointers();
    ASSERT_EQ(pointerTensor->getShape().nbDims, 2);
    ASSERT_EQ(pointerTensor->getShape().d[0], 4);
    EXPECT_EQ(pointerTensor->getDataType(), kvb::trtllm::TRTDataType<void*>::value);
    kvb::trtllm::BufferRange<void*> pointers(*pointerTensor);
    ASSERT_EQ(pointers.size(), 8u);
    for (int32_t p = 0; p < 4; ++p) {
        auto [primary, rowBytes] = f->impl().getModelPoolPointer(p, KVB_CACHE_LEVEL_PRIMARY);
        auto secondary = f->impl().getModelPoolPointer(p, KVB_CACHE_LEVEL_SECONDARY).first;
        ASSERT_NE(primary, nullptr);
        EXPECT_EQ(pointers[static_cast<size_t>(2 * p)], primary);
        EXPECT_EQ(pointers[static_cast<size_t>(2 * p + 1)], secondary);
        auto view = bm.getPrimaryPoolView(p);
        EXPECT_EQ(view.data, primary);
        EXPECT_EQ(static_cast<size_t>(view.rowBytes), rowBytes);
        EXPECT_EQ(view.rowBytes, view.numLayers * view.kvFactor * view.bytesPerField);
        EXPECT_EQ(view.numBlocks, view.windowSize == kSliding ? 6 : 12);
        auto host = bm.getSecondaryPoolView(p);
        EXPECT_EQ(host.data, secondary);
        EXPECT_EQ(host.numBlocks, view.windowSize == kSliding ? 2 : 4);
    }
    // getPrimaryPool(layer) is the pool holding the layer.
    for (int32_t l = 0; l < static_cast<int32_t>(kHeads.size()); ++l)
        EXPECT_EQ(f->getPrimaryPool(l)->data(), bm.getPrimaryPoolView(bm.getLayerPoolIdx(l)).data);
    EXPECT_EQ(statusOf([&] { (void)f->getUniquePrimaryPool(); }), KVB_STATUS_UNSUPPORTED);
    auto single = makeFacade({2, 2}, 8);
    // Two windows make two pools even with equal heads; one window makes one.
    EXPECT_EQ(single->getBlockManager().getNumPools(), 2);
    kvb::trtllm::KvblockOptions options;
    options.copyBackend = KVB_COPY_BACKEND_HOST;
    KVCacheManager one({2, 2}, 8, kTpb, KVCacheManager::BlocksPerWindow{{kFull, {10, 0}}}, 8, 1,
                       {kFull}, 2, 0, nullptr, kFull, 0, true, CacheType::kSELF, std::nullopt,
                       nullptr, true, true, options);
    one.allocatePools();
    // The byte-sized constructor names no element type: the pool's tensor is bytes,
    // [blocks][layers][K|V][bytes of one layer's K].
    auto unique = one.getUniquePrimaryPool();
    EXPECT_EQ(unique->data(), one.impl().getModelPoolPointer(0, KVB_CACHE_LEVEL_PRIMARY).first);
    EXPECT_EQ(unique->getDataType(), kvb::trtllm::nvinfer1::DataType::kUINT8);
    ASSERT_EQ(unique->getShape().nbDims, 4);
    EXPECT_EQ(unique->getShape().d[0], 10);
    EXPECT_EQ(unique->getShape().d[1], 2);
    EXPECT_EQ(unique->getShape().d[2], 2);
    EXPECT_EQ(unique->getShape().d[3], 2 * kTpb * 8 * 2);
    kvb::trtllm::PoolView uniqueView = one.getPrimaryPoolView(0);
    EXPECT_EQ(uniqueView.bytesPerField, 2 * kTpb * 8 * 2);
    // No host tier: the secondary pointer is null.
    EXPECT_EQ(kvb::trtllm::bufferCast<void*>(*one.getBlockPoolPointers())[1], nullptr);
}

// Rows 26, 89: an NVFP4 cache has a block-scale pool per data pool.
TEST(TrtllmFacade, Nvfp4CacheHasBlockScalePools) {
    auto f = makeFacade(kHeads, 16, CacheType::kSELF, KVB_KV_DATA_TYPE_NVFP4);
    auto const& bm = f->getBlockManager();
    EXPECT_EQ(bm.getNumPools(false), 4);
    EXPECT_EQ(bm.getNumPools(true), 8);
    EXPECT_EQ(bm.getPoolConfigurations().size(), 8u);
    auto scaleTensor = f->getBlockScalePoolPointers();
    auto primary = f->impl().getBlockScalePoolPointers(KVB_CACHE_LEVEL_PRIMARY);
    auto secondary = f->impl().getBlockScalePoolPointers(KVB_CACHE_LEVEL_SECONDARY);
    ASSERT_EQ(scaleTensor->getShape().d[0], 4);
    auto const* scales = kvb::trtllm::bufferCast<void*>(*scaleTensor);
    for (size_t p = 0; p < 4; ++p) {
        EXPECT_NE(scales[2 * p], nullptr);
        EXPECT_EQ(scales[2 * p], primary[p]);
        EXPECT_EQ(scales[2 * p + 1], secondary[p]);
    }
    // The block-scale pools come after the data pools, each marked as such.
    for (int32_t p = 0; p < 8; ++p) EXPECT_EQ(bm.containsBlockScales(p), p >= 4);
    // Without NVFP4 the table has no rows.
    auto plain = makeMixedHeads();
    EXPECT_EQ(plain->getBlockScalePoolPointers()->getShape().d[0], 0);
    EXPECT_FALSE(plain->getBlockManager().containsBlockScales(0));
}

// Rows 1, 14, 39, 40: K-only and cross cache types reach kvblock's cache types.
TEST(TrtllmFacade, KOnlyAndCrossCacheTypes) {
    auto konly = makeFacade({1, 1}, 576, CacheType::kSELFKONLY);
    EXPECT_EQ(konly->getCacheType(), CacheType::kSELFKONLY);
    EXPECT_EQ(konly->getOffsetTableDimensions().cacheType, CacheType::kSELFKONLY);
    EXPECT_FALSE(konly->isCrossKv());
    for (auto const& p : konly->getBlockManager().getPoolConfigurations()) {
        EXPECT_EQ(p.kv_factor, 1);
        EXPECT_EQ(p.cache_type, KVB_CACHE_TYPE_SELF_K_ONLY);
    }
    auto cross = makeFacade({2, 2}, 8, CacheType::kCROSS, KVB_KV_DATA_TYPE_DEFAULT,
                            /*reuse*/ false);
    EXPECT_TRUE(cross->isCrossKv());
    EXPECT_EQ(cross->getCacheType(), CacheType::kCROSS);
    for (auto const& p : cross->getBlockManager().getPoolConfigurations())
        EXPECT_EQ(p.cache_type, KVB_CACHE_TYPE_CROSS);
    // The Config constructor reads the cache type from the layers.
    kvb::Config c;
    c.addWindow(kFull, 8, 0).addLayers(2, kFull, KVB_CACHE_TYPE_SELF_K_ONLY, 1, 64);
    c.raw.tokens_per_block = kTpb;
    c.raw.max_sequence_length = kFull;
    c.raw.bytes_per_element = 2;
    KVCacheManager fromConfig(c);
    EXPECT_EQ(fromConfig.getCacheType(), CacheType::kSELFKONLY);
}

// Row 82: window metadata from kvblock's per-window queries.
TEST(TrtllmFacade, WindowSizesMetadataFollowsThePools) {
    auto f = makeMixedHeads();
    auto meta = f->getBlockManager().getWindowSizesMetadata();
    ASSERT_EQ(meta.size(), 2u);
    auto const& s = meta.at(kSliding);
    auto const& l = meta.at(kFull);
    EXPECT_EQ(s.windowSize, kSliding);
    EXPECT_EQ(s.allottedPrimaryBlocks, 6);
    EXPECT_EQ(s.allottedSecondaryBlocks, f->impl().getHostTierBlocks(kSliding));
    EXPECT_EQ(s.maxNumBlocks, s.allottedPrimaryBlocks + s.allottedSecondaryBlocks);
    EXPECT_EQ(s.absolutePoolsOffset, 0);
    EXPECT_EQ(s.numPools, 2);
    EXPECT_EQ(s.maxBlocksPerSeq, f->impl().getMaxBlocksPerSeq(kSliding));
    EXPECT_TRUE(s.isSWA);
    EXPECT_EQ(l.absolutePoolsOffset, 2);
    EXPECT_EQ(l.numPools, 2);
    EXPECT_EQ(l.allottedPrimaryBlocks, 12);
    EXPECT_EQ(l.maxBlocksPerSeq, f->impl().getMaxBlocksPerSeq(kFull));
    EXPECT_FALSE(l.isSWA);
    EXPECT_EQ(l.maxTokenNum, kFull);
}

// Row 58: elements per token over a window's layers, with their own heads.
TEST(TrtllmFacade, CacheSizePerTokenSumsPerLayerHeads) {
    // Layers 0, 2, 4: 4 + 4 + 2 heads of 16 elements.
    EXPECT_EQ(KVCacheManager::calculateCacheSizePerTokenForSingleWindowSize(kHeads, 16, {0, 2, 4},
                                                                            false, 2),
              2 * 10 * 16);
    EXPECT_EQ(KVCacheManager::calculateCacheSizePerTokenForSingleWindowSize(kHeads, 16, {0, 2, 4},
                                                                            false, 1),
              10 * 16);
    EXPECT_EQ(
        KVCacheManager::calculateCacheSizePerTokenForSingleWindowSize(kHeads, 16, {1, 3}, true, 2),
        2 * 3 * 16);
    EXPECT_EQ(statusOf([&] {
                  (void)KVCacheManager::calculateCacheSizePerTokenForSingleWindowSize(
                      kHeads, 16, {0}, false, 3);
              }),
              KVB_STATUS_INVALID_ARGUMENT);
}

// Row 59: layers per window, the window vector cycled; the groups feed row 58.
TEST(TrtllmFacade, GroupLayersByWindowSizeCyclesTheWindows) {
    auto groups = KVCacheManager::groupLayersByWindowSize(kWindows, 5);
    ASSERT_EQ(groups.size(), 2u);
    EXPECT_EQ(groups.at(kSliding), (std::vector<int32_t>{0, 2, 4}));
    EXPECT_EQ(groups.at(kFull), (std::vector<int32_t>{1, 3}));
    EXPECT_EQ(KVCacheManager::calculateCacheSizePerTokenForSingleWindowSize(
                  kHeads, 16, groups.at(kFull), false, 2),
              2 * 3 * 16);
    EXPECT_EQ(statusOf([&] { (void)KVCacheManager::groupLayersByWindowSize({}, 2); }),
              KVB_STATUS_INVALID_ARGUMENT);
}

// Row 61: blocks per window from memory budgets and per-layer heads.
TEST(TrtllmFacade, MaxNumBlocksFromBudgetsAndPerLayerHeads) {
    // One window, two layers of 2 heads x 8 elements x 2 bytes, K and V: 128 bytes a token,
    // 512 a block of 4 tokens.
    auto one =
        KVCacheManager::calculateMaxNumBlocks({2, 2}, 8, {kFull}, 2, kTpb, 512 * 10, 512 * 3);
    ASSERT_EQ(one.size(), 1u);
    EXPECT_EQ(std::get<0>(one.at(kFull)), 10);
    EXPECT_EQ(std::get<1>(one.at(kFull)), 3);
    // The extra cost comes off the primary budget.
    auto less = KVCacheManager::calculateMaxNumBlocks({2, 2}, 8, {kFull}, 2, kTpb, 512 * 10,
                                                      512 * 3, 512 * 2);
    EXPECT_EQ(std::get<0>(less.at(kFull)), 8);
    // Two windows, priced as kvblock's pools of each window price a block: the blocks fill the
    // budget, rounded up to a whole block per window as TensorRT-LLM rounds.
    auto two = KVCacheManager::calculateMaxNumBlocks(kHeads, 16, kWindows, 2, kTpb, 1 << 20, 0);
    ASSERT_EQ(two.size(), 2u);
    auto f = makeMixedHeads();
    uint64_t used = 0, oneBlockEach = 0;
    for (auto const& [window, blocks] : two) {
        uint64_t rowBytes = 0;
        for (auto const& p : f->getBlockManager().getPoolConfigurations())
            if (p.window_size == window) rowBytes += p.row_bytes;
        EXPECT_GT(std::get<0>(blocks), 0);
        EXPECT_EQ(std::get<1>(blocks), 0);
        used += rowBytes * static_cast<uint64_t>(std::get<0>(blocks));
        oneBlockEach += rowBytes;
    }
    EXPECT_LE(used, (1u << 20) + oneBlockEach);
    EXPECT_GT(used + oneBlockEach, 1u << 20);
}

// Rows 32-35 and 50: the indexer K cache of DeepSeek-V3.2's sparse attention. With MLA latents
// on every layer and an FP8 indexer (128 elements and one FP32 scale) on the layers the mask
// keeps, the latent pools keep the indices they have without an indexer, the indexer is one
// K-only pool after them, and every block's indexer row moves with the block.
TEST(TrtllmFacade, TheIndexerKCacheIsAPoolAfterTheKvPools) {
    auto make = [](bool indexer) {
        kvb::trtllm::KvblockOptions options;
        options.copyBackend = KVB_COPY_BACKEND_HOST;
        options.kvDataType = KVB_KV_DATA_TYPE_BF16;
        options.enableIndexerKCache = indexer;
        options.indexerKCacheIndexHeadDim = 128;
        options.indexerKCacheQuantBlockSize = 128;
        options.indexerKCacheLayerMask = {true, false, true, true};
        auto m = std::make_unique<KVCacheManager>(std::vector<int32_t>(4, 1), 576, kTpb,
                                                  KVCacheManager::BlocksPerWindow{{kFull, {12, 4}}},
                                                  8, 1, std::vector<int32_t>{kFull}, 2, 0, nullptr,
                                                  kFull, 0, true, CacheType::kSELFKONLY,
                                                  std::nullopt, nullptr, true, true, options);
        m->allocatePools(false);
        return m;
    };
    auto plain = make(false), f = make(true);
    EXPECT_FALSE(plain->isEnableIndexerKCache());
    EXPECT_EQ(statusOf([&] { (void)plain->getIndexerKCachePool(); }), KVB_STATUS_UNSUPPORTED);
    ASSERT_TRUE(f->isEnableIndexerKCache());
    EXPECT_EQ(f->getIndexerKCacheIndexHeadDim(), 128);
    EXPECT_EQ(f->getIndexerKCacheQuantBlockSize(), 128);
    EXPECT_FALSE(f->getIndexerKCacheUseFp4());
    auto const& bm = f->getBlockManager();
    EXPECT_EQ(bm.getNumPools(false, true), 2);
    EXPECT_EQ(bm.getNumPools(false, false), 1);
    EXPECT_EQ(bm.getNumPools(false, false), plain->getBlockManager().getNumPools(false, false));
    // The model's layers map to the latent pool as without an indexer.
    auto mapping = f->layerToPoolTable();
    EXPECT_EQ(mapping, plain->layerToPoolTable());
    ASSERT_EQ(mapping.size(), 4u);
    EXPECT_EQ(f->getLayerToPoolMapping()->getShape().d[0], 4);
    kvb::trtllm::PoolView latent = bm.getPrimaryPoolView(0),
                          indexer = f->getIndexerKCachePoolView();
    EXPECT_EQ(latent.rowBytes, plain->getBlockManager().getPrimaryPoolView(0).rowBytes);
    EXPECT_EQ(f->getIndexerKCachePool()->data(), indexer.data);
    EXPECT_EQ(f->getIndexerKCachePool()->getSizeInBytes(),
              static_cast<size_t>(indexer.numBlocks * indexer.rowBytes));
    EXPECT_EQ(indexer.poolIdx, 1);
    EXPECT_EQ(indexer.numLayers, 3);  // the mask leaves layer 1 without one
    EXPECT_EQ(indexer.kvFactor, 1);
    EXPECT_EQ(indexer.bytesPerField, kTpb * (128 + 4));
    ASSERT_NE(indexer.data, nullptr);
    // A block's indexer row is offloaded and onboarded with its latent row.
    kvb::Manager& m = f->impl();
    std::vector<int32_t> prompt{1, 2, 3, 4, 5, 6, 7, 8, 9};
    m.addSequence(kvb::Request(1, prompt));
    int32_t first = m.getCacheBlockIds(1, kFull)[0];
    size_t row = static_cast<size_t>(m.getBlockInfo(kFull, first).memory_index);
    std::memset(indexer.data + row * indexer.rowBytes, 0x5a, indexer.rowBytes);
    m.storeContextBlocks(1, 9);
    m.removeSequence(1);
    for (uint64_t id = 2; id < 6; ++id) {  // evicts the prompt's blocks to the host tier
        std::vector<int32_t> other(12);
        for (int32_t t = 0; t < 12; ++t)
            other[static_cast<size_t>(t)] = 1000 * static_cast<int32_t>(id) + t;
        m.addSequence(kvb::Request(id, other));
        m.storeContextBlocks(id, 12);
        m.removeSequence(id);
    }
    kvb_admission_t a = m.addSequence(kvb::Request(9, prompt));
    ASSERT_GE(a.prepopulated_prompt_len, kTpb);
    int32_t back = m.getCacheBlockIds(9, kFull)[0];
    size_t backRow = static_cast<size_t>(m.getBlockInfo(kFull, back).memory_index);
    EXPECT_GT(m.getKvCacheStats().onboarded_blocks, 0);
    for (int64_t b = 0; b < indexer.rowBytes; ++b)
        ASSERT_EQ(indexer.data[backRow * indexer.rowBytes + static_cast<size_t>(b)], 0x5a) << b;
}

// A bad indexer configuration is refused at construction.
TEST(TrtllmFacade, ABadIndexerKCacheConfigurationIsRefused) {
    auto make = [](int32_t headDim, int32_t quant, bool fp4, std::vector<bool> mask) {
        kvb::trtllm::KvblockOptions options;
        options.enableIndexerKCache = true;
        options.indexerKCacheIndexHeadDim = headDim;
        options.indexerKCacheQuantBlockSize = quant;
        options.indexerKCacheUseFp4 = fp4;
        options.indexerKCacheLayerMask = std::move(mask);
        return statusOf([&] {
            KVCacheManager m(std::vector<int32_t>(2, 1), 576, kTpb,
                             KVCacheManager::BlocksPerWindow{{kFull, {12, 4}}}, 8, 1,
                             std::vector<int32_t>{kFull}, 2, 0, nullptr, kFull, 0, true,
                             CacheType::kSELFKONLY, std::nullopt, nullptr, true, true, options);
        });
    };
    EXPECT_EQ(make(0, 128, false, {}), KVB_STATUS_INVALID_CONFIG);
    EXPECT_EQ(make(100, 128, false, {}), KVB_STATUS_INVALID_CONFIG);
    EXPECT_EQ(make(128, 128, true, {}), KVB_STATUS_UNSUPPORTED);
    EXPECT_EQ(make(128, 128, false, {true}), KVB_STATUS_INVALID_CONFIG);
    EXPECT_EQ(make(128, 16, true, {}), KVB_OK);
}

}  // namespace
