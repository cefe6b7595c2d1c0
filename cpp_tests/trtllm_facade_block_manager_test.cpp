// The TensorRT-LLM facade's BlockManager on its own: built by TensorRT-LLM's constructor it owns
// its manager and is driven with GenerationRequest records its caller owns (addSequenceBatch,
// releaseBlocks, storeContextBlocks, onboardBlock), and block handles (getBlockById ->
// BlockPtr, whose queries follow the block; getPrevBlock walks the reuse tree to its root).
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <set>
#include <stdexcept>
#include <vector>

#include "kvblock_trtllm.hpp"
#include "test_support.hpp"
#include "trtllm_test_support.hpp"

namespace {

using kvb::trtllm::AddSequenceResult;
using kvb::trtllm::BlockKey;
using kvb::trtllm::BlockManager;
using kvb::trtllm::BlockPtr;
using kvb::trtllm::GenerationRequest;
using kvb::trtllm::KVCacheBlock;
using kvb::trtllm::Request;
using kvb::trtllm::nvinfer1::DataType;
using kvb_test::statusOf;
using kvb_test::tokenRun;

constexpr int32_t kTpb = 4;
constexpr int32_t kWindow = 32;

using kvb_test::EngineStream;

/// A BlockManager built as TensorRT-LLM's tests build one: two layers of two heads.
std::unique_ptr<BlockManager> makeOwning(int32_t primary = 8, int32_t secondary = 0,
                                         int32_t beams = 1,
                                         std::vector<int32_t> windows = {kWindow},
                                         std::shared_ptr<EngineStream> stream = nullptr) {
    if (!stream) stream = std::make_shared<EngineStream>();
    BlockManager::BlocksPerWindow blocks;
    for (int32_t w : windows) blocks[w] = {primary, secondary};
    int32_t const maxWindow = *std::max_element(windows.begin(), windows.end());
    auto bm = std::make_unique<BlockManager>(
        std::vector<int32_t>(windows.size() * 1, 2), /*sizePerHead*/ 8, kTpb, blocks,
        /*maxNumSequences*/ 8, stream, /*maxSequenceLength*/ maxWindow, beams, windows,
        DataType::kHALF, /*sinkBubbleLength*/ 0, /*onboardBlocks*/ true);
    bm->allocatePools(false);
    return bm;
}

GenerationRequest makeSeq(BlockManager const& bm, uint64_t id, int32_t tokens, int32_t beams = 1) {
    return GenerationRequest(id, tokens, beams, bm.getWindowSizesMetadata());
}

/// TensorRT-LLM's call for one sequence in `window`.
AddSequenceResult admit(BlockManager& bm, GenerationRequest& seq, Request& req,
                        int32_t window = kWindow, bool reuse = true) {
    int32_t const len = req.getPromptLen();
    return bm
        .addSequenceBatch({&seq}, {len}, {(len + kTpb - 1) / kTpb}, {std::ref(req)}, window, reuse)
        .at(0);
}

}  // namespace

// TensorRT-LLM's constructor makes a BlockManager that owns its manager and the engine's
// stream object; getBlockManager() stays a view.
TEST(TrtllmFacadeBlockManager, OwningConstructorOwnsTheManagerAndTheStream) {
    auto stream = std::make_shared<EngineStream>();
    auto bm = makeOwning(8, 0, 1, {kWindow}, stream);
    EXPECT_TRUE(bm->isOwning());
    EXPECT_FALSE(bm->getKVCacheManager().getBlockManager().isOwning());
    EXPECT_EQ(&bm->getKVCacheManager().getBlockManager().getKVCacheManager(),
              &bm->getKVCacheManager());
    EXPECT_EQ(stream.use_count(), 2);
    EXPECT_EQ(bm->getTokensPerBlock(), kTpb);
    EXPECT_EQ(bm->getMaxNumBlocks(), 8);
    EXPECT_EQ(bm->getNumFreeBlocks(), 8);
    EXPECT_TRUE(bm->getKVCacheManager().isEnableBlockReuse());
    bm.reset();
    EXPECT_EQ(stream.use_count(), 1);
}

