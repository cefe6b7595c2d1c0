// Block allocation and prefix-reuse scenarios through the public C++ wrapper (the scenarios of
// TensorRT-LLM's tests BlockManagerTest, BlockManagerReuse*Test, KVCacheManagerPerRequestStatsTest,
// PinAndUnpinBlocksById, FindBlocksInReuseTreeByBlockKeysTest).
//
// Every scenario uses tokens_per_block 4, one full-attention window of 128 tokens (= the
// maximum sequence length) and a handful of primary blocks, so expected ids and counts can be
// worked out by hand. Facts the comments rely on:
//   * a fresh manager hands out primary blocks in id order 0, 1, 2, ... (free queue order);
//   * released blocks go to the back of the free queue, last block of a sequence first, so
//     never-used blocks are taken before cached ones;
//   * reuse keys cover input_length - 1 tokens: a 9-token prompt stores blocks [0..4) and
//     [4..8); its third block (token 8 only) gets no key and is never stored.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kvblock.hpp"
#include "test_support.hpp"

namespace {

constexpr int32_t kTpb = 4;
constexpr int32_t kWindow = 128;

kvb::Manager makeManager(int32_t primaryBlocks, bool reuse = true, int32_t maxBeamWidth = 1) {
    kvb::Config c = kvb_test::windowConfig(kWindow, primaryBlocks, 0, kTpb, kWindow);
    c.raw.max_beam_width = maxBeamWidth;
    c.raw.enable_block_reuse = reuse;
    return kvb::Manager(c);
}

// Tokens begin, begin + 1, ..., end - 1 (end excluded; kvb_test::tokenRun takes a count).
std::vector<int32_t> tokenRange(int32_t begin, int32_t end) {
    std::vector<int32_t> v;
    for (int32_t t = begin; t < end; ++t) v.push_back(t);
    return v;
}

using kvb_test::concatTokens;
using kvb_test::ids;
using kvb_test::statusOf;

/// Admits `r`, computes its prompt (kvb_test::markPrefillComputed) and releases it, storing its
/// blocks for reuse.
kvb_admission_t storePrompt(kvb::Manager& m, const kvb::Request& r) {
    kvb_admission_t a = m.addSequence(r);
    kvb_test::markPrefillComputed(m, r.id);
    m.removeSequence(r.id, true);
    return a;
}

/// Admits `r`, returns its prepopulated length and releases it without storing anything new.
int32_t probeReuse(kvb::Manager& m, const kvb::Request& r) {
    int32_t p = m.addSequence(r).prepopulated_prompt_len;
    m.checkInvariants();
    m.removeSequence(r.id, false);
    return p;
}

::testing::AssertionResult admitted(const kvb_admission_t& a, int32_t prepopulated, uint64_t reused,
                                    uint64_t missed, uint64_t allocTotal, uint64_t allocNew) {
    const kvb_request_stats_t& s = a.stats;
    if (a.prepopulated_prompt_len == prepopulated && s.reused_blocks == reused &&
        s.missed_blocks == missed && s.alloc_total_blocks == allocTotal &&
        s.alloc_new_blocks == allocNew) {
        return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure()
           << "got prepopulated=" << a.prepopulated_prompt_len << " reused=" << s.reused_blocks
           << " missed=" << s.missed_blocks << " allocTotal=" << s.alloc_total_blocks
           << " allocNew=" << s.alloc_new_blocks << "; expected " << prepopulated << "/" << reused
           << "/" << missed << "/" << allocTotal << "/" << allocNew;
}

kvb_multimodal_item_t mmItem(uint8_t digestByte, int32_t position, int32_t length) {
    kvb_multimodal_item_t item{};
    std::memset(item.digest, digestByte, sizeof(item.digest));
    item.position = position;
    item.length = length;
    return item;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// BlockManagerTest: allocation without reuse, beam search, failures.
// ---------------------------------------------------------------------------------------------

// With beam search the context blocks are shared by all beams, except the last one when the
// prompt does not end on a block boundary: every beam will write its own token into it.
TEST(BlockManagerTest, BeamSearchSharesContextBlocksExceptPerBeamLastBlock) {
    auto m = makeManager(16, /*reuse=*/false, /*maxBeamWidth=*/4);
    // 10 tokens = 3 context blocks: 2 shared (ids 0, 1) + one per beam (ids 2..5).
    m.addSequence(kvb::Request(1, tokenRange(0, 10)).withBeamWidth(4));
    for (int32_t beam = 0; beam < 4; ++beam) {
        EXPECT_EQ(m.getCacheBlockIds(1, kWindow, beam), ids({0, 1, 2 + beam})) << "beam " << beam;
    }
    // (n - 1) + beamWidth = 2 + 4 blocks in use.
    EXPECT_EQ(m.getNumFreeBlocks(), 16 - 6);
    EXPECT_EQ(m.getKvCacheStats().used_num_blocks, 6u);
    EXPECT_EQ(m.getBlockInfo(kWindow, 0).ref_count, 4);  // one reference per beam
    EXPECT_EQ(m.getBlockInfo(kWindow, 2).ref_count, 1);
    m.checkInvariants();

    m.removeSequence(1);
    EXPECT_EQ(m.getNumFreeBlocks(), 16);
    EXPECT_EQ(m.getKvCacheStats().used_num_blocks, 0u);
    for (int32_t b = 0; b < 6; ++b) {
        EXPECT_TRUE(m.getBlockInfo(kWindow, b).is_free) << "block " << b;
    }
    m.checkInvariants();
}

// A prompt ending on a block boundary has no partially written last block: without reuse all of
// its blocks are shared among the beams (TensorRT-LLM's isShareLastContextBlock).
TEST(BlockManagerTest, PromptOnBlockBoundarySharesLastContextBlock) {
    auto m = makeManager(16, /*reuse=*/false, /*maxBeamWidth=*/4);
    m.addSequence(kvb::Request(1, tokenRange(0, 8)).withBeamWidth(4));
    for (int32_t beam = 0; beam < 4; ++beam) {
        EXPECT_EQ(m.getCacheBlockIds(1, kWindow, beam), ids({0, 1})) << "beam " << beam;
    }
    EXPECT_EQ(m.getNumFreeBlocks(), 16 - 2);
    m.checkInvariants();
    m.removeSequence(1);
    EXPECT_EQ(m.getNumFreeBlocks(), 16);
    m.checkInvariants();
}

// With reuse on, the last context block of a beam-search request is always per beam (it is
// written by the beams), and beam-search sequences are not stored for reuse at release.
TEST(BlockManagerTest, WithReuseBeamSearchLastContextBlockIsPerBeamAndNotStored) {
    auto m = makeManager(16, /*reuse=*/true, /*maxBeamWidth=*/4);
    // 8 tokens = 2 context blocks: block 0 shared, then one block per beam (1..4).
    m.addSequence(kvb::Request(1, tokenRange(0, 8)).withBeamWidth(4));
    for (int32_t beam = 0; beam < 4; ++beam) {
        EXPECT_EQ(m.getCacheBlockIds(1, kWindow, beam), ids({0, 1 + beam})) << "beam " << beam;
    }
    EXPECT_EQ(m.getNumFreeBlocks(), 16 - 5);
    m.checkInvariants();
    m.removeSequence(1, true);
    EXPECT_EQ(m.getNumFreeBlocks(), 16);
    EXPECT_FALSE(m.getBlockInfo(kWindow, 0).in_reuse_tree);
    // So the same prompt with beam width 1 finds nothing to reuse.
    EXPECT_EQ(m.addSequence(kvb::Request(2, tokenRange(0, 8))).prepopulated_prompt_len, 0);
    m.checkInvariants();
}

// A request id can only be admitted once while its sequence lives; the failed call changes
// nothing, and the id can be used again after release.
TEST(BlockManagerTest, DuplicateRequestIdFails) {
    auto m = makeManager(16, /*reuse=*/false, /*maxBeamWidth=*/4);
    m.addSequence(kvb::Request(1, tokenRange(0, 10)).withBeamWidth(4));
    const auto before = m.getKvCacheStats();
    EXPECT_EQ(statusOf([&] { m.addSequence(kvb::Request(1, tokenRange(50, 54))); }),
              KVB_STATUS_DUPLICATE_REQUEST);
    EXPECT_EQ(m.getNumFreeBlocks(), 10);
    EXPECT_EQ(m.getKvCacheStats().alloc_total_blocks, before.alloc_total_blocks);
    EXPECT_EQ(m.getCacheBlockIds(1, kWindow, 3), ids({0, 1, 5}));  // the live sequence is intact
    m.checkInvariants();

    m.removeSequence(1);
    m.addSequence(kvb::Request(1, tokenRange(50, 54)));
    EXPECT_EQ(m.getNumFreeBlocks(), 15);
    m.checkInvariants();
}

// When a request needs more blocks than are free, admission fails with OUT_OF_BLOCKS and the
// manager is unchanged: no sequence, no blocks taken, no counters moved.
TEST(BlockManagerTest, OutOfBlocksFailsAndChangesNothing) {
    auto m = makeManager(16, /*reuse=*/false, /*maxBeamWidth=*/4);
    // Each 10-token, 4-beam request takes 2 + 4 = 6 blocks: 16 -> 10 -> 4.
    m.addSequence(kvb::Request(1, tokenRange(0, 10)).withBeamWidth(4));
    m.addSequence(kvb::Request(2, tokenRange(0, 10)).withBeamWidth(4));
    EXPECT_EQ(m.getNumFreeBlocks(), 4);
    const auto before = m.getKvCacheStats();

    EXPECT_EQ(statusOf([&] { m.addSequence(kvb::Request(3, tokenRange(0, 10)).withBeamWidth(4)); }),
              KVB_STATUS_OUT_OF_BLOCKS);
    EXPECT_EQ(m.getNumFreeBlocks(), 4);
    const auto after = m.getKvCacheStats();
    EXPECT_EQ(after.alloc_total_blocks, before.alloc_total_blocks);
    EXPECT_EQ(after.alloc_new_blocks, before.alloc_new_blocks);
    EXPECT_EQ(after.missed_blocks, before.missed_blocks);
    EXPECT_EQ(statusOf([&] { m.getCacheBlockIds(3, kWindow); }), KVB_STATUS_UNKNOWN_REQUEST);
    m.checkInvariants();

    // Once blocks are released the same request fits.
    m.removeSequence(1);
    m.addSequence(kvb::Request(3, tokenRange(0, 10)).withBeamWidth(4));
    EXPECT_EQ(m.getNumFreeBlocks(), 4);
    m.checkInvariants();
}

// ---------------------------------------------------------------------------------------------
// BlockManagerReuseTest: the core reuse scenarios.
// ---------------------------------------------------------------------------------------------

// Full blocks stored by a finished request are shared, with the same block ids, by later
// requests with the same prefix; only the rest is allocated.
TEST(BlockManagerReuseTest, ExactReuseOfFullBlocks) {
    auto m = makeManager(16);
    auto a1 = m.addSequence(kvb::Request(1, tokenRange(0, 9)));
    EXPECT_TRUE(admitted(a1, 0, 0, 3, 3, 3));
    EXPECT_EQ(m.getCacheBlockIds(1, kWindow), ids({0, 1, 2}));
    EXPECT_EQ(m.getNumFreeBlocks(), 13);
    m.checkInvariants();

    kvb_test::markPrefillComputed(m, 1);
    m.removeSequence(1, true);  // stores [0..4) and [4..8)
    EXPECT_EQ(m.getNumFreeBlocks(), 16);
    EXPECT_EQ(m.getKvCacheStats().used_num_blocks, 0u);
    EXPECT_TRUE(m.getBlockInfo(kWindow, 0).in_reuse_tree);
    EXPECT_TRUE(m.getBlockInfo(kWindow, 1).in_reuse_tree);
    EXPECT_FALSE(m.getBlockInfo(kWindow, 2).in_reuse_tree);  // held only the last token
    m.checkInvariants();

    // Same prompt: 8 tokens reused from blocks 0 and 1; the third block is new (block 3).
    auto a2 = m.addSequence(kvb::Request(2, tokenRange(0, 9)));
    EXPECT_TRUE(admitted(a2, 8, 2, 1, 1, 1));
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow), ids({0, 1, 3}));
    EXPECT_EQ(m.getNumFreeBlocks(), 13);
    EXPECT_EQ(m.getBlockInfo(kWindow, 0).ref_count, 1);
    EXPECT_FALSE(m.getBlockInfo(kWindow, 0).is_free);
    m.checkInvariants();

    // A concurrent request shares the same blocks (2 references each) and takes block 4.
    auto a3 = m.addSequence(kvb::Request(3, tokenRange(0, 9)));
    EXPECT_TRUE(admitted(a3, 8, 2, 1, 1, 1));
    EXPECT_EQ(m.getCacheBlockIds(3, kWindow), ids({0, 1, 4}));
    EXPECT_EQ(m.getBlockInfo(kWindow, 1).ref_count, 2);
    EXPECT_EQ(m.getNumFreeBlocks(), 12);
    m.checkInvariants();

    auto s = m.getKvCacheStats();
    EXPECT_EQ(s.reused_blocks, 4u);
    EXPECT_EQ(s.missed_blocks, 5u);
    EXPECT_EQ(s.alloc_total_blocks, 5u);
    EXPECT_DOUBLE_EQ(s.cache_hit_rate, 4.0 / 9.0);

    kvb_test::markPrefillComputed(m, 2);
    m.removeSequence(2, true);
    kvb_test::markPrefillComputed(m, 3);
    m.removeSequence(3, true);
    EXPECT_EQ(m.getNumFreeBlocks(), 16);
    m.checkInvariants();
}

// A partial match of a stored block that no sequence references and that has no children is
// taken over: the new sequence owns it (no allocation, no copy) and it leaves the reuse tree.
TEST(BlockManagerReuseTest, PartialReuseTakesOverUnreferencedLeaf) {
    auto m = makeManager(16);
    // 7 tokens: stores [0..4) in block 0 and the partial [4, 5] in block 1.
    storePrompt(m, kvb::Request(1, tokenRange(0, 7)));
    auto leaf = m.getBlockInfo(kWindow, 1);
    EXPECT_TRUE(leaf.in_reuse_tree);
    EXPECT_TRUE(leaf.is_leaf);
    EXPECT_EQ(leaf.num_tokens, 2);
    EXPECT_EQ(m.getNumFreeBlocks(), 16);

    // Shares 0..5 then diverges: block 0 exact, block 1 partially (2 tokens) -> 6 reused.
    const auto prompt = concatTokens(tokenRange(0, 6), {100, 101, 102});
    auto a2 = m.addSequence(kvb::Request(2, prompt));
    EXPECT_TRUE(admitted(a2, 6, 2, 1, 1, 1));
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow), ids({0, 1, 2}));  // block 1 itself, not a copy
    EXPECT_EQ(m.getNumFreeBlocks(), 13);
    auto taken = m.getBlockInfo(kWindow, 1);
    EXPECT_FALSE(taken.in_reuse_tree);
    EXPECT_EQ(taken.parent, -2);
    EXPECT_EQ(taken.ref_count, 1);
    m.checkInvariants();

    // The taken-over block is no longer reusable: the same prompt now only reuses block 0.
    auto a3 = m.addSequence(kvb::Request(3, prompt));
    EXPECT_TRUE(admitted(a3, 4, 1, 2, 2, 2));
    EXPECT_EQ(m.getCacheBlockIds(3, kWindow), ids({0, 3, 4}));
    EXPECT_EQ(m.getNumFreeBlocks(), 11);
    m.checkInvariants();
}

