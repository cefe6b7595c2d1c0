// Eviction behaviour of the primary tier (the priority, timed-retention and leaf scenarios of
// TensorRT-LLM's tests): which cached block an allocation takes, and what stays reusable.
//
// Every scenario uses 4 tokens per block and one full-attention window (window = maximum sequence
// length), so a sequence of n tokens holds ceil(n / 4) blocks and removeSequence stores its first
// n - 1 tokens for reuse (a partial last block included). Free blocks are queued per priority
// (lowest evicted first) and, within one priority, in release order; a sequence releases its
// blocks last to first. Block ids 0..P-1 start free in id order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kvblock.hpp"
#include "test_support.hpp"

namespace {

constexpr int32_t kWindow = 64;
constexpr int32_t kTokensPerBlock = 4;

kvb::Config evictionConfig(int32_t primary, int32_t secondary = 0) {
    return kvb_test::windowConfig(kWindow, primary, secondary, kTokensPerBlock, kWindow);
}

using kvb_test::concatTokens;
using kvb_test::ids;
using kvb_test::reusableBlocks;
using kvb_test::statusOf;
using kvb_test::tokenRun;

std::vector<int32_t> sorted(std::vector<int32_t> v) {
    std::sort(v.begin(), v.end());
    return v;
}

}  // namespace

// Token-range priorities decide eviction order: priority-10 prompt blocks and priority-20
// generated blocks go before never-used default blocks, while the priority-90 first block stays
// cached and is reused by a later request.
TEST(BlockManagerBlockPriorityTest, LowPriorityCachedBlocksAreEvictedFirst) {
    kvb::Manager m(evictionConfig(6));

    kvb::Request r0(0, tokenRun(0, 8));
    r0.withRange(0, 4, 90).withRange(4, -1, 10).withDecodeRetention(20);
    EXPECT_EQ(m.addSequence(r0).prepopulated_prompt_len, 0);
    for (int32_t t = 0; t < 4; ++t) m.addToken(0, 100 + t);  // allocates block 2 (decode)
    ASSERT_EQ(m.getCacheBlockIds(0, kWindow), ids({0, 1, 2}));
    EXPECT_EQ(m.getPriorityByBlockId(kWindow, 0), 90);
    EXPECT_EQ(m.getPriorityByBlockId(kWindow, 1), 10);
    EXPECT_EQ(m.getPriorityByBlockId(kWindow, 2), 20);
    m.removeSequence(0);  // stores blocks 0 and 1 (full) and block 2 (3 tokens)
    m.checkInvariants();
    EXPECT_TRUE(m.getBlockInfo(kWindow, 2).in_reuse_tree);

    // Queues now: 10 -> {1}, 20 -> {2}, 35 -> {3, 4, 5}, 90 -> {0}. Pure LRU would take the
    // never-used blocks 3, 4, 5 first; priorities make 1 and 2 go first.
    m.addSequence(kvb::Request(1, tokenRun(1000, 13)));
    EXPECT_EQ(m.getCacheBlockIds(1, kWindow), ids({1, 2, 3, 4}));
    kvb_block_info_t first = m.getBlockInfo(kWindow, 0);
    EXPECT_TRUE(first.in_reuse_tree);
    EXPECT_TRUE(first.is_free);
    EXPECT_EQ(first.priority, 90);
    EXPECT_EQ(first.parent, -1);
    m.checkInvariants();
    m.removeSequence(1, false);

    // The original prompt finds only its first block: block 1 was evicted.
    kvb_admission_t a = m.addSequence(kvb::Request(2, tokenRun(0, 9)));
    EXPECT_EQ(a.prepopulated_prompt_len, 4);
    EXPECT_EQ(a.stats.reused_blocks, 1u);
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow).at(0), 0);
    kvb_test::markPrefillComputed(m, 2);
    m.removeSequence(2);
    m.checkInvariants();
}

