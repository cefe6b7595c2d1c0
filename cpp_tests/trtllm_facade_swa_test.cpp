// The facade's addToken(requestId) slides a sliding attention window as TensorRT-LLM's does,
// although the token id reaches kvblock only later: the blocks that left the window of the new
// last slot are released (free counts and getNumFrontBlocksRemoved move at addToken), a block
// released and then taken by another request is never found again under the first request's
// tokens, and a block that left the window before its tokens were handed over is never
// published under a key.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <variant>

#include "kvblock_trtllm.hpp"
#include "test_support.hpp"

namespace {

using kvb::trtllm::KVCacheManager;
using kvb::trtllm::KVCacheStoredData;
using kvb::trtllm::Request;
using kvb_test::tokenRun;

constexpr int32_t kTpb = 4;
constexpr int32_t kWindow = 8;
constexpr int32_t kMaxSeqLen = 128;

std::unique_ptr<KVCacheManager> makeManager(int32_t primaryBlocks) {
    auto events = std::make_shared<kvb::trtllm::KVCacheEventManager>();
    events->maxKVEventEntries = 1000;
    auto m = std::make_unique<KVCacheManager>(
        /*numKvHeadsPerLayer*/ std::vector<int32_t>{2, 2}, /*sizePerHead*/ 8, kTpb,
        KVCacheManager::BlocksPerWindow{{kWindow, {primaryBlocks, 0}}}, /*maxNumSequences*/ 8,
        /*maxBeamWidth*/ 1, std::vector<KVCacheManager::SizeType32>{kWindow}, 2,
        /*sinkTokenLength*/ 0, nullptr, kMaxSeqLen, /*chunkSize*/ 0, /*enableBlockReuse*/ true,
        kvb::trtllm::CacheType::kSELF, std::nullopt, events);
    m->allocatePools();
    return m;
}

void admit(KVCacheManager& m, Request& r) {
    m.addSequenceBatch({{r.getRequestId(), r.getPromptLen(), 1}}, {std::ref(r)});
}

/// The prompt is computed and its full blocks stored, as an engine does after its prefill.
void finishPrefill(KVCacheManager& m, Request& r) {
    r.contextCurrentPosition = r.getPromptLen();
    r.contextInit = false;
    r.generationInProgress = true;
    m.storeContextBlocks(r);
}

void generate(KVCacheManager& m, Request& r, int32_t token) {
    r.addNewToken(token);
    m.addToken(r.getRequestId());
}

int32_t freeBlocks(KVCacheManager const& m) {
    return m.getBlockManager().getNumFreeBlocks();
}

}  // namespace

// A slot past window + tokensPerBlock releases the front block at addToken, before the token
// id is handed over; a slot at a block boundary then allocates as usual.
TEST(TrtllmFacadeSwa, AddTokenReleasesTheBlockThatLeftTheWindow) {
    auto m = makeManager(5);
    Request r(1, tokenRun(1000, 11));
    admit(*m, r);
    finishPrefill(*m, r);
    EXPECT_EQ(freeBlocks(*m), 2);
    generate(*m, r, 1011);  // 12 slots: positions 0..3 are out of the window of position 11
    EXPECT_EQ(m->getTokenCount(1), 12);
    EXPECT_EQ(m->getNumFrontBlocksRemoved(1, kWindow), 1);
    EXPECT_EQ(m->getSequence(1).getNumFrontBlocksRemoved(kWindow), 1);
    EXPECT_EQ(freeBlocks(*m), 3);
    generate(*m, r, 1012);  // 13 slots: a new block, nothing more leaves the window
    EXPECT_EQ(m->getNumFrontBlocksRemoved(1, kWindow), 1);
    EXPECT_EQ(freeBlocks(*m), 2);
    // The detached block stays listed, as TensorRT-LLM lists it.
    EXPECT_EQ(m->getCacheBlockIds(1, kWindow).at(0).size(), 4u);
    EXPECT_TRUE(m->getBlockManager().verifyQueueIntegrity(kWindow));
    (void)m->removeSequence(1, r);
    EXPECT_EQ(freeBlocks(*m), 5);
}