// A partial match of a block that a running sequence references is not taken away from it: the
// matched prefix is copied into a fresh block (copy-on-partial-reuse) with its own id.
TEST(BlockManagerReuseTest, PartialReuseCopiesBlockReferencedByRunningSequence) {
    auto m = makeManager(16);
    m.addSequence(kvb::Request(1, tokenRange(0, 9)));  // blocks 0, 1, 2
    m.storeContextBlocks(1, 9);                        // stores [0..4), [4..8) while running
    EXPECT_EQ(m.getNumFreeBlocks(), 13);
    m.checkInvariants();

    // Block 0 matches exactly (shared); block 1 matches 2 tokens but request 1 holds it, so its
    // first 2 tokens are copied into block 3; block 4 holds the rest.
    const auto prompt = concatTokens(tokenRange(0, 6), {200, 201, 202});
    auto a2 = m.addSequence(kvb::Request(2, prompt));
    EXPECT_TRUE(admitted(a2, 6, 2, 1, 2, 2));
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow), ids({0, 3, 4}));
    EXPECT_EQ(m.getNumFreeBlocks(), 11);
    EXPECT_EQ(m.getBlockInfo(kWindow, 0).ref_count, 2);
    auto source = m.getBlockInfo(kWindow, 1);
    EXPECT_TRUE(source.in_reuse_tree);
    EXPECT_EQ(source.ref_count, 1);
    EXPECT_FALSE(m.getBlockInfo(kWindow, 3).in_reuse_tree);
    m.checkInvariants();

    // Released, both branches under block 0 are reusable.
    kvb_test::markPrefillComputed(m, 2);
    m.removeSequence(2, true);
    m.removeSequence(1, true);
    EXPECT_EQ(m.getNumFreeBlocks(), 16);
    EXPECT_EQ(m.getBlockInfo(kWindow, 3).parent, 0);
    EXPECT_EQ(m.getBlockInfo(kWindow, 1).parent, 0);
    auto a3 = m.addSequence(kvb::Request(3, prompt));
    EXPECT_EQ(a3.prepopulated_prompt_len, 8);
    EXPECT_EQ(m.getCacheBlockIds(3, kWindow)[1], 3);
    m.checkInvariants();
}

