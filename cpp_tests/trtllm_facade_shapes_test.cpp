// The TensorRT-LLM facade takes and returns TensorRT-LLM's shapes, so an engine's call sites
// (and TensorRT-LLM's own manager tests) port by renaming: the constructor an engine calls
// (element type enumeration, shared stream object, uniform heads), the live per-sequence record
// behind getSequence / getCacheBlockIds, stores bounded by the request's computed extent,
// retention priorities read from the request, events with a variant payload, and the
// BlockManager's counters.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <variant>

#include "kvblock_trtllm.hpp"
#include "test_support.hpp"

namespace {

using kvb::trtllm::KVCacheManager;
using kvb::trtllm::KvCacheRetentionConfig;
using kvb::trtllm::Request;
using kvb::trtllm::nvinfer1::DataType;
using kvb_test::tokenRun;

constexpr int32_t kTpb = 4;
constexpr int32_t kWindow = 32;

using kvb_test::EngineStream;

/// A request carrying a retention configuration, as TensorRT-LLM's LlmRequest does.
struct RetainedRequest : Request {
    using Request::Request;
    std::optional<KvCacheRetentionConfig> retention;
    std::optional<KvCacheRetentionConfig> getKvCacheRetentionConfig() const override {
        return retention;
    }
};

std::unique_ptr<KVCacheManager> makeManager(int32_t primaryBlocks = 16, bool reuse = true,
                                            std::shared_ptr<EngineStream> stream = nullptr,
                                            DataType dtype = DataType::kHALF) {
    if (!stream) stream = std::make_shared<EngineStream>();
    return std::make_unique<KVCacheManager>(
        /*numLayers*/ 2, /*numKvHeads*/ 2, /*sizePerHead*/ 8, kTpb,
        KVCacheManager::BlocksPerWindow{{kWindow, {primaryBlocks, 0}}}, /*maxNumSequences*/ 8,
        /*maxBeamWidth*/ 1, std::vector<KVCacheManager::SizeType32>{kWindow}, dtype,
        /*sinkTokenLength*/ 0, stream, /*maxSequenceLength*/ kWindow, /*chunkSize*/ 0, reuse);
}

void admit(KVCacheManager& m, kvb::trtllm::LlmRequest& r, int32_t promptLen) {
    m.addSequenceBatch({{r.getRequestId(), promptLen, 1}}, {std::ref(r)});
}

}  // namespace

TEST(TrtllmFacadeShapes, EngineConstructorTakesDataTypeAndSharedStream) {
    auto stream = std::make_shared<EngineStream>();
    auto m = makeManager(16, true, stream);
    // The manager holds the engine's stream object for its lifetime.
    EXPECT_EQ(stream.use_count(), 2);
    // kHALF: 2 bytes an element; the BlockManager counts a layer's K in elements.
    EXPECT_EQ(m->getBlockManager().getBlockSize(0), 2 * kTpb * 8);
    auto fp32 = makeManager(16, true, nullptr, DataType::kFLOAT);
    EXPECT_EQ(fp32->getBlockManager().getPrimaryPoolView(0).bytesPerField,
              2 * m->getBlockManager().getPrimaryPoolView(0).bytesPerField);
    m.reset();
    EXPECT_EQ(stream.use_count(), 1);
}

TEST(TrtllmFacadeShapes, ATypeTheCacheCannotHoldIsRefused) {
    EXPECT_THROW(makeManager(16, true, nullptr, DataType::kINT4), kvb::Error);
}

TEST(TrtllmFacadeShapes, SequencesAreAdmittedBeforeAllocatePools) {
    auto m = makeManager();  // no allocatePools(): TensorRT-LLM admits all the same
    Request r(1, tokenRun(0, 9));
    admit(*m, r, 9);
    EXPECT_EQ(m->getSequence(1).getCacheBlockIds(kWindow).at(0).size(), 3u);
}