// With every block held, the block leaving the window is what serves the next slot's block:
// addToken detaches before it allocates.
TEST(TrtllmFacadeSwa, AddTokenDetachesBeforeItAllocates) {
    auto m = makeManager(3);
    Request r(1, tokenRun(1000, 12));
    admit(*m, r);
    finishPrefill(*m, r);
    EXPECT_EQ(freeBlocks(*m), 0);
    EXPECT_NO_THROW(generate(*m, r, 1012));
    EXPECT_EQ(m->getNumFrontBlocksRemoved(1, kWindow), 1);
    EXPECT_EQ(freeBlocks(*m), 0);
    EXPECT_TRUE(m->getBlockManager().verifyQueueIntegrity(kWindow));
}

// An out-of-window block nobody took stays reusable under its tokens after release.
TEST(TrtllmFacadeSwa, AnOutOfWindowBlockNobodyTookIsReused) {
    auto m = makeManager(8);
    Request r(1, tokenRun(1000, 11));
    admit(*m, r);
    finishPrefill(*m, r);
    generate(*m, r, 1011);
    (void)m->removeSequence(1, r);
    Request again(2, tokenRun(1000, kTpb));
    admit(*m, again);
    EXPECT_EQ(again.prepopulatedPromptLen, kTpb - 1);  // the last prompt token is computed
    (void)m->removeSequence(2, std::nullopt);
    EXPECT_EQ(freeBlocks(*m), 8);
}

// An out-of-window block another request took holds that request's KV: the first request's
// tokens never find it again, and neither does a later block of the first request without it.
TEST(TrtllmFacadeSwa, AnOutOfWindowBlockAnotherRequestTookIsNotReused) {
    auto m = makeManager(3);
    Request r(1, tokenRun(1000, 11));
    admit(*m, r);
    finishPrefill(*m, r);
    generate(*m, r, 1011);
    EXPECT_EQ(freeBlocks(*m), 1);
    Request thief(2, tokenRun(2000, kTpb));
    admit(*m, thief);  // takes the released block
    EXPECT_EQ(freeBlocks(*m), 0);
    (void)m->removeSequence(2, std::nullopt);
    (void)m->removeSequence(1, r);
    EXPECT_EQ(freeBlocks(*m), 3);
    Request first(3, tokenRun(1000, kTpb));
    admit(*m, first);
    EXPECT_EQ(first.prepopulatedPromptLen, 0);
    (void)m->removeSequence(3, std::nullopt);
    Request second(4, tokenRun(1000 + kTpb, kTpb));
    admit(*m, second);
    EXPECT_EQ(second.prepopulatedPromptLen, 0);
    (void)m->removeSequence(4, std::nullopt);
    EXPECT_TRUE(m->getBlockManager().verifyQueueIntegrity(kWindow));
}

// Slots may run ahead of the tokens handed over by more than the window: the blocks that left
// the window before their tokens arrived are never stored, so every stored block carries the
// request's own tokens.
TEST(TrtllmFacadeSwa, BlocksSlidOutBeforeTheirTokensArriveAreNeverPublished) {
    auto m = makeManager(16);
    Request r(1, tokenRun(1000, kTpb));
    admit(*m, r);
    finishPrefill(*m, r);
    for (int32_t t = 1004; t < 1020; ++t) generate(*m, r, t);
    EXPECT_EQ(m->getNumFrontBlocksRemoved(1, kWindow), 3);
    EXPECT_TRUE(m->getBlockManager().verifyQueueIntegrity(kWindow));
    m->flushIterationEvents();
    (void)m->getLatestEvents(std::chrono::milliseconds(0));
    r.contextCurrentPosition = 19;
    (void)m->removeSequence(1, r);
    m->flushIterationEvents();
    for (auto const& e : m->getLatestEvents(std::chrono::milliseconds(0))) {
        auto const* stored = std::get_if<KVCacheStoredData>(&e.data);
        if (!stored) continue;
        for (auto const& block : stored->blocks) {
            ASSERT_FALSE(block.tokens.empty());
            int32_t first = block.tokens[0].tokenId;
            ASSERT_GE(first, 1000);
            ASSERT_EQ((first - 1000) % kTpb, 0);
            for (size_t i = 0; i < block.tokens.size(); ++i)
                EXPECT_EQ(block.tokens[i].tokenId, first + static_cast<int32_t>(i));
        }
    }
    EXPECT_TRUE(m->getBlockManager().verifyQueueIntegrity(kWindow));
    EXPECT_EQ(freeBlocks(*m), 16);
}