// A partial match of an inner block (it has stored children) is copied even when unreferenced:
// taking it over would cut its descendants off the tree.
TEST(BlockManagerReuseTest, PartialMatchOfInnerBlockIsCopied) {
    auto m = makeManager(16);
    storePrompt(m, kvb::Request(1, tokenRange(0, 13)));  // chain 0 -> 1 -> 2
    EXPECT_FALSE(m.getBlockInfo(kWindow, 1).is_leaf);

    // Block 1 matches 2 tokens: copied into the first never-used block (4); block 5 is new.
    auto a2 = m.addSequence(kvb::Request(2, concatTokens(tokenRange(0, 6), {300, 301, 302})));
    EXPECT_TRUE(admitted(a2, 6, 2, 1, 2, 2));
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow), ids({0, 4, 5}));
    EXPECT_EQ(m.getNumFreeBlocks(), 13);
    auto inner = m.getBlockInfo(kWindow, 1);
    EXPECT_TRUE(inner.in_reuse_tree);
    EXPECT_TRUE(inner.is_free);
    EXPECT_EQ(inner.ref_count, 0);
    EXPECT_EQ(m.getBlockInfo(kWindow, 2).parent, 1);  // the descendant is still linked
    m.checkInvariants();
}

// The KV of the last prompt token is always recomputed: a prompt of exactly two blocks reuses
// at most 2 * 4 - 1 = 7 tokens, whether the cache holds its own partial block or longer full
// blocks.
TEST(BlockManagerReuseTest, LastPromptTokenIsNeverReused) {
    {
        auto m = makeManager(16);
        // 8 tokens: keys cover 7 -> block 0 [0..4) and the partial block 1 [4, 5, 6].
        auto a1 = storePrompt(m, kvb::Request(1, tokenRange(0, 8)));
        EXPECT_TRUE(admitted(a1, 0, 0, 2, 2, 2));
        EXPECT_EQ(m.getBlockInfo(kWindow, 1).num_tokens, 3);
        // Same prompt: block 0 shared, block 1 (unreferenced leaf) taken over; nothing allocated.
        auto a2 = m.addSequence(kvb::Request(2, tokenRange(0, 8)));
        EXPECT_TRUE(admitted(a2, 7, 2, 0, 0, 0));
        EXPECT_EQ(m.getCacheBlockIds(2, kWindow), ids({0, 1}));
        EXPECT_EQ(m.getNumFreeBlocks(), 14);
        m.checkInvariants();
    }
    {
        auto m = makeManager(16);
        // 16 tokens: stores full blocks 0, 1, 2 and the partial block 3 [12, 13, 14].
        storePrompt(m, kvb::Request(1, tokenRange(0, 16)));
        // 8-token prompt: block 1 is cached in full, yet only 3 of its tokens are reused (copied
        // into the never-used block 4, as block 1 is an inner block).
        auto a2 = m.addSequence(kvb::Request(2, tokenRange(0, 8)));
        EXPECT_TRUE(admitted(a2, 7, 2, 0, 1, 1));
        EXPECT_EQ(m.getCacheBlockIds(2, kWindow), ids({0, 4}));
        EXPECT_EQ(m.getNumFreeBlocks(), 14);
        m.checkInvariants();
    }
}

