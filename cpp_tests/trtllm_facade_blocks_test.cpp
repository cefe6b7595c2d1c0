// The TensorRT-LLM facade's calls on single blocks and on a hybrid model's recurrent state
// (docs/trtllm-parity.md rows 60, 74-75, 93, 96-97): onboardBlock, storeBlocks,
// WindowBlockManager::pinBlock/unpinBlock, copyLinearAttentionBlock(Batch) and
// calculateFreeMemBytes, each checked against kvblock's own calls on the same manager.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "kvblock_trtllm.hpp"
#include "test_support.hpp"

namespace {

using kvb::trtllm::BlockKey;
using kvb::trtllm::KVCacheManager;
using kvb::trtllm::Request;
using kvb_test::statusOf;
using kvb_test::tokenRun;

constexpr int32_t kTpb = 4;
constexpr int32_t kWindow = 64;

kvb::Config hostConfig(int32_t primary, int32_t secondary) {
    kvb::Config c;
    c.addWindow(kWindow, primary, secondary, 1, 2, 8);
    c.raw.tokens_per_block = kTpb;
    c.raw.max_sequence_length = kWindow;
    c.raw.enable_block_reuse = true;
    c.raw.bytes_per_element = 2;
    c.raw.copy_backend = KVB_COPY_BACKEND_HOST;
    return c;
}

std::unique_ptr<KVCacheManager> makeFacade(kvb::Config c) {
    auto m = std::make_unique<KVCacheManager>(std::move(c));
    m->allocatePools(false);
    return m;
}

// Request `id` computes `prompt` and is released: its full blocks stay cached and free.
std::vector<int32_t> cachePrompt(KVCacheManager& f, uint64_t id,
                                 const std::vector<int32_t>& prompt) {
    f.impl().addSequence(kvb::Request(id, prompt));
    std::vector<int32_t> ids = f.impl().getCacheBlockIds(id, kWindow);
    kvb_test::markPrefillComputed(f.impl(), id);
    f.impl().removeSequence(id);
    return ids;
}

BlockKey keyOf(const std::vector<int32_t>& tokens, size_t from, size_t to) {
    BlockKey k;
    for (size_t i = from; i < to; ++i) k.uniqueTokens.push_back({tokens[i], 0});
    return k;
}

}  // namespace

// Row 93: onboardBlock(blockId, window) brings a free cached host block back, by id (TensorRT-LLM
// takes the sequence and the block object, and a transfer mode kvblock does not have).
TEST(TrtllmFacade, OnboardBlockBringsACachedHostBlockBackByItsId) {
    auto f = makeFacade(hostConfig(4, 4));
    auto const& bm = f->getBlockManager();
    std::vector<int32_t> ids = cachePrompt(*f, 1, tokenRun(0, 9));
    ASSERT_TRUE(bm.offloadBlock(ids[1], kWindow));
    EXPECT_TRUE(bm.onboardBlock(ids[1], kWindow));
    kvb_block_info_t info = bm.getBlockById(ids[1], kWindow);
    EXPECT_EQ(info.cache_level, KVB_CACHE_LEVEL_PRIMARY);
    EXPECT_TRUE(info.in_reuse_tree);
    EXPECT_EQ(info.parent, ids[0]);
    EXPECT_FALSE(bm.onboardBlock(ids[1], kWindow)) << "already on the GPU";
    EXPECT_EQ(f->impl().getKvCacheStats().onboarded_blocks, 1u);

    f->impl().addSequence(kvb::Request(2, tokenRun(0, 9)));
    EXPECT_FALSE(bm.onboardBlock(ids[1], kWindow)) << "in use, on the GPU already";
    EXPECT_EQ(f->impl().getKvCacheStats().onboarded_blocks, 1u) << "reuse found it on the GPU";
}

// Row 96: storeBlocks(keys, ids, window, pin) -> {stored, pinned ids}; the ids unpin through
// KVCacheManager::unpinBlocksById without a window, and the keys find the blocks again.
TEST(TrtllmFacade, StoreBlocksStoresGivenBlocksUnderPerBlockKeys) {
    auto f = makeFacade(hostConfig(8, 0));
    kvb::Manager twin(hostConfig(8, 0));
    const std::vector<int32_t> prompt = tokenRun(0, 10);
    f->impl().addSequence(kvb::Request(1, prompt));
    twin.addSequence(kvb::Request(1, prompt));
    std::vector<int32_t> ids = f->impl().getCacheBlockIds(1, kWindow);
    ASSERT_EQ(ids, twin.getCacheBlockIds(1, kWindow));
    const std::vector<BlockKey> keys{keyOf(prompt, 0, 4), keyOf(prompt, 4, 8)};

    auto [stored, pinned] =
        f->getBlockManager().storeBlocks(keys, {ids[0], ids[1]}, kWindow, /*pinBlocks=*/true);
    auto [twinStored, twinPinned] =
        twin.storeBlocks(kvb::Request(1, prompt), 8, kWindow, {ids[0], ids[1]}, true);
    EXPECT_EQ(stored, 2);
    EXPECT_EQ(stored, twinStored);
    EXPECT_EQ(pinned, twinPinned);
    EXPECT_EQ(f->impl().getBlockInfo(kWindow, ids[1]).ref_count, 2);
    f->unpinBlocksById(pinned);
    EXPECT_EQ(f->impl().getBlockInfo(kWindow, ids[1]).ref_count, 1);

    auto match = f->getBlockManager().findBlocksInReuseTreeByBlockKeys(keys, kWindow);
    ASSERT_TRUE(match.has_value());
    EXPECT_EQ(match->blockIds, (std::vector<int32_t>{ids[0], ids[1]}));
    // Stored again: every key is cached, nothing joins.
    EXPECT_EQ(f->getBlockManager().storeBlocks(keys, {ids[0], ids[1]}, kWindow).first, 0);
}

