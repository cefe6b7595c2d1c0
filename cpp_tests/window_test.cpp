// Sliding-window attention (the TensorRT-LLM test scenarios KVCacheManagerMaxAttentionWindow*,
// KVCacheManagerSWAInvalidateReuseTest and KVCacheManagerVariableWindowAttentionWithReuseTest).
//
// A window smaller than max_sequence_length is a sliding window. Prompt blocks are allocated
// linearly; during addToken, while num_tokens - removed * tpb >= window + tpb the first block
// still held is detached (released if nobody else references it). Detached ids stay listed in
// getCacheBlockIds, so a sequence lists ceil(num_tokens / tpb) ids but holds fewer.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kvblock.hpp"
#include "test_support.hpp"

namespace {

using kvb_test::concatTokens;
using kvb_test::tokenRun;

int32_t ceilDiv(int32_t a, int32_t b) {
    return (a + b - 1) / b;
}

// Front blocks a beam-1 sequence of `t` tokens has detached: the smallest r with
// t - r * tpb < window + tpb.
int32_t detachedBlocks(int32_t t, int32_t window, int32_t tpb) {
    return t >= window + tpb ? (t - window - tpb) / tpb + 1 : 0;
}

kvb::Config swaConfig(int32_t window, int32_t primary, int32_t secondary, int32_t tpb,
                      int32_t maxSeqLen, bool reuse) {
    kvb::Config cfg = kvb_test::windowConfig(window, primary, secondary, tpb, maxSeqLen);
    cfg.raw.enable_block_reuse = reuse;
    return cfg;
}

}  // namespace

// SWA with window = input length (8 tokens, tpb 4, max length 32), no reuse. Four sequences
// generate in lockstep in a pool of exactly 4 * (window / tpb + 1) = 12 blocks: this only works
// because out-of-window blocks are detached and freed during addToken, bounding each sequence to
// 3 live blocks. At 32 tokens every sequence holds 2 blocks, so 4 blocks (one per sequence) end
// up free.
TEST(KVCacheManagerMaxAttentionWindowTest, DetachBoundsFootprint) {
    constexpr int32_t kWindow = 8, kTpb = 4, kMaxLen = 32, kSeqs = 4, kPrimary = 12;
    kvb::Manager m(swaConfig(kWindow, kPrimary, 0, kTpb, kMaxLen, false));
    for (uint64_t s = 0; s < kSeqs; ++s) {
        m.addSequence(kvb::Request(s, tokenRun(static_cast<int32_t>(s) * 100, kWindow)));
    }
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary - 2 * kSeqs);

    const int32_t maxBlocks = m.getOffsetTableDimensions().first;
    std::vector<int32_t> table(static_cast<size_t>(2 * maxBlocks));
    // Free blocks after each token, worked out by hand: allocation at 9, 13, ... and a detach
    // at 12, 16, ... (live blocks 3, 3, 3, 2, 3, ...).
    const int32_t expectedLive[] = {/*9*/ 3, 3, 3, /*12*/ 2, /*13*/ 3, 3, 3, /*16*/ 2};
    for (int32_t t = kWindow + 1; t <= kMaxLen; ++t) {
        for (uint64_t s = 0; s < kSeqs; ++s)
            ASSERT_NO_THROW(m.addToken(s, 1000 + t)) << "token " << t;
        const int32_t listed = ceilDiv(t, kTpb);
        const int32_t live = listed - detachedBlocks(t, kWindow, kTpb);
        if (t - kWindow - 1 < 8) { EXPECT_EQ(live, expectedLive[t - kWindow - 1]) << t; }
        EXPECT_LE(live, kWindow / kTpb + 1);
        EXPECT_EQ(m.getNumFreeBlocks(), kPrimary - kSeqs * live) << "token " << t;
        for (uint64_t s = 0; s < kSeqs; ++s) {
            EXPECT_EQ(static_cast<int32_t>(m.getCacheBlockIds(s, kWindow).size()), listed)
                << "detached ids stay listed";
            // Offsets of detached blocks are still written (their ids are listed).
            EXPECT_EQ(m.copyBlockOffsets(table, 1, 0, s), listed);
        }
        m.checkInvariants();
    }
    EXPECT_EQ(m.getNumFreeBlocks(), kSeqs);
    for (uint64_t s = 0; s < kSeqs; ++s) m.removeSequence(s);
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary);
    m.checkInvariants();
}