// With two windows only the sliding one releases blocks at addToken.
TEST(TrtllmFacadeSwa, OnlyTheSlidingWindowReleasesBlocks) {
    KVCacheManager m(std::vector<int32_t>{2, 2}, 8, kTpb,
                     KVCacheManager::BlocksPerWindow{{8, {8, 0}}, {32, {8, 0}}}, 4, 1,
                     std::vector<int32_t>{8, 32}, 2, 0, nullptr, 32, 0, true);
    m.allocatePools();
    Request r(1, tokenRun(1000, 11));
    admit(m, r);
    finishPrefill(m, r);
    generate(m, r, 1011);
    EXPECT_EQ(m.getNumFrontBlocksRemoved(1, 8), 1);
    EXPECT_EQ(m.getNumFrontBlocksRemoved(1, 32), 0);
    auto free = m.getBlockManager().getNumFreeBlocksPerWindowSize();
    EXPECT_EQ(free.at(8), 6);
    EXPECT_EQ(free.at(32), 5);
    EXPECT_TRUE(m.getBlockManager().verifyQueueIntegrity(8));
}

// The BlockManager's counts TensorRT-LLM's sliding-window tests read: every block of every
// window is counted, the host tier's too, and only GPU blocks are free, so the host blocks count
// as allocated.
TEST(TrtllmFacadeSwa, BlockManagerCountsTheHostBlocksAsAllocated) {
    KVCacheManager m(std::vector<int32_t>{2, 2}, 8, kTpb,
                     KVCacheManager::BlocksPerWindow{{kWindow, {6, 4}}}, 4, 1,
                     std::vector<int32_t>{kWindow}, 2, 0, nullptr, kMaxSeqLen, 0, true);
    m.allocatePools();
    auto const& bm = m.getBlockManager();
    EXPECT_EQ(bm.getMaxNumBlocks(), 10);
    EXPECT_EQ(bm.getNumAllocatedBlocks(), 4);
    Request r(1, tokenRun(1000, 11));
    admit(m, r);
    EXPECT_EQ(bm.getNumAllocatedBlocks(), 7);
    (void)m.removeSequence(1, std::nullopt);
    EXPECT_EQ(bm.getNumAllocatedBlocks(), 4);
}

// The scheduler's one-step estimate counts the slots addToken reserved, as TensorRT-LLM's
// sequence counts them, even before the engine hands the token ids over.
TEST(TrtllmFacadeSwa, TheOneStepEstimateCountsSlotsAddTokenReserved) {
    auto m = makeManager(16);
    Request r(1, tokenRun(1000, 5), /*maxNewTokens*/ 100);
    admit(*m, r);
    finishPrefill(*m, r);
    EXPECT_EQ(m->getNeededBlocksOneStep(r, /*twoStepsLookAhead*/ false, kWindow), 0);
    for (int32_t i = 0; i < 3; ++i) m->addToken(1);  // 8 slots: the ninth starts a block
    EXPECT_EQ(m->getNeededBlocksOneStep(r, false, kWindow), 1);
    EXPECT_EQ(m->getNeededBlocksOneStep(r, true, kWindow), 1);
}
