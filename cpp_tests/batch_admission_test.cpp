// Batched admission (the bug fixed by TensorRT-LLM PRs #12878/#12892 → #13029).
//
// The bug: a scheduler budgets a batch with per-request reuse estimates, then the executor admits
// the requests one by one. Request A's misses (or the helper block taken to onboard A's host
// blocks) come from the LRU front of the free queue, which may hold cached blocks request B was
// counted on reusing; with a host tier, A's eviction offloads into a host block that may hold B's
// cached content. B then reuses less than estimated and computes (and allocates) more.
//
// The fix: `addSequenceBatch` claims every reusable block of every request of the batch (phase 1)
// before anything is onboarded, copied or allocated (phase 2), and `estimateBatch` predicts exactly
// what it delivers. These tests pin that contract down through the C ABI: the bug's regression,
// estimate == delivery, sharing and take-over inside one batch, protected copy sources, key
// partitioning, all-or-nothing failure, longest-prefix admission, bad input, per-request stats and
// the events of the batch path.
//
// Every scenario uses 4 tokens per block. Block ids are window-local: 0..P-1 start with primary
// rows, P..P+S-1 with host rows. A prompt of n tokens has ceil(n/4) context blocks and its reuse
// keys cover n-1 tokens (the last prompt token is never reused).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "kvblock.hpp"
#include "test_support.hpp"

namespace {

constexpr int32_t kTpb = 4;
constexpr int32_t kFull = 64;  // full-attention window = maximum sequence length
constexpr int32_t kSliding = 32;

kvb::Config batchConfig(int32_t primary, int32_t secondary, int32_t eventEntries = 0) {
    kvb::Config c = kvb_test::windowConfig(kFull, primary, secondary, kTpb, kFull);
    c.raw.max_beam_width = 2;
    c.raw.max_kv_event_entries = eventEntries;
    return c;
}

// Two windows (32 and 64 tokens) with the same capacity; every prompt here fits both.
kvb::Config twoWindowConfig(int32_t primary, int32_t secondary, int32_t eventEntries = 0) {
    kvb::Config c = kvb_test::windowConfig(kSliding, primary, secondary, kTpb, kFull);
    c.addWindow(kFull, primary, secondary);
    c.raw.max_kv_event_entries = eventEntries;
    return c;
}

// Host copy backend: rows of [2 layers][K|V][2 heads][4 tokens][4 elements] × 2 bytes.
constexpr int32_t kLayers = 2;
constexpr int32_t kHeads = 2;
constexpr int32_t kHeadSize = 4;
constexpr size_t kTokenBytes = static_cast<size_t>(kHeadSize) * 2;
constexpr size_t kSlabBytes = kTokenBytes * kTpb;
constexpr size_t kSlabs = static_cast<size_t>(kLayers) * 2 * kHeads;

kvb::Config hostDataConfig(int32_t primary, int32_t secondary = 0) {
    kvb::Config c;
    c.addWindow(kFull, primary, secondary, kLayers, kHeads, kHeadSize);
    c.raw.tokens_per_block = kTpb;
    c.raw.max_sequence_length = kFull;
    c.raw.bytes_per_element = 2;
    c.raw.copy_backend = KVB_COPY_BACKEND_HOST;
    return c;
}

using kvb_test::concatTokens;
using kvb_test::expectSameStats;
using kvb_test::statusOf;
using kvb_test::tokenRun;

// Admits `request`, computes its prompt (kvb_test::markPrefillComputed), then removes it storing
// its blocks for reuse; returns its block ids (window `window`) as they were while it ran.
std::vector<int32_t> storeForReuse(kvb::Manager& m, const kvb::Request& request,
                                   int32_t window = kFull) {
    m.addSequence(request);
    std::vector<int32_t> ids = m.getCacheBlockIds(request.id, window);
    kvb_test::markPrefillComputed(m, request.id);
    m.removeSequence(request.id, true);
    return ids;
}

void expectSameBlock(const kvb_block_info_t& a, const kvb_block_info_t& b,
                     const std::string& what) {
    EXPECT_EQ(a.cache_level, b.cache_level) << what;
    EXPECT_EQ(a.memory_index, b.memory_index) << what;
    EXPECT_EQ(a.ref_count, b.ref_count) << what;
    EXPECT_EQ(a.priority, b.priority) << what;
    EXPECT_EQ(a.in_reuse_tree, b.in_reuse_tree) << what;
    EXPECT_EQ(a.is_leaf, b.is_leaf) << what;
    EXPECT_EQ(a.is_free, b.is_free) << what;
    EXPECT_EQ(a.num_tokens, b.num_tokens) << what;
    EXPECT_EQ(a.hash, b.hash) << what;
    EXPECT_EQ(a.parent, b.parent) << what;
}

// Everything observable about a manager that a failed call must leave unchanged.
struct Snapshot {
    kvb_kv_cache_stats_t stats{};
    int64_t numFree = 0;
    std::vector<std::pair<int64_t, int64_t>> freePerWindow;
    std::vector<std::vector<kvb_block_info_t>> blocks;  // per window, every block id
};

Snapshot snapshot(const kvb::Manager& m, const std::vector<int32_t>& windows,
                  int32_t blocksPerWindow) {
    Snapshot s;
    s.stats = m.getKvCacheStats();
    s.numFree = m.getNumFreeBlocks();
    for (int32_t w : windows) {
        s.freePerWindow.push_back(m.getNumFreeBlocksPerWindowSize(w));
        std::vector<kvb_block_info_t> infos;
        for (int32_t b = 0; b < blocksPerWindow; ++b) infos.push_back(m.getBlockInfo(w, b));
        s.blocks.push_back(infos);
    }
    return s;
}

void expectSameSnapshot(const Snapshot& a, const Snapshot& b, const std::vector<int32_t>& windows) {
    expectSameStats(a.stats, b.stats);
    EXPECT_EQ(a.numFree, b.numFree);
    ASSERT_EQ(a.freePerWindow.size(), b.freePerWindow.size());
    for (size_t w = 0; w < a.freePerWindow.size(); ++w) {
        EXPECT_EQ(a.freePerWindow[w], b.freePerWindow[w]) << "window " << windows[w];
        for (size_t blk = 0; blk < a.blocks[w].size(); ++blk) {
            expectSameBlock(
                a.blocks[w][blk], b.blocks[w][blk],
                "window " + std::to_string(windows[w]) + " block " + std::to_string(blk));
        }
    }
}

// Estimates `batch`, admits it, and checks that every figure of the estimate was delivered:
// reused tokens, allocations, reused/missed blocks per request, the whole-manager counters and
// the drop in free primary blocks.
std::vector<kvb_admission_t> admitAsEstimated(kvb::Manager& m,
                                              const std::vector<kvb::Request>& batch) {
    const std::vector<kvb_batch_estimate_t> est = m.estimateBatch(batch);
    const kvb_kv_cache_stats_t before = m.getKvCacheStats();
    const std::vector<kvb_admission_t> res = m.addSequenceBatch(batch);
    const kvb_kv_cache_stats_t after = m.getKvCacheStats();
    EXPECT_EQ(res.size(), batch.size());
    uint64_t allocated = 0, reused = 0, missed = 0, consumed = 0;
    for (size_t i = 0; i < res.size() && i < est.size(); ++i) {
        const std::string what = "request " + std::to_string(batch[i].id);
        EXPECT_TRUE(est[i].fits) << what;
        EXPECT_EQ(est[i].reusable_tokens, res[i].prepopulated_prompt_len) << what;
        EXPECT_EQ(static_cast<uint64_t>(est[i].allocated_blocks), res[i].stats.alloc_total_blocks)
            << what;
        EXPECT_EQ(static_cast<uint64_t>(est[i].reused_blocks), res[i].stats.reused_blocks) << what;
        EXPECT_EQ(static_cast<uint64_t>(est[i].missed_blocks), res[i].stats.missed_blocks) << what;
        allocated += static_cast<uint64_t>(est[i].allocated_blocks);
        reused += static_cast<uint64_t>(est[i].reused_blocks);
        missed += static_cast<uint64_t>(est[i].missed_blocks);
        consumed += static_cast<uint64_t>(est[i].free_blocks_consumed);
    }
    EXPECT_EQ(after.alloc_total_blocks - before.alloc_total_blocks, allocated);
    EXPECT_EQ(after.reused_blocks - before.reused_blocks, reused);
    EXPECT_EQ(after.missed_blocks - before.missed_blocks, missed);
    EXPECT_EQ(before.free_num_blocks - after.free_num_blocks, consumed)
        << "free primary blocks consumed by the batch";
    return res;
}

// ---- Host-memory data helpers -----------------------------------------------------------------

uint8_t* rowOf(kvb::Manager& m, int32_t block) {
    const kvb_block_info_t info = m.getBlockInfo(kFull, block);
    auto pool = m.getPoolPointer(kFull, static_cast<kvb_cache_level_t>(info.cache_level));
    EXPECT_EQ(pool.second, kSlabBytes * kSlabs);
    return pool.first + static_cast<size_t>(info.memory_index) * pool.second;
}

void fillRow(kvb::Manager& m, int32_t block, uint8_t seed) {
    uint8_t* row = rowOf(m, block);
    for (size_t i = 0; i < kSlabBytes * kSlabs; ++i) row[i] = static_cast<uint8_t>(seed + i * 7);
}

// True when the first `tokens` tokens of every slab of `block` hold the pattern `seed`.
bool rowStartsWith(kvb::Manager& m, int32_t block, uint8_t seed, int32_t tokens) {
    const uint8_t* row = rowOf(m, block);
    for (size_t s = 0; s < kSlabs; ++s) {
        for (size_t i = s * kSlabBytes;
             i < s * kSlabBytes + static_cast<size_t>(tokens) * kTokenBytes; ++i) {
            if (row[i] != static_cast<uint8_t>(seed + i * 7)) return false;
        }
    }
    return true;
}

// ---- The bug's starting state ------------------------------------------------------------------

// Starting state, eviction variant (P = 6, S = 1): a chain x0 -> x1 holding tokens 0..8 is cached
// and free, and sits at the LRU front behind one unkeyed block; the three blocks behind them are
// free but hold nothing reusable. Returns {x0, x1}.
std::vector<int32_t> cachedChainAtLruFront(kvb::Manager& m) {
    std::vector<int32_t> x = storeForReuse(m, kvb::Request(1, tokenRun(0, 9)));
    m.addSequence(kvb::Request(2, tokenRun(1000, 12)));
    m.removeSequence(2, false);  // released behind the cached chain, nothing stored
    return {x[0], x[1]};
}

// Starting state, host variant (P = 4, S = 2): cached blocks a (tokens 100..103) and b
// (200..203) live on host rows, b at the front of the host queue; a cached primary block c
// (300..303) is at the front of the primary queue, so the next allocation offloads c into the
// front host block. Returns {a, b, c}.
std::vector<int32_t> hostBlocksBehindOffloadableFront(kvb::Manager& m) {
    const int32_t a = storeForReuse(m, kvb::Request(1, tokenRun(100, 5)))[0];
    const int32_t b = storeForReuse(m, kvb::Request(2, tokenRun(200, 5)))[0];
    EXPECT_TRUE(m.offloadBlock(kFull, b));
    EXPECT_TRUE(m.offloadBlock(kFull, a));
    const int32_t c = storeForReuse(m, kvb::Request(3, tokenRun(300, 5)))[0];
    m.addSequence(kvb::Request(4, tokenRun(400, 9)));
    m.removeSequence(4, false);
    return {a, b, c};
}

}  // namespace