// Window 3 smaller than a block (tpb 4): a block is allocated at tokens 5, 9, 13 and the
// previous one detached at 7, 11, 15 (num_tokens - removed * 4 >= 3 + 4), so the sequence holds
// 1 or 2 blocks while its listed ids grow {0}, {0,1}, {0,1,2}, {0,1,2,3}.
TEST(KVCacheManagerMaxAttentionWindowSmallerThanBlockSizeTest, AllocateDetachCadence) {
    constexpr int32_t kWindow = 3, kTpb = 4, kPrimary = 4;
    kvb::Manager m(swaConfig(kWindow, kPrimary, 0, kTpb, 16, false));
    m.addSequence(kvb::Request(1, tokenRun(0, 2)));
    EXPECT_EQ(m.getCacheBlockIds(1, kWindow), (std::vector<int32_t>{0}));
    EXPECT_EQ(m.getNumFreeBlocks(), 3);

    struct Step {
        int32_t tokens, free;
    };
    const Step steps[] = {{3, 3},  {4, 3},  {5, 2},  {6, 2},  {7, 3},  {8, 3},  {9, 2},
                          {10, 2}, {11, 3}, {12, 3}, {13, 2}, {14, 2}, {15, 3}, {16, 3}};
    for (const Step& s : steps) {
        m.addToken(1, 100 + s.tokens);
        EXPECT_EQ(m.getNumTokens(1), s.tokens);
        EXPECT_EQ(m.getNumFreeBlocks(), s.free) << "after token " << s.tokens;
        EXPECT_EQ(static_cast<int32_t>(m.getCacheBlockIds(1, kWindow).size()),
                  ceilDiv(s.tokens, kTpb));
        if (s.tokens == 5) {
            EXPECT_EQ(m.getCacheBlockIds(1, kWindow), (std::vector<int32_t>{0, 1}));
        }
        if (s.tokens == 9) {
            EXPECT_EQ(m.getCacheBlockIds(1, kWindow), (std::vector<int32_t>{0, 1, 2}));
        }
        if (s.tokens == 13) {
            EXPECT_EQ(m.getCacheBlockIds(1, kWindow), (std::vector<int32_t>{0, 1, 2, 3}));
        }
        m.checkInvariants();
    }
    // Blocks 0..2 were detached and freed; block 3 is the only one held.
    EXPECT_EQ(m.getBlockInfo(kWindow, 2).ref_count, 0);
    EXPECT_TRUE(m.getBlockInfo(kWindow, 2).is_free);
    EXPECT_EQ(m.getBlockInfo(kWindow, 3).ref_count, 1);
    m.removeSequence(1);
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary);
    m.checkInvariants();
}

