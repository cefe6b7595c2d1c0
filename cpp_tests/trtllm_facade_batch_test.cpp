// addSequenceBatch through the TensorRT-LLM facade when the requests of one batch compete for the
// same cached blocks: who keeps a free cached leaf that several of them match (a whole match
// shares it; otherwise the last partial matcher takes it over and the earlier ones copy), and
// what every request is told it reuses.
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <vector>

#include "kvblock_trtllm.hpp"
#include "test_support.hpp"
#include "trtllm_test_support.hpp"

namespace {

using kvb::trtllm::KVCacheManager;
using kvb::trtllm::Request;
using kvb::trtllm::nvinfer1::DataType;
using kvb_test::tokenRun;

constexpr int32_t kTpb = 4;
constexpr int32_t kWindow = 32;

using kvb_test::EngineStream;

std::unique_ptr<KVCacheManager> makeManager(int32_t primaryBlocks) {
    auto m = std::make_unique<KVCacheManager>(
        /*numLayers*/ 1, /*numKvHeads*/ 1, /*sizePerHead*/ 16, kTpb,
        KVCacheManager::BlocksPerWindow{{kWindow, {primaryBlocks, 0}}}, /*maxNumSequences*/ 8,
        /*maxBeamWidth*/ 1, std::vector<KVCacheManager::SizeType32>{kWindow}, DataType::kHALF,
        /*sinkTokenLength*/ 0, std::make_shared<EngineStream>(), /*maxSequenceLength*/ kWindow,
        /*chunkSize*/ kWindow, /*enableBlockReuse*/ true, kvb::trtllm::CacheType::kSELF,
        /*secondaryOffloadMinPriority*/ std::nullopt, /*eventManager*/ nullptr,
        /*enablePartialReuse*/ true);
    m->allocatePools(false);
    return m;
}

/// Runs `tokens` through a whole prefill and releases it, so its blocks are cached and free.
void cacheThenRelease(KVCacheManager& m, uint64_t id, std::vector<int32_t> tokens) {
    auto r = std::make_shared<Request>(id, tokens);
    const auto len = static_cast<int32_t>(tokens.size());
    m.addSequenceBatch({{id, len, 1}}, {std::ref(*r)});
    r->contextCurrentPosition = len;
    (void)m.removeSequence(id, r);
}

int32_t secondBlock(KVCacheManager& m, uint64_t id) {
    return m.getSequence(id).getCacheBlockIds(kWindow).at(0).at(1);
}

}  // namespace

TEST(TrtllmFacadeBatch, TheLastPartialMatcherOfACachedLeafTakesItOver) {
    auto m = makeManager(16);
    cacheThenRelease(*m, 0, {0, 1, 2, 3, 4, 5, 6});  // leaf [4 5], block 1
    Request a(1, {0, 1, 2, 3, 4, 10});
    Request b(2, {0, 1, 2, 3, 4, 20});
    m->addSequenceBatch({{1, 6, 1}, {2, 6, 1}}, {std::ref(a), std::ref(b)});
    EXPECT_EQ(a.prepopulatedPromptLen, kTpb + 1);
    EXPECT_EQ(b.prepopulatedPromptLen, kTpb + 1);
    EXPECT_EQ(secondBlock(*m, 2), 1) << "the last matcher keeps the cached block";
    EXPECT_NE(secondBlock(*m, 1), 1) << "the first copied its matched token";
}

TEST(TrtllmFacadeBatch, AWholeMatchSharesTheLeafAndPartialMatchersCopy) {
    auto m = makeManager(16);
    cacheThenRelease(*m, 0, tokenRun(0, 9));  // [0..3] [4..7], both full
    Request partial(1, {0, 1, 2, 3, 4, 5, 6, 10});
    Request whole(2, tokenRun(0, 9));
    m->addSequenceBatch({{1, 8, 1}, {2, 9, 1}}, {std::ref(partial), std::ref(whole)});
    EXPECT_EQ(partial.prepopulatedPromptLen, kTpb + 3);
    EXPECT_EQ(whole.prepopulatedPromptLen, 2 * kTpb);
    EXPECT_EQ(secondBlock(*m, 2), 1);
    EXPECT_NE(secondBlock(*m, 1), 1);
}

namespace {

using kvb_test::FixedConnector;

std::unique_ptr<KVCacheManager> makeConnected(
    std::shared_ptr<kvb::trtllm::kv_connector::KvCacheConnectorManager> connector) {
    return std::make_unique<KVCacheManager>(
        /*numLayers*/ 1, /*numKvHeads*/ 1, /*sizePerHead*/ 16, kTpb,
        KVCacheManager::BlocksPerWindow{{kWindow, {16, 0}}}, /*maxNumSequences*/ 8,
        /*maxBeamWidth*/ 1, std::vector<KVCacheManager::SizeType32>{kWindow}, DataType::kHALF,
        /*sinkTokenLength*/ 0, std::make_shared<EngineStream>(), /*maxSequenceLength*/ kWindow,
        /*chunkSize*/ kWindow, /*enableBlockReuse*/ true, kvb::trtllm::CacheType::kSELF,
        /*secondaryOffloadMinPriority*/ std::nullopt, /*eventManager*/ nullptr,
        /*enablePartialReuse*/ true, /*copyOnPartialReuse*/ true, std::move(connector));
}

}  // namespace