// ---- The bug's regression -----------------------------------------------------------------------

// The bug, eviction variant: the scheduler's per-request estimate says B reuses two blocks (8
// tokens). Admitted sequentially, A's three misses take the LRU front (an unkeyed block, then
// x1 and x0, offloaded to the single host block, the second offload evicting the first), so B
// finds only x0 and reuses 4 tokens — the shortfall that overflowed max-num-tokens upstream.
// addSequenceBatch on the same state claims x0 and x1 for B before A allocates: B reuses exactly
// its stand-alone estimate and both requests get exactly estimateBatch's figures.
TEST(AddSequenceBatchRegression, SequentialAdmissionLosesReuseTheBatchKeeps) {
    const kvb::Request a(10, tokenRun(2000, 9));
    const kvb::Request b(11, concatTokens(tokenRun(0, 8), {500, 501}));

    kvb::Manager seq(batchConfig(6, 1));
    cachedChainAtLruFront(seq);
    EXPECT_EQ(seq.countReusableBlocks(b, kFull), 2);
    const int32_t standalone = seq.estimateBatch({b})[0].reusable_tokens;
    EXPECT_EQ(standalone, 8);
    seq.addSequence(a);
    const kvb_admission_t bSequential = seq.addSequence(b);
    EXPECT_LT(bSequential.prepopulated_prompt_len, standalone)
        << "sequential admission: A's allocations evicted reuse B was counted on";
    EXPECT_EQ(bSequential.prepopulated_prompt_len, 4);
    seq.checkInvariants();

    kvb::Manager batched(batchConfig(6, 1));
    const std::vector<int32_t> x = cachedChainAtLruFront(batched);
    EXPECT_EQ(batched.estimateBatch({b})[0].reusable_tokens, standalone);
    const std::vector<kvb_admission_t> res = admitAsEstimated(batched, {a, b});
    ASSERT_EQ(res.size(), 2u);
    EXPECT_EQ(res[0].prepopulated_prompt_len, 0);
    EXPECT_EQ(res[1].prepopulated_prompt_len, standalone);
    const std::vector<int32_t> bIds = batched.getCacheBlockIds(b.id, kFull);
    EXPECT_EQ(bIds[0], x[0]);
    EXPECT_EQ(bIds[1], x[1]);
    EXPECT_EQ(batched.getKvCacheStats().offloaded_blocks, 0u) << "nothing B reuses was evicted";
    batched.checkInvariants();
}