// A prompt shorter than the stored one reuses the common prefix; the part of a block it shares
// is copied from the stored block.
TEST(BlockManagerReuseTest, ShorterPromptReusesPrefixOfStoredChain) {
    auto m = makeManager(16);
    storePrompt(m, kvb::Request(1, tokenRange(0, 13)));  // chain 0 -> 1 -> 2, block 3 unkeyed
    EXPECT_EQ(m.getNumFreeBlocks(), 16);
    // 6 tokens: keys cover [0..4) (block 0) and [4] (1 token of inner block 1 -> copy into 4).
    auto a2 = m.addSequence(kvb::Request(2, tokenRange(0, 6)));
    EXPECT_TRUE(admitted(a2, 5, 2, 0, 1, 1));
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow), ids({0, 4}));
    EXPECT_EQ(m.getNumFreeBlocks(), 14);
    EXPECT_EQ(m.getKvCacheStats().used_num_blocks, 2u);
    m.checkInvariants();
}

// A prompt longer than the stored one reuses every stored block and allocates the rest.
TEST(BlockManagerReuseTest, LongerPromptReusesStoredChainAndAllocatesRest) {
    auto m = makeManager(16);
    storePrompt(m, kvb::Request(1, tokenRange(0, 9)));  // chain 0 -> 1
    // 17 tokens = 5 blocks: 0 and 1 reused, [8..12), [12..16), [16] in new blocks 3, 4, 5.
    auto a2 = m.addSequence(kvb::Request(2, tokenRange(0, 17)));
    EXPECT_TRUE(admitted(a2, 8, 2, 3, 3, 3));
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow), ids({0, 1, 3, 4, 5}));
    EXPECT_EQ(m.getNumFreeBlocks(), 11);
    m.checkInvariants();

    // Released, the longer chain is stored: a third request reuses 16 tokens.
    kvb_test::markPrefillComputed(m, 2);
    m.removeSequence(2, true);
    EXPECT_EQ(m.getNumFreeBlocks(), 16);
    auto a3 = m.addSequence(kvb::Request(3, tokenRange(0, 18)));
    EXPECT_TRUE(admitted(a3, 16, 4, 1, 1, 1));
    EXPECT_EQ(m.getNumFreeBlocks(), 11);
    m.checkInvariants();
}