TEST(TrtllmFacadeShapes, CacheBlockIdReferencesStayLiveAcrossGrowth) {
    auto m = makeManager();
    m->allocatePools(false);
    Request r(1, tokenRun(0, 4));
    admit(*m, r, 4);
    // The common port `auto const& ids = getCacheBlockIds(id, w)[0]` must read the manager's
    // record, not a temporary: it sees the block addToken adds.
    auto const& ids = m->getCacheBlockIds(1, kWindow)[0];
    auto const& seq = m->getSequence(1);
    ASSERT_EQ(ids.size(), 1u);
    m->addToken(1);
    EXPECT_EQ(ids.size(), 2u);
    EXPECT_EQ(seq.getNumTokens(), 5);
    EXPECT_EQ(seq.getCacheBlockIds(kWindow)[0], ids);
    EXPECT_EQ(ids, m->impl().getCacheBlockIds(1, kWindow, 0));
    m->rewindKVCache(1, 1);
    EXPECT_EQ(ids.size(), 1u);
    EXPECT_THROW((void)m->getSequence(7), kvb::Error);
}

TEST(TrtllmFacadeShapes, RemoveSequenceStoresUpToTheComputedContext) {
    auto m = makeManager();
    Request r(1, tokenRun(0, 12));
    admit(*m, r, 12);
    r.contextCurrentPosition = 5;  // one chunk of 5 computed, then released
    (void)m->removeSequence(1, std::make_shared<Request>(r));
    Request again(2, tokenRun(0, 12));
    admit(*m, again, 12);
    // One full block (4 tokens) of the 5 computed is reusable; nothing past the chunk.
    EXPECT_EQ(again.prepopulatedPromptLen, 4);
}

TEST(TrtllmFacadeShapes, StoreBlocksForReuseTakesTheExtentFromTheRequest) {
    auto m = makeManager();
    Request r(1, tokenRun(0, 12));
    admit(*m, r, 12);
    r.contextCurrentPosition = 12;
    (void)m->storeBlocksForReuse(1, std::make_shared<Request const>(r));
    (void)m->removeSequence(1);
    Request again(2, tokenRun(0, 12));
    admit(*m, again, 12);
    EXPECT_EQ(again.prepopulatedPromptLen, 11);  // all but the last token, as always
}

// A kept difference (docs/trtllm-parity.md): a request released with fewer tokens than it was
// admitted with (the engine discarded its tail) still leaves the prefix it reused in the tree.
// That KV was computed for exactly those tokens and never rewritten; TensorRT-LLM drops the
// partially reused block instead, and a later request recomputes one more token.
TEST(TrtllmFacadeShapes, ReleasingWithAShorterRequestKeepsTheReusedPrefix) {
    auto m = makeManager();
    Request first(1, tokenRun(0, 11));  // stores [0..4) [4..8) and the partial [8, 9]
    admit(*m, first, 11);
    first.contextCurrentPosition = 11;
    (void)m->removeSequence(1, std::make_shared<Request>(first));

    std::vector<int32_t> prompt = tokenRun(0, 10);
    prompt.push_back(99);
    Request reusing(2, prompt);
    admit(*m, reusing, 11);
    ASSERT_EQ(reusing.prepopulatedPromptLen, 10);  // through token 9, in the partial block
    int32_t const tail = m->getCacheBlockIds(2, kWindow)[0].at(2);
    Request shortened(2, tokenRun(0, 9));  // the engine hands back only tokens 0..8
    shortened.contextCurrentPosition = 9;
    (void)m->removeSequence(2, std::make_shared<Request>(shortened));

    prompt.back() = 77;
    Request later(3, prompt);
    admit(*m, later, 11);
    EXPECT_EQ(later.prepopulatedPromptLen, 10);
    EXPECT_EQ(m->getCacheBlockIds(3, kWindow)[0].at(2), tail);
}

TEST(TrtllmFacadeShapes, RetentionPrioritiesComeFromTheRequest) {
    auto m = makeManager();
    RetainedRequest r(1, tokenRun(0, 12));
    r.retention = KvCacheRetentionConfig(
        {KvCacheRetentionConfig::TokenRangeRetentionConfig(0, 4, 90),
         KvCacheRetentionConfig::TokenRangeRetentionConfig(4, std::nullopt, 10)},
        /*decodeRetentionPriority*/ 20);
    admit(*m, r, 12);
    auto const& ids = m->getCacheBlockIds(1, kWindow)[0];
    EXPECT_EQ(m->getPriorityByBlockId(ids[0], kWindow), 90);
    EXPECT_EQ(m->getPriorityByBlockId(ids[1], kWindow), 10);
    EXPECT_EQ(m->getPriorityByBlockId(ids[2], kWindow), 10);
}