// addSequenceBatch writes the sequence's ids into the caller's GenerationRequest (a reference
// taken before the call reads them), returns the prepopulated length without writing it into
// the request, and adds to the request's block counters.
TEST(TrtllmFacadeBlockManager, AddSequenceBatchFillsTheCallersRecord) {
    auto bm = makeOwning();
    GenerationRequest seq = makeSeq(*bm, 1, 9);
    auto const& ids = seq.getCacheBlockIds(kWindow);
    ASSERT_EQ(ids.size(), 1u);
    EXPECT_TRUE(ids[0].empty());
    Request req(1, tokenRun(10, 9));
    AddSequenceResult r = admit(*bm, seq, req);
    EXPECT_EQ(r.prepopulatedLen, 0);
    EXPECT_EQ(r.allocTotalBlocks, 3);
    EXPECT_EQ(ids[0], bm->getKVCacheManager().impl().getCacheBlockIds(1, kWindow));
    EXPECT_EQ(ids[0].size(), 3u);
    EXPECT_EQ(req.allocTotalBlocks, 3);
    EXPECT_EQ(req.missedBlocks, 3);
    EXPECT_EQ(bm->getNumAllocatedBlocks(), 3);
    EXPECT_EQ(bm->getNumFreeBlocks(), 5);
}

// releaseBlocks with the request stores the computed blocks, frees the sequence and empties
// the caller's record; the same prompt is then reused (its last token is never reused).
TEST(TrtllmFacadeBlockManager, ReleaseBlocksStoresAndEmptiesTheRecord) {
    auto bm = makeOwning();
    GenerationRequest seq0 = makeSeq(*bm, 1, 9);
    Request req0(1, tokenRun(10, 9));
    admit(*bm, seq0, req0);
    auto first = seq0.getCacheBlockIds(kWindow)[0];
    req0.contextCurrentPosition = 9;
    bm->releaseBlocks(seq0, req0);
    EXPECT_TRUE(seq0.getCacheBlockIds(kWindow)[0].empty());
    EXPECT_EQ(bm->getNumFreeBlocks(), 8);
    EXPECT_FALSE(bm->getKVCacheManager().hasSequence(1));

    GenerationRequest seq1 = makeSeq(*bm, 2, 9);
    Request req1(2, tokenRun(10, 9));
    AddSequenceResult r = admit(*bm, seq1, req1);
    EXPECT_EQ(r.prepopulatedLen, 2 * kTpb);
    EXPECT_EQ(r.reusedBlocks, 2);
    EXPECT_EQ(req1.prepopulatedPromptLen, 0) << "the caller sets it, as in TensorRT-LLM";
    auto const& again = seq1.getCacheBlockIds(kWindow)[0];
    ASSERT_EQ(again.size(), 3u);
    EXPECT_EQ(again[0], first[0]);
    EXPECT_EQ(again[1], first[1]);
}

// Without the request nothing is stored; a sequence admitted with reuse off is never stored.
TEST(TrtllmFacadeBlockManager, ReleaseStoresOnlyWithTheRequestAndReuseOn) {
    auto bm = makeOwning();
    GenerationRequest a = makeSeq(*bm, 1, 9);
    Request ra(1, tokenRun(10, 9));
    admit(*bm, a, ra);
    bm->releaseBlocks(a);
    GenerationRequest b = makeSeq(*bm, 2, 9);
    Request rb(2, tokenRun(10, 9));
    EXPECT_EQ(admit(*bm, b, rb, kWindow, /*reuse*/ false).prepopulatedLen, 0);
    rb.contextCurrentPosition = 9;
    bm->storeContextBlocks(b, rb);
    bm->releaseBlocks(b, rb);
    GenerationRequest c = makeSeq(*bm, 3, 9);
    Request rc(3, tokenRun(10, 9));
    EXPECT_EQ(admit(*bm, c, rc).prepopulatedLen, 0);
}

// A request still in the context state whose prefill is complete and which has tokens past its
// prompt ran decode steps: its release stores every token but the newest that the blocks it
// holds have room for. Mid-prefill only the context position counts.
TEST(TrtllmFacadeBlockManager, ReleaseStoresTokensGeneratedAfterAFinishedPrefill) {
    auto bm = makeOwning();
    auto run = [&](uint64_t id, int32_t position) {
        GenerationRequest seq = makeSeq(*bm, id, 9);
        Request req(id, tokenRun(10, 9));
        admit(*bm, seq, req);
        req.addNewToken(100);
        req.addNewToken(101);  // 11 tokens in 3 blocks, no addToken: TensorRT-LLM's tests do so
        req.contextCurrentPosition = position;
        bm->releaseBlocks(seq, req);
        EXPECT_FALSE(bm->getKVCacheManager().hasSequence(id));
    };
    auto probe = [&](uint64_t id) {
        GenerationRequest seq = makeSeq(*bm, id, 11);
        Request req(id, kvb_test::concatTokens(tokenRun(10, 9), {100, 7}));
        int32_t n = admit(*bm, seq, req).prepopulatedLen;
        bm->releaseBlocks(seq);
        return n;
    };
    run(1, 8);  // mid-prefill: two whole blocks are computed
    EXPECT_EQ(probe(2), 2 * kTpb);
    run(3, 9);  // prefill complete: tokens 8 and 100 are stored in the third block
    EXPECT_EQ(probe(4), 2 * kTpb + 2);
}