// The bug, host-offload variant: A and B each reuse one host block. Sequentially, onboarding
// A's block takes a primary helper block from the LRU front — the cached block c, offloadable —
// so c is offloaded into the front host block, which holds B's content: B's block is evicted and
// B reuses nothing. In a batch both host blocks are claimed first (out of the host queue), so
// the offload cannot pick B's block and B reuses its stand-alone estimate.
TEST(AddSequenceBatchRegression, OnboardingEvictsHostBlockOfLaterRequestOnlySequentially) {
    const kvb::Request a(10, concatTokens(tokenRun(100, 4), {150}));
    const kvb::Request b(11, concatTokens(tokenRun(200, 4), {250}));

    kvb::Manager seq(batchConfig(4, 2));
    const std::vector<int32_t> s = hostBlocksBehindOffloadableFront(seq);
    EXPECT_EQ(seq.getBlockInfo(kFull, s[1]).cache_level, KVB_CACHE_LEVEL_SECONDARY);
    EXPECT_EQ(seq.countReusableBlocks(b, kFull), 1);
    const int32_t standalone = seq.estimateBatch({b})[0].reusable_tokens;
    EXPECT_EQ(standalone, 4);
    EXPECT_EQ(seq.addSequence(a).prepopulated_prompt_len, 4);
    EXPECT_FALSE(seq.getBlockInfo(kFull, s[1]).in_reuse_tree)
        << "A's onboarding evicted B's host block";
    const kvb_admission_t bSequential = seq.addSequence(b);
    EXPECT_LT(bSequential.prepopulated_prompt_len, standalone);
    EXPECT_EQ(bSequential.prepopulated_prompt_len, 0);
    seq.checkInvariants();

    kvb::Manager batched(batchConfig(4, 2));
    const std::vector<int32_t> h = hostBlocksBehindOffloadableFront(batched);
    const std::vector<kvb_admission_t> res = admitAsEstimated(batched, {a, b});
    ASSERT_EQ(res.size(), 2u);
    EXPECT_EQ(res[0].prepopulated_prompt_len, 4);
    EXPECT_EQ(res[1].prepopulated_prompt_len, standalone);
    for (int i = 0; i < 2; ++i) {
        const kvb_block_info_t info = batched.getBlockInfo(kFull, h[static_cast<size_t>(i)]);
        EXPECT_EQ(info.cache_level, KVB_CACHE_LEVEL_PRIMARY) << "onboarded";
        EXPECT_EQ(info.ref_count, 1);
        EXPECT_TRUE(info.in_reuse_tree);
    }
    EXPECT_EQ(batched.getCacheBlockIds(a.id, kFull)[0], h[0]);
    EXPECT_EQ(batched.getCacheBlockIds(b.id, kFull)[0], h[1]);
    EXPECT_EQ(batched.getKvCacheStats().onboarded_blocks, 2u);
    batched.checkInvariants();
}

// ---- Estimates equal delivery -------------------------------------------------------------------

// estimateBatch then addSequenceBatch on the same state deliver the same figures, for a batch
// that exercises every kind of step: shared free cached blocks, shared host blocks (onboarded),
// a partially matched free leaf taken over, a partial copy of a block a running sequence holds,
// a beam-search request sharing blocks another request of the batch claimed, and plain misses.
TEST(AddSequenceBatchEstimateTest, EstimatesEqualDelivery) {
    kvb::Manager m(batchConfig(24, 4));
    storeForReuse(m, kvb::Request(1, tokenRun(0, 13)));    // 3 full blocks
    storeForReuse(m, kvb::Request(2, tokenRun(100, 11)));  // 2 full + leaf [108,109]
    const std::vector<int32_t> h = storeForReuse(m, kvb::Request(3, tokenRun(200, 9)));
    EXPECT_TRUE(m.offloadBlock(kFull, h[1]));
    EXPECT_TRUE(m.offloadBlock(kFull, h[0]));
    m.addSequence(kvb::Request(4, tokenRun(300, 9)));  // running, blocks stored
    m.storeContextBlocks(4, 9);

    const std::vector<kvb::Request> batch = {
        kvb::Request(10, concatTokens(tokenRun(0, 12), {900, 901})),
        kvb::Request(11, concatTokens(tokenRun(100, 9), {950, 951, 952})),
        kvb::Request(12, concatTokens(tokenRun(200, 8), {960})),
        kvb::Request(13, concatTokens(tokenRun(300, 6), {970, 971, 972})),
        kvb::Request(14, tokenRun(0, 13)).withBeamWidth(2),
        kvb::Request(15, tokenRun(5000, 7)),
    };
    const std::vector<kvb_admission_t> res = admitAsEstimated(m, batch);
    ASSERT_EQ(res.size(), batch.size());
    const std::vector<int32_t> expectedReuse = {12, 9, 8, 6, 12, 0};
    for (size_t i = 0; i < res.size(); ++i) {
        EXPECT_EQ(res[i].prepopulated_prompt_len, expectedReuse[i]) << "request " << batch[i].id;
    }
    m.checkInvariants();
}

// The same with two windows (32 and 64 tokens): estimates and counters sum both windows, and
// the reused length is the same in each.
TEST(AddSequenceBatchEstimateTest, EstimatesEqualDeliveryWithSeveralWindows) {
    kvb::Manager m(twoWindowConfig(20, 0));
    storeForReuse(m, kvb::Request(1, tokenRun(0, 13)));
    storeForReuse(m, kvb::Request(2, tokenRun(100, 11)));
    m.addSequence(kvb::Request(4, tokenRun(300, 9)));
    m.storeContextBlocks(4, 9);

    const std::vector<kvb::Request> batch = {
        kvb::Request(10, concatTokens(tokenRun(0, 12), {900, 901})),
        kvb::Request(11, concatTokens(tokenRun(100, 9), {950, 951, 952})),
        kvb::Request(13, concatTokens(tokenRun(300, 6), {970, 971, 972})),
        kvb::Request(15, tokenRun(5000, 7)),
    };
    const std::vector<kvb_admission_t> res = admitAsEstimated(m, batch);
    ASSERT_EQ(res.size(), batch.size());
    EXPECT_EQ(res[0].prepopulated_prompt_len, 12);
    EXPECT_EQ(res[0].stats.reused_blocks, 6u) << "3 blocks in each window";
    EXPECT_EQ(res[1].prepopulated_prompt_len, 9);
    EXPECT_EQ(res[2].prepopulated_prompt_len, 6);
    EXPECT_EQ(res[3].prepopulated_prompt_len, 0);
    for (int32_t w : {kSliding, kFull}) {
        EXPECT_EQ(m.getCacheBlockIds(10, w).size(), 4u) << "window " << w;
    }
    m.checkInvariants();
}

// Windows that hold different prefixes: the 32-token window (no host tier) dropped x2 under
// allocation pressure while the 64-token window offloaded it to a host row, and both hold the
// partial leaf L = [8, 9] beside it. Every window reuses the minimum over windows (10 tokens): in
// the 32-token window Q takes L over and R, later in the batch, copies from it; in the 64-token
// window both copy the first 2 tokens of the host block x2 instead of sharing it. The estimate
// is what is delivered, and x2 goes back to the host queue, still cached.
TEST(AddSequenceBatchEstimateTest, WindowsWithDifferentPrefixesReuseTheSameLength) {
    kvb::Config cfg;
    cfg.addWindow(kSliding, 10, 0);
    cfg.addWindow(kFull, 10, 4);
    cfg.raw.tokens_per_block = kTpb;
    cfg.raw.max_sequence_length = kFull;
    kvb::Manager m(cfg);
    m.addSequence(kvb::Request(1, tokenRun(0, 13)));
    m.addSequence(kvb::Request(2, tokenRun(0, 11)));
    const int32_t x2 = m.getCacheBlockIds(1, kFull)[2];
    kvb_test::markPrefillComputed(m, 1);
    m.removeSequence(1, true);  // x0, x1, x2
    kvb_test::markPrefillComputed(m, 2);
    m.removeSequence(2, true);  // L = [8, 9] under x1
    m.addSequence(
        kvb::Request(3, tokenRun(1000, 20)));  // evicts x2: dropped in 32, offloaded in 64
    m.removeSequence(3, false);
    ASSERT_FALSE(m.getBlockInfo(kSliding, x2).in_reuse_tree);
    ASSERT_TRUE(m.getBlockInfo(kFull, x2).in_reuse_tree);
    ASSERT_EQ(m.getBlockInfo(kFull, x2).cache_level, KVB_CACHE_LEVEL_SECONDARY);

    const kvb::Request q(10, concatTokens(tokenRun(0, 12), {5}));
    const kvb::Request r(11, concatTokens(tokenRun(0, 12), {6}));
    const std::vector<kvb_admission_t> res = admitAsEstimated(m, {q, r});
    ASSERT_EQ(res.size(), 2u);
    EXPECT_EQ(res[0].prepopulated_prompt_len, 10);
    EXPECT_EQ(res[1].prepopulated_prompt_len, 10);
    for (uint64_t id : {q.id, r.id}) {
        EXPECT_NE(m.getCacheBlockIds(id, kFull)[2], x2) << "capped: copied, not shared";
    }
    const kvb_block_info_t info = m.getBlockInfo(kFull, x2);
    EXPECT_TRUE(info.in_reuse_tree);
    EXPECT_TRUE(info.is_free);
    EXPECT_EQ(info.cache_level, KVB_CACHE_LEVEL_SECONDARY);
    EXPECT_EQ(m.getKvCacheStats().onboarded_blocks, 0u);
    m.checkInvariants();
}