TEST(TrtllmFacadeShapes, EventsCarryAVariantPayload) {
    auto events = std::make_shared<kvb::trtllm::KVCacheEventManager>(64);
    KVCacheManager m(2, 2, 8, kTpb, KVCacheManager::BlocksPerWindow{{kWindow, {16, 2}}}, 8, 1,
                     std::vector<int32_t>{kWindow}, DataType::kHALF, 0,
                     std::make_shared<EngineStream>(), kWindow, 0, true,
                     kvb::trtllm::CacheType::kSELF, std::nullopt, events);
    m.allocatePools(false);
    m.flushIterationEvents();
    auto created = m.getLatestEvents(std::chrono::milliseconds(0));
    ASSERT_EQ(created.size(), 1u);
    auto const* c = std::get_if<kvb::trtllm::KVCacheCreatedData>(&created.front().data);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->numBlocksPerCacheLevel, (std::vector<int32_t>{16, 2}));

    Request r(1, tokenRun(0, 9));
    r.loraTaskId = 42;
    admit(m, r, 9);
    r.contextCurrentPosition = 9;
    m.storeContextBlocks(r);
    m.flushIterationEvents();
    auto stored = m.getLatestEvents(std::chrono::milliseconds(0));
    ASSERT_EQ(stored.size(), 1u);
    EXPECT_EQ(stored.front().eventId, created.front().eventId + 1);
    auto const& data = std::get<kvb::trtllm::KVCacheStoredData>(stored.front().data);
    EXPECT_EQ(data.parentHash, std::nullopt);
    ASSERT_EQ(data.blocks.size(), 2u);
    EXPECT_EQ(data.blocks[0].loraId, 42u);
    EXPECT_EQ(data.blocks[1].tokens.size(), static_cast<size_t>(kTpb));
    EXPECT_EQ(data.blocks[1].tokens[0].tokenId, 4);
}

TEST(TrtllmFacadeShapes, BlockManagerCountsAndQueueCheck) {
    auto m = makeManager(16);
    auto const& bm = m->getBlockManager();
    EXPECT_EQ(bm.getMaxNumBlocks(), 16);
    EXPECT_EQ(bm.getNumPrimaryBlocks(), 16);
    EXPECT_EQ(bm.getTokensPerBlock(), kTpb);
    EXPECT_FALSE(bm.isVariableGQA());
    Request r(1, tokenRun(0, 9));
    admit(*m, r, 9);
    EXPECT_EQ(bm.getNumAllocatedBlocks(), 3);
    EXPECT_EQ(bm.getNumFreeBlocks(), 13);
    EXPECT_TRUE(bm.verifyQueueIntegrity(kWindow));
}

TEST(TrtllmFacadeShapes, VariableHeadsAreVariableGqa) {
    KVCacheManager m(std::vector<int32_t>{2, 4}, 8, kTpb,
                     KVCacheManager::BlocksPerWindow{{kWindow, {16, 0}}}, 8, 1,
                     std::vector<int32_t>{kWindow}, DataType::kHALF, 0,
                     std::make_shared<EngineStream>(), kWindow);
    EXPECT_TRUE(m.getBlockManager().isVariableGQA());
}

TEST(TrtllmFacadeShapes, OptionalRefTakesTheEnginesSmartPointers) {
    auto shared = std::make_shared<Request>(1, tokenRun(0, 4));
    kvb::trtllm::OptionalRef<kvb::trtllm::LlmRequest const> a(shared);
    EXPECT_TRUE(a.has_value());
    EXPECT_EQ(a->getRequestId(), 1u);
    std::unique_ptr<Request> unique;
    kvb::trtllm::OptionalRef<kvb::trtllm::LlmRequest const> b(unique);
    EXPECT_FALSE(b.has_value());
}

