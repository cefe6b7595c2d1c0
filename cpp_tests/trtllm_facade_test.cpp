// The TensorRT-LLM facade (kvblock_trtllm.hpp): the executor's calls of one iteration, each
// checked against kvblock's own API driven through the same scenario on a twin manager, and
// one test per porting-table row where the facade's meaning differs from kvblock's own call.
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <thread>
#include <variant>

#include "kvblock_trtllm.hpp"
#include "test_support.hpp"

namespace {

using kvb::trtllm::KVCacheManager;
using kvb::trtllm::KVCacheRemovedData;
using kvb::trtllm::KVCacheStoredData;
using kvb::trtllm::Request;
using kvb_test::statusOf;
using kvb_test::tokenRun;

constexpr int32_t kTpb = 4;
constexpr int32_t kWindow = 64;
constexpr int32_t kPrimary = 40;
constexpr int32_t kSecondary = 8;
constexpr int32_t kExtra = 1;
constexpr int32_t kDraft = 2;

// The executor's construction: maxSequenceLength counts the extra and draft tokens.
std::unique_ptr<KVCacheManager> makeFacade(bool reuse = true, int32_t events = 1000) {
    auto eventManager = std::make_shared<kvb::trtllm::KVCacheEventManager>();
    eventManager->maxKVEventEntries = events;
    kvb::trtllm::KvblockOptions options;
    options.numExtraKvTokens = kExtra;
    options.maxDraftTokens = kDraft;
    auto m = std::make_unique<KVCacheManager>(
        std::vector<int32_t>{2, 2}, 8, kTpb,
        KVCacheManager::BlocksPerWindow{{kWindow, {kPrimary, kSecondary}}}, 8, 2,
        std::vector<int32_t>{kWindow}, 2, 0, nullptr, kWindow + kExtra + kDraft, 0, reuse,
        kvb::trtllm::CacheType::kSELF, std::nullopt, eventManager, true, true, options);
    m->allocatePools(false);
    return m;
}

// The same manager configured through kvblock's own API.
kvb::Manager makeTwin(bool reuse = true, int32_t events = 1000) {
    kvb::Config c;
    c.addWindow(kWindow, kPrimary, kSecondary, 2, 2, 8);
    c.raw.tokens_per_block = kTpb;
    c.raw.max_beam_width = 2;
    c.raw.max_sequence_length = kWindow;
    c.raw.num_extra_kv_tokens = kExtra;
    c.raw.max_draft_tokens = kDraft;
    c.raw.enable_block_reuse = reuse;
    c.raw.enable_partial_reuse = true;
    c.raw.copy_on_partial_reuse = true;
    c.raw.bytes_per_element = 2;
    c.raw.max_kv_event_entries = events;
    return kvb::Manager(c);
}

std::vector<std::reference_wrapper<kvb::trtllm::LlmRequest>> refs(
    std::initializer_list<Request*> rs) {
    std::vector<std::reference_wrapper<kvb::trtllm::LlmRequest>> out;
    for (Request* r : rs) out.emplace_back(*r);
    return out;
}

void admit(KVCacheManager& m, Request& r, int32_t beams = 1) {
    m.addSequenceBatch({{r.requestId, r.promptLen, beams}}, refs({&r}));
}

// A finished request: prompt computed, `generated` tokens appended through the facade.
void runToCompletion(KVCacheManager& m, Request& r, int32_t generated, int32_t firstToken) {
    admit(m, r);
    r.contextCurrentPosition = r.promptLen;
    m.storeContextBlocks(r);
    r.contextInit = false;
    r.generationInProgress = true;
    for (int32_t i = 0; i < generated; ++i) {
        r.addNewToken(firstToken + i);
        m.addToken(r.requestId);
        m.storeNewBlock(r);
    }
}

void expectSameStats(const kvb::trtllm::KvCacheStats& f, const kvb_kv_cache_stats_t& k) {
    EXPECT_EQ(f.maxNumBlocks, static_cast<int32_t>(k.max_num_blocks));
    EXPECT_EQ(f.freeNumBlocks, static_cast<int32_t>(k.free_num_blocks));
    EXPECT_EQ(f.usedNumBlocks, static_cast<int32_t>(k.used_num_blocks));
    EXPECT_EQ(f.allocTotalBlocks, static_cast<int32_t>(k.alloc_total_blocks));
    EXPECT_EQ(f.allocNewBlocks, static_cast<int32_t>(k.alloc_new_blocks));
    EXPECT_EQ(f.reusedBlocks, static_cast<int32_t>(k.reused_blocks));
    EXPECT_EQ(f.missedBlocks, static_cast<int32_t>(k.missed_blocks));
}

}  // namespace