// Blocks allocated by addToken carry the request's decode retention priority. With two finished
// requests (decode priority 90 and 10), pressure evicts the priority-10 generated blocks first,
// then default-priority blocks in release order; the priority-90 generated block survives and a
// final request with the first request's tokens reuses all 12 stored tokens.
TEST(KVCacheManagerDecodeBlockPriorityTest, GeneratedBlocksUseDecodePriority) {
    kvb::Manager m(evictionConfig(10));

    const std::vector<int32_t> genA = {1000, 1001, 1002, 1003, 1004};
    const std::vector<int32_t> genB = {2000, 2001, 2002, 2003, 2004};
    kvb::Request a(0, tokenRun(0, 8));
    a.withDecodeRetention(90);
    kvb::Request b(1, tokenRun(200, 8));
    b.withDecodeRetention(10);
    m.addSequence(a);
    for (int32_t t : genA) m.addToken(0, t);
    m.addSequence(b);
    for (int32_t t : genB) m.addToken(1, t);
    ASSERT_EQ(m.getCacheBlockIds(0, kWindow), ids({0, 1, 2, 3}));
    ASSERT_EQ(m.getCacheBlockIds(1, kWindow), ids({4, 5, 6, 7}));
    EXPECT_EQ(m.getPriorityByBlockId(kWindow, 1), 35);  // prompt block: default
    EXPECT_EQ(m.getPriorityByBlockId(kWindow, 2), 90);  // generated blocks: decode priority
    EXPECT_EQ(m.getPriorityByBlockId(kWindow, 3), 90);
    EXPECT_EQ(m.getPriorityByBlockId(kWindow, 5), 35);
    EXPECT_EQ(m.getPriorityByBlockId(kWindow, 6), 10);
    m.removeSequence(0);  // stores 12 tokens: blocks 0, 1, 2
    m.removeSequence(1);  // stores 12 tokens: blocks 4, 5, 6
    m.checkInvariants();

    // Queues: 10 -> {7, 6}, 35 -> {8, 9, 1, 0, 5, 4}, 90 -> {3, 2}. Four blocks: priority 10
    // first (LRU: 7 before 6), then the oldest default blocks 8 and 9.
    kvb::Request pressure(2, tokenRun(5000, 16));
    pressure.withRange(0, -1, 0);  // its blocks are the next victims once released
    m.addSequence(pressure);
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow), ids({7, 6, 8, 9}));
    m.removeSequence(2, false);
    m.checkInvariants();

    std::vector<int32_t> tokensA = concatTokens(tokenRun(0, 8), genA);
    std::vector<int32_t> tokensB = concatTokens(tokenRun(200, 8), genB);
    kvb_admission_t ra = m.addSequence(kvb::Request(3, tokensA));
    EXPECT_EQ(ra.prepopulated_prompt_len, 12);  // prompt blocks + the priority-90 decode block
    EXPECT_EQ(m.getCacheBlockIds(3, kWindow).at(2), 2);
    kvb_admission_t rb = m.addSequence(kvb::Request(4, tokensB));
    EXPECT_EQ(rb.prepopulated_prompt_len, 8);  // its priority-10 decode block was evicted
    EXPECT_EQ(m.getCacheBlockIds(4, kWindow).at(0), 4);
    EXPECT_EQ(m.getCacheBlockIds(4, kWindow).at(1), 5);
    m.checkInvariants();
}

// A priority-80 retention with a 10 ms duration outlives priority-50 blocks until the duration
// has passed; refreshBlocks then decays it to the default 35 and those blocks are evicted before
// the priority-50 ones.
TEST(KVCacheManagerTimedEvictionTest, TimedPriorityDecaysAfterDuration) {
    kvb::Config cfg = evictionConfig(6);
    cfg.raw.manual_clock = true;
    kvb::Manager m(cfg);

    kvb::Request timed(0, tokenRun(0, 9));
    timed.withRange(0, -1, 80, 10);
    kvb::Request fifty(1, tokenRun(100, 9));
    fifty.withRange(0, -1, 50);
    m.addSequence(timed);
    m.addSequence(fifty);
    ASSERT_EQ(m.getCacheBlockIds(0, kWindow), ids({0, 1, 2}));
    ASSERT_EQ(m.getCacheBlockIds(1, kWindow), ids({3, 4, 5}));
    kvb_test::markPrefillComputed(m, 0);
    m.removeSequence(0);
    kvb_test::markPrefillComputed(m, 1);
    m.removeSequence(1);
    m.checkInvariants();

    // Before the duration: priority 80 holds and the priority-50 blocks are the victims.
    m.advanceTime(9);
    m.refreshBlocks();
    EXPECT_EQ(m.getPriorityByBlockId(kWindow, 0), 80);
    m.addSequence(kvb::Request(2, tokenRun(1000, 3)));
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow), ids({5}));
    EXPECT_EQ(reusableBlocks(m, tokenRun(0, 9), kWindow), 2);
    m.removeSequence(2, false);
    m.checkInvariants();

    // After the duration: the blocks decay to 35 and go before the priority-50 blocks.
    m.advanceTime(2);
    m.refreshBlocks();
    for (int32_t b = 0; b < 3; ++b) EXPECT_EQ(m.getPriorityByBlockId(kWindow, b), 35) << b;
    EXPECT_EQ(m.getPriorityByBlockId(kWindow, 3), 50);
    m.addSequence(kvb::Request(3, tokenRun(2000, 16)));
    EXPECT_EQ(sorted(m.getCacheBlockIds(3, kWindow)), ids({0, 1, 2, 5}));
    EXPECT_EQ(reusableBlocks(m, tokenRun(0, 9), kWindow), 0);
    EXPECT_EQ(reusableBlocks(m, tokenRun(100, 9), kWindow), 2);
    kvb_block_info_t kept = m.getBlockInfo(kWindow, 3);
    EXPECT_TRUE(kept.in_reuse_tree);
    EXPECT_TRUE(kept.is_free);
    EXPECT_EQ(kept.priority, 50);
    m.checkInvariants();
}