// Row 97: WindowBlockManager::pinBlock/unpinBlock, one block by id: a pinned cached block is not
// free (not evictable) until unpinned; pinning a host block or unpinning twice throws.
TEST(TrtllmFacade, WindowBlockManagerPinsAndUnpinsOneBlock) {
    auto f = makeFacade(hostConfig(4, 2));
    std::vector<int32_t> ids = cachePrompt(*f, 1, tokenRun(0, 9));
    auto wbm = f->getBlockManager().getWindowBlockManager(kWindow);
    EXPECT_EQ(wbm.getWindowSize(), kWindow);
    wbm.pinBlock(ids[0]);
    EXPECT_FALSE(f->impl().getBlockInfo(kWindow, ids[0]).is_free);
    EXPECT_EQ(f->impl().getNumFreeBlocksPerWindowSize(kWindow).first, 3);
    wbm.unpinBlock(ids[0]);
    EXPECT_TRUE(f->impl().getBlockInfo(kWindow, ids[0]).is_free);
    EXPECT_EQ(statusOf([&] { wbm.unpinBlock(ids[0]); }), KVB_STATUS_INVALID_ARGUMENT);
    ASSERT_TRUE(f->getBlockManager().offloadBlock(ids[1], kWindow));
    EXPECT_EQ(statusOf([&] { wbm.pinBlock(ids[1]); }), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(statusOf([&] { (void)f->getBlockManager().getWindowBlockManager(7); }),
              KVB_STATUS_INVALID_ARGUMENT);
}

// KVCacheBlock::setPriority: a sequence's block raised above the default is released into its
// priority's queue, so the free blocks of lower priority are taken before it; a free block is
// queued again at once; a priority outside 0..100 is refused and changes nothing.
TEST(TrtllmFacade, ABlockRaisedWithSetPriorityOutlivesItsNeighboursInTheFreeQueue) {
    auto f = makeFacade(hostConfig(3, 0));
    f->impl().addSequence(kvb::Request(1, tokenRun(0, 12)));
    std::vector<int32_t> ids = f->impl().getCacheBlockIds(1, kWindow);
    ASSERT_EQ(ids.size(), 3u);
    auto const& bm = f->getBlockManager();
    bm.getBlockById(ids[1], kWindow)->setPriority(75);
    EXPECT_EQ(bm.getBlockById(ids[1], kWindow)->getPriority(), 75);
    kvb_test::markPrefillComputed(f->impl(), 1);
    f->impl().removeSequence(1);
    // Two new blocks come from the default-priority ones; the raised block stays free.
    f->impl().addSequence(kvb::Request(2, tokenRun(100, 8)));
    std::vector<int32_t> taken = f->impl().getCacheBlockIds(2, kWindow);
    EXPECT_EQ(std::count(taken.begin(), taken.end(), ids[1]), 0);
    EXPECT_TRUE(f->impl().getBlockInfo(kWindow, ids[1]).is_free);
    // Lowered while free: it is evicted first now.
    bm.getBlockById(ids[1], kWindow)->setPriority(0);
    EXPECT_EQ(statusOf([&] { bm.getBlockById(ids[1], kWindow)->setPriority(101); }),
              KVB_STATUS_INVALID_RETENTION);
    EXPECT_EQ(bm.getBlockById(ids[1], kWindow)->getPriority(), 0);
    f->impl().removeSequence(2);
    f->impl().addSequence(kvb::Request(3, tokenRun(200, 4)));
    EXPECT_EQ(f->impl().getCacheBlockIds(3, kWindow).at(0), ids[1]);
}

namespace {

// A hybrid model: attention layers and recurrent layers in one window.
kvb::Config hybridConfig() {
    kvb::Config c;
    c.addWindow(kWindow, 12, 0);
    c.addLayers(2, kWindow, KVB_CACHE_TYPE_SELF, 2, 8, KVB_KV_DATA_TYPE_FP16);
    c.addLayers(2, kWindow, KVB_CACHE_TYPE_RECURRENT_STATE, 2, 16, KVB_KV_DATA_TYPE_FP32);
    c.raw.tokens_per_block = kTpb;
    c.raw.max_sequence_length = kWindow;
    c.raw.copy_backend = KVB_COPY_BACKEND_HOST;
    return c;
}

std::vector<uint8_t> stateRow(KVCacheManager& f, int32_t block) {
    kvb_block_info_t b = f.impl().getBlockInfo(kWindow, block);
    auto [base, rowBytes] = f.impl().getModelPoolPointer(1, KVB_CACHE_LEVEL_PRIMARY);
    const uint8_t* row = base + size_t(b.memory_index) * rowBytes;
    return std::vector<uint8_t>(row, row + rowBytes);
}

void fillStateRow(KVCacheManager& f, int32_t block, uint8_t seed) {
    kvb_block_info_t b = f.impl().getBlockInfo(kWindow, block);
    auto [base, rowBytes] = f.impl().getModelPoolPointer(1, KVB_CACHE_LEVEL_PRIMARY);
    std::memset(base + size_t(b.memory_index) * rowBytes, seed, rowBytes);
}

}  // namespace

// Rows 74-75: copyLinearAttentionBlock(Batch) carries the recurrent state into the next block
// where the request's processed tokens end a block: the context position while the prompt is
// computed, all but the newest token after; kvblock's own call with those positions does the
// same. Requests the manager does not hold are skipped.
TEST(TrtllmFacade, CopyLinearAttentionBlockCarriesTheStateAtBlockBoundaries) {
    auto f = makeFacade(hybridConfig());
    ASSERT_EQ(f->impl().getPoolInfo(1).cache_type, KVB_CACHE_TYPE_RECURRENT_STATE);
    auto a = std::make_shared<Request>(1, tokenRun(0, 10));
    auto b = std::make_shared<Request>(2, tokenRun(100, 8));
    for (auto const& r : {a, b}) {
        f->impl().addSequence(kvb::Request(r->requestId, r->tokens[0]));
        std::vector<int32_t> ids = f->impl().getCacheBlockIds(r->requestId, kWindow);
        for (size_t i = 0; i < ids.size(); ++i)
            fillStateRow(*f, ids[i], static_cast<uint8_t>(10 * r->requestId + i));
    }
    std::vector<int32_t> ia = f->impl().getCacheBlockIds(1, kWindow);
    std::vector<int32_t> ib = f->impl().getCacheBlockIds(2, kWindow);

    a->contextCurrentPosition = 6;  // mid-block: nothing
    EXPECT_FALSE(f->copyLinearAttentionBlock(*a));
    EXPECT_NE(stateRow(*f, ia[1]), stateRow(*f, ia[0]));
    a->contextCurrentPosition = 4;  // the first block is done
    EXPECT_TRUE(f->copyLinearAttentionBlock(*a));
    EXPECT_EQ(stateRow(*f, ia[1]), stateRow(*f, ia[0]));

    // Batch: `b` finished its 8-token prompt and generated one token (9 tokens, 8 processed);
    // `a` is mid-block; id 99 is not held.
    b->contextCurrentPosition = 8;
    b->contextInit = false;
    b->generationInProgress = true;
    b->addNewToken(5);
    f->impl().addToken(2, 5);
    ib = f->impl().getCacheBlockIds(2, kWindow);
    ASSERT_EQ(ib.size(), 3u);
    fillStateRow(*f, ib[2], 77);
    a->contextCurrentPosition = 7;
    auto stranger = std::make_shared<Request>(99, tokenRun(0, 4));
    EXPECT_TRUE(f->copyLinearAttentionBlockBatch({a, b, stranger}));
    EXPECT_EQ(stateRow(*f, ib[2]), stateRow(*f, ib[1]));
    EXPECT_FALSE(f->copyLinearAttentionBlockBatch({stranger}));

    // kvblock's own call, same positions: the same copies.
    kvb::Manager twin(hybridConfig());
    twin.addSequence(kvb::Request(1, tokenRun(0, 10)));
    EXPECT_EQ(twin.copyRecurrentState({1}, {6}), 0u);
    EXPECT_EQ(twin.copyRecurrentState({1}, {4}), 1u);
}

// Row 60: calculateFreeMemBytes(bufferManager, config) needs a CUDA driver (checked on the
// simulated driver and a GPU by CudaBackendTest.FreeMemoryBudgetsFollowTheDevicesFreeBytes);
// its arguments are checked first everywhere.
TEST(TrtllmFacade, CalculateFreeMemBytesChecksTheFractionFirst) {
    kvb::trtllm::KvCacheConfig config;
    config.freeGpuMemoryFraction = 1.5f;
    EXPECT_EQ(statusOf([&] {
                  (void)KVCacheManager::calculateFreeMemBytes(kvb::trtllm::BufferManager{}, config);
              }),
              KVB_STATUS_INVALID_ARGUMENT);
    config.freeGpuMemoryFraction = 0.5f;
    config.hostCacheSize = 1 << 20;
    kvb_status_t s = statusOf([&] {
        auto [gpu, host] =
            KVCacheManager::calculateFreeMemBytes(kvb::trtllm::BufferManager{}, config);
        EXPECT_EQ(host, uint64_t{1} << 20);
        EXPECT_GT(gpu, 0u);
    });
    EXPECT_TRUE(s == KVB_OK || s == KVB_STATUS_UNSUPPORTED) << kvb_status_string(s);
}