// ---- Sharing inside one batch ---------------------------------------------------------------------

// Three requests of one batch match the same cached chain x0 (free, primary) -> x1 (host): all
// three share the same block ids, each block gets one reference per request, x0 is claimed from
// the free queue once and x1 is onboarded once (one helper block), so the batch consumes
// 1 claim + 1 onboarding + 3 misses free primary blocks.
TEST(AddSequenceBatchSharingTest, BlockMatchedBySeveralRequestsIsSharedAndClaimedOnce) {
    kvb::Manager m(batchConfig(16, 2));
    const std::vector<int32_t> x = storeForReuse(m, kvb::Request(1, tokenRun(0, 9)));
    EXPECT_TRUE(m.offloadBlock(kFull, x[1]));
    const int64_t freeBefore = m.getNumFreeBlocks();

    const std::vector<kvb::Request> batch = {
        kvb::Request(10, concatTokens(tokenRun(0, 8), {700})),
        kvb::Request(11, concatTokens(tokenRun(0, 8), {701})),
        kvb::Request(12, concatTokens(tokenRun(0, 8), {702})),
    };
    const std::vector<kvb_batch_estimate_t> est = m.estimateBatch(batch);
    EXPECT_EQ(est[0].free_blocks_consumed, 3) << "claim x0, onboarding helper, miss";
    EXPECT_EQ(est[1].free_blocks_consumed, 1) << "only its miss";
    EXPECT_EQ(est[2].free_blocks_consumed, 1);
    const std::vector<kvb_admission_t> res = admitAsEstimated(m, batch);
    ASSERT_EQ(res.size(), 3u);
    for (const kvb_admission_t& r : res) EXPECT_EQ(r.prepopulated_prompt_len, 8);
    for (const kvb::Request& r : batch) {
        const std::vector<int32_t> ids = m.getCacheBlockIds(r.id, kFull);
        ASSERT_EQ(ids.size(), 3u);
        EXPECT_EQ(ids[0], x[0]) << "request " << r.id;
        EXPECT_EQ(ids[1], x[1]) << "request " << r.id;
    }
    for (int32_t b : {x[0], x[1]}) {
        const kvb_block_info_t info = m.getBlockInfo(kFull, b);
        EXPECT_EQ(info.ref_count, 3) << "block " << b;
        EXPECT_EQ(info.cache_level, KVB_CACHE_LEVEL_PRIMARY) << "block " << b;
        EXPECT_FALSE(info.is_free);
    }
    EXPECT_EQ(freeBefore - m.getNumFreeBlocks(), 5);
    EXPECT_EQ(m.getKvCacheStats().onboarded_blocks, 1u) << "onboarded once for the batch";
    EXPECT_EQ(res[0].stats.alloc_total_blocks, 2u) << "onboarding helper + miss";
    EXPECT_EQ(res[1].stats.alloc_total_blocks, 1u);
    EXPECT_EQ(res[2].stats.alloc_total_blocks, 1u);
    m.checkInvariants();
}

// A free leaf L (tokens [8, 9]) partially matched by two requests of one batch goes to the last
// of them (TensorRT-LLM's rule): B takes it over, and A, earlier in the batch, copies its one
// matched token into a fresh block. A's copy reads L's row as it was, although B's takeover is
// planned and claimed in the same batch; both reuse exactly what was estimated.
TEST(AddSequenceBatchSharingTest, ALeafTwoRequestsMatchPartiallyGoesToTheLaterOne) {
    kvb::Manager m(hostDataConfig(16));
    const std::vector<int32_t> x = storeForReuse(m, kvb::Request(1, tokenRun(0, 11)));
    const int32_t leaf = x[2];
    ASSERT_TRUE(m.getBlockInfo(kFull, leaf).is_leaf);
    ASSERT_EQ(m.getBlockInfo(kFull, leaf).num_tokens, 2);
    fillRow(m, leaf, 0x31);

    const kvb::Request a(10, concatTokens(tokenRun(0, 9), {50, 51}));  // key [8, 50]: 1 token of L
    const kvb::Request b(11,
                         concatTokens(tokenRun(0, 10), {60, 61}));  // key [8, 9, 60]: 2 tokens of L
    const std::vector<kvb_batch_estimate_t> est = m.estimateBatch({a, b});
    EXPECT_EQ(est[0].reusable_tokens, 9);
    EXPECT_EQ(est[1].reusable_tokens, 10);
    const std::vector<kvb_admission_t> res = admitAsEstimated(m, {a, b});
    ASSERT_EQ(res.size(), 2u);

    const std::vector<int32_t> aIds = m.getCacheBlockIds(a.id, kFull);
    const std::vector<int32_t> bIds = m.getCacheBlockIds(b.id, kFull);
    EXPECT_EQ(bIds[2], leaf) << "B, the later partial matcher, took the leaf over";
    EXPECT_NE(aIds[2], leaf) << "A copies into a fresh block";
    EXPECT_EQ(aIds[0], x[0]);
    EXPECT_EQ(aIds[1], x[1]);
    EXPECT_EQ(m.getBlockInfo(kFull, leaf).ref_count, 1);
    EXPECT_FALSE(m.getBlockInfo(kFull, leaf).in_reuse_tree);
    EXPECT_EQ(m.getBlockInfo(kFull, aIds[2]).ref_count, 1);
    EXPECT_TRUE(rowStartsWith(m, aIds[2], 0x31, 1)) << "A's block holds L's first token";
    EXPECT_TRUE(rowStartsWith(m, leaf, 0x31, 2)) << "B's block is L, its bytes untouched";
    m.checkInvariants();
}