// One executor iteration as resource_manager.py makes it, on the facade and (with kvblock's own
// calls) on a twin manager; every result the executor reads must agree.
TEST(TrtllmFacade, ExecutorIterationMatchesKvblock) {
    auto f = makeFacade();
    kvb::Manager k = makeTwin();

    // A finished request leaves its prompt in the tree, so the batch below reuses it.
    Request warm(1, tokenRun(100, 12), 4);
    runToCompletion(*f, warm, 2, 900);
    f->removeSequence(1, warm);
    k.addSequence(kvb::Request(1, tokenRun(100, 12)));
    k.storeContextBlocks(1, 12);
    k.resize(1, 13);
    k.addToken(1, 900);
    k.storeNewBlock(1);
    k.resize(1, 14);
    k.addToken(1, 901);
    k.storeNewBlock(1);
    k.removeSequence(1, true);
    expectSameStats(f->getKvCacheStats(), k.getKvCacheStats());

    // Admission batch: request 2 shares the warm prompt's first 8 tokens; request 3 is new and
    // runs two draft tokens; each gets the extra KV token.
    Request r2(2, kvb_test::concatTokens(tokenRun(100, 8), tokenRun(300, 5)), 8);
    Request r3(3, tokenRun(500, 9), 8);
    r3.numDraftTokens = kDraft;
    // Request 4 searches two beams.
    Request r4(4, tokenRun(700, 6), 4);
    r4.tokens.push_back(r4.tokens[0]);
    f->addSequenceBatch({{2, 13, 1}, {3, 9, 1}, {4, 6, 2}}, refs({&r2, &r3, &r4}));
    auto admitted =
        k.addSequenceBatch({kvb::Request(2, r2.tokens[0]), kvb::Request(3, r3.tokens[0]),
                            kvb::Request(4, r4.tokens[0]).withBeamWidth(2)});
    ASSERT_EQ(admitted.size(), 3u);
    auto beams = f->getCacheBlockIds(4, kWindow);
    ASSERT_EQ(beams.size(), 2u);
    for (int32_t b = 0; b < 2; ++b)
        EXPECT_EQ(beams[static_cast<size_t>(b)], k.getCacheBlockIds(4, kWindow, b));
    EXPECT_EQ(r2.prepopulatedPromptLen, admitted[0].prepopulated_prompt_len);
    EXPECT_EQ(r2.prepopulatedPromptLen, 8);
    EXPECT_EQ(r2.reusedBlocks, static_cast<int32_t>(admitted[0].stats.reused_blocks));
    EXPECT_EQ(r2.missedBlocks, static_cast<int32_t>(admitted[0].stats.missed_blocks));
    EXPECT_EQ(r2.allocTotalBlocks, static_cast<int32_t>(admitted[0].stats.alloc_total_blocks));
    EXPECT_EQ(r3.prepopulatedPromptLen, admitted[1].prepopulated_prompt_len);
    for (uint64_t id : {2u, 3u}) {
        f->addToken(id);  // the extra KV token
        k.resize(id, k.getSequenceLengths(id).capacity + 1);
    }
    for (int32_t d = 0; d < kDraft; ++d) f->addToken(3);  // draft-token slots
    k.resize(3, k.getSequenceLengths(3).capacity + kDraft);
    for (uint64_t id : {2u, 3u}) {
        EXPECT_EQ(f->getTokenCount(id), static_cast<int32_t>(k.getSequenceLengths(id).capacity));
        auto perBeam = f->getCacheBlockIds(id, kWindow);
        ASSERT_EQ(perBeam.size(), 1u);
        EXPECT_EQ(perBeam[0], k.getCacheBlockIds(id, kWindow, 0));
    }
    auto batch = f->getBatchCacheBlockIds({2, 3}, kWindow);
    EXPECT_EQ(batch[1][0], k.getCacheBlockIds(3, kWindow, 0));
    f->refreshBlocks();
    k.refreshBlocks();

    // The context step computes both prompts and samples one token each; request 3's drafts
    // are rejected.
    for (Request* r : {&r2, &r3}) {
        r->contextCurrentPosition = r->promptLen;
        f->storeContextBlocks(*r);
        k.storeContextBlocks(r->requestId, r->promptLen);
        r->contextInit = false;
        r->generationInProgress = true;
    }
    f->rewindKVCache(3, kDraft);
    k.resize(3, k.getSequenceLengths(3).capacity - kDraft);
    EXPECT_EQ(f->getTokenCount(3), static_cast<int32_t>(k.getSequenceLengths(3).capacity));

    // Decode reservations: the tokens sampled in the context step arrive with storeNewBlock.
    r2.addNewToken(700);
    r3.addNewToken(701);
    for (Request* r : {&r2, &r3}) {
        f->addToken(r->requestId);
        f->storeNewBlock(*r);
        auto l = k.getSequenceLengths(r->requestId);
        k.resize(r->requestId, l.capacity + 1);
        k.addTokenBatch({r->requestId}, {r->tokens[0].back()}, true);
        EXPECT_EQ(f->impl().getSequenceLengths(r->requestId).num_tokens,
                  k.getSequenceLengths(r->requestId).num_tokens);
        EXPECT_EQ(f->getCacheBlockIds(r->requestId, kWindow)[0],
                  k.getCacheBlockIds(r->requestId, kWindow, 0));
    }

    // Statistics and events.
    auto fs = f->getKvCacheStats();
    expectSameStats(fs, k.getKvCacheStats());
    EXPECT_EQ(fs.numFreeBlocksPerWindowSize.at(kWindow),
              static_cast<int32_t>(k.getNumFreeBlocksPerWindowSize(kWindow).first));
    auto iter = f->getIterationStats();
    ASSERT_EQ(iter.count(kWindow), 1u);
    EXPECT_EQ(iter.at(kWindow).iterAllocTotalBlocks,
              static_cast<int32_t>(k.getKvCacheStats().alloc_total_blocks));
    EXPECT_EQ(iter.at(kWindow).primaryFreeNumBlocks, fs.freeNumBlocks);
    f->flushIterationEvents();
    k.flushIterationEvents();
    auto fe = f->getLatestEvents(std::chrono::milliseconds(0));
    auto ke = k.getLatestEvents(0);
    ASSERT_EQ(fe.size(), ke.size());
    for (size_t i = 0; i < ke.size(); ++i) {
        // TensorRT-LLM's shape: the payload is a variant in kvblock's event-type order.
        EXPECT_EQ(fe[i].data.index(), static_cast<size_t>(ke[i].type));
        EXPECT_EQ(fe[i].eventId, ke[i].id);
        if (ke[i].type != KVB_EVENT_STORED) continue;
        auto const& stored = std::get<KVCacheStoredData>(fe[i].data);
        EXPECT_EQ(stored.parentHash, ke[i].parentHash);
        ASSERT_EQ(stored.blocks.size(), ke[i].storedBlocks.size());
        for (size_t b = 0; b < ke[i].storedBlocks.size(); ++b) {
            EXPECT_EQ(stored.blocks[b].blockHash, ke[i].storedBlocks[b].hash);
            EXPECT_EQ(stored.blocks[b].tokens.size(), ke[i].storedBlocks[b].tokens.size());
        }
    }

    // Removal with pinning (a disaggregated context request): the blocks outlive the sequence
    // until the executor unpins the ids it read before.
    auto ids2 = f->getCacheBlockIds(2, kWindow)[0];
    auto last = f->removeSequence(2, r2, /*pinOnRelease*/ true);
    ASSERT_TRUE(last.has_value());
    EXPECT_EQ(*last, ids2.back());
    k.pinBlocks(2);
    k.removeSequence(2, true);
    EXPECT_EQ(f->getNumFreeBlocks(), static_cast<int32_t>(k.getNumFreeBlocks()));
    f->unpinBlocksById(ids2);
    k.unpinBlocksById(kWindow, ids2);
    EXPECT_EQ(f->getNumFreeBlocks(), static_cast<int32_t>(k.getNumFreeBlocks()));
    f->removeSequence(3, r3);
    k.removeSequence(3, true);
    f->removeSequence(4);
    k.removeSequence(4, false);
    expectSameStats(f->getKvCacheStats(), k.getKvCacheStats());

    // Truncation keeps the warm prompt's first block; reset drops the rest.
    f->truncateBlocks(tokenRun(100, 12), kTpb);
    kvb::Request probe(9, tokenRun(100, 13));
    EXPECT_EQ(f->impl().countReusableBlocks(probe, kWindow), 1);
    EXPECT_EQ(k.countReusableBlocks(probe, kWindow), 3);
    f->resetReuseState();
    EXPECT_EQ(f->impl().countReusableBlocks(probe, kWindow), 0);
    EXPECT_EQ(f->getNumFreeBlocks(), static_cast<int32_t>(k.getNumFreeBlocks()));
    f->impl().checkInvariants();
}