// SWA (window 8, tpb 4, max length 32) with reuse and a host pool. A sequence that detached its
// first block still stores all its blocks at removal when nobody took the detached block; a block
// offloaded to host is onboarded on reuse and keeps its id; an unreferenced partially matching
// leaf is taken over, and a referenced one is copied into a fresh block. Detaching blocks that
// another sequence still references frees nothing.
TEST(KVCacheManagerMaxAttentionWindowWithReuseTest, IdsAndPartialReuse) {
    constexpr int32_t kWindow = 8, kPrimary = 8, kSecondary = 4;
    kvb::Manager m(swaConfig(kWindow, kPrimary, kSecondary, 4, 32, true));
    const auto promptA = tokenRun(0, 10);
    m.addSequence(kvb::Request(1, promptA));
    for (int32_t t : {100, 101, 102, 103, 104}) m.addToken(1, t);  // 15 tokens
    EXPECT_EQ(m.getCacheBlockIds(1, kWindow), (std::vector<int32_t>{0, 1, 2, 3}));
    EXPECT_EQ(m.getBlockInfo(kWindow, 0).ref_count, 0) << "detached at 12 tokens";
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary - 3);
    m.checkInvariants();

    // Stores tokens 0..13: three full blocks and a partial one of 2 tokens, detached block 0
    // included.
    m.removeSequence(1);
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary);
    const int64_t parents[] = {-1, 0, 1, 2};
    for (int32_t b = 0; b < 4; ++b) {
        const auto info = m.getBlockInfo(kWindow, b);
        EXPECT_TRUE(info.in_reuse_tree) << b;
        EXPECT_EQ(info.parent, parents[b]) << b;
        EXPECT_EQ(info.num_tokens, b == 3 ? 2 : 4) << b;
    }

    // Move block 0 to the host tier.
    EXPECT_TRUE(m.offloadBlock(kWindow, 0));
    EXPECT_EQ(m.getBlockInfo(kWindow, 0).cache_level, KVB_CACHE_LEVEL_SECONDARY);
    EXPECT_EQ(m.getNumFreeBlocksPerWindowSize(kWindow),
              (std::pair<int64_t, int64_t>{kPrimary, kSecondary}));
    m.checkInvariants();

    // B repeats A's 14 stored tokens (+1 last token): 3 full matches (block 0 onboarded) and the
    // free partial leaf 3 taken over. Same ids as A; one allocation (the onboarding row).
    const auto promptB = concatTokens(promptA, {100, 101, 102, 103, 7});
    const auto b = m.addSequence(kvb::Request(2, promptB));
    EXPECT_EQ(b.prepopulated_prompt_len, 14);
    EXPECT_EQ(b.stats.reused_blocks, 4u);
    EXPECT_EQ(b.stats.missed_blocks, 0u);
    EXPECT_EQ(b.stats.alloc_total_blocks, 1u);
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow), (std::vector<int32_t>{0, 1, 2, 3}));
    EXPECT_EQ(m.getBlockInfo(kWindow, 0).cache_level, KVB_CACHE_LEVEL_PRIMARY);
    EXPECT_FALSE(m.getBlockInfo(kWindow, 3).in_reuse_tree) << "taken-over leaf leaves the tree";
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary - 4);
    m.checkInvariants();

    // C diverges inside block 2, which B references: 2 tokens are copied into a fresh block.
    const auto promptC = concatTokens(promptA, {999, 998, 997});
    const auto c = m.addSequence(kvb::Request(3, promptC));
    EXPECT_EQ(c.prepopulated_prompt_len, 10);
    EXPECT_EQ(c.stats.reused_blocks, 3u);
    EXPECT_EQ(c.stats.missed_blocks, 1u);
    EXPECT_EQ(c.stats.alloc_total_blocks, 2u);
    const auto idsC = m.getCacheBlockIds(3, kWindow);
    ASSERT_EQ(idsC.size(), 4u);
    EXPECT_EQ(idsC[0], 0);
    EXPECT_EQ(idsC[1], 1);
    EXPECT_NE(idsC[2], 2) << "a referenced block is copied, not shared";
    EXPECT_EQ(m.getBlockInfo(kWindow, 2).ref_count, 1);
    EXPECT_EQ(m.getBlockInfo(kWindow, 0).ref_count, 2);
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary - 6);
    m.checkInvariants();

    // B's 16th token detaches blocks 0 and 1 (16 - 2 * 4 < 12); C still holds them.
    m.addToken(2, 200);
    EXPECT_EQ(m.getBlockInfo(kWindow, 0).ref_count, 1);
    EXPECT_EQ(m.getBlockInfo(kWindow, 1).ref_count, 1);
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary - 6);
    m.addToken(2, 201);  // 17 tokens: a new block
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow).size(), 5u);
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary - 7);
    m.checkInvariants();

    m.removeSequence(2);
    kvb_test::markPrefillComputed(m, 3);
    m.removeSequence(3);
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary);
    m.checkInvariants();
}

// When a block that sequence A detached is allocated to another sequence, its content is no
// longer A's: A's removeSequence must not store A's blocks, so an identical prompt later finds
// nothing (nothing was stored before either).
TEST(KVCacheManagerSWAInvalidateReuseTest, TakenDetachedBlockInvalidatesStore) {
    constexpr int32_t kWindow = 8;
    // 4 primary blocks: A's detached block 0 is the only free block when B arrives.
    kvb::Manager m(swaConfig(kWindow, 4, 0, 4, 32, true));
    const auto tokensA = concatTokens(tokenRun(0, 10), {100, 101, 102});
    m.addSequence(kvb::Request(1, tokenRun(0, 10)));
    for (int32_t t : {100, 101, 102}) m.addToken(1, t);  // detach block 0 at 12, allocate at 13
    EXPECT_EQ(m.getCacheBlockIds(1, kWindow), (std::vector<int32_t>{0, 1, 2, 3}));
    EXPECT_EQ(m.getNumFreeBlocks(), 1);

    m.addSequence(kvb::Request(2, {500, 501, 502}));
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow), (std::vector<int32_t>{0}))
        << "B takes A's detached block";
    m.checkInvariants();

    m.removeSequence(1, /*storeForReuse=*/true);
    EXPECT_EQ(m.countReusableBlocks(kvb::Request(9, tokensA), kWindow), 0);
    m.removeSequence(2, /*storeForReuse=*/false);
    const auto d = m.addSequence(kvb::Request(3, tokensA));
    EXPECT_EQ(d.prepopulated_prompt_len, 0) << "A's blocks were not stored";
    EXPECT_EQ(d.stats.reused_blocks, 0u);
    m.checkInvariants();
}