// Releasing a shorter request that reused part of a longer stored chain stores only its own new
// (partial) block beside the chain; the longer chain stays intact and reusable, and the short
// request's block is reusable too.
TEST(BlockManagerReuseTest, ReleasingShorterRequestKeepsLongerChainReusable) {
    auto m = makeManager(16);
    storePrompt(m, kvb::Request(1, tokenRange(0, 13)));          // chain 0 -> 1 -> 2
    auto a2 = m.addSequence(kvb::Request(2, tokenRange(0, 6)));  // blocks 0 and copy 4 = [4]
    EXPECT_EQ(a2.prepopulated_prompt_len, 5);
    kvb_test::markPrefillComputed(m, 2);
    m.removeSequence(2, true);
    EXPECT_EQ(m.getNumFreeBlocks(), 16);
    auto shortBlock = m.getBlockInfo(kWindow, 4);
    EXPECT_TRUE(shortBlock.in_reuse_tree);
    EXPECT_EQ(shortBlock.parent, 0);
    EXPECT_EQ(shortBlock.num_tokens, 1);
    EXPECT_EQ(m.getBlockInfo(kWindow, 1).parent, 0);
    EXPECT_EQ(m.getBlockInfo(kWindow, 2).parent, 1);
    m.checkInvariants();

    // The long chain: 17 tokens reuse 0, 1, 2 (12 tokens) and allocate 2 never-used blocks.
    auto a3 = m.addSequence(kvb::Request(3, tokenRange(0, 17)));
    EXPECT_TRUE(admitted(a3, 12, 3, 2, 2, 2));
    EXPECT_EQ(m.getCacheBlockIds(3, kWindow), ids({0, 1, 2, 5, 6}));
    EXPECT_EQ(m.getNumFreeBlocks(), 11);
    kvb_test::markPrefillComputed(m, 3);
    m.removeSequence(3, true);
    EXPECT_EQ(m.getNumFreeBlocks(), 16);

    // The short branch: the 1-token block 4 is an unreferenced leaf, taken over (no allocation).
    auto a4 = m.addSequence(kvb::Request(4, tokenRange(0, 6)));
    EXPECT_TRUE(admitted(a4, 5, 2, 0, 0, 0));
    EXPECT_EQ(m.getCacheBlockIds(4, kWindow), ids({0, 4}));
    EXPECT_EQ(m.getNumFreeBlocks(), 14);
    m.checkInvariants();
}

// A prompt that only shares its first token with the cache still reuses that token (copied
// from the stored first block).
TEST(BlockManagerReuseTest, IncidentalReuseOfSingleToken) {
    auto m = makeManager(16);
    storePrompt(m, kvb::Request(1, tokenRange(0, 9)));  // chain 0 -> 1
    // Block 0 [0..4) shares token 0 with [0, 50, 51, 52]: 1 token copied into block 3; block 4
    // holds the last token.
    auto a2 = m.addSequence(kvb::Request(2, {0, 50, 51, 52, 53}));
    EXPECT_TRUE(admitted(a2, 1, 1, 1, 2, 2));
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow), ids({3, 4}));
    EXPECT_EQ(m.getNumFreeBlocks(), 14);
    auto stored = m.getBlockInfo(kWindow, 0);
    EXPECT_TRUE(stored.in_reuse_tree);
    EXPECT_TRUE(stored.is_free);
    m.checkInvariants();
}

// A one-token prompt has nothing reusable (its only token is the last prompt token).
TEST(BlockManagerReuseTest, SingleTokenPromptReusesNothing) {
    auto m = makeManager(16);
    storePrompt(m, kvb::Request(1, tokenRange(0, 9)));
    auto a2 = m.addSequence(kvb::Request(2, {0}));
    EXPECT_TRUE(admitted(a2, 0, 0, 1, 1, 1));
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow), ids({3}));
    EXPECT_EQ(m.getNumFreeBlocks(), 15);
    EXPECT_EQ(m.getBlockInfo(kWindow, 0).ref_count, 0);
    m.checkInvariants();
}

// ---------------------------------------------------------------------------------------------
// Key attributes: extra ids, multimodal items, LoRA task ids, cache salts.
// ---------------------------------------------------------------------------------------------

// Token extra ids (prompt-tuning tokens) are part of the key: the same token ids with other extra
// ids are different tokens.
TEST(BlockManagerReuseWithExtraIdTest, ExtraIdsArePartOfTheKey) {
    auto m = makeManager(16);
    const auto prompt = tokenRange(0, 9);
    const std::vector<uint64_t> ones(9, 1);
    const std::vector<uint64_t> twos(9, 2);
    std::vector<uint64_t> secondBlockDiffers = ones;
    for (size_t i = 4; i < secondBlockDiffers.size(); ++i) secondBlockDiffers[i] = 2;

    storePrompt(m, kvb::Request(1, prompt).withExtraIds(ones));  // chain 0 -> 1

    auto a2 = m.addSequence(kvb::Request(2, prompt).withExtraIds(ones));
    EXPECT_EQ(a2.prepopulated_prompt_len, 8);
    EXPECT_EQ(a2.stats.reused_blocks, 2u);
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow), ids({0, 1, 3}));
    m.removeSequence(2, false);

    EXPECT_EQ(probeReuse(m, kvb::Request(3, prompt).withExtraIds(twos)), 0);
    EXPECT_EQ(probeReuse(m, kvb::Request(4, prompt).withExtraIds(secondBlockDiffers)), 4);
    // Without extra ids the tokens differ from the stored (token, 1) pairs.
    EXPECT_EQ(probeReuse(m, kvb::Request(5, prompt)), 0);
    EXPECT_EQ(m.getNumFreeBlocks(), 16);
    m.checkInvariants();
}

// A multimodal item's digest is part of the keys of the blocks it overlaps: the same digest
// reuses them, another digest does not.
TEST(BlockManagerReuseWithMultimodalHashTest, SameDigestReusesDifferentDigestDoesNot) {
    auto m = makeManager(16);
    const auto prompt = tokenRange(0, 9);
    // Item over tokens [2, 6): in the keys of block 0 (offset 0) and block 1 (offset 2).
    storePrompt(m, kvb::Request(1, prompt).withMultimodal(mmItem(0xA1, 2, 4)));

    auto a2 = m.addSequence(kvb::Request(2, prompt).withMultimodal(mmItem(0xA1, 2, 4)));
    EXPECT_EQ(a2.prepopulated_prompt_len, 8);
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow), ids({0, 1, 3}));
    m.removeSequence(2, false);

    EXPECT_EQ(probeReuse(m, kvb::Request(3, prompt).withMultimodal(mmItem(0xB2, 2, 4))), 0);
    // Without the item, the tokens alone do not match either.
    EXPECT_EQ(probeReuse(m, kvb::Request(4, prompt)), 0);
    EXPECT_EQ(m.getNumFreeBlocks(), 16);
    m.checkInvariants();
}