// Row getPriorityByBlockId: TensorRT-LLM takes (blockId, windowSize); kvblock (window, block).
TEST(TrtllmFacade, PriorityByBlockIdTakesBlockThenWindow) {
    auto f = makeFacade();
    kvb::Request req(1, tokenRun(10, 9));
    req.withRange(0, -1, 80);
    f->impl().addSequence(req);
    int32_t block = f->getCacheBlockIds(1, kWindow)[0][0];
    EXPECT_EQ(f->getPriorityByBlockId(block, kWindow),
              f->impl().getPriorityByBlockId(kWindow, block));
    EXPECT_EQ(f->getPriorityByBlockId(block, kWindow), 80);
}

// Row unpinBlocksById: no window argument; every window's pins of the group are dropped.
TEST(TrtllmFacade, UnpinBlocksByIdNeedsNoWindow) {
    auto f = makeFacade();
    Request r(1, tokenRun(10, 9));
    admit(*f, r);
    int32_t freeBefore = f->getNumFreeBlocks();
    auto ids = f->getCacheBlockIds(1, kWindow)[0];
    f->pinBlocks(1);
    f->removeSequence(1);
    EXPECT_EQ(f->getNumFreeBlocks(), freeBefore);
    f->unpinBlocksById(ids);
    EXPECT_EQ(f->getNumFreeBlocks(), freeBefore + static_cast<int32_t>(ids.size()));
}

// Row 92: BlockManager::offloadBlock takes the block's id and the window (no BlockPtr, transfer
// mode or directory) and says whether the block moved; a block in use moves too, as
// TensorRT-LLM's does, and stays its sequence's until onboardBlock brings it back.
TEST(TrtllmFacade, OffloadBlockMovesAFreeCachedBlockByItsId) {
    auto f = makeFacade();
    Request r(1, tokenRun(10, 9));
    admit(*f, r);
    r.contextCurrentPosition = r.promptLen;
    f->storeContextBlocks(r);
    auto ids = f->getCacheBlockIds(1, kWindow)[0];
    auto const& bm = f->getBlockManager();
    ASSERT_TRUE(bm.offloadBlock(ids[0], kWindow)) << "in use";
    auto const block = bm.getBlockById(ids[0], kWindow);
    EXPECT_FALSE(block->isPrimary());
    EXPECT_EQ(f->getCacheBlockIds(1, kWindow)[0], ids);
    ASSERT_TRUE(bm.onboardBlock(ids[0], kWindow));
    EXPECT_TRUE(block->isPrimary());
    f->removeSequence(1, r);
    ASSERT_TRUE(bm.offloadBlock(ids[0], kWindow));
    EXPECT_EQ(f->impl().getBlockInfo(kWindow, ids[0]).cache_level, KVB_CACHE_LEVEL_SECONDARY);
    EXPECT_FALSE(bm.offloadBlock(ids[0], kWindow)) << "already on the host tier";
    // The offloaded block is still reused (onboarded) by the same prompt.
    Request again(2, tokenRun(10, 9));
    admit(*f, again);
    EXPECT_GE(again.prepopulatedPromptLen, kTpb);
}

// Row getCacheBlockIds: [beam][block] (kvblock: one beam per call); getBatchCacheBlockIds.
TEST(TrtllmFacade, CacheBlockIdsArePerBeam) {
    auto f = makeFacade();
    Request r(1, tokenRun(10, 10));
    admit(*f, r, /*beams*/ 2);
    auto perBeam = f->getCacheBlockIds(1, kWindow);
    ASSERT_EQ(perBeam.size(), 2u);
    EXPECT_EQ(perBeam[0], f->impl().getCacheBlockIds(1, kWindow, 0));
    EXPECT_EQ(perBeam[1], f->impl().getCacheBlockIds(1, kWindow, 1));
    EXPECT_NE(perBeam[0].back(), perBeam[1].back());  // the partial last block is per beam
    auto batch = f->getBatchCacheBlockIds({1, 1}, kWindow);
    ASSERT_EQ(batch.size(), 2u);
    EXPECT_EQ(batch[1], perBeam);
}