// A partial copy whose source is free and an inner node (x1, with child x2) must keep that
// source out of the free queue until it is copied. Free queue before the batch: x3 (unkeyed),
// x2, x1, x0, then four released unkeyed blocks. C shares x0 and copies 2 tokens of x1; its copy
// destination and miss take x3 and x2; D's four misses then take the next free blocks — x1 would
// be the first of them were it not held. Afterwards x1 returns to the free queue and stays in the
// tree; the estimate does not count it as consumed.
TEST(AddSequenceBatchCopyTest, FreeInnerCopySourceIsProtectedUntilCopied) {
    kvb::Manager m(hostDataConfig(8));
    const std::vector<int32_t> x = storeForReuse(m, kvb::Request(1, tokenRun(0, 13)));
    m.addSequence(kvb::Request(2, tokenRun(1000, 16)));  // the four other blocks, released behind x
    m.removeSequence(2, false);
    const int32_t source = x[1];
    ASSERT_FALSE(m.getBlockInfo(kFull, source).is_leaf);
    ASSERT_TRUE(m.getBlockInfo(kFull, source).is_free);
    fillRow(m, source, 0x52);

    const kvb::Request c(
        10, concatTokens(tokenRun(0, 6), {90, 91, 92}));  // shares x0, copies 2 tokens of x1
    const kvb::Request d(11, tokenRun(5000, 16));         // 4 misses
    const std::vector<kvb_batch_estimate_t> est = m.estimateBatch({c, d});
    EXPECT_EQ(est[0].reusable_tokens, 6);
    EXPECT_EQ(est[0].free_blocks_consumed, 3) << "claim x0, copy destination, miss";
    EXPECT_EQ(est[1].free_blocks_consumed, 4);
    EXPECT_TRUE(est[1].fits) << "8 free blocks: 4 for C (x1 held while copied) + 4 for D";
    admitAsEstimated(m, {c, d});

    const kvb_block_info_t info = m.getBlockInfo(kFull, source);
    EXPECT_EQ(info.ref_count, 0);
    EXPECT_TRUE(info.is_free) << "the copy source went back to the free queue";
    EXPECT_TRUE(info.in_reuse_tree) << "and is still reusable";
    EXPECT_EQ(info.parent, x[0]);
    EXPECT_EQ(m.getNumFreeBlocks(), 1);
    for (int32_t b = 0; b < 8; ++b) {
        if (b != source) { EXPECT_GE(m.getBlockInfo(kFull, b).ref_count, 1) << "block " << b; }
    }
    const std::vector<int32_t> cIds = m.getCacheBlockIds(c.id, kFull);
    EXPECT_EQ(cIds[0], x[0]);
    EXPECT_NE(cIds[1], source);
    EXPECT_TRUE(rowStartsWith(m, cIds[1], 0x52, 2)) << "copied from the protected source";
    m.checkInvariants();
}

// One host block used two ways in one batch: request B (first) copies 2 tokens of the inner host
// block x1, request A (second) shares it, which onboards it (its row moves to a primary row and the
// helper block takes the host row back into the host queue). Both must read x1's content as it
// was: B's copy is queued before A's onboarding and the batch's copies run in order.
TEST(AddSequenceBatchCopyTest, CopyAndOnboardingOfOneHostBlockBothReadItsContent) {
    kvb::Manager m(hostDataConfig(12, 2));
    const std::vector<int32_t> x = storeForReuse(m, kvb::Request(1, tokenRun(0, 13)));
    ASSERT_TRUE(m.offloadBlock(kFull, x[1]));
    ASSERT_EQ(m.getBlockInfo(kFull, x[1]).cache_level, KVB_CACHE_LEVEL_SECONDARY);
    fillRow(m, x[1], 0x6d);

    const kvb::Request b(
        10, concatTokens(tokenRun(0, 6), {90, 91, 92}));  // shares x0, copies 2 tokens of x1
    const kvb::Request a(11, concatTokens(tokenRun(0, 12), {7}));  // shares x0, x1 (onboarded), x2
    const std::vector<kvb_admission_t> res = admitAsEstimated(m, {b, a});
    ASSERT_EQ(res.size(), 2u);
    EXPECT_EQ(res[0].prepopulated_prompt_len, 6);
    EXPECT_EQ(res[1].prepopulated_prompt_len, 12);
    const std::vector<int32_t> bIds = m.getCacheBlockIds(b.id, kFull);
    const std::vector<int32_t> aIds = m.getCacheBlockIds(a.id, kFull);
    EXPECT_EQ(aIds[1], x[1]);
    EXPECT_EQ(m.getBlockInfo(kFull, x[1]).cache_level, KVB_CACHE_LEVEL_PRIMARY);
    EXPECT_TRUE(rowStartsWith(m, x[1], 0x6d, kTpb)) << "onboarded row holds x1's content";
    EXPECT_NE(bIds[1], x[1]);
    EXPECT_TRUE(rowStartsWith(m, bIds[1], 0x6d, 2)) << "B's copy read x1's content";
    EXPECT_EQ(m.getKvCacheStats().onboarded_blocks, 1u);
    m.checkInvariants();
}

// The `fits` flags of estimateBatch agree with what admission does when a request of the batch
// copies from a free block: x1 is out of the free queue until C's copy of it is queued, then free
// again, so D's 5 misses fit in what is left of the 8 (x1 among them); with 6 they do not, and
// longest_prefix admits only C. The estimate says the same in both cases.
TEST(AddSequenceBatchCopyTest, FitsFlagsCountACopySourceFreedOnceCopied) {
    auto build = [] {
        kvb::Manager m(batchConfig(8, 0));
        storeForReuse(m, kvb::Request(1, tokenRun(0, 13)));
        return m;
    };
    const kvb::Request c(
        10, concatTokens(tokenRun(0, 6), {90, 91, 92}));  // claim x0, copy x1, copy dest, miss
    for (int32_t misses : {5, 6}) {
        SCOPED_TRACE(misses);
        const kvb::Request d(11, tokenRun(5000, 4 * misses));
        kvb::Manager m = build();
        const std::vector<kvb_batch_estimate_t> est = m.estimateBatch({c, d});
        EXPECT_TRUE(est[0].fits);
        EXPECT_EQ(est[1].fits, misses == 5);
        const std::vector<kvb_admission_t> res = m.addSequenceBatch({c, d}, true);
        EXPECT_EQ(res.size(), misses == 5 ? 2u : 1u) << "estimate and admission disagree";
        if (misses == 5) { EXPECT_EQ(m.getNumFreeBlocks(), 0); }
        m.checkInvariants();
    }
}

// A free inner block that one request only copies from (x1, held while copied) and a later
// request of the same batch shares stays with the later request: it does not return to the free
// queue, so the later request's estimate counts it as consumed and the drop in free blocks equals
// the estimates' sum.
TEST(AddSequenceBatchCopyTest, CopySourceSharedByALaterRequestCountsAsConsumed) {
    kvb::Manager m(batchConfig(8, 0));
    const std::vector<int32_t> x = storeForReuse(m, kvb::Request(1, tokenRun(0, 13)));
    const kvb::Request c(10, concatTokens(tokenRun(0, 6), {90, 91, 92}));  // copies 2 tokens of x1
    const kvb::Request e(11, concatTokens(tokenRun(0, 12), {77}));         // shares x0, x1, x2
    const std::vector<kvb_admission_t> res = admitAsEstimated(m, {c, e});
    ASSERT_EQ(res.size(), 2u);
    EXPECT_EQ(res[0].prepopulated_prompt_len, 6);
    EXPECT_EQ(res[1].prepopulated_prompt_len, 12);
    EXPECT_EQ(m.getBlockInfo(kFull, x[1]).ref_count, 1);
    EXPECT_FALSE(m.getBlockInfo(kFull, x[1]).is_free);
    EXPECT_EQ(m.getNumFreeBlocks(), 2) << "x0, x1, x2, C's copy and miss, E's miss";
    m.checkInvariants();
}

// ---- Key partitioning -----------------------------------------------------------------------------