// Counterpart: when nobody took the detached block, A's removeSequence stores all its blocks
// (detached one included) and an identical prompt reuses 12 tokens.
TEST(KVCacheManagerSWAInvalidateReuseTest, UntakenDetachedBlockIsStored) {
    constexpr int32_t kWindow = 8;
    kvb::Manager m(swaConfig(kWindow, 8, 0, 4, 32, true));
    const auto tokensA = concatTokens(tokenRun(0, 10), {100, 101, 102});
    m.addSequence(kvb::Request(1, tokenRun(0, 10)));
    for (int32_t t : {100, 101, 102}) m.addToken(1, t);
    EXPECT_EQ(m.getBlockInfo(kWindow, 0).ref_count, 0);

    m.addSequence(kvb::Request(2, {500, 501, 502}));
    EXPECT_NE(m.getCacheBlockIds(2, kWindow), (std::vector<int32_t>{0}));
    m.removeSequence(1, /*storeForReuse=*/true);
    EXPECT_EQ(m.countReusableBlocks(kvb::Request(9, tokensA), kWindow), 3);
    m.removeSequence(2, /*storeForReuse=*/false);

    const auto d = m.addSequence(kvb::Request(3, tokensA));
    EXPECT_EQ(d.prepopulated_prompt_len, 12);
    EXPECT_EQ(d.stats.reused_blocks, 3u);
    const auto ids = m.getCacheBlockIds(3, kWindow);
    ASSERT_EQ(ids.size(), 4u);
    EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + 3), (std::vector<int32_t>{0, 1, 2}));
    m.checkInvariants();
}