// Row addToken: a slot without a token (kvblock's addToken(id, token) appends a token).
TEST(TrtllmFacade, AddTokenReservesASlotWithoutAToken) {
    auto f = makeFacade();
    Request r(1, tokenRun(10, 8));
    admit(*f, r);
    int32_t blocks = static_cast<int32_t>(f->getCacheBlockIds(1, kWindow)[0].size());
    f->addToken(1);
    EXPECT_EQ(f->getTokenCount(1), 9);
    EXPECT_EQ(f->impl().getNumTokens(1), 8);  // no token id yet
    EXPECT_EQ(static_cast<int32_t>(f->getCacheBlockIds(1, kWindow)[0].size()), blocks + 1);
    r.addNewToken(42);
    f->syncTokens(r);
    EXPECT_EQ(f->impl().getNumTokens(1), 9);
    EXPECT_EQ(f->getTokenCount(1), 9);
    // A token the manager has no slot for waits for the next addToken.
    r.addNewToken(43);
    f->syncTokens(r);
    EXPECT_EQ(f->impl().getNumTokens(1), 9);
}

// Row addToken with beam search: a slot at a block boundary takes a block for every beam, as
// TensorRT-LLM's decode step does; the prompt's full blocks stay shared.
TEST(TrtllmFacade, AddTokenWithBeamSearchTakesABlockPerBeamAtABoundary) {
    auto f = makeFacade();
    Request r(1, tokenRun(10, kTpb + 2));
    admit(*f, r, /*beams*/ 2);
    auto const freeAfterAdmission = f->getNumFreeBlocks();
    for (int32_t slot = kTpb + 3; slot <= 2 * kTpb; ++slot) f->addToken(1);
    EXPECT_EQ(f->getNumFreeBlocks(), freeAfterAdmission) << "the beams' last blocks have room";
    f->addToken(1);
    EXPECT_EQ(f->getNumFreeBlocks(), freeAfterAdmission - 2) << "one new block per beam";
    auto const& ids = f->getCacheBlockIds(1, kWindow);
    ASSERT_EQ(ids.size(), 2u);
    ASSERT_EQ(ids[0].size(), 3u);
    ASSERT_EQ(ids[1].size(), 3u);
    EXPECT_EQ(ids[0][0], ids[1][0]) << "the prompt's full block is shared";
    EXPECT_NE(ids[0][2], ids[1][2]);
    EXPECT_EQ(f->getTokenCount(1), 2 * kTpb + 1);
    (void)f->removeSequence(1);
    EXPECT_EQ(f->getNumFreeBlocks(), freeAfterAdmission + 3);
}

// Row addSequenceBatch: (id, length, beam) tuples plus the requests; results written back.
TEST(TrtllmFacade, AddSequenceBatchWritesBackIntoRequests) {
    auto f = makeFacade();
    Request first(1, tokenRun(10, 13));
    runToCompletion(*f, first, 0, 0);
    f->removeSequence(1, first);
    Request a(2, tokenRun(10, 13));
    Request b(3, tokenRun(60, 5));
    f->addSequenceBatch({{2, 13, 1}, {3, 5, 1}}, refs({&a, &b}));
    EXPECT_EQ(a.prepopulatedPromptLen, 12);
    EXPECT_EQ(a.reusedBlocks, 3);
    EXPECT_EQ(a.prepopulatedPromptLen, f->impl().getRequestStats(2).prepopulated_prompt_len);
    EXPECT_EQ(b.prepopulatedPromptLen, 0);
    EXPECT_EQ(b.missedBlocks, 2);
    EXPECT_EQ(b.allocTotalBlocks,
              static_cast<int32_t>(f->impl().getRequestStats(3).stats.alloc_total_blocks));
}

// Row removeSequence: an unknown id is not an error (kvblock: KVB_STATUS_UNKNOWN_REQUEST).
TEST(TrtllmFacade, RemoveSequenceOfUnknownIdIsANoOp) {
    auto f = makeFacade();
    EXPECT_FALSE(f->removeSequence(77).has_value());
    EXPECT_EQ(statusOf([&] { f->impl().removeSequence(77); }), KVB_STATUS_UNKNOWN_REQUEST);
}

// Row removeSequence: storing is decided by passing the request, not by a flag.
TEST(TrtllmFacade, RemoveSequenceStoresOnlyWithARequest) {
    auto f = makeFacade();
    kvb::Request probe(9, tokenRun(10, 13));
    for (uint64_t id : {1u, 2u}) {
        Request r(id, tokenRun(10, 13));
        admit(*f, r);
        f->impl().advanceHistory(id, 13);  // computed, nothing stored yet
        if (id == 1) {
            EXPECT_FALSE(f->removeSequence(id).has_value());  // no request: not stored
            EXPECT_EQ(f->impl().countReusableBlocks(probe, kWindow), 0);
        } else {
            EXPECT_TRUE(f->removeSequence(id, r).has_value());
            EXPECT_EQ(f->impl().countReusableBlocks(probe, kWindow), 3);
        }
    }
}

// Row storeBlocksForReuse(id, request, pin): the request in the middle, the pinned ids back.
TEST(TrtllmFacade, StoreBlocksForReuseTakesTheRequestAndPins) {
    auto f = makeFacade();
    Request r(1, tokenRun(10, 13));
    runToCompletion(*f, r, 0, 0);
    auto pinned = f->storeBlocksForReuse(1, r, /*pinBlocks*/ true);
    EXPECT_EQ(pinned, f->getCacheBlockIds(1, kWindow)[0]);
    int32_t freeBefore = f->getNumFreeBlocks();
    f->removeSequence(1);
    EXPECT_EQ(f->getNumFreeBlocks(), freeBefore);
    f->unpinBlocksById(pinned);
    EXPECT_EQ(f->getNumFreeBlocks(), freeBefore + static_cast<int32_t>(pinned.size()));
}