// A request that copies part of a free cached block which is not a leaf, and needs every block of
// the pool, that block included: the source is free again once its copy is queued.
TEST(TrtllmFacadeBatch, ATightPoolAdmitsARequestThatAlsoNeedsItsCopySource) {
    auto m = makeManager(8);
    cacheThenRelease(*m, 0, {0, 1, 2, 3, 4, 5, 6, 7, 99});
    cacheThenRelease(*m, 1, {0, 1, 2, 3, 10, 11, 12, 13, 99});  // [0..3] has two children
    ASSERT_EQ(m->getNumFreeBlocks(), 8);
    std::vector<int32_t> tokens{0, 1};
    for (int32_t t = 50; t < 80; ++t) tokens.push_back(t);  // 32 tokens: 8 blocks
    Request big(2, tokens);
    m->addSequenceBatch({{2, 32, 1}}, {std::ref(big)});
    EXPECT_EQ(big.prepopulatedPromptLen, 2);
    EXPECT_EQ(m->getNumFreeBlocks(), 0);
    EXPECT_EQ(m->getSequence(2).getCacheBlockIds(kWindow).at(0).size(), 8u);
    (void)m->removeSequence(2);
    EXPECT_EQ(m->getNumFreeBlocks(), 8);
}

TEST(TrtllmFacadeBatch, AConnectorsTokensAfterTheReusedPrefixArePrepopulated) {
    auto connector = std::make_shared<FixedConnector>(4);
    auto m = makeConnected(connector);
    cacheThenRelease(*m, 0, tokenRun(0, 9));  // the tree holds 8 tokens of it
    Request r(1, tokenRun(0, 20));
    m->addSequenceBatch({{1, 20, 1}}, {std::ref(r)});
    ASSERT_EQ(connector->asked.size(), 2u) << "asked once per admitted request";
    EXPECT_EQ(connector->asked[1], (std::pair<uint64_t, int32_t>{1, 2 * kTpb}))
        << "asked after the tree's match";
    EXPECT_EQ(r.prepopulatedPromptLen, 2 * kTpb + 4);
    EXPECT_EQ(m->getSequence(1).getCacheBlockIds(kWindow).at(0).size(), 5u)
        << "the blocks are the prompt's, whoever fills them";
}

TEST(TrtllmFacadeBatch, AConnectorNeverPrepopulatesTheLastPromptToken) {
    auto m = makeConnected(std::make_shared<FixedConnector>(1000));
    Request r(1, tokenRun(0, 6));
    m->addSequenceBatch({{1, 6, 1}}, {std::ref(r)});
    EXPECT_EQ(r.prepopulatedPromptLen, 5);
    auto negative = makeConnected(std::make_shared<FixedConnector>(-3));
    Request s(2, tokenRun(0, 6));
    negative->addSequenceBatch({{2, 6, 1}}, {std::ref(s)});
    EXPECT_EQ(s.prepopulatedPromptLen, 0);
}

TEST(TrtllmFacadeBatch, ANullConnectorIsNone) {
    auto m = makeConnected(nullptr);
    Request r(1, tokenRun(0, 6));
    m->addSequenceBatch({{1, 6, 1}}, {std::ref(r)});
    EXPECT_EQ(r.prepopulatedPromptLen, 0);
}

namespace {

/// A connector written against the engine's own request type, failing on request 7.
class EngineConnector : public kvb::trtllm::kv_connector::KvCacheConnectorManagerFor<Request> {
  public:
    int32_t getNumNewMatchedTokens(Request const& request, int32_t numComputedTokens) override {
        if (request.getRequestId() == 7) throw std::runtime_error("store unreachable");
        return numComputedTokens == 0 ? 2 : 0;
    }
};

}  // namespace

TEST(TrtllmFacadeBatch, AConnectorOverTheEnginesRequestTypeIsAskedWithIt) {
    auto m = makeConnected(std::make_shared<EngineConnector>());
    Request r(1, tokenRun(0, 6));
    m->addSequenceBatch({{1, 6, 1}}, {std::ref(r)});
    EXPECT_EQ(r.prepopulatedPromptLen, 2);
}

TEST(TrtllmFacadeBatch, AConnectorThatThrowsAdmitsNothing) {
    auto m = makeConnected(std::make_shared<EngineConnector>());
    auto const freeBefore = m->getNumFreeBlocks();
    Request ok(1, tokenRun(0, 6));
    Request failing(7, tokenRun(50, 6));
    EXPECT_THROW(m->addSequenceBatch({{1, 6, 1}, {7, 6, 1}}, {std::ref(ok), std::ref(failing)}),
                 std::runtime_error);
    EXPECT_EQ(m->getNumFreeBlocks(), freeBefore);
    EXPECT_THROW((void)m->getSequence(1), kvb::Error) << "the whole batch was refused";
}