// The decode retention priority may carry a duration too: priority-100 generated blocks outlive
// priority-50 blocks for 20 ms, then decay to 35 at refreshBlocks and are evicted before them,
// so the prompt (priority 100, no duration) is still reused up to position 8.
TEST(KVCacheManagerDecodeTimedEvictionTest, DecodePriorityDecaysAfterDuration) {
    kvb::Config cfg = evictionConfig(10);
    cfg.raw.manual_clock = true;
    kvb::Manager m(cfg);

    const std::vector<int32_t> genA = {1000, 1001, 1002, 1003, 1004};
    const std::vector<int32_t> genB = {2000, 2001, 2002, 2003, 2004};
    kvb::Request a(0, tokenRun(0, 8));
    a.withRange(0, -1, 100).withDecodeRetention(100, 20);
    kvb::Request b(1, tokenRun(200, 8));
    b.withRange(0, -1, 50).withDecodeRetention(50);
    m.addSequence(a);
    for (int32_t t : genA) m.addToken(0, t);
    m.addSequence(b);
    for (int32_t t : genB) m.addToken(1, t);
    ASSERT_EQ(m.getCacheBlockIds(0, kWindow), ids({0, 1, 2, 3}));
    ASSERT_EQ(m.getCacheBlockIds(1, kWindow), ids({4, 5, 6, 7}));
    m.removeSequence(0);
    m.removeSequence(1);
    m.checkInvariants();
    std::vector<int32_t> tokensA = concatTokens(tokenRun(0, 8), genA);
    std::vector<int32_t> tokensB = concatTokens(tokenRun(200, 8), genB);

    // At 10 ms the generated blocks still have priority 100: the never-used blocks and the
    // priority-50 blocks of B go first.
    m.advanceTime(10);
    m.refreshBlocks();
    EXPECT_EQ(m.getPriorityByBlockId(kWindow, 2), 100);
    m.addSequence(kvb::Request(2, tokenRun(5000, 16)));  // stays running
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow), ids({8, 9, 7, 6}));
    EXPECT_EQ(reusableBlocks(m, tokensA, kWindow), 3);
    EXPECT_EQ(reusableBlocks(m, tokensB, kWindow), 2);
    m.checkInvariants();

    // At 25 ms the generated blocks have decayed to 35 and are taken before B's blocks.
    m.advanceTime(15);
    m.refreshBlocks();
    EXPECT_EQ(m.getPriorityByBlockId(kWindow, 2), 35);
    EXPECT_EQ(m.getPriorityByBlockId(kWindow, 3), 35);
    EXPECT_EQ(m.getPriorityByBlockId(kWindow, 0), 100);
    m.addSequence(kvb::Request(3, tokenRun(6000, 8)));
    EXPECT_EQ(sorted(m.getCacheBlockIds(3, kWindow)), ids({2, 3}));
    EXPECT_EQ(reusableBlocks(m, tokensB, kWindow), 2);

    kvb_admission_t ra = m.addSequence(kvb::Request(4, tokensA));
    EXPECT_EQ(ra.prepopulated_prompt_len, 8);
    m.checkInvariants();
}