// Rows storeContextBlocks / storeNewBlock: the request, whose position and tokens are read.
TEST(TrtllmFacade, StoreContextBlocksAndStoreNewBlockTakeTheRequest) {
    auto f = makeFacade();
    Request r(1, tokenRun(10, 7));
    admit(*f, r);
    r.contextCurrentPosition = 4;  // a first chunk of one block
    f->storeContextBlocks(r);
    EXPECT_EQ(f->impl().getSequenceLengths(1).history, 4u);
    r.contextCurrentPosition = 7;
    f->storeContextBlocks(r);
    r.contextInit = false;
    r.generationInProgress = true;
    r.addNewToken(50);
    f->addToken(1);
    f->storeNewBlock(r);  // token 50 completes block 1 (tokens 4..7)
    kvb::Request probe(9, kvb_test::concatTokens(tokenRun(10, 7), {50, 51}));
    EXPECT_EQ(f->impl().countReusableBlocks(probe, kWindow), 1);
    r.addNewToken(51);
    f->addToken(1);
    f->storeNewBlock(r);  // token 51 opens block 2: block 1 is stored now
    EXPECT_EQ(f->impl().countReusableBlocks(probe, kWindow), 2);
}

// Rows analyzePrefixReuse and the cachedSummary argument: one walk feeds both estimates.
TEST(TrtllmFacade, AnalyzePrefixReuseFeedsTheCachedEstimates) {
    auto f = makeFacade();
    Request holder(1, tokenRun(10, 17));
    runToCompletion(*f, holder, 0, 0);
    f->storeBlocksForReuse(1, holder);
    Request probe(2, kvb_test::concatTokens(tokenRun(10, 12), tokenRun(90, 6)));
    kvb::trtllm::VecUniqueTokens unique;
    for (int32_t t : probe.tokens[0]) unique.push_back({t, 0});
    auto summary = f->analyzePrefixReuse(unique, probe);
    EXPECT_EQ(summary.reusableBlocksAll, 3);
    EXPECT_EQ(summary.reusableBlocksAllocated, 3);  // sequence 1 still holds them
    ASSERT_TRUE(summary.firstNewBlock.has_value());
    EXPECT_EQ(*summary.firstNewBlock, 3);
    EXPECT_EQ(f->getNeededBlocksOneStep(probe, false, kWindow, summary),
              f->getNeededBlocksOneStep(probe, false, kWindow));
    EXPECT_EQ(f->getRemainingBlocksToCompletion(probe, kWindow, summary),
              f->getRemainingBlocksToCompletion(probe, kWindow));
    // One argument order everywhere: (request state, prompt, twoSteps, window) in C.
    kvb_request_state_t state{};
    kvb_request_state_init(&state);
    state.request_id = 2;
    state.prompt_len = 18;
    state.context_chunk_size = 18;
    state.max_new_tokens = 0;
    int32_t viaC = 0;
    kvb::Request c(2, probe.tokens[0]);
    c.withC([&](const kvb_request_t* cr) {
        kvb::check(kvb_manager_get_needed_blocks_one_step(f->impl().get(), &state, cr, false,
                                                          kWindow, &viaC));
    });
    EXPECT_EQ(viaC, f->getNeededBlocksOneStep(probe, false, kWindow));
    EXPECT_EQ(viaC, 5 - 3);  // ceil(18 / 4) blocks, 3 held by sequence 1
}

// Row getIterationStats: per-window deltas since the last call, the peak between calls, and
// the evictable gauge.
TEST(TrtllmFacade, IterationStatsAreDeltasWithPeaksAndGauges) {
    auto f = makeFacade();
    f->getIterationStats();
    Request r(1, tokenRun(10, 13));
    runToCompletion(*f, r, 0, 0);
    f->removeSequence(1, r);
    auto s = f->getIterationStats().at(kWindow);
    EXPECT_EQ(s.iterAllocTotalBlocks, 4);
    EXPECT_EQ(s.iterMissedBlocks, 4);
    EXPECT_EQ(s.primaryUsedNumBlocks, 0);
    EXPECT_EQ(s.primaryPeakUsedNumBlocks, 4);
    EXPECT_EQ(s.primaryEvictableNumBlocks, 3);  // the stored full blocks, free but cached
    auto again = f->getIterationStats().at(kWindow);
    EXPECT_EQ(again.iterAllocTotalBlocks, 0);
    EXPECT_EQ(again.primaryPeakUsedNumBlocks, 0);
    EXPECT_EQ(again.primaryEvictableNumBlocks, 3);
}

// Row getKvCacheStats: the per-window free map; plain writable fields.
TEST(TrtllmFacade, KvCacheStatsHasPerWindowFreeMapAndIsWritable) {
    auto f = makeFacade();
    auto s = f->getKvCacheStats();
    EXPECT_EQ(s.numFreeBlocksPerWindowSize.at(kWindow), kPrimary);
    EXPECT_EQ(s.maxNumBlocks, kPrimary + kSecondary);
    s.reusedBlocks = 5;
    s.cacheHitRate = 0.5f;
    EXPECT_EQ(s.reusedBlocks, 5);
    EXPECT_EQ(f->getMaxNumBlocks(), kPrimary + kSecondary);
    EXPECT_EQ(f->getUsedNumBlocks(), kSecondary);  // host blocks count as used, as there
}