// storeContextBlocks stores what the request has computed (its context position), no more.
TEST(TrtllmFacadeBlockManager, StoreContextBlocksStopsAtTheContextPosition) {
    auto bm = makeOwning(16);
    GenerationRequest a = makeSeq(*bm, 1, 13);
    Request ra(1, tokenRun(10, 13));
    admit(*bm, a, ra);
    ra.contextCurrentPosition = kTpb;
    bm->storeContextBlocks(a, ra);
    GenerationRequest b = makeSeq(*bm, 2, 13);
    Request rb(2, tokenRun(10, 13));
    AddSequenceResult r = admit(*bm, b, rb);
    EXPECT_EQ(r.prepopulatedLen, kTpb);
    EXPECT_EQ(b.getCacheBlockIds(kWindow)[0][0], a.getCacheBlockIds(kWindow)[0][0]);
}

// A live id and a batch that does not fit throw std::runtime_error and admit nothing.
TEST(TrtllmFacadeBlockManager, DuplicatesAndExhaustionThrow) {
    auto bm = makeOwning(4);
    GenerationRequest a = makeSeq(*bm, 7, 5);
    Request ra(7, tokenRun(10, 5));
    admit(*bm, a, ra);
    GenerationRequest dup = makeSeq(*bm, 7, 5);
    Request rdup(7, tokenRun(10, 5));
    EXPECT_THROW(admit(*bm, dup, rdup), std::runtime_error);
    EXPECT_TRUE(dup.getCacheBlockIds(kWindow)[0].empty());
    GenerationRequest big = makeSeq(*bm, 8, 13);
    Request rbig(8, tokenRun(50, 13));
    EXPECT_EQ(statusOf([&] { admit(*bm, big, rbig); }), KVB_STATUS_OUT_OF_BLOCKS);
    EXPECT_EQ(bm->getNumFreeBlocks(), 2);
    EXPECT_FALSE(bm->getKVCacheManager().hasSequence(8));
}

// Beam search: the prompt's full blocks are shared, each beam has its own last block.
TEST(TrtllmFacadeBlockManager, BeamsShareTheFullPromptBlocks) {
    auto bm = makeOwning(12, 0, /*beams*/ 3);
    GenerationRequest seq = makeSeq(*bm, 1, 9, 3);
    Request req(1, tokenRun(10, 9));
    bm->addSequenceBatch({&seq}, {9}, {3}, {std::ref(req)}, kWindow, true);
    auto const& ids = seq.getCacheBlockIds(kWindow);
    ASSERT_EQ(ids.size(), 3u);
    std::set<int32_t> all;
    for (auto const& beam : ids) {
        ASSERT_EQ(beam.size(), 3u);
        EXPECT_EQ(beam[0], ids[0][0]);
        EXPECT_EQ(beam[1], ids[0][1]);
        all.insert(beam.begin(), beam.end());
    }
    EXPECT_EQ(all.size(), 2u + 3u);
    EXPECT_EQ(bm->getNumFreeBlocks(), 12 - 5);
}

// A call with isEnableBlockReuse false takes TensorRT-LLM's non-reuse path for its requests:
// a cached prompt is not matched, and beams share the last block when the prompt fills it.
TEST(TrtllmFacadeBlockManager, ACallWithoutReuseMatchesNothingAndBeamsShareAFilledLastBlock) {
    auto bm = makeOwning(16, 0, /*beams*/ 4);
    GenerationRequest a = makeSeq(*bm, 1, 9);
    Request ra(1, tokenRun(10, 9));
    admit(*bm, a, ra);
    ra.contextCurrentPosition = 9;
    bm->releaseBlocks(a, ra);
    GenerationRequest b = makeSeq(*bm, 2, 9);
    Request rb(2, tokenRun(10, 9));
    EXPECT_EQ(admit(*bm, b, rb, kWindow, /*reuse*/ false).prepopulatedLen, 0);
    EXPECT_EQ(b.getCacheBlockIds(kWindow)[0].size(), 3u);
    bm->releaseBlocks(b, rb);
    GenerationRequest c = makeSeq(*bm, 3, 9);
    Request rc(3, tokenRun(10, 9));
    EXPECT_EQ(admit(*bm, c, rc).prepopulatedLen, 8);
    bm->releaseBlocks(c);

    int32_t const free = bm->getNumFreeBlocks();
    GenerationRequest beams = makeSeq(*bm, 4, 8, 4);
    Request rbeams(4, tokenRun(200, 8));
    bm->addSequenceBatch({&beams}, {8}, {2}, {std::ref(rbeams)}, kWindow, false);
    auto const& ids = beams.getCacheBlockIds(kWindow);
    ASSERT_EQ(ids.size(), 4u);
    for (auto const& beam : ids) EXPECT_EQ(beam, ids[0]);
    EXPECT_EQ(bm->getNumFreeBlocks(), free - 2);
    bm->releaseBlocks(beams);
    EXPECT_EQ(bm->getNumFreeBlocks(), 16);
}