// A sequence's last block is released first and therefore evicted first: after one finished
// request, an allocation of two blocks takes the never-used block and then the partial last
// block, never the full prefix blocks. The partial block is then gone (reuse stops at 8, not 9),
// and an admission that cannot get enough blocks fails with OUT_OF_BLOCKS without side effects.
TEST(KVCacheManagerLeafBlockTest, LastBlockIsEvictedFirst) {
    kvb::Manager m(evictionConfig(4));

    m.addSequence(kvb::Request(0, tokenRun(0, 10)));
    ASSERT_EQ(m.getCacheBlockIds(0, kWindow), ids({0, 1, 2}));
    kvb_test::markPrefillComputed(m, 0);
    m.removeSequence(0);  // stores 9 tokens: blocks 0, 1 full, block 2 holds token 8
    kvb_block_info_t leaf = m.getBlockInfo(kWindow, 2);
    EXPECT_TRUE(leaf.in_reuse_tree);
    EXPECT_TRUE(leaf.is_leaf);
    EXPECT_EQ(leaf.num_tokens, 1);
    EXPECT_EQ(leaf.parent, 1);
    m.checkInvariants();

    m.addSequence(kvb::Request(1, tokenRun(100, 5)));
    EXPECT_EQ(m.getCacheBlockIds(1, kWindow), ids({3, 2}));
    EXPECT_FALSE(m.getBlockInfo(kWindow, 2).in_reuse_tree);
    EXPECT_TRUE(m.getBlockInfo(kWindow, 1).in_reuse_tree);
    EXPECT_TRUE(m.getBlockInfo(kWindow, 1).is_leaf);
    m.checkInvariants();

    // The original prompt needs its two cached blocks plus a fresh one: only two are free.
    EXPECT_EQ(m.getNumFreeBlocks(), 2);
    kvb::Request again(2, tokenRun(0, 10));
    EXPECT_EQ(statusOf([&] { m.addSequence(again); }), KVB_STATUS_OUT_OF_BLOCKS);
    EXPECT_EQ(m.getNumFreeBlocks(), 2);
    EXPECT_TRUE(m.getBlockInfo(kWindow, 0).is_free);
    EXPECT_TRUE(m.getBlockInfo(kWindow, 1).in_reuse_tree);
    EXPECT_EQ(statusOf([&] { m.getNumTokens(2); }), KVB_STATUS_UNKNOWN_REQUEST);
    m.checkInvariants();

    m.removeSequence(1, false);
    kvb_admission_t a = m.addSequence(again);
    EXPECT_EQ(a.prepopulated_prompt_len, 8);
    std::vector<int32_t> got = m.getCacheBlockIds(2, kWindow);
    EXPECT_EQ(got.at(0), 0);
    EXPECT_EQ(got.at(1), 1);
    m.checkInvariants();
}

// A raised-priority middle block survives its lower-priority neighbours; once evicted it is
// offloaded and stays in the tree as a secondary (host) block under its primary parent. When the
// parent is reclaimed, the whole subtree leaves the tree: the host block is still cached memory
// but no longer reachable (not in the tree, parent -2).
TEST(KVCacheManagerLeafBlockWithDependentTest, ReclaimingParentDetachesDescendants) {
    kvb::Config cfg = evictionConfig(5, 1);
    cfg.raw.secondary_offload_min_priority = 50;  // only the raised block is worth a host block
    kvb::Manager m(cfg);

    kvb::Request r0(0, tokenRun(0, 13));
    r0.withRange(4, 8, 90);
    m.addSequence(r0);
    ASSERT_EQ(m.getCacheBlockIds(0, kWindow), ids({0, 1, 2, 3}));
    kvb_test::markPrefillComputed(m, 0);
    m.removeSequence(0);  // chain 0 -> 1 -> 2 in the tree
    EXPECT_EQ(m.getBlockInfo(kWindow, 1).parent, 0);
    EXPECT_EQ(m.getBlockInfo(kWindow, 1).priority, 90);
    EXPECT_EQ(m.getBlockInfo(kWindow, 2).parent, 1);

    // Request 1 holds the first block, so the middle block becomes evictable before its parent.
    kvb_admission_t a1 = m.addSequence(kvb::Request(1, concatTokens(tokenRun(0, 4), {500})));
    EXPECT_EQ(a1.prepopulated_prompt_len, 4);
    EXPECT_EQ(m.getCacheBlockIds(1, kWindow), ids({0, 4}));

    // Three blocks: block 3 (never stored), block 2 (35 < 50: dropped), block 1 (90: offloaded,
    // its host partner 5 takes its primary row).
    m.addSequence(kvb::Request(2, tokenRun(700, 9)));
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow), ids({3, 2, 5}));
    kvb_block_info_t middle = m.getBlockInfo(kWindow, 1);
    EXPECT_EQ(middle.cache_level, KVB_CACHE_LEVEL_SECONDARY);
    EXPECT_TRUE(middle.in_reuse_tree);
    EXPECT_TRUE(middle.is_free);
    EXPECT_TRUE(middle.is_leaf);
    EXPECT_EQ(middle.parent, 0);
    EXPECT_FALSE(m.getBlockInfo(kWindow, 2).in_reuse_tree);
    EXPECT_EQ(m.getBlockInfo(kWindow, 2).parent, -2);
    EXPECT_EQ(m.getKvCacheStats().offloaded_blocks, 1u);
    m.checkInvariants();

    // Releasing request 1 frees the parent; reclaiming it detaches the host child too.
    m.removeSequence(1, false);
    m.addSequence(kvb::Request(3, tokenRun(900, 5)));
    EXPECT_EQ(m.getCacheBlockIds(3, kWindow), ids({4, 0}));
    middle = m.getBlockInfo(kWindow, 1);
    EXPECT_FALSE(middle.in_reuse_tree);
    EXPECT_EQ(middle.parent, -2);
    EXPECT_EQ(middle.cache_level, KVB_CACHE_LEVEL_SECONDARY);
    EXPECT_TRUE(middle.is_free);
    EXPECT_EQ(middle.priority, 90);
    EXPECT_EQ(reusableBlocks(m, tokenRun(0, 13), kWindow), 0);
    EXPECT_EQ(m.getNumFreeBlocksPerWindowSize(kWindow).second, 1);
    m.checkInvariants();
}