// Row getNumFrontBlocksRemoved(id, window): sliding-window detaches per window.
TEST(TrtllmFacade, NumFrontBlocksRemovedCountsSlidingWindowDetaches) {
    kvb::trtllm::KvblockOptions options;
    KVCacheManager f(std::vector<int32_t>{2, 2}, 8, kTpb,
                     KVCacheManager::BlocksPerWindow{{8, {20, 0}}, {32, {20, 0}}}, 4, 1,
                     std::vector<int32_t>{8, 32}, 2, 0, nullptr, 32, 0, false,
                     kvb::trtllm::CacheType::kSELF, std::nullopt, nullptr, true, true, options);
    f.allocatePools();
    EXPECT_TRUE(f.isVariableWindow());
    EXPECT_EQ(f.getBlockManager().getFirstWindowSize(), 8);
    EXPECT_EQ(f.getBlockManager().getLastWindowSize(), 32);
    Request r(1, tokenRun(10, 8));
    admit(f, r);
    r.contextCurrentPosition = 8;
    f.storeContextBlocks(r);
    for (int32_t i = 0; i < 8; ++i) {
        r.addNewToken(100 + i);
        f.addToken(1);
        f.syncTokens(r);
    }
    EXPECT_GT(f.getNumFrontBlocksRemoved(1, 8), 0);
    EXPECT_EQ(f.getNumFrontBlocksRemoved(1, 32), 0);
}

// Row truncateBlocks(tokens, keep): the cached tail past `keep` tokens leaves the tree.
TEST(TrtllmFacade, TruncateBlocksDropsTheCachedTail) {
    auto f = makeFacade();
    Request r(1, tokenRun(10, 17));
    runToCompletion(*f, r, 0, 0);
    f->removeSequence(1, r);
    kvb::Request probe(9, tokenRun(10, 17));
    EXPECT_EQ(f->impl().countReusableBlocks(probe, kWindow), 4);
    f->truncateBlocks(tokenRun(10, 17), 5);  // keeps ceil(5 / 4) = 2 blocks
    EXPECT_EQ(f->impl().countReusableBlocks(probe, kWindow), 2);
    f->impl().checkInvariants();
}

// Row resetReuseState: nothing stays reusable; held blocks stay with their sequences.
TEST(TrtllmFacade, ResetReuseStateEmptiesTheTree) {
    auto f = makeFacade();
    Request a(1, tokenRun(10, 13));
    runToCompletion(*f, a, 0, 0);
    f->removeSequence(1, a);
    Request b(2, tokenRun(10, 13));
    admit(*f, b);
    EXPECT_EQ(b.prepopulatedPromptLen, 12);
    f->flushIterationEvents();
    (void)f->getLatestEvents(std::chrono::milliseconds(0));
    f->resetReuseState();
    kvb::Request probe(9, tokenRun(10, 13));
    EXPECT_EQ(f->impl().countReusableBlocks(probe, kWindow), 0);
    f->impl().checkInvariants();
    f->flushIterationEvents();
    size_t removed = 0;
    for (auto const& e : f->getLatestEvents(std::chrono::milliseconds(0)))
        if (auto const* r = std::get_if<KVCacheRemovedData>(&e.data))
            removed += r->blockHashes.size();
    EXPECT_EQ(removed, 3u);   // the three full prompt blocks
    f->removeSequence(2, b);  // stores again: the live sequence's blocks are still its own
    EXPECT_EQ(f->impl().countReusableBlocks(probe, kWindow), 3);
}

// Row commitAndGetBlockHashesForRequest: the hash chain equals the Stored events' hashes.
TEST(TrtllmFacade, CommittedHashesMatchStoredEvents) {
    auto f = makeFacade();
    Request r(1, tokenRun(10, 13));
    admit(*f, r);
    r.contextCurrentPosition = 13;
    f->impl().advanceHistory(1, 13);
    auto hashes = f->commitAndGetBlockHashesForRequest(r, kWindow);
    ASSERT_EQ(hashes.size(), 3u);
    f->flushIterationEvents();
    std::vector<int64_t> stored;
    for (auto const& e : f->getLatestEvents(std::chrono::milliseconds(0)))
        if (auto const* s = std::get_if<KVCacheStoredData>(&e.data))
            for (auto const& b : s->blocks) stored.push_back(static_cast<int64_t>(b.blockHash));
    EXPECT_EQ(hashes, stored);
}

// Row commitAndGetBlockHashesForRequest, a difference: with block reuse off nothing is committed
// and kvblock keeps no tokens to hash, so the chain is empty (TensorRT-LLM hashes the request's
// tokens anyway).
TEST(TrtllmFacade, CommittedHashesAreEmptyWithoutReuse) {
    auto f = makeFacade(/*reuse=*/false);
    Request r(1, tokenRun(10, 13));
    admit(*f, r);
    r.contextCurrentPosition = 13;
    f->impl().advanceHistory(1, 13);
    EXPECT_TRUE(f->commitAndGetBlockHashesForRequest(r, kWindow).empty());
}

// Row getMemoryPoolBlockIndicesByBlockIds: ids to GPU rows; -1 once a block moved to host.
TEST(TrtllmFacade, MemoryPoolIndicesFollowOffload) {
    auto f = makeFacade();
    Request r(1, tokenRun(10, 9));
    runToCompletion(*f, r, 0, 0);
    auto ids = f->getCacheBlockIds(1, kWindow)[0];
    f->removeSequence(1, r);
    auto rows = f->getMemoryPoolBlockIndicesByBlockIds(ids, kWindow);
    for (size_t i = 0; i < ids.size(); ++i)
        EXPECT_EQ(rows[i],
                  static_cast<int32_t>(f->impl().getBlockInfo(kWindow, ids[i]).memory_index));
    ASSERT_TRUE(f->impl().offloadBlock(kWindow, ids[0]));
    EXPECT_EQ(f->getMemoryPoolBlockIndicesByBlockIds({ids[0]}, kWindow)[0], -1);
}