// One batch mixing LoRA task ids, cache salts and multimodal digests over identical tokens:
// each request reuses exactly the blocks stored under its own key attributes, and nothing when
// no prefix was stored with them (lora 2, salt 8, another digest, lora + salt together).
TEST(AddSequenceBatchKeyTest, LoraSaltAndMultimodalRequestsReuseOnlyTheirOwnPrefixes) {
    kvb_multimodal_item_t mm1{};
    kvb_multimodal_item_t mm2{};
    for (int i = 0; i < 32; ++i) {
        mm1.digest[i] = static_cast<uint8_t>(i);
        mm2.digest[i] = static_cast<uint8_t>(100 + i);
    }
    mm1.position = mm2.position = 0;
    mm1.length = mm2.length = 4;
    const std::vector<int32_t> tokens = tokenRun(0, 9);

    kvb::Manager m(batchConfig(40, 0));
    const std::vector<int32_t> plain = storeForReuse(m, kvb::Request(1, tokens));
    const std::vector<int32_t> lora1 = storeForReuse(m, kvb::Request(2, tokens).withLora(1));
    const std::vector<int32_t> salt7 = storeForReuse(m, kvb::Request(3, tokens).withSalt(7));
    const std::vector<int32_t> digest1 =
        storeForReuse(m, kvb::Request(4, tokens).withMultimodal(mm1));

    struct Case {
        kvb::Request request;
        const std::vector<int32_t>* own;  // null: nothing stored for its key
    };
    const std::vector<Case> cases = {
        {kvb::Request(10, tokens), &plain},
        {kvb::Request(11, tokens).withLora(1), &lora1},
        {kvb::Request(12, tokens).withLora(2), nullptr},
        {kvb::Request(13, tokens).withSalt(7), &salt7},
        {kvb::Request(14, tokens).withSalt(8), nullptr},
        {kvb::Request(15, tokens).withMultimodal(mm1), &digest1},
        {kvb::Request(16, tokens).withMultimodal(mm2), nullptr},
        {kvb::Request(17, tokens).withLora(1).withSalt(7), nullptr},
    };
    std::vector<kvb::Request> batch;
    for (const Case& c : cases) batch.push_back(c.request);
    const std::vector<kvb_admission_t> res = admitAsEstimated(m, batch);
    ASSERT_EQ(res.size(), cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
        const uint64_t id = cases[i].request.id;
        const std::vector<int32_t> ids = m.getCacheBlockIds(id, kFull);
        if (cases[i].own) {
            EXPECT_EQ(res[i].prepopulated_prompt_len, 8) << "request " << id;
            EXPECT_EQ(ids[0], (*cases[i].own)[0]) << "request " << id;
            EXPECT_EQ(ids[1], (*cases[i].own)[1]) << "request " << id;
        } else {
            EXPECT_EQ(res[i].prepopulated_prompt_len, 0) << "request " << id;
            for (const std::vector<int32_t>* stored : {&plain, &lora1, &salt7, &digest1}) {
                EXPECT_NE(ids[0], (*stored)[0]) << "request " << id;
            }
        }
    }
    m.checkInvariants();
}

// ---- Failure and prefixes ---------------------------------------------------------------------------

// A batch that does not fit fails with KVB_STATUS_OUT_OF_BLOCKS and leaves the manager exactly
// as it was, although its first requests would have claimed cached blocks, raised priorities,
// onboarded host blocks, taken over a leaf and copied a referenced block: every counter, the free
// counts per window and level, every block's state in both windows, no sequence of the batch,
// and no event. The prefix that fits is then admitted exactly as estimated (no claim leaked).
TEST(AddSequenceBatchAtomicTest, BatchThatDoesNotFitChangesNothing) {
    constexpr int32_t kPrimary = 20, kSecondary = 2;
    const std::vector<int32_t> windows = {kSliding, kFull};
    kvb::Manager m(twoWindowConfig(kPrimary, kSecondary, 1000));
    storeForReuse(m, kvb::Request(1, tokenRun(0, 13)));
    m.addSequence(kvb::Request(2, tokenRun(100, 9)));
    const std::vector<int32_t> hSliding = m.getCacheBlockIds(2, kSliding);
    const std::vector<int32_t> hFull = m.getCacheBlockIds(2, kFull);
    kvb_test::markPrefillComputed(m, 2);
    m.removeSequence(2, true);
    for (int32_t i : {1, 0}) {  // both cached blocks of request 2 to host rows, in each window
        EXPECT_TRUE(m.offloadBlock(kSliding, hSliding[static_cast<size_t>(i)]));
        EXPECT_TRUE(m.offloadBlock(kFull, hFull[static_cast<size_t>(i)]));
    }
    storeForReuse(m, kvb::Request(3, tokenRun(200, 11)));  // leaf [208, 209]
    m.addSequence(kvb::Request(4, tokenRun(300, 9)));
    m.storeContextBlocks(4, 9);
    m.flushIterationEvents();
    m.getLatestEvents();

    const std::vector<kvb::Request> batch = {
        kvb::Request(10, concatTokens(tokenRun(0, 12), {1})).withRange(0, -1, 80),
        kvb::Request(11, concatTokens(tokenRun(100, 8), {2})),
        kvb::Request(12, concatTokens(tokenRun(200, 9), {5, 6})),
        kvb::Request(13, concatTokens(tokenRun(300, 6), {7, 8, 9})),
        kvb::Request(14, tokenRun(9000, 60)),
    };
    const Snapshot before = snapshot(m, windows, kPrimary + kSecondary);
    const std::vector<kvb_batch_estimate_t> est = m.estimateBatch(batch);  // changes nothing either
    for (size_t i = 0; i + 1 < est.size(); ++i)
        EXPECT_TRUE(est[i].fits) << "request " << batch[i].id;
    EXPECT_FALSE(est.back().fits);
    EXPECT_EQ(est[0].reusable_tokens, 12);
    EXPECT_EQ(est[1].reusable_tokens, 8) << "from host blocks";
    EXPECT_EQ(est[2].reusable_tokens, 9) << "taking the leaf over";
    EXPECT_EQ(est[3].reusable_tokens, 6) << "copying part of a referenced block";

    EXPECT_EQ(statusOf([&] { m.addSequenceBatch(batch); }), KVB_STATUS_OUT_OF_BLOCKS);
    const Snapshot after = snapshot(m, windows, kPrimary + kSecondary);
    expectSameSnapshot(before, after, windows);
    for (const kvb::Request& r : batch) {
        EXPECT_EQ(statusOf([&] { m.getRequestStats(r.id); }), KVB_STATUS_UNKNOWN_REQUEST) << r.id;
        EXPECT_EQ(statusOf([&] { m.getNumTokens(r.id); }), KVB_STATUS_UNKNOWN_REQUEST) << r.id;
    }
    m.flushIterationEvents();
    EXPECT_TRUE(m.getLatestEvents().empty()) << "a failed batch emits no event";
    m.checkInvariants();

    const std::vector<kvb::Request> prefix(batch.begin(), batch.end() - 1);
    const std::vector<kvb_admission_t> res = admitAsEstimated(m, prefix);
    for (size_t i = 0; i < res.size(); ++i) {
        EXPECT_EQ(res[i].prepopulated_prompt_len, est[i].reusable_tokens)
            << "request " << prefix[i].id;
    }
    m.checkInvariants();
}