// Only the blocks an item overlaps carry it: an item inside block 1 leaves block 0 reusable by a
// request whose item there has another digest.
TEST(BlockManagerReuseWithMultimodalHashTest, DifferentDigestOnlyBreaksBlocksItOverlaps) {
    auto m = makeManager(16);
    const auto prompt = tokenRange(0, 9);
    storePrompt(m, kvb::Request(1, prompt).withMultimodal(mmItem(0xA1, 5, 2)));  // [5, 7)
    EXPECT_EQ(probeReuse(m, kvb::Request(2, prompt).withMultimodal(mmItem(0xA1, 5, 2))), 8);
    EXPECT_EQ(probeReuse(m, kvb::Request(3, prompt).withMultimodal(mmItem(0xB2, 5, 2))), 4);
    m.checkInvariants();
}

// With two items, reuse stops at the first block whose item differs: a different second item
// keeps blocks 0 and 1, a different first item only block 0 (the block before it).
TEST(BlockManagerReuseWithMultimodalHashTest, TwoItemsReuseUpToTheFirstDifferingItem) {
    auto m = makeManager(16);
    const auto prompt = tokenRange(0, 13);  // keys cover 12 tokens: 3 full blocks
    const auto itemA = mmItem(0xA1, 4, 2);  // in block 1
    const auto itemB = mmItem(0xB1, 8, 2);  // in block 2
    const auto otherA = mmItem(0xA2, 4, 2);
    const auto otherB = mmItem(0xB2, 8, 2);
    storePrompt(m, kvb::Request(1, prompt).withMultimodal(itemA).withMultimodal(itemB));

    auto withItems = [&](uint64_t id, const kvb_multimodal_item_t& first,
                         const kvb_multimodal_item_t& second) {
        return kvb::Request(id, prompt).withMultimodal(first).withMultimodal(second);
    };
    EXPECT_EQ(probeReuse(m, withItems(2, itemA, itemB)), 12);
    EXPECT_EQ(probeReuse(m, withItems(3, itemA, otherB)), 8);
    EXPECT_EQ(probeReuse(m, withItems(4, otherA, itemB)), 4);
    EXPECT_EQ(m.getNumFreeBlocks(), 16);
    m.checkInvariants();
}

// The LoRA task id partitions reuse: blocks computed with one adapter are only reused with the
// same adapter, and "no LoRA" is not LoRA task 0.
TEST(BlockManagerReuseWithLoraTaskIdTest, LoraTaskIdPartitionsReuse) {
    auto m = makeManager(16);
    const auto prompt = tokenRange(0, 9);
    storePrompt(m, kvb::Request(1, prompt).withLora(1));  // chain 0 -> 1

    auto a2 = m.addSequence(kvb::Request(2, prompt).withLora(1));
    EXPECT_EQ(a2.prepopulated_prompt_len, 8);
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow), ids({0, 1, 3}));
    m.removeSequence(2, false);

    EXPECT_EQ(probeReuse(m, kvb::Request(3, prompt).withLora(2)), 0);
    EXPECT_EQ(probeReuse(m, kvb::Request(4, prompt)), 0);  // no LoRA vs LoRA 1

    // A request without LoRA stores its own chain...
    EXPECT_EQ(storePrompt(m, kvb::Request(5, prompt)).prepopulated_prompt_len, 0);
    // ... which LoRA 0 does not match, while another request without LoRA does.
    EXPECT_EQ(probeReuse(m, kvb::Request(6, prompt).withLora(0)), 0);
    EXPECT_EQ(probeReuse(m, kvb::Request(7, prompt)), 8);
    EXPECT_EQ(probeReuse(m, kvb::Request(8, prompt).withLora(1)), 8);
    EXPECT_EQ(m.getNumFreeBlocks(), 16);
    m.checkInvariants();
}

// Extra ids and LoRA task id together: reuse needs both to match.
TEST(BlockManagerReuseWithExtraIdAndLoraTaskIdTest, BothMustMatch) {
    auto m = makeManager(16);
    const auto prompt = tokenRange(0, 9);
    const std::vector<uint64_t> ones(9, 1);
    const std::vector<uint64_t> twos(9, 2);
    std::vector<uint64_t> secondBlockDiffers = ones;
    for (size_t i = 4; i < secondBlockDiffers.size(); ++i) secondBlockDiffers[i] = 2;

    storePrompt(m, kvb::Request(1, prompt).withExtraIds(ones).withLora(1));

    EXPECT_EQ(probeReuse(m, kvb::Request(2, prompt).withExtraIds(ones).withLora(1)), 8);
    EXPECT_EQ(probeReuse(m, kvb::Request(3, prompt).withExtraIds(ones).withLora(2)), 0);
    EXPECT_EQ(probeReuse(m, kvb::Request(4, prompt).withExtraIds(ones)), 0);
    EXPECT_EQ(probeReuse(m, kvb::Request(5, prompt).withExtraIds(twos).withLora(1)), 0);
    EXPECT_EQ(probeReuse(m, kvb::Request(6, prompt).withExtraIds(secondBlockDiffers).withLora(1)),
              4);
    EXPECT_EQ(m.getNumFreeBlocks(), 16);
    m.checkInvariants();
}