// Rows findBlocksInReuseTreeByBlockKey(s): lookups by key, and the pinning overload.
TEST(TrtllmFacade, ReuseTreeLookupByKeyPins) {
    auto f = makeFacade();
    Request r(1, tokenRun(10, 13));
    runToCompletion(*f, r, 0, 0);
    auto ids = f->getCacheBlockIds(1, kWindow)[0];
    f->removeSequence(1, r);
    kvb::trtllm::BlockKey key;
    for (int32_t t : tokenRun(10, 12)) key.uniqueTokens.push_back({t, 0});
    auto& bm = f->getBlockManager();
    auto match = bm.findBlocksInReuseTreeByBlockKey(key, kWindow);
    ASSERT_TRUE(match.has_value());
    EXPECT_EQ(match->blockIds, std::vector<int32_t>(ids.begin(), ids.begin() + 3));
    std::vector<kvb::trtllm::BlockKey> perBlock(3);
    for (int b = 0; b < 3; ++b)
        for (int32_t t : tokenRun(10 + 4 * b, 4))
            perBlock[static_cast<size_t>(b)].uniqueTokens.push_back({t, 0});
    EXPECT_EQ(bm.findBlocksInReuseTreeByBlockKeys(perBlock, kWindow)->blockIds, match->blockIds);
    int32_t freeBefore = f->getNumFreeBlocks();
    std::vector<int32_t> pinned;
    auto held = bm.findBlocksInReuseTreeByBlockKey(key, kWindow, pinned);
    EXPECT_EQ(pinned, match->blockIds);
    EXPECT_EQ(f->getNumFreeBlocks(), freeBefore - 3);
    f->unpinBlocksById(pinned);
    EXPECT_EQ(f->getNumFreeBlocks(), freeBefore);
    kvb::trtllm::BlockKey other;
    other.uniqueTokens = {{1, 0}, {2, 0}, {3, 0}, {4, 0}};
    EXPECT_FALSE(bm.findBlocksInReuseTreeByBlockKey(other, kWindow).has_value());
}

// Rows isEnableBlockReuse / isEnablePartialReuse / isVariableWindow / pools per window.
TEST(TrtllmFacade, ConfigurationQueries) {
    auto f = makeFacade(/*reuse*/ false);
    EXPECT_FALSE(f->isEnableBlockReuse());
    EXPECT_TRUE(f->isEnablePartialReuse());
    EXPECT_FALSE(f->isVariableWindow());
    EXPECT_FALSE(f->isCrossKv());
    EXPECT_EQ(f->getNumPools(), 1);
    EXPECT_EQ(f->getBlockManager().getPoolWindowSize(0), kWindow);
    EXPECT_EQ(f->getBlockManager().getNumSecondaryBlocks(), kSecondary);
    EXPECT_EQ(f->getBlockManager().getNumFreeBlocksPerWindowSize().at(kWindow), kPrimary);
}

// Rows copyBatchBlockOffsets (slot offset) and getBlockOffsetsOfBatch (firstBatchSlotIdx).
TEST(TrtllmFacade, BatchBlockOffsetsTakeASlotOffset) {
    auto f = makeFacade();
    Request a(1, tokenRun(10, 9));
    Request b(2, tokenRun(40, 5));
    f->addSequenceBatch({{1, 9, 1}, {2, 5, 1}}, refs({&a, &b}));
    auto dims = f->getOffsetTableDimensions();
    kvb::trtllm::BlockOffsetsTensor batch{
        std::vector<int32_t>(static_cast<size_t>(dims.numPools * 6 * 2 * dims.maxBlocksPerSeq), -7),
        6};
    f->copyBatchBlockOffsets(batch, {1, 2}, 1, 3);
    kvb::trtllm::BlockOffsetsTensor one{batch.data, 6};
    std::fill(one.data.begin(), one.data.end(), -7);
    f->copyBlockOffsets(one, 3, 1);
    f->copyBlockOffsets(one, 4, 2);
    EXPECT_EQ(batch.data, one.data);
    kvb::trtllm::BlockOffsetsTensor bySlot{std::vector<int32_t>(batch.data.size(), -7), 6};
    f->getBlockOffsetsOfBatch(bySlot, 1, 2, 1);  // ids 1 and 2 at slots 0 and 1
    kvb::trtllm::BlockOffsetsTensor ref{std::vector<int32_t>(batch.data.size(), -7), 6};
    f->impl().getBlockOffsetsOfBatch(ref.data, 6, {1, 2}, 1);
    EXPECT_EQ(bySlot.data, ref.data);
}

// Rows allocatePools / releasePools: no manager before, none after.
TEST(TrtllmFacade, PoolsAreMadeOnFirstUseAndForgottenOnRelease) {
    KVCacheManager f(std::vector<int32_t>{1}, 8, kTpb,
                     KVCacheManager::BlocksPerWindow{{16, {10, 0}}}, 4, 1, std::vector<int32_t>{16},
                     2, 0, nullptr, 16);
    // TensorRT-LLM admits sequences before allocatePools(): the manager is made on first use.
    EXPECT_EQ(f.getNumFreeBlocks(), 10);
    EXPECT_EQ(statusOf([&] { f.allocatePools(true); }), KVB_STATUS_UNSUPPORTED);
    f.allocatePools();
    Request r(1, tokenRun(0, 9));
    admit(f, r);
    EXPECT_EQ(f.getNumFreeBlocks(), 7);
    EXPECT_TRUE(f.hasSequence(1));
    f.releasePools();  // forgets every sequence and cached block
    EXPECT_FALSE(f.hasSequence(1));
    EXPECT_EQ(f.getNumFreeBlocks(), 10);
}