// With longest_prefix the batch admits the longest prefix that fits (in order: a later request
// that would fit on its own is not admitted after one that does not), reports how many, and
// estimateBatch's `fits` flags say the same. Without longest_prefix the same batch fails whole;
// when not even the first request fits, longest_prefix admits none and changes nothing.
TEST(AddSequenceBatchLongestPrefixTest, AdmitsLongestPrefixThatFits) {
    auto build = [] {
        kvb::Manager m(batchConfig(12, 0));
        storeForReuse(m, kvb::Request(1, tokenRun(0, 13)));
        return m;
    };
    const std::vector<kvb::Request> batch = {
        kvb::Request(10, concatTokens(tokenRun(0, 12), {1})),  // 3 claimed cached blocks + 1 miss
        kvb::Request(11, tokenRun(500, 17)),                   // 5 misses (9 of 12)
        kvb::Request(12, tokenRun(600, 17)),                   // 5 misses: 14 > 12
        kvb::Request(13, tokenRun(700, 2)),                    // 1 miss: would fit alone
    };
    kvb::Manager m = build();
    const std::vector<kvb_batch_estimate_t> est = m.estimateBatch(batch);
    ASSERT_EQ(est.size(), 4u);
    EXPECT_TRUE(est[0].fits);
    EXPECT_TRUE(est[1].fits);
    EXPECT_FALSE(est[2].fits);
    EXPECT_FALSE(est[3].fits) << "nothing after a request that does not fit";

    const Snapshot before = snapshot(m, {kFull}, 12);
    EXPECT_EQ(statusOf([&] { m.addSequenceBatch(batch, false); }), KVB_STATUS_OUT_OF_BLOCKS);
    expectSameSnapshot(before, snapshot(m, {kFull}, 12), {kFull});

    const std::vector<kvb_admission_t> res = m.addSequenceBatch(batch, true);
    ASSERT_EQ(res.size(), 2u);
    EXPECT_EQ(res[0].prepopulated_prompt_len, est[0].reusable_tokens);
    EXPECT_EQ(res[0].prepopulated_prompt_len, 12);
    EXPECT_EQ(res[1].stats.alloc_total_blocks, static_cast<uint64_t>(est[1].allocated_blocks));
    EXPECT_EQ(m.getNumFreeBlocks(), 12 - est[0].free_blocks_consumed - est[1].free_blocks_consumed);
    EXPECT_NO_THROW(m.getRequestStats(10));
    EXPECT_NO_THROW(m.getRequestStats(11));
    EXPECT_EQ(statusOf([&] { m.getRequestStats(12); }), KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_EQ(statusOf([&] { m.getRequestStats(13); }), KVB_STATUS_UNKNOWN_REQUEST);
    m.checkInvariants();

    // Nothing fits now: the prefix is empty, the call succeeds and changes nothing.
    const std::vector<kvb::Request> tooBig = {kvb::Request(20, tokenRun(800, 17)),
                                              kvb::Request(21, tokenRun(900, 2))};
    const std::vector<kvb_batch_estimate_t> none = m.estimateBatch(tooBig);
    EXPECT_FALSE(none[0].fits);
    EXPECT_FALSE(none[1].fits);
    const Snapshot full = snapshot(m, {kFull}, 12);
    EXPECT_TRUE(m.addSequenceBatch(tooBig, true).empty());
    expectSameSnapshot(full, snapshot(m, {kFull}, 12), {kFull});
    EXPECT_EQ(statusOf([&] { m.getRequestStats(21); }), KVB_STATUS_UNKNOWN_REQUEST);
    m.checkInvariants();
}

// ---- Bad input ------------------------------------------------------------------------------------

// Two requests of one batch with the same id: KVB_STATUS_DUPLICATE_REQUEST, for admission and
// estimate alike, and nothing is admitted (not even the requests before the duplicate). A batch
// naming a running sequence's id fails the same way.
TEST(AddSequenceBatchBadInputTest, DuplicateRequestIdsFailAndChangeNothing) {
    kvb::Manager m(batchConfig(16, 0));
    storeForReuse(m, kvb::Request(1, tokenRun(0, 9)));
    m.addSequence(kvb::Request(2, tokenRun(50, 5)));
    const std::vector<kvb::Request> dup = {kvb::Request(5, concatTokens(tokenRun(0, 8), {1})),
                                           kvb::Request(6, tokenRun(100, 5)),
                                           kvb::Request(5, tokenRun(200, 5))};
    const Snapshot before = snapshot(m, {kFull}, 16);
    EXPECT_EQ(statusOf([&] { m.addSequenceBatch(dup); }), KVB_STATUS_DUPLICATE_REQUEST);
    EXPECT_EQ(statusOf([&] { m.addSequenceBatch(dup, true); }), KVB_STATUS_DUPLICATE_REQUEST);
    EXPECT_EQ(statusOf([&] { m.estimateBatch(dup); }), KVB_STATUS_DUPLICATE_REQUEST);
    const std::vector<kvb::Request> running = {kvb::Request(7, tokenRun(300, 5)),
                                               kvb::Request(2, tokenRun(400, 5))};
    EXPECT_EQ(statusOf([&] { m.addSequenceBatch(running); }), KVB_STATUS_DUPLICATE_REQUEST);
    expectSameSnapshot(before, snapshot(m, {kFull}, 16), {kFull});
    for (uint64_t id : {5u, 6u, 7u}) {
        EXPECT_EQ(statusOf([&] { m.getRequestStats(id); }), KVB_STATUS_UNKNOWN_REQUEST) << id;
    }
    m.checkInvariants();
}

// One invalid request anywhere in a batch (here beam width above the maximum, then fewer tokens
// than its input length) rejects the whole batch with that request's status; nothing is admitted.
TEST(AddSequenceBatchBadInputTest, InvalidRequestRejectsWholeBatch) {
    kvb::Manager m(batchConfig(16, 0));
    storeForReuse(m, kvb::Request(1, tokenRun(0, 9)));
    const Snapshot before = snapshot(m, {kFull}, 16);
    kvb::Request shortTokens(7, tokenRun(300, 5));
    shortTokens.inputLength = 6;
    const std::vector<kvb::Request> beams = {kvb::Request(5, concatTokens(tokenRun(0, 8), {1})),
                                             kvb::Request(6, tokenRun(100, 5)).withBeamWidth(3)};
    const std::vector<kvb::Request> tokens = {kvb::Request(5, concatTokens(tokenRun(0, 8), {1})),
                                              shortTokens};
    EXPECT_EQ(statusOf([&] { m.addSequenceBatch(beams); }), KVB_STATUS_BEAM_WIDTH_EXCEEDED);
    EXPECT_EQ(statusOf([&] { m.addSequenceBatch(beams, true); }), KVB_STATUS_BEAM_WIDTH_EXCEEDED);
    EXPECT_EQ(statusOf([&] { m.addSequenceBatch(tokens, true); }), KVB_STATUS_TOO_FEW_TOKENS);
    EXPECT_EQ(statusOf([&] { m.estimateBatch(tokens); }), KVB_STATUS_TOO_FEW_TOKENS);
    expectSameSnapshot(before, snapshot(m, {kFull}, 16), {kFull});
    EXPECT_EQ(statusOf([&] { m.getRequestStats(5); }), KVB_STATUS_UNKNOWN_REQUEST);
    m.checkInvariants();
}

// An empty batch is an invalid argument, for admission and estimate, through the C ABI too.
TEST(AddSequenceBatchBadInputTest, EmptyBatchIsInvalid) {
    kvb::Manager m(batchConfig(8, 0));
    EXPECT_EQ(statusOf([&] { m.addSequenceBatch({}); }), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(statusOf([&] { m.addSequenceBatch({}, true); }), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(statusOf([&] { m.estimateBatch({}); }), KVB_STATUS_INVALID_ARGUMENT);
    kvb_request_t one;
    kvb::check(kvb_request_init(&one));
    kvb_admission_t out{};
    size_t admitted = 7;
    EXPECT_EQ(kvb_manager_add_sequence_batch(m.get(), &one, 0, false, &out, &admitted),
              KVB_STATUS_INVALID_ARGUMENT);
    kvb_batch_estimate_t e{};
    EXPECT_EQ(kvb_manager_estimate_batch(m.get(), &one, 0, &e), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(m.getNumFreeBlocks(), 8);
    m.checkInvariants();
}

// ---- Per-request stats ------------------------------------------------------------------------------

// Each request of a batch gets its own counters, not a share of the batch's (upstream review of
// #12892: deltas taken against one batch-wide baseline attribute earlier requests' work to later
// ones). Free queue before the batch: 6, 7 (never used), 2 (never keyed), then 1, 0 (cached
// chain, claimed by s1), then 5, 4, 3 (released keyed blocks that are not reusable).
//   s1: shares x0, x1; its miss takes 6          → total 1, new 1, reused 2, missed 1
//   s2: three misses take 7, 2, 5                → total 3, new 2, reused 0, missed 3
//   s3: two misses take 4, 3                     → total 2, new 0, reused 0, missed 2
// getRequestStats returns the same figures as the batch's results.
TEST(AddSequenceBatchStatsTest, PerRequestStatsAreExactPerRequest) {
    kvb::Manager m(batchConfig(8, 0));
    storeForReuse(m, kvb::Request(1, tokenRun(0, 9)));
    m.addSequence(kvb::Request(2, tokenRun(1000, 12)));
    m.removeSequence(2, false);
    const kvb_kv_cache_stats_t before = m.getKvCacheStats();

    const std::vector<kvb::Request> batch = {kvb::Request(10, concatTokens(tokenRun(0, 8), {42})),
                                             kvb::Request(11, tokenRun(100, 9)),
                                             kvb::Request(12, tokenRun(200, 5))};
    const std::vector<kvb_admission_t> res = m.addSequenceBatch(batch);
    ASSERT_EQ(res.size(), 3u);
    struct Want {
        int32_t prepopulated;
        uint64_t total, fresh, reused, missed;
        double hit;
    };
    const Want want[3] = {{8, 1, 1, 2, 1, 2.0 / 3.0}, {0, 3, 2, 0, 3, 0.0}, {0, 2, 0, 0, 2, 0.0}};
    for (size_t i = 0; i < 3; ++i) {
        const kvb_admission_t& r = res[i];
        const std::string what = "request " + std::to_string(batch[i].id);
        EXPECT_EQ(r.prepopulated_prompt_len, want[i].prepopulated) << what;
        EXPECT_EQ(r.stats.alloc_total_blocks, want[i].total) << what;
        EXPECT_EQ(r.stats.alloc_new_blocks, want[i].fresh) << what;
        EXPECT_EQ(r.stats.reused_blocks, want[i].reused) << what;
        EXPECT_EQ(r.stats.missed_blocks, want[i].missed) << what;
        EXPECT_DOUBLE_EQ(r.stats.cache_hit_rate, want[i].hit) << what;
        const kvb_admission_t q = m.getRequestStats(batch[i].id);
        EXPECT_EQ(q.prepopulated_prompt_len, r.prepopulated_prompt_len) << what;
        EXPECT_EQ(q.stats.alloc_total_blocks, r.stats.alloc_total_blocks) << what;
        EXPECT_EQ(q.stats.alloc_new_blocks, r.stats.alloc_new_blocks) << what;
        EXPECT_EQ(q.stats.reused_blocks, r.stats.reused_blocks) << what;
        EXPECT_EQ(q.stats.missed_blocks, r.stats.missed_blocks) << what;
        EXPECT_DOUBLE_EQ(q.stats.cache_hit_rate, r.stats.cache_hit_rate) << what;
    }
    const kvb_kv_cache_stats_t after = m.getKvCacheStats();
    EXPECT_EQ(after.alloc_total_blocks - before.alloc_total_blocks, 6u);
    EXPECT_EQ(after.alloc_new_blocks - before.alloc_new_blocks, 3u);
    EXPECT_EQ(after.reused_blocks - before.reused_blocks, 2u);
    EXPECT_EQ(after.missed_blocks - before.missed_blocks, 6u);
    EXPECT_EQ(m.getNumFreeBlocks(), 0);
    m.checkInvariants();
}

// ---- Events ---------------------------------------------------------------------------------------

// The batch path reports what happened and nothing it avoided: onboarding the two host blocks y0,
// y1 gives one Updated cacheLevel 1→0 each; the cached chain x0 -> x1 it shares was claimed, not
// evicted, so no Removed names x0, x1, y0 or y1; the only Removed hashes are those of the
// low-priority cached blocks z0, z1 that the last request's misses evicted (priority 10 < 30: not
// offloaded). Nothing is stored by admission.
TEST(AddSequenceBatchEventsTest, OnboardedBlocksReportUpdatedAndReusedBlocksAreNotRemoved) {
    kvb::Manager m(batchConfig(8, 4, 1000));
    const std::vector<int32_t> x = storeForReuse(m, kvb::Request(1, tokenRun(0, 9)));
    const std::vector<int32_t> y = storeForReuse(m, kvb::Request(2, tokenRun(100, 9)));
    EXPECT_TRUE(m.offloadBlock(kFull, y[0]));
    EXPECT_TRUE(m.offloadBlock(kFull, y[1]));
    const std::vector<int32_t> z =
        storeForReuse(m, kvb::Request(3, tokenRun(200, 9)).withRange(0, -1, 10));
    auto hashOf = [&](int32_t b) { return m.getBlockInfo(kFull, b).hash; };
    const std::set<uint64_t> reusedHashes = {hashOf(x[0]), hashOf(x[1]), hashOf(y[0]),
                                             hashOf(y[1])};
    const std::set<uint64_t> evictable = {hashOf(z[0]), hashOf(z[1])};
    ASSERT_TRUE(m.getBlockInfo(kFull, z[0]).in_reuse_tree);
    ASSERT_EQ(m.getBlockInfo(kFull, z[0]).priority, 10);
    m.flushIterationEvents();
    m.getLatestEvents();

    const std::vector<kvb::Request> batch = {
        kvb::Request(10, concatTokens(tokenRun(0, 8), {1})),  // shares x0, x1 + 1 miss
        kvb::Request(11,
                     concatTokens(tokenRun(100, 8), {2})),  // shares y0, y1 (onboarded) + 1 miss
        kvb::Request(12, tokenRun(500, 5)),  // 2 misses: the last free blocks, z1 and z0
    };
    const std::vector<kvb_admission_t> res = admitAsEstimated(m, batch);
    ASSERT_EQ(res.size(), 3u);
    EXPECT_EQ(res[0].prepopulated_prompt_len, 8);
    EXPECT_EQ(res[1].prepopulated_prompt_len, 8);
    m.flushIterationEvents();
    const std::vector<kvb::Event> events = m.getLatestEvents();

    std::multiset<uint64_t> onboarded, removed;
    for (const kvb::Event& e : events) {
        EXPECT_NE(e.type, KVB_EVENT_STORED) << "admission stores nothing";
        if (e.type == KVB_EVENT_UPDATED && e.cacheLevel) {
            EXPECT_EQ(e.cacheLevel->oldValue, KVB_CACHE_LEVEL_SECONDARY);
            EXPECT_EQ(e.cacheLevel->newValue, KVB_CACHE_LEVEL_PRIMARY);
            onboarded.insert(e.blockHash);
        }
        if (e.type == KVB_EVENT_REMOVED) {
            for (uint64_t h : e.removedHashes) {
                EXPECT_EQ(reusedHashes.count(h), 0u)
                    << "a block the batch reused was reported removed";
                removed.insert(h);
            }
        }
    }
    EXPECT_EQ(onboarded, (std::multiset<uint64_t>{hashOf(y[0]), hashOf(y[1])}));
    EXPECT_EQ(removed, (std::multiset<uint64_t>(evictable.begin(), evictable.end())));
    for (int32_t b : {x[0], x[1], y[0], y[1]}) EXPECT_TRUE(m.getBlockInfo(kFull, b).in_reuse_tree);
    m.checkInvariants();
}