// The cache salt partitions reuse (e.g. per tenant): only the same salt reuses salted blocks,
// unsalted requests reuse unsalted blocks, and salted and unsalted never mix.
TEST(BlockManagerReuseWithCacheSaltIdTest, SaltPartitionsReuse) {
    auto m = makeManager(16);
    const auto prompt = tokenRange(0, 9);
    storePrompt(m, kvb::Request(1, prompt).withSalt(7));

    auto a2 = m.addSequence(kvb::Request(2, prompt).withSalt(7));
    EXPECT_EQ(a2.prepopulated_prompt_len, 8);
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow), ids({0, 1, 3}));
    m.removeSequence(2, false);

    EXPECT_EQ(probeReuse(m, kvb::Request(3, prompt).withSalt(8)), 0);
    EXPECT_EQ(probeReuse(m, kvb::Request(4, prompt)), 0);  // no salt vs salt 7

    EXPECT_EQ(storePrompt(m, kvb::Request(5, prompt)).prepopulated_prompt_len, 0);
    EXPECT_EQ(probeReuse(m, kvb::Request(6, prompt)), 8);              // no salt reuses no salt
    EXPECT_EQ(probeReuse(m, kvb::Request(7, prompt).withSalt(7)), 8);  // salt 7 chain unchanged
    EXPECT_EQ(probeReuse(m, kvb::Request(8, prompt).withSalt(8)), 0);
    EXPECT_EQ(m.getNumFreeBlocks(), 16);
    m.checkInvariants();
}

// ---------------------------------------------------------------------------------------------
// KVCacheManagerPerRequestStatsTest
// ---------------------------------------------------------------------------------------------

// addSequence reports per-request deltas of the allocation counters (and getRequestStats repeats
// them while the sequence lives): a first request allocates only new blocks; a second reuses;
// a third allocates blocks that held cached tokens (counted in total, not in new).
TEST(KVCacheManagerPerRequestStatsTest, PerRequestCountersAndHitRate) {
    auto m = makeManager(4);

    auto a1 = m.addSequence(kvb::Request(1, tokenRange(0, 9)));  // blocks 0, 1, 2
    EXPECT_TRUE(admitted(a1, 0, 0, 3, 3, 3));
    EXPECT_DOUBLE_EQ(a1.stats.cache_hit_rate, 0.0);
    auto r1 = m.getRequestStats(1);
    EXPECT_TRUE(admitted(r1, 0, 0, 3, 3, 3));
    kvb_test::markPrefillComputed(m, 1);
    m.removeSequence(1, true);  // free queue: 3, 2, 1, 0; tree 0 -> 1

    // 12 tokens: keys cover 11; [0..4), [4..8) reused, [8, 9, 10] in never-used block 3.
    auto a2 = m.addSequence(kvb::Request(2, tokenRange(0, 12)));
    EXPECT_TRUE(admitted(a2, 8, 2, 1, 1, 1));
    EXPECT_DOUBLE_EQ(a2.stats.cache_hit_rate, 2.0 / 3.0);
    auto r2 = m.getRequestStats(2);
    EXPECT_TRUE(admitted(r2, 8, 2, 1, 1, 1));
    EXPECT_DOUBLE_EQ(r2.stats.cache_hit_rate, 2.0 / 3.0);
    m.checkInvariants();
    kvb_test::markPrefillComputed(m, 2);
    m.removeSequence(2, true);  // free queue: 2, 3, 1, 0; tree 0 -> 1 -> 3

    // Unrelated prompt: takes block 2 (never held tokens) then cached blocks 3 and 1.
    auto a3 = m.addSequence(kvb::Request(3, tokenRange(100, 109)));
    EXPECT_TRUE(admitted(a3, 0, 0, 3, 3, 1));
    EXPECT_DOUBLE_EQ(a3.stats.cache_hit_rate, 0.0);
    EXPECT_EQ(m.getCacheBlockIds(3, kWindow), ids({2, 3, 1}));
    EXPECT_EQ(m.getNumFreeBlocks(), 1);
    m.checkInvariants();

    auto s = m.getKvCacheStats();
    EXPECT_EQ(s.alloc_total_blocks, 7u);
    EXPECT_EQ(s.alloc_new_blocks, 5u);
    EXPECT_EQ(s.reused_blocks, 2u);
    EXPECT_EQ(s.missed_blocks, 7u);
    EXPECT_DOUBLE_EQ(s.cache_hit_rate, 2.0 / 9.0);
    EXPECT_EQ(statusOf([&] { m.getRequestStats(1); }), KVB_STATUS_UNKNOWN_REQUEST);
}

// ---------------------------------------------------------------------------------------------
// PinAndUnpinBlocksById
// ---------------------------------------------------------------------------------------------

// Pinned blocks survive removeSequence: they stay allocated (not free) and, when stored, stay in
// the reuse tree for later requests; unpinning returns them to the free queue.
TEST(PinAndUnpinBlocksById, PinnedBlocksSurviveRemoveSequence) {
    auto m = makeManager(8);
    m.addSequence(kvb::Request(1, tokenRange(0, 9)));  // blocks 0, 1, 2
    m.pinBlocks(1);
    EXPECT_EQ(m.getBlockInfo(kWindow, 0).ref_count, 2);
    kvb_test::markPrefillComputed(m, 1);
    m.removeSequence(1, true);
    EXPECT_EQ(m.getNumFreeBlocks(), 8 - 3);
    for (int32_t b = 0; b < 3; ++b) {
        auto info = m.getBlockInfo(kWindow, b);
        EXPECT_FALSE(info.is_free) << "block " << b;
        EXPECT_EQ(info.ref_count, 1) << "block " << b;
    }
    EXPECT_TRUE(m.getBlockInfo(kWindow, 0).in_reuse_tree);
    EXPECT_TRUE(m.getBlockInfo(kWindow, 1).in_reuse_tree);
    m.checkInvariants();

    // A later request reuses the pinned blocks; releasing it does not free them.
    auto a2 = m.addSequence(kvb::Request(2, tokenRange(0, 9)));
    EXPECT_EQ(a2.prepopulated_prompt_len, 8);
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow), ids({0, 1, 3}));
    EXPECT_EQ(m.getNumFreeBlocks(), 4);
    kvb_test::markPrefillComputed(m, 2);
    m.removeSequence(2, true);
    EXPECT_EQ(m.getNumFreeBlocks(), 5);
    m.checkInvariants();

    m.unpinBlocksById(kWindow, {0, 1, 2});
    EXPECT_EQ(m.getNumFreeBlocks(), 8);
    auto unpinned = m.getBlockInfo(kWindow, 0);
    EXPECT_TRUE(unpinned.is_free);
    EXPECT_TRUE(unpinned.in_reuse_tree);  // still cached after unpinning
    m.checkInvariants();
    EXPECT_EQ(probeReuse(m, kvb::Request(3, tokenRange(0, 9))), 8);
}