// TensorRT-LLM calls addSequenceBatch once per window; kvblock admits every window on the
// first call, and the call for the other window returns the same admission.
TEST(TrtllmFacadeBlockManager, TheCallForASecondWindowReturnsTheSameAdmission) {
    auto bm = makeOwning(8, 0, 1, {8, kWindow});
    GenerationRequest seq = makeSeq(*bm, 1, 6);
    Request req(1, tokenRun(10, 6));
    AddSequenceResult small = admit(*bm, seq, req, 8);
    int32_t const freeAfter = bm->getNumFreeBlocks();
    AddSequenceResult large = admit(*bm, seq, req, kWindow);
    EXPECT_EQ(large.allocTotalBlocks, small.allocTotalBlocks);
    EXPECT_EQ(bm->getNumFreeBlocks(), freeAfter);
    EXPECT_EQ(req.allocTotalBlocks, small.allocTotalBlocks) << "counted once";
    EXPECT_EQ(seq.getCacheBlockIds(8)[0].size(), 2u);
    EXPECT_EQ(seq.getCacheBlockIds(kWindow)[0].size(), 2u);
    // Another record with the same id is a duplicate, as is the same window again.
    GenerationRequest other = makeSeq(*bm, 1, 6);
    EXPECT_THROW(admit(*bm, other, req, kWindow), std::runtime_error);
    EXPECT_THROW(admit(*bm, seq, req, 8), std::runtime_error);
}

// getBlockById returns a live handle: its queries follow the block through offload and
// onboard, and it converts to kvblock's snapshot.
TEST(TrtllmFacadeBlockManager, BlockHandlesFollowTheBlock) {
    auto bm = makeOwning(8, 4);
    GenerationRequest seq = makeSeq(*bm, 1, 9);
    Request req(1, tokenRun(10, 9));
    admit(*bm, seq, req);
    int32_t const id = seq.getCacheBlockIds(kWindow)[0][0];
    BlockPtr block = bm->getBlockById(id, kWindow);
    ASSERT_NE(block, nullptr);
    EXPECT_EQ(block->getBlockId(), id);
    EXPECT_TRUE(block->isPrimary());
    EXPECT_TRUE(block->hasRefs());
    kvb_block_info_t info = bm->getBlockById(id, kWindow);
    EXPECT_EQ(block->getMemoryPoolBlockIndex(), info.memory_index);
    EXPECT_EQ(info.ref_count, 1);
    req.contextCurrentPosition = 9;
    bm->releaseBlocks(seq, req);
    EXPECT_FALSE(block->hasRefs());
    ASSERT_TRUE(bm->offloadBlock(block, kWindow));
    EXPECT_FALSE(block->isPrimary());
    EXPECT_EQ(block->getMemoryPoolBlockIndex(),
              bm->getKVCacheManager().impl().getBlockInfo(kWindow, id).memory_index);
    GenerationRequest other = makeSeq(*bm, 2, 3);
    EXPECT_TRUE(bm->onboardBlock(other, block, kWindow));
    EXPECT_TRUE(block->isPrimary());
    EXPECT_EQ(bm->getBlockById(id, kWindow), block);
    EXPECT_NE(bm->getBlockById(id + 1, kWindow), block);
    EXPECT_EQ(statusOf([&] { (void)bm->getBlockById(999, kWindow); }), KVB_STATUS_INVALID_ARGUMENT);
}