TEST(TrtllmFacadeShapes, ChopVectorIntoBlocks) {
    std::vector<int> v{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    auto whole = kvb::trtllm::chopVectorIntoBlocks<int>(v, 10, 4, false);
    ASSERT_EQ(whole.size(), 2u);
    EXPECT_EQ(whole[1], (std::vector<int>{4, 5, 6, 7}));
    auto partial = kvb::trtllm::chopVectorIntoBlocks<int>(v, 7, 4, true);
    ASSERT_EQ(partial.size(), 2u);
    EXPECT_EQ(partial[1], (std::vector<int>{4, 5, 6}));
}

TEST(TrtllmFacadeShapes, EstimatesTellAnUnadmittedRequestItsReusableTokens) {
    auto m = makeManager();
    Request first(1, tokenRun(0, 12));
    admit(*m, first, 12);
    first.contextCurrentPosition = 12;
    m->storeContextBlocks(first);  // cached and still held by request 1
    Request next(2, tokenRun(0, 12));
    auto const held = m->analyzePrefixReuse({{0, 0},
                                             {1, 0},
                                             {2, 0},
                                             {3, 0},
                                             {4, 0},
                                             {5, 0},
                                             {6, 0},
                                             {7, 0},
                                             {8, 0},
                                             {9, 0},
                                             {10, 0},
                                             {11, 0}},
                                            next);
    ASSERT_GT(held.reusableBlocksAllocated, 0);
    // The next step needs no block for what other sequences hold, and counts those tokens.
    next.estimatedReusableTokens = -1;
    EXPECT_EQ(m->getNeededBlocksOneStep(next, false, kWindow), 3 - held.reusableBlocksAllocated);
    EXPECT_EQ(next.estimatedReusableTokens, held.reusableBlocksAllocated * kTpb);
    (void)m->removeSequence(1, std::make_shared<Request>(first));
    // Released: the blocks are free (they may be evicted before admission) but cached.
    next.estimatedReusableTokens = -1;
    (void)m->getNeededBlocksOneStep(next, false, kWindow);
    EXPECT_EQ(next.estimatedReusableTokens, 0);
    (void)m->getRemainingBlocksToCompletion(next, kWindow);
    EXPECT_EQ(next.estimatedReusableTokens, 2 * kTpb);  // 11 tokens stored: 2 whole blocks
    admit(*m, next, 12);
    EXPECT_EQ(next.estimatedReusableTokens, 0);  // admitted: the reuse is applied
    Request other(3, tokenRun(100, 12));
    (void)m->getRemainingBlocksToCompletion(other, kWindow);
    EXPECT_EQ(other.estimatedReusableTokens, 0);
}

TEST(TrtllmFacadeShapes, ReuseTreeLookupReturnsTheDeepestBlockAndItsChain) {
    auto m = makeManager();
    Request r(1, tokenRun(0, 12));
    admit(*m, r, 12);
    auto const ids = m->getCacheBlockIds(1, kWindow)[0];
    r.contextCurrentPosition = 12;
    (void)m->removeSequence(1, std::make_shared<Request>(r));
    auto deepest = m->findBlocksInReuseTreeByBlockKey(
        kvb::trtllm::BlockKey(kvb::trtllm::VecTokens(tokenRun(0, 8))), kWindow);
    ASSERT_NE(deepest, nullptr);
    EXPECT_EQ(deepest->getBlockId(), ids[1]);
    auto first = deepest->getPrevBlock();
    ASSERT_NE(first, nullptr);
    EXPECT_EQ(first->getBlockId(), ids[0]);
    auto root = first->getPrevBlock();
    ASSERT_NE(root, nullptr);
    EXPECT_EQ(root->getBlockId(), kvb::trtllm::KVCacheBlock::kCachedBlocksRootId);
    EXPECT_EQ(root->getPrevBlock(), nullptr);
    EXPECT_EQ(m->findBlocksInReuseTreeByBlockKey(
                  kvb::trtllm::BlockKey(kvb::trtllm::VecTokens{7, 7, 7, 7}), kWindow),
              nullptr);
}