// Row constructor: maxSequenceLength counts extra and draft tokens (kvblock takes them apart).
TEST(TrtllmFacade, MaxSequenceLengthIncludesExtraAndDraftTokens) {
    auto f = makeFacade();
    kvb::Manager k = makeTwin();
    EXPECT_EQ(f->getMaxBlocksPerSeq(), k.getOffsetTableDimensions().first);
    EXPECT_EQ(f->getMaxBlocksPerSeq(), (kWindow + kExtra + kDraft + kTpb - 1) / kTpb);
    EXPECT_EQ(statusOf([&] {
                  KVCacheManager bad(std::vector<int32_t>{1, 2}, 8, kTpb,
                                     KVCacheManager::BlocksPerWindow{{16, {10, 0}}}, 4, 1,
                                     std::vector<int32_t>{16}, 2, /*sinkTokenLength*/ 1, nullptr,
                                     16);
              }),
              KVB_STATUS_UNSUPPORTED);  // sink tokens (per-layer heads: trtllm_facade_pools_test)
}

// Row getLatestEvents: no timeout waits for an event, but returns at once with events off.
TEST(TrtllmFacade, LatestEventsWithoutTimeout) {
    auto f = makeFacade(true, /*events*/ 0);
    EXPECT_TRUE(f->getLatestEvents().empty());
    auto g = makeFacade();
    g->flushIterationEvents();  // the Created event
    EXPECT_FALSE(g->getLatestEvents().empty());
}

// Rows calculateMaxBlockRequirements(PerBeam) / calculateMaxAttentionWindow /
// getSinkBubbleLength: TensorRT-LLM's argument lists (with the sink length, which must be 0).
TEST(TrtllmFacade, StaticSizingHelpersTakeTheSinkArgument) {
    int32_t perBeam = 0, total = 0, window = 0;
    ASSERT_EQ(kvb_calculate_max_block_requirements_per_beam(100, 64, kTpb, &perBeam), KVB_OK);
    ASSERT_EQ(kvb_calculate_max_block_requirements(60, 40, 64, 2, kTpb, &total), KVB_OK);
    ASSERT_EQ(kvb_calculate_max_attention_window(60, 40, 30, 2, kTpb, &window), KVB_OK);
    EXPECT_EQ(KVCacheManager::calculateMaxBlockRequirementsPerBeam(100, 0, 64, kTpb), perBeam);
    EXPECT_EQ(KVCacheManager::calculateMaxBlockRequirements(60, 40, 0, 64, 2, kTpb), total);
    EXPECT_EQ(KVCacheManager::calculateMaxAttentionWindow(60, 40, 0, 30, 2, kTpb), window);
    EXPECT_EQ(KVCacheManager::getSinkBubbleLength(0, kTpb), 0);
    // Sink tokens: the bubble pads them to a block; the per-beam requirement counts it, and
    // a sequence longer than the window holds one extra block.
    EXPECT_EQ(KVCacheManager::getSinkBubbleLength(4, kTpb), 0);
    EXPECT_EQ(KVCacheManager::getSinkBubbleLength(5, kTpb), 3);
    EXPECT_EQ(KVCacheManager::calculateMaxBlockRequirementsPerBeam(20, 5, 64, kTpb), 6);
    EXPECT_EQ(KVCacheManager::calculateMaxBlockRequirementsPerBeam(100, 5, 64, kTpb), 18);
    EXPECT_EQ(statusOf([] { (void)KVCacheManager::getSinkBubbleLength(-1, kTpb); }),
              KVB_STATUS_INVALID_ARGUMENT);
}

// Rows BlockManager::getBlockById (a snapshot) and getAndResetIterationStats.
TEST(TrtllmFacade, BlockManagerSnapshotsAndIterationStats) {
    auto f = makeFacade();
    Request r(1, tokenRun(10, 9));
    admit(*f, r);
    int32_t block = f->getCacheBlockIds(1, kWindow)[0][0];
    kvb_block_info_t info = f->getBlockManager().getBlockById(block, kWindow);
    EXPECT_EQ(info.ref_count, 1);
    EXPECT_FALSE(info.is_free);
    auto stats = f->getBlockManager().getAndResetIterationStats();
    EXPECT_EQ(stats.at(kWindow).iterAllocTotalBlocks, 3);
    EXPECT_EQ(f->getIterationStats().at(kWindow).iterAllocTotalBlocks, 0);
}

// Row findBlocksInReuseTreeByBlockKey(…, pinnedBlockIds): safe from a cache-transceiver thread
// while the executor keeps admitting and releasing.
TEST(TrtllmFacade, PinningLookupsFromAnotherThread) {
    auto f = makeFacade();
    Request r(1, tokenRun(10, 13));
    runToCompletion(*f, r, 0, 0);
    f->removeSequence(1, r);
    const int32_t freeBefore = f->getNumFreeBlocks();
    kvb::trtllm::BlockKey key;
    for (int32_t t : tokenRun(10, 12)) key.uniqueTokens.push_back({t, 0});
    std::thread transceiver([&] {
        for (int i = 0; i < 200; ++i) {
            std::vector<int32_t> pinned;
            auto match = f->getBlockManager().findBlocksInReuseTreeByBlockKey(key, kWindow, pinned);
            if (!pinned.empty()) f->unpinBlocksById(pinned);
        }
    });
    for (uint64_t id = 100; id < 300; ++id) {
        Request other(id, kvb_test::concatTokens(tokenRun(10, 8),
                                                 tokenRun(static_cast<int32_t>(id) * 10, 5)));
        admit(*f, other);
        f->removeSequence(id);
    }
    transceiver.join();
    f->impl().checkInvariants();
    EXPECT_EQ(f->getNumFreeBlocks(), freeBefore);
    kvb::Request probe(9, tokenRun(10, 13));
    EXPECT_EQ(f->impl().countReusableBlocks(probe, kWindow), 3);
}