// VSWA: windows 8 (6 blocks, 1 layer) and 16 (8 blocks, 2 layers) with max length 16. Each
// window has its own pool and its own block ids; reuse works in both; every window reuses the
// same number of tokens (the minimum over windows); a partial match of a referenced block is
// copied (first N tokens of every layer and K/V slab) in each window's own pool.
TEST(KVCacheManagerVariableWindowAttentionWithReuseTest, SeparatePoolsReuseAndPartialCopy) {
    constexpr int32_t kSmall = 8, kLarge = 16, kTpb = 4;
    kvb::Config cfg;
    cfg.addWindow(kLarge, 8, 0, /*layers=*/2);
    cfg.addWindow(kSmall, 6, 0, /*layers=*/1);
    cfg.raw.tokens_per_block = kTpb;
    cfg.raw.max_sequence_length = 16;
    cfg.raw.copy_backend = KVB_COPY_BACKEND_HOST;
    kvb::Manager m(cfg);
    EXPECT_EQ(m.getOffsetTableDimensions(), (std::pair<int32_t, int32_t>{4, 2}));
    const auto poolSmall = m.getPoolPointer(kSmall, KVB_CACHE_LEVEL_PRIMARY);
    const auto poolLarge = m.getPoolPointer(kLarge, KVB_CACHE_LEVEL_PRIMARY);
    EXPECT_NE(poolSmall.first, poolLarge.first);
    // Row = layers * 2 (K, V) * 1 head * 4 tokens * 1 element * 2 bytes.
    EXPECT_EQ(poolSmall.second, 16u);
    EXPECT_EQ(poolLarge.second, 32u);

    const auto prompt = tokenRun(0, 10);
    m.addSequence(kvb::Request(1, prompt));
    for (int32_t w : {kSmall, kLarge}) {
        EXPECT_EQ(m.getCacheBlockIds(1, w), (std::vector<int32_t>{0, 1, 2})) << w;
    }
    EXPECT_EQ(m.getNumFreeBlocksPerWindowSize(kSmall).first, 3);
    EXPECT_EQ(m.getNumFreeBlocksPerWindowSize(kLarge).first, 5);
    EXPECT_EQ(m.getNumFreeBlocks(), 8);
    std::vector<int32_t> table(2 * 1 * 2 * 4);
    m.copyBlockOffsets(table, 1, 0, 1);
    // Pool 0 is the small window (stride 2 * 1 layer), pool 1 the large one (2 * 2 layers).
    EXPECT_EQ(table[2], 2 * 2);
    EXPECT_EQ(table[8 + 2], 2 * 4);
    EXPECT_EQ(table[8 + 4 + 2], 2 * 4 + 1);

    // A stores tokens 0..8 in both windows: two full blocks and a partial one ([8]).
    kvb_test::markPrefillComputed(m, 1);
    m.removeSequence(1);
    for (int32_t w : {kSmall, kLarge}) {
        EXPECT_TRUE(m.getBlockInfo(w, 2).in_reuse_tree) << w;
        EXPECT_EQ(m.getBlockInfo(w, 2).parent, 1) << w;
    }

    // C (13 tokens, 4 blocks) evicts A's partial block 2 from the small window only: there it is
    // the 4th free block in line, in the large window the 8th.
    m.addSequence(kvb::Request(2, tokenRun(100, 13)));
    EXPECT_EQ(m.getCacheBlockIds(2, kSmall), (std::vector<int32_t>{3, 4, 5, 2}));
    EXPECT_EQ(m.getCacheBlockIds(2, kLarge), (std::vector<int32_t>{3, 4, 5, 6}));
    EXPECT_FALSE(m.getBlockInfo(kSmall, 2).in_reuse_tree);
    EXPECT_TRUE(m.getBlockInfo(kLarge, 2).in_reuse_tree);
    m.removeSequence(2, /*storeForReuse=*/false);
    m.checkInvariants();

    // B repeats A's prompt: the large window could reuse 9 tokens, the small one 8; both reuse 8.
    const auto b = m.addSequence(kvb::Request(3, prompt));
    EXPECT_EQ(b.prepopulated_prompt_len, 8);
    EXPECT_EQ(b.stats.reused_blocks, 4u) << "2 blocks in each window";
    EXPECT_EQ(b.stats.missed_blocks, 2u);
    EXPECT_EQ(m.getCacheBlockIds(3, kSmall), (std::vector<int32_t>{0, 1, 2}));
    EXPECT_EQ(m.getCacheBlockIds(3, kLarge), (std::vector<int32_t>{0, 1, 7}));
    EXPECT_TRUE(m.getBlockInfo(kLarge, 2).in_reuse_tree)
        << "the large window's partial leaf stays cached";
    EXPECT_EQ(m.getBlockInfo(kLarge, 2).ref_count, 0);
    m.checkInvariants();

    // Zero both primary pools, then give block 1 (held by B) a recognisable pattern.
    auto pattern = [](int32_t slab, int32_t token, int32_t byte) {
        return static_cast<uint8_t>(1 + slab * 16 + token * 2 + byte);
    };
    for (int32_t w : {kSmall, kLarge}) {
        const auto pool = m.getPoolPointer(w, KVB_CACHE_LEVEL_PRIMARY);
        std::memset(pool.first, 0, pool.second * static_cast<size_t>(w == kSmall ? 6 : 8));
        uint8_t* row =
            pool.first + pool.second * static_cast<size_t>(m.getBlockInfo(w, 1).memory_index);
        const int32_t slabs = w == kSmall ? 2 : 4;  // layers * (K, V)
        for (int32_t s = 0; s < slabs; ++s)
            for (int32_t t = 0; t < kTpb; ++t)
                for (int32_t byte = 0; byte < 2; ++byte)
                    row[s * 8 + t * 2 + byte] = pattern(s, t, byte);
    }

    // D diverges after 6 tokens, inside block 1 which B references: in each window block 0 is
    // shared and the first 2 tokens of block 1 are copied into a fresh block.
    const auto d = m.addSequence(kvb::Request(4, concatTokens(tokenRun(0, 6), {50, 51, 52})));
    EXPECT_EQ(d.prepopulated_prompt_len, 6);
    EXPECT_EQ(m.getCacheBlockIds(4, kSmall), (std::vector<int32_t>{0, 5, 4}));
    EXPECT_EQ(m.getCacheBlockIds(4, kLarge), (std::vector<int32_t>{0, 2, 6}));
    for (int32_t w : {kSmall, kLarge}) {
        const int32_t copy = m.getCacheBlockIds(4, w)[1];
        const auto pool = m.getPoolPointer(w, KVB_CACHE_LEVEL_PRIMARY);
        const size_t rowIndex = static_cast<size_t>(m.getBlockInfo(w, copy).memory_index);
        const uint8_t* row = pool.first + pool.second * rowIndex;
        const int32_t slabs = w == kSmall ? 2 : 4;
        for (int32_t s = 0; s < slabs; ++s)
            for (int32_t t = 0; t < kTpb; ++t)
                for (int32_t byte = 0; byte < 2; ++byte) {
                    const uint8_t want = t < 2 ? pattern(s, t, byte) : 0;
                    EXPECT_EQ(row[s * 8 + t * 2 + byte], want)
                        << "window " << w << " slab " << s << " token " << t;
                }
    }
    m.checkInvariants();

    kvb_test::markPrefillComputed(m, 3);
    m.removeSequence(3);
    kvb_test::markPrefillComputed(m, 4);
    m.removeSequence(4);
    EXPECT_EQ(m.getNumFreeBlocksPerWindowSize(kSmall).first, 6);
    EXPECT_EQ(m.getNumFreeBlocksPerWindowSize(kLarge).first, 8);
    m.checkInvariants();
}