// getPriorityByBlockId returns the retention priority a block was given (also after release);
// ids that name no block (-1, 9999) give the default 35.
TEST(GetPriorityByBlockId, ReturnsSetPriorityOrDefault) {
    kvb::Manager m(evictionConfig(4));
    kvb::Request r(0, tokenRun(0, 9));
    r.withRange(0, 4, 77).withRange(4, -1, 5);
    m.addSequence(r);
    EXPECT_EQ(m.getPriorityByBlockId(kWindow, 0), 77);
    EXPECT_EQ(m.getPriorityByBlockId(kWindow, 1), 5);
    EXPECT_EQ(m.getPriorityByBlockId(kWindow, 2), 5);
    EXPECT_EQ(m.getPriorityByBlockId(kWindow, 3), 35);  // never allocated
    EXPECT_EQ(m.getPriorityByBlockId(kWindow, -1), 35);
    EXPECT_EQ(m.getPriorityByBlockId(kWindow, 9999), 35);
    kvb_test::markPrefillComputed(m, 0);
    m.removeSequence(0);
    EXPECT_EQ(m.getPriorityByBlockId(kWindow, 0), 77);
    EXPECT_EQ(m.getBlockInfo(kWindow, 0).priority, 77);
    EXPECT_EQ(m.getPriorityByBlockId(kWindow, 1), 5);
    m.checkInvariants();
}

// Within one priority the least recently released blocks are evicted first: of two cached
// prefixes, the one released earlier is the one an allocation destroys, whichever it is.
TEST(KVCacheManagerEvictionLruTest, LeastRecentlyReleasedIsEvictedFirst) {
    const std::vector<int32_t> tokensA = tokenRun(0, 5);
    const std::vector<int32_t> tokensB = tokenRun(100, 5);
    for (bool releaseAFirst : {true, false}) {
        SCOPED_TRACE(releaseAFirst ? "A released first" : "B released first");
        kvb::Manager m(evictionConfig(4));
        m.addSequence(kvb::Request(0, tokensA));  // blocks 0, 1
        m.addSequence(kvb::Request(1, tokensB));  // blocks 2, 3
        kvb_test::markPrefillComputed(m, 0);
        kvb_test::markPrefillComputed(m, 1);
        m.removeSequence(releaseAFirst ? 0 : 1);
        m.removeSequence(releaseAFirst ? 1 : 0);
        ASSERT_EQ(reusableBlocks(m, tokensA, kWindow), 1);
        ASSERT_EQ(reusableBlocks(m, tokensB, kWindow), 1);

        m.addSequence(kvb::Request(2, tokenRun(500, 5)));
        EXPECT_EQ(m.getCacheBlockIds(2, kWindow), releaseAFirst ? ids({1, 0}) : ids({3, 2}));
        EXPECT_EQ(reusableBlocks(m, tokensA, kWindow), releaseAFirst ? 0 : 1);
        EXPECT_EQ(reusableBlocks(m, tokensB, kWindow), releaseAFirst ? 1 : 0);
        m.checkInvariants();
    }
}