// The deepest block a key matches walks getPrevBlock() to the tree's root (id -1), whose
// previous block is null; a block outside the tree has none.
TEST(TrtllmFacadeBlockManager, PrevBlockWalksTheReuseTreeToItsRoot) {
    auto bm = makeOwning();
    GenerationRequest seq = makeSeq(*bm, 1, 13);
    Request req(1, tokenRun(10, 13));
    admit(*bm, seq, req);
    auto ids = seq.getCacheBlockIds(kWindow)[0];
    EXPECT_EQ(bm->getBlockById(ids[0], kWindow)->getPrevBlock(), nullptr) << "not stored yet";
    req.contextCurrentPosition = 13;
    bm->releaseBlocks(seq, req);
    BlockKey key;
    for (int32_t t : tokenRun(10, 12)) key.uniqueTokens.push_back({t, 0});
    BlockPtr last = bm->findBlockInReuseTreeByBlockKey(key, kWindow);
    ASSERT_NE(last, nullptr);
    EXPECT_EQ(last->getBlockId(), ids[2]);
    EXPECT_TRUE(last->isLeaf() || bm->getBlockById(ids[3], kWindow)->getPrevBlock() == last);
    BlockPtr prev = last->getPrevBlock();
    ASSERT_NE(prev, nullptr);
    EXPECT_EQ(prev->getBlockId(), ids[1]);
    EXPECT_FALSE(prev->isLeaf());
    BlockPtr first = prev->getPrevBlock();
    ASSERT_NE(first, nullptr);
    EXPECT_EQ(first->getBlockId(), ids[0]);
    BlockPtr root = first->getPrevBlock();
    ASSERT_NE(root, nullptr);
    EXPECT_EQ(root->getBlockId(), KVCacheBlock::kCachedBlocksRootId);
    EXPECT_EQ(root->getPrevBlock(), nullptr);
    BlockKey other;
    other.uniqueTokens = {{1, 0}, {2, 0}, {3, 0}, {4, 0}};
    EXPECT_EQ(bm->findBlockInReuseTreeByBlockKey(other, kWindow), nullptr);
}

// calculateWindowSizeToShare: each window's share is its size times its cache size per token.
TEST(TrtllmFacadeBlockManager, WindowSharesAreProportionalToWindowTimesCacheSize) {
    auto shares = BlockManager::calculateWindowSizeToShare({{1024, {1}}, {4096, {0, 2, 3}}},
                                                           {{1024, 2}, {4096, 1}});
    ASSERT_EQ(shares.size(), 2u);
    EXPECT_NEAR(shares.at(1024), 2048.0f / (2048.0f + 4096.0f), 1e-6f);
    EXPECT_NEAR(shares.at(4096), 4096.0f / (2048.0f + 4096.0f), 1e-6f);
    EXPECT_EQ(statusOf([] {
                  (void)BlockManager::calculateWindowSizeToShare({{8, {0}}}, {});
              }),
              KVB_STATUS_INVALID_ARGUMENT);
}

// A BlockManager built with a connector counts what the connector loads in the prepopulated
// length it returns, as the KVCacheManager does; its per-window calls ask once per sequence.
TEST(TrtllmFacadeBlockManager, AConnectorsTokensCountInThePrepopulatedLengthReturned) {
    auto connector = std::make_shared<kvb_test::FixedConnector>(3);
    BlockManager bm(std::vector<int32_t>{2}, /*sizePerHead*/ 8, kTpb,
                    BlockManager::BlocksPerWindow{{kWindow, {8, 0}}}, /*maxNumSequences*/ 8,
                    std::make_shared<EngineStream>(), /*maxSequenceLength*/ kWindow,
                    /*maxBeamWidth*/ 1, std::vector<int32_t>{kWindow}, DataType::kHALF,
                    /*sinkBubbleLength*/ 0, /*onboardBlocks*/ true, kvb::trtllm::CacheType::kSELF,
                    /*secondaryOffloadMinPriority*/ std::nullopt, /*eventManager*/ nullptr,
                    /*enablePartialReuse*/ true, /*copyOnPartialReuse*/ true, connector);
    bm.allocatePools(false);
    Request first(1, tokenRun(0, 9));
    auto seq1 = makeSeq(bm, 1, 9);
    EXPECT_EQ(admit(bm, seq1, first).prepopulatedLen, 3) << "nothing cached: the connector's 3";
    first.contextCurrentPosition = 9;
    bm.releaseBlocks(seq1, first);

    Request second(2, tokenRun(0, 20));
    auto seq2 = makeSeq(bm, 2, 20);
    EXPECT_EQ(admit(bm, seq2, second).prepopulatedLen, 2 * kTpb + 3)
        << "the two cached blocks, then the connector's tokens";
    ASSERT_EQ(connector->asked.size(), 2u);
    EXPECT_EQ(connector->asked[1], (std::pair<uint64_t, int32_t>{2, 2 * kTpb}));

    Request shortPrompt(3, tokenRun(100, 3));
    auto seq3 = makeSeq(bm, 3, 3);
    EXPECT_EQ(admit(bm, seq3, shortPrompt).prepopulatedLen, 2)
        << "never the last prompt token, which the engine computes";
}