// storeBlocksForReuse with pin stores the sequence and pins every block on the stored path,
// returning their ids; those survive removeSequence, the unstored last block does not.
TEST(PinAndUnpinBlocksById, StoreBlocksForReuseWithPinReturnsPinnedIds) {
    auto m = makeManager(8);
    m.addSequence(kvb::Request(1, tokenRange(0, 9)));  // blocks 0, 1, 2
    kvb_test::markPrefillComputed(m, 1);
    auto pinned = m.storeBlocksForReuse(1, /*pin=*/true);
    EXPECT_EQ(pinned, ids({0, 1}));  // 8 stored tokens: two blocks
    EXPECT_EQ(m.getBlockInfo(kWindow, 1).ref_count, 2);
    m.checkInvariants();

    m.removeSequence(1, true);
    EXPECT_EQ(m.getNumFreeBlocks(), 8 - 2);
    EXPECT_TRUE(m.getBlockInfo(kWindow, 2).is_free);
    EXPECT_FALSE(m.getBlockInfo(kWindow, 1).is_free);

    EXPECT_EQ(probeReuse(m, kvb::Request(2, tokenRange(0, 9))), 8);
    EXPECT_EQ(m.getNumFreeBlocks(), 6);

    m.unpinBlocksById(kWindow, pinned);
    EXPECT_EQ(m.getNumFreeBlocks(), 8);
    m.checkInvariants();
}

// Unpinning a block that holds no pin fails with INVALID_ARGUMENT and unpins nothing, even when
// other listed ids are pinned (all ids are checked first).
TEST(PinAndUnpinBlocksById, UnpinningUnpinnedBlockFailsAndChangesNothing) {
    auto m = makeManager(8);
    m.addSequence(kvb::Request(1, tokenRange(0, 9)));
    m.pinBlocks(1);
    kvb_test::markPrefillComputed(m, 1);
    m.removeSequence(1, true);  // blocks 0, 1, 2 pinned once
    EXPECT_EQ(m.getNumFreeBlocks(), 5);

    EXPECT_EQ(statusOf([&] { m.unpinBlocksById(kWindow, {3}); }), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(statusOf([&] { m.unpinBlocksById(kWindow, {0, 3}); }), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(statusOf([&] { m.unpinBlocksById(kWindow, {0, 0}); }), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(m.getBlockInfo(kWindow, 0).ref_count, 1);
    EXPECT_EQ(m.getNumFreeBlocks(), 5);
    m.checkInvariants();

    // A block referenced by a running sequence is not pinned either.
    m.addSequence(kvb::Request(2, tokenRange(50, 55)));  // blocks 3, 4
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow), ids({3, 4}));
    EXPECT_EQ(statusOf([&] { m.unpinBlocksById(kWindow, {3}); }), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(m.getBlockInfo(kWindow, 3).ref_count, 1);
    m.removeSequence(2, false);

    m.unpinBlocksById(kWindow, {0, 1, 2});
    EXPECT_EQ(m.getNumFreeBlocks(), 8);
    EXPECT_EQ(statusOf([&] { m.unpinBlocksById(kWindow, {0}); }), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(m.getNumFreeBlocks(), 8);
    m.checkInvariants();
}

// ---------------------------------------------------------------------------------------------
// FindBlocksInReuseTreeByBlockKeys
// ---------------------------------------------------------------------------------------------

// After release, the stored blocks form a parent chain in the reuse tree: each block's parent is
// the block before it, the first block's parent is the root (-1); the unstored last block is not
// in the tree (-2).
TEST(FindBlocksInReuseTreeByBlockKeys, StoredBlocksFormParentChain) {
    auto m = makeManager(8);
    storePrompt(m, kvb::Request(1, tokenRange(0, 13)));  // stores 12 tokens in blocks 0, 1, 2
    auto b0 = m.getBlockInfo(kWindow, 0);
    auto b1 = m.getBlockInfo(kWindow, 1);
    auto b2 = m.getBlockInfo(kWindow, 2);
    auto b3 = m.getBlockInfo(kWindow, 3);
    EXPECT_EQ(b0.parent, -1);
    EXPECT_EQ(b1.parent, 0);
    EXPECT_EQ(b2.parent, 1);
    EXPECT_EQ(b3.parent, -2);
    EXPECT_FALSE(b3.in_reuse_tree);
    EXPECT_FALSE(b0.is_leaf);
    EXPECT_FALSE(b1.is_leaf);
    EXPECT_TRUE(b2.is_leaf);
    for (const auto& info : {b0, b1, b2}) {
        EXPECT_TRUE(info.in_reuse_tree);
        EXPECT_EQ(info.num_tokens, kTpb);
        EXPECT_TRUE(info.is_free);
        EXPECT_EQ(info.ref_count, 0);
    }
    EXPECT_NE(b0.hash, b1.hash);
    EXPECT_NE(b1.hash, b2.hash);

    // A prompt diverging after block 0 hangs its own branch under block 0.
    // Request 2 shares block 0 and gets never-used blocks 4 ([90..94)) and 5 (last token).
    m.addSequence(kvb::Request(2, concatTokens(tokenRange(0, 4), {90, 91, 92, 93, 94})));
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow), ids({0, 4, 5}));
    kvb_test::markPrefillComputed(m, 2);
    m.removeSequence(2, true);
    EXPECT_EQ(m.getBlockInfo(kWindow, 4).parent, 0);
    EXPECT_EQ(m.getBlockInfo(kWindow, 1).parent, 0);
    EXPECT_EQ(m.getBlockInfo(kWindow, 5).parent, -2);
    m.checkInvariants();
}
