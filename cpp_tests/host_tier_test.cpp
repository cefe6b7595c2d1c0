// The host (secondary) tier (offload and onboarding, TensorRT-LLM's secondary pool): evicted cached
// blocks of priority >= the offload minimum move to host rows instead of being dropped, reuse
// brings them back to primary rows, and the bytes really move (host copy backend). Also the
// free-counter accounting of the offload path (TensorRT-LLM issue #11879,
// `LRUPolicyTest.ClaimAfterSwapDoesNotCorruptQueues`).
//
// Every scenario uses 4 tokens per block and one full-attention window (window = maximum sequence
// length). Block ids 0..P-1 start with primary rows, P..P+S-1 with host rows; offloading swaps the
// rows of two blocks, so a block id keeps its place in the reuse tree while its row changes level.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kvblock.hpp"
#include "test_support.hpp"

namespace {

constexpr int32_t kWindow = 64;
constexpr int32_t kTokensPerBlock = 4;

kvb::Config hostTierConfig(int32_t primary, int32_t secondary) {
    return kvb_test::windowConfig(kWindow, primary, secondary, kTokensPerBlock, kWindow);
}

using kvb_test::concatTokens;
using kvb_test::ids;
using kvb_test::reusableBlocks;
using kvb_test::statusOf;
using kvb_test::tokenRun;

// Every block of a running sequence must be primary (its offsets are written for the kernels).
void expectAllPrimary(const kvb::Manager& m, uint64_t id) {
    for (int32_t b : m.getCacheBlockIds(id, kWindow)) {
        kvb_block_info_t info = m.getBlockInfo(kWindow, b);
        EXPECT_EQ(info.cache_level, KVB_CACHE_LEVEL_PRIMARY) << "block " << b;
        EXPECT_GE(info.ref_count, 1) << "block " << b;
    }
}

// ---- Data helpers (host copy backend) -------------------------------------------------------

// Pool geometry of the data tests: row = [layers][K|V][heads][tokens_per_block][head_size]
// elements of kBytesPerElement bytes.
constexpr int kLayers = 2;
constexpr int kHeads = 2;
constexpr int kHeadSize = 4;
constexpr int kBytesPerElement = 2;
constexpr size_t kTokenBytes = static_cast<size_t>(kHeadSize) * kBytesPerElement;
constexpr size_t kRowBytes =
    static_cast<size_t>(kLayers) * 2 * kHeads * kTokensPerBlock * kTokenBytes;

kvb::Config dataConfig(int32_t primary, int32_t secondary) {
    kvb::Config c;
    c.addWindow(kWindow, primary, secondary, kLayers, kHeads, kHeadSize);
    c.raw.tokens_per_block = kTokensPerBlock;
    c.raw.max_sequence_length = kWindow;
    c.raw.bytes_per_element = kBytesPerElement;
    c.raw.copy_backend = KVB_COPY_BACKEND_HOST;
    return c;
}

// Byte offset of token slot `t` of slab (layer, kv, head) inside a row.
size_t slabTokenOffset(int layer, int kv, int head, int t) {
    size_t slab = (static_cast<size_t>(layer) * 2 + static_cast<size_t>(kv)) * kHeads +
                  static_cast<size_t>(head);
    return (slab * kTokensPerBlock + static_cast<size_t>(t)) * kTokenBytes;
}

// The KV bytes a request `tag` "computed" for token position `pos` of one (layer, kv, head);
// never zero, so fresh (zeroed) rows are distinguishable.
uint8_t patternByte(uint32_t tag, int32_t pos, int layer, int kv, int head, size_t byte) {
    uint32_t v = tag * 131u + static_cast<uint32_t>(pos) * 31u +
                 static_cast<uint32_t>(layer) * 17u + static_cast<uint32_t>(kv) * 7u +
                 static_cast<uint32_t>(head) * 5u + static_cast<uint32_t>(byte) * 3u;
    v ^= v >> 5;
    return static_cast<uint8_t>(1u + v % 255u);
}

template <typename F>
void forEachSlab(F&& f) {
    for (int layer = 0; layer < kLayers; ++layer)
        for (int kv = 0; kv < 2; ++kv)
            for (int head = 0; head < kHeads; ++head) f(layer, kv, head);
}

uint8_t* rowOf(const kvb::Manager& m, const kvb_block_info_t& info) {
    auto [base, rowBytes] =
        m.getPoolPointer(kWindow, static_cast<kvb_cache_level_t>(info.cache_level));
    EXPECT_EQ(rowBytes, kRowBytes);
    return base + static_cast<size_t>(info.memory_index) * rowBytes;
}

// Writes request `tag`'s pattern for its first `numTokens` positions into the rows of its blocks.
void writeRequestPattern(const kvb::Manager& m, uint64_t id, uint32_t tag, int32_t numTokens) {
    std::vector<int32_t> blocks = m.getCacheBlockIds(id, kWindow);
    for (size_t bi = 0; bi < blocks.size(); ++bi) {
        kvb_block_info_t info = m.getBlockInfo(kWindow, blocks[bi]);
        ASSERT_EQ(info.cache_level, KVB_CACHE_LEVEL_PRIMARY);
        uint8_t* row = rowOf(m, info);
        for (int t = 0; t < kTokensPerBlock; ++t) {
            int32_t pos = static_cast<int32_t>(bi) * kTokensPerBlock + t;
            if (pos >= numTokens) break;
            forEachSlab([&](int layer, int kv, int head) {
                uint8_t* p = row + slabTokenOffset(layer, kv, head, t);
                for (size_t b = 0; b < kTokenBytes; ++b)
                    p[b] = patternByte(tag, pos, layer, kv, head, b);
            });
        }
    }
}

// Token slots [from, to) of every slab of `row` hold request `tag`'s bytes for positions
// firstPos + slot.
::testing::AssertionResult rowHoldsPattern(const uint8_t* row, uint32_t tag, int32_t firstPos,
                                           int from, int to) {
    for (int layer = 0; layer < kLayers; ++layer)
        for (int kv = 0; kv < 2; ++kv)
            for (int head = 0; head < kHeads; ++head)
                for (int t = from; t < to; ++t) {
                    const uint8_t* p = row + slabTokenOffset(layer, kv, head, t);
                    for (size_t b = 0; b < kTokenBytes; ++b) {
                        uint8_t want = patternByte(tag, firstPos + t, layer, kv, head, b);
                        if (p[b] != want) {
                            return ::testing::AssertionFailure()
                                   << "layer " << layer << " kv " << kv << " head " << head
                                   << " token " << t << " byte " << b << ": got " << int(p[b])
                                   << ", want " << int(want);
                        }
                    }
                }
    return ::testing::AssertionSuccess();
}

// Token slots [from, to) of every slab of `row` equal those of `expected` (a saved row).
::testing::AssertionResult slotsEqual(const uint8_t* row, const std::vector<uint8_t>& expected,
                                      int from, int to) {
    bool same = true;
    forEachSlab([&](int layer, int kv, int head) {
        for (int t = from; t < to; ++t) {
            size_t off = slabTokenOffset(layer, kv, head, t);
            if (std::memcmp(row + off, expected.data() + off, kTokenBytes) != 0) same = false;
        }
    });
    if (!same) {
        return ::testing::AssertionFailure()
               << "token slots [" << from << ", " << to << ") changed";
    }
    return ::testing::AssertionSuccess();
}

bool slotsAreZero(const uint8_t* row, int from, int to) {
    bool zero = true;
    forEachSlab([&](int layer, int kv, int head) {
        for (int t = from; t < to; ++t) {
            const uint8_t* p = row + slabTokenOffset(layer, kv, head, t);
            for (size_t b = 0; b < kTokenBytes; ++b) zero = zero && p[b] == 0;
        }
    });
    return zero;
}

}  // namespace

// Evicting cached primary blocks offloads those with priority >= secondary_offload_min_priority
// (default 30) to free host blocks, keeping them in the reuse tree; lower-priority blocks are
// dropped (they leave the tree). The threshold is configurable: at 40 only the priority-45 blocks
// are offloaded, at 50 none.
TEST(HostTierOffloadTest, EvictionOffloadsBlocksAtOrAboveMinimumPriority) {
    struct Case {
        int32_t minPriority;
        std::vector<int32_t> pressureIds;
        uint64_t offloaded;
    };
    const std::vector<Case> cases = {
        {30, ids({8, 7, 6, 2, 9, 10, 5, 11, 12}), 4},
        {40, ids({8, 7, 6, 2, 1, 0, 5, 9, 10}), 2},
        {50, ids({8, 7, 6, 2, 1, 0, 5, 4, 3}), 0},
    };
    const std::vector<int32_t> promptDefault = tokenRun(0, 9);  // blocks 0, 1 cached (35)
    const std::vector<int32_t> promptHigh = tokenRun(100, 9);   // blocks 3, 4 cached (45)
    const std::vector<int32_t> promptLow = tokenRun(200, 9);    // blocks 6, 7 cached (20)
    for (const Case& c : cases) {
        SCOPED_TRACE("secondary_offload_min_priority " + std::to_string(c.minPriority));
        kvb::Config cfg = hostTierConfig(9, 4);
        cfg.raw.secondary_offload_min_priority = c.minPriority;
        kvb::Manager m(cfg);

        m.addSequence(kvb::Request(0, promptDefault));
        kvb::Request high(1, promptHigh);
        high.withRange(0, -1, 45);
        m.addSequence(high);
        kvb::Request low(2, promptLow);
        low.withRange(0, -1, 20);
        m.addSequence(low);
        for (uint64_t id : {0, 1, 2}) {
            kvb_test::markPrefillComputed(m, id);
            m.removeSequence(id);  // each: 2 cached blocks + 1 private
        }
        m.checkInvariants();

        // Nine blocks: queue 20 (8, 7, 6), queue 35 (2, 1, 0), queue 45 (5, 4, 3). A cached block
        // at or above the threshold is offloaded and its host partner (9..12) is handed out.
        m.addSequence(kvb::Request(3, tokenRun(5000, 33)));
        EXPECT_EQ(m.getCacheBlockIds(3, kWindow), c.pressureIds);
        kvb_kv_cache_stats_t s = m.getKvCacheStats();
        EXPECT_EQ(s.offloaded_blocks, c.offloaded);
        EXPECT_EQ(s.free_num_blocks, 0u);
        EXPECT_EQ(s.free_secondary_blocks, 4u);
        EXPECT_EQ(reusableBlocks(m, promptDefault, kWindow), 35 >= c.minPriority ? 2 : 0);
        EXPECT_EQ(reusableBlocks(m, promptHigh, kWindow), 45 >= c.minPriority ? 2 : 0);
        EXPECT_EQ(reusableBlocks(m, promptLow, kWindow), 0);
        for (int32_t b : {0, 1, 3, 4, 6, 7}) {
            int32_t priority = b < 3 ? 35 : b < 6 ? 45 : 20;
            kvb_block_info_t info = m.getBlockInfo(kWindow, b);
            bool expectOffloaded = priority >= c.minPriority;
            EXPECT_EQ(info.cache_level == KVB_CACHE_LEVEL_SECONDARY, expectOffloaded)
                << "block " << b;
            EXPECT_EQ(info.in_reuse_tree, expectOffloaded) << "block " << b;
            EXPECT_EQ(info.is_free, expectOffloaded) << "block " << b;  // else request 3 holds it
            EXPECT_EQ(info.priority, expectOffloaded ? priority : 35) << "block " << b;
        }
        m.checkInvariants();
    }
}

// A request whose prefix lives on the host onboards it: each matched host block gets a primary
// row again (onboarded_blocks), keeps its block id and tree position, and the running sequence
// references only primary blocks, whose offsets name their primary rows.
TEST(HostTierOnboardTest, ReuseOnboardsHostBlocksToPrimary) {
    kvb::Manager m(hostTierConfig(4, 4));
    const std::vector<int32_t> prompt = tokenRun(0, 13);
    m.addSequence(kvb::Request(0, prompt));
    kvb_test::markPrefillComputed(m, 0);
    m.removeSequence(0);  // chain 0 -> 1 -> 2 cached, block 3 private
    m.addSequence(kvb::Request(1, tokenRun(1000, 13)));
    EXPECT_EQ(m.getCacheBlockIds(1, kWindow), ids({3, 4, 5, 6}));
    for (int32_t b : {0, 1, 2}) {
        EXPECT_EQ(m.getBlockInfo(kWindow, b).cache_level, KVB_CACHE_LEVEL_SECONDARY) << b;
    }
    EXPECT_EQ(m.getKvCacheStats().offloaded_blocks, 3u);
    m.removeSequence(1, false);
    m.checkInvariants();

    kvb_kv_cache_stats_t before = m.getKvCacheStats();
    kvb_admission_t a = m.addSequence(kvb::Request(2, prompt));
    EXPECT_EQ(a.prepopulated_prompt_len, 12);
    EXPECT_EQ(a.stats.reused_blocks, 3u);
    EXPECT_EQ(a.stats.missed_blocks, 1u);
    kvb_kv_cache_stats_t after = m.getKvCacheStats();
    EXPECT_EQ(after.onboarded_blocks - before.onboarded_blocks, 3u);
    std::vector<int32_t> got = m.getCacheBlockIds(2, kWindow);
    ASSERT_EQ(got.size(), 4u);
    EXPECT_EQ(got[0], 0);
    EXPECT_EQ(got[1], 1);
    EXPECT_EQ(got[2], 2);
    expectAllPrimary(m, 2);
    EXPECT_EQ(m.getBlockInfo(kWindow, 1).parent, 0);
    EXPECT_EQ(m.getBlockInfo(kWindow, 2).parent, 1);
    EXPECT_EQ(after.free_secondary_blocks, 4u);

    // The offsets the kernels read name the (primary) rows of the blocks.
    auto [maxBlocks, numPools] = m.getOffsetTableDimensions();
    ASSERT_EQ(numPools, 1);
    std::vector<int32_t> table(static_cast<size_t>(numPools) * 2 * maxBlocks, -7);
    EXPECT_EQ(m.copyBlockOffsets(table, 1, 0, 2), 4);
    for (size_t i = 0; i < got.size(); ++i) {
        int32_t row = m.getBlockInfo(kWindow, got[i]).memory_index;
        EXPECT_EQ(table[i], row * 2) << i;                                       // K (1 layer)
        EXPECT_EQ(table[static_cast<size_t>(maxBlocks) + i], row * 2 + 1) << i;  // V
    }
    m.checkInvariants();
}

// A host parent with a primary child (the child has a higher priority, so the parent was
// offloaded first): reusing the whole chain onboards the parent and shares the primary children;
// all 12 stored tokens are reused and every block ends primary. (TensorRT-LLM stops at 4 tokens
// here, a documented FIXME; kvblock reuses the full chain.)
TEST(KVCacheManagerSecondaryBlockPrimaryChildTest, ChainWithHostParentIsReusedInFull) {
    kvb::Manager m(hostTierConfig(4, 2));
    const std::vector<int32_t> prompt = tokenRun(0, 13);
    kvb::Request r0(0, prompt);
    r0.withRange(4, 12, 60);
    m.addSequence(r0);
    kvb_test::markPrefillComputed(m, 0);
    m.removeSequence(0);  // chain 0 (35) -> 1 (60) -> 2 (60); block 3 private

    m.addSequence(kvb::Request(1, tokenRun(1000, 5)));
    EXPECT_EQ(m.getCacheBlockIds(1, kWindow), ids({3, 4}));
    kvb_block_info_t parent = m.getBlockInfo(kWindow, 0);
    kvb_block_info_t child = m.getBlockInfo(kWindow, 1);
    EXPECT_EQ(parent.cache_level, KVB_CACHE_LEVEL_SECONDARY);
    EXPECT_TRUE(parent.in_reuse_tree);
    EXPECT_EQ(parent.parent, -1);
    EXPECT_EQ(child.cache_level, KVB_CACHE_LEVEL_PRIMARY);
    EXPECT_TRUE(child.in_reuse_tree);
    EXPECT_EQ(child.parent, 0);
    m.removeSequence(1, false);
    m.checkInvariants();

    uint64_t onboardedBefore = m.getKvCacheStats().onboarded_blocks;
    kvb_admission_t a = m.addSequence(kvb::Request(2, prompt));
    EXPECT_EQ(a.prepopulated_prompt_len, 12);
    std::vector<int32_t> got = m.getCacheBlockIds(2, kWindow);
    ASSERT_EQ(got.size(), 4u);
    EXPECT_EQ(got[0], 0);
    EXPECT_EQ(got[1], 1);
    EXPECT_EQ(got[2], 2);
    expectAllPrimary(m, 2);
    EXPECT_EQ(m.getKvCacheStats().onboarded_blocks - onboardedBefore, 1u);
    EXPECT_EQ(m.getBlockInfo(kWindow, 1).parent, 0);
    EXPECT_EQ(m.getBlockInfo(kWindow, 2).parent, 1);
    m.checkInvariants();
}

// Bytes follow the blocks: a request's KV rows are copied to host rows when its cached blocks
// are offloaded, survive other requests overwriting the primary rows, and are copied into
// (possibly different) primary rows when a later request onboards them.
TEST(HostTierDataTest, OffloadAndOnboardPreserveBytes) {
    kvb::Manager m(dataConfig(4, 4));
    const std::vector<int32_t> prompt = tokenRun(0, 13);
    m.addSequence(kvb::Request(0, prompt));
    writeRequestPattern(m, 0, 0, 13);
    kvb_test::markPrefillComputed(m, 0);
    m.removeSequence(0);  // chain 0 -> 1 -> 2 cached

    // Another request takes all four primary blocks: the three cached ones are offloaded.
    m.addSequence(kvb::Request(1, tokenRun(1000, 13)));
    writeRequestPattern(m, 1, 1, 13);  // overwrites every primary row
    for (int32_t b = 0; b < 3; ++b) {
        kvb_block_info_t info = m.getBlockInfo(kWindow, b);
        ASSERT_EQ(info.cache_level, KVB_CACHE_LEVEL_SECONDARY) << b;
        EXPECT_TRUE(rowHoldsPattern(rowOf(m, info), 0, b * kTokensPerBlock, 0, kTokensPerBlock))
            << "host row of block " << b;
    }
    m.removeSequence(1, false);
    m.checkInvariants();

    kvb_admission_t a = m.addSequence(kvb::Request(2, prompt));
    EXPECT_EQ(a.prepopulated_prompt_len, 12);
    std::vector<int32_t> got = m.getCacheBlockIds(2, kWindow);
    expectAllPrimary(m, 2);
    for (int32_t bi = 0; bi < 3; ++bi) {
        EXPECT_EQ(got.at(static_cast<size_t>(bi)), bi);
        kvb_block_info_t info = m.getBlockInfo(kWindow, bi);
        EXPECT_TRUE(rowHoldsPattern(rowOf(m, info), 0, bi * kTokensPerBlock, 0, kTokensPerBlock))
            << "primary row of onboarded block " << bi;
    }
    m.checkInvariants();
}

// Copy-on-partial-reuse (BlockManagerTestPartialCopy): a request whose prompt diverges inside a
// cached block that another sequence still uses gets a fresh block holding exactly the matched
// first N tokens of every (layer, K|V, head) slab; the other token slots keep what the row held
// (zero for a never-used row), and the source block is not modified.
TEST(BlockManagerTestPartialCopy, CopiesMatchedTokensOfReferencedBlock) {
    kvb::Manager m(dataConfig(5, 2));
    m.addSequence(kvb::Request(0, tokenRun(0, 9)));  // blocks 0, 1, 2; stays running
    writeRequestPattern(m, 0, 0, 9);
    m.storeContextBlocks(0, 9);  // blocks 0 and 1 enter the tree while referenced
    ASSERT_TRUE(m.getBlockInfo(kWindow, 1).in_reuse_tree);
    const uint8_t* sourceRow = rowOf(m, m.getBlockInfo(kWindow, 1));

    // 3 of block 1's tokens match: copied into a never-used row.
    kvb_admission_t a = m.addSequence(kvb::Request(1, concatTokens(tokenRun(0, 7), {900, 901})));
    EXPECT_EQ(a.prepopulated_prompt_len, 7);
    std::vector<int32_t> got = m.getCacheBlockIds(1, kWindow);
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got[0], 0);
    EXPECT_NE(got[1], 1);
    kvb_block_info_t copy = m.getBlockInfo(kWindow, got[1]);
    ASSERT_EQ(copy.cache_level, KVB_CACHE_LEVEL_PRIMARY);
    EXPECT_TRUE(rowHoldsPattern(rowOf(m, copy), 0, 4, 0, 3));
    EXPECT_TRUE(slotsAreZero(rowOf(m, copy), 3, 4));
    EXPECT_TRUE(rowHoldsPattern(sourceRow, 0, 4, 0, 4)) << "source modified";
    m.checkInvariants();

    // Request 1 fills its rows with other bytes, then finishes without storing.
    for (int32_t b : got) {
        kvb_block_info_t info = m.getBlockInfo(kWindow, b);
        if (b != 0) std::memset(rowOf(m, info), 0xAB, kRowBytes);
    }
    m.removeSequence(1, false);

    // 2 tokens match now; the target row is a used one: slots 2 and 3 keep their bytes.
    auto [primaryBase, rowBytes] = m.getPoolPointer(kWindow, KVB_CACHE_LEVEL_PRIMARY);
    std::vector<uint8_t> snapshot(primaryBase, primaryBase + rowBytes * 5);
    a = m.addSequence(kvb::Request(2, concatTokens(tokenRun(0, 6), {800, 801, 802})));
    EXPECT_EQ(a.prepopulated_prompt_len, 6);
    got = m.getCacheBlockIds(2, kWindow);
    ASSERT_EQ(got.size(), 3u);
    copy = m.getBlockInfo(kWindow, got[1]);
    ASSERT_EQ(copy.cache_level, KVB_CACHE_LEVEL_PRIMARY);
    const uint8_t* target = rowOf(m, copy);
    std::vector<uint8_t> before(
        snapshot.begin() + static_cast<std::ptrdiff_t>(copy.memory_index * rowBytes),
        snapshot.begin() + static_cast<std::ptrdiff_t>((copy.memory_index + 1) * rowBytes));
    EXPECT_TRUE(rowHoldsPattern(target, 0, 4, 0, 2));
    EXPECT_TRUE(slotsEqual(target, before, 2, 4));
    EXPECT_FALSE(slotsAreZero(before.data(), 2, 4)) << "target row was expected to hold old bytes";
    EXPECT_TRUE(rowHoldsPattern(sourceRow, 0, 4, 0, 4)) << "source modified";
    m.checkInvariants();
}

// A partial match of a cached inner block that lives on the host is copied host -> primary. The
// copy source stays claimed while the fresh block is allocated: that allocation offloads a cached
// primary block and takes the front host block, which would otherwise be the source itself. The
// fresh block holds exactly the first N tokens of each slab; the source keeps its bytes and its
// place in the tree.
TEST(BlockManagerTestPartialCopy, CopiesFromHostSource) {
    kvb::Manager m(dataConfig(4, 2));
    kvb::Request r0(0, tokenRun(0, 13));
    r0.withRange(8, 12, 60);  // block 2 outlives its parents on the primary tier
    m.addSequence(r0);
    writeRequestPattern(m, 0, 0, 13);
    kvb_test::markPrefillComputed(m, 0);
    m.removeSequence(0);  // chain 0 -> 1 -> 2 cached; queues 35: {3, 1, 0}, 60: {2}
    m.addSequence(kvb::Request(1, tokenRun(1000, 9)));  // offloads blocks 1 and 0
    EXPECT_EQ(m.getCacheBlockIds(1, kWindow), ids({3, 4, 5}));
    writeRequestPattern(m, 1, 1, 9);
    kvb_test::markPrefillComputed(m, 1);
    m.removeSequence(1);  // its blocks 3 -> 4 are cached on the primary tier
    kvb_block_info_t source = m.getBlockInfo(kWindow, 1);
    ASSERT_EQ(source.cache_level, KVB_CACHE_LEVEL_SECONDARY);
    ASSERT_FALSE(source.is_leaf);  // block 2 (primary) hangs below it
    ASSERT_EQ(m.getBlockInfo(kWindow, 0).cache_level, KVB_CACHE_LEVEL_SECONDARY);

    auto [primaryBase, rowBytes] = m.getPoolPointer(kWindow, KVB_CACHE_LEVEL_PRIMARY);
    std::vector<uint8_t> snapshot(primaryBase, primaryBase + rowBytes * 4);
    kvb_admission_t a = m.addSequence(
        kvb::Request(2, concatTokens(tokenRun(0, 6), {800, 801, 802, 803, 804, 805, 806})));
    EXPECT_EQ(a.prepopulated_prompt_len, 6);
    std::vector<int32_t> got = m.getCacheBlockIds(2, kWindow);
    ASSERT_EQ(got.size(), 4u);
    EXPECT_EQ(got[0], 0);
    EXPECT_NE(got[1], 1);
    expectAllPrimary(m, 2);
    EXPECT_TRUE(rowHoldsPattern(rowOf(m, m.getBlockInfo(kWindow, 0)), 0, 0, 0, 4));
    kvb_block_info_t copy = m.getBlockInfo(kWindow, got[1]);
    const uint8_t* target = rowOf(m, copy);
    std::vector<uint8_t> before(
        snapshot.begin() + static_cast<std::ptrdiff_t>(copy.memory_index * rowBytes),
        snapshot.begin() + static_cast<std::ptrdiff_t>((copy.memory_index + 1) * rowBytes));
    EXPECT_TRUE(rowHoldsPattern(target, 0, 4, 0, 2));
    EXPECT_TRUE(slotsEqual(target, before, 2, 4));
    EXPECT_FALSE(slotsAreZero(before.data(), 2, 4)) << "target row was expected to hold old bytes";
    // The source is still a cached host block with its bytes.
    source = m.getBlockInfo(kWindow, 1);
    EXPECT_EQ(source.cache_level, KVB_CACHE_LEVEL_SECONDARY);
    EXPECT_TRUE(source.is_free);
    EXPECT_TRUE(source.in_reuse_tree);
    EXPECT_TRUE(rowHoldsPattern(rowOf(m, source), 0, 4, 0, 4));
    m.checkInvariants();
}

namespace {

// Counters of one window agree with each other and with what the running sequences reference:
// no host block is ever referenced, so secondary free == S; primary free == P - |referenced|.
void expectConsistentAccounting(const kvb::Manager& m, const std::set<uint64_t>& running,
                                int64_t numPrimary, int64_t numSecondary) {
    m.checkInvariants();
    auto [freePrimary, freeSecondary] = m.getNumFreeBlocksPerWindowSize(kWindow);
    kvb_kv_cache_stats_t s = m.getKvCacheStats();
    std::set<int32_t> referenced;
    for (uint64_t id : running) {
        for (int32_t b : m.getCacheBlockIds(id, kWindow)) {
            referenced.insert(b);
            kvb_block_info_t info = m.getBlockInfo(kWindow, b);
            ASSERT_EQ(info.cache_level, KVB_CACHE_LEVEL_PRIMARY) << "block " << b;
            ASSERT_FALSE(info.is_free) << "block " << b;
        }
    }
    ASSERT_EQ(freePrimary, numPrimary - static_cast<int64_t>(referenced.size()));
    ASSERT_EQ(freeSecondary, numSecondary);
    ASSERT_EQ(m.getNumFreeBlocks(), freePrimary);
    ASSERT_EQ(s.free_num_blocks, static_cast<uint64_t>(freePrimary));
    ASSERT_EQ(s.free_secondary_blocks, static_cast<uint64_t>(freeSecondary));
    ASSERT_EQ(s.num_primary_blocks, static_cast<uint64_t>(numPrimary));
    ASSERT_EQ(s.num_secondary_blocks, static_cast<uint64_t>(numSecondary));
    ASSERT_EQ(s.max_num_blocks, static_cast<uint64_t>(numPrimary + numSecondary));
    ASSERT_LE(s.free_num_blocks, s.max_num_blocks);
    ASSERT_EQ(s.used_num_blocks, s.max_num_blocks - s.free_num_blocks);
    ASSERT_GE(s.used_num_blocks, static_cast<uint64_t>(numSecondary));  // host blocks count as used
}

bool sameStats(const kvb_kv_cache_stats_t& a, const kvb_kv_cache_stats_t& b) {
    return a.free_num_blocks == b.free_num_blocks && a.used_num_blocks == b.used_num_blocks &&
           a.free_secondary_blocks == b.free_secondary_blocks &&
           a.alloc_total_blocks == b.alloc_total_blocks &&
           a.alloc_new_blocks == b.alloc_new_blocks && a.reused_blocks == b.reused_blocks &&
           a.missed_blocks == b.missed_blocks && a.offloaded_blocks == b.offloaded_blocks &&
           a.onboarded_blocks == b.onboarded_blocks;
}

}  // namespace

// Claim before swap (TensorRT-LLM #11879 / #12834): the offload path of an allocation must take
// both blocks out of their free queues before swapping their rows, or the per-level free counters
// drift (usedNumBlocks negative, free above max). Each allocation that offloads a cached block
// lowers primary free by exactly 1 and leaves secondary free unchanged, whatever the priorities
// the blocks were queued with; a long random run under offload pressure keeps every counter equal
// to what the running sequences reference.
TEST(LRUPolicyTest, ClaimAfterSwapDoesNotCorruptQueues) {
    constexpr int64_t kPrimary = 8;
    constexpr int64_t kSecondary = 4;
    {
        kvb::Manager m(hostTierConfig(kPrimary, kSecondary));
        kvb::Request r0(0, tokenRun(0, 32));
        r0.withRange(0, 8, 90).withRange(8, 16, 60);  // blocks 0-1: 90, 2-3: 60, 4-7: 35
        m.addSequence(r0);
        kvb_test::markPrefillComputed(m, 0);
        m.removeSequence(0);  // 31 tokens stored: all 8 blocks cached (block 7 partial)
        std::set<uint64_t> running;
        expectConsistentAccounting(m, running, kPrimary, kSecondary);

        // Victims in order 7, 6, 5, 4 (35), 3, 2 (60), 1, 0 (90); all cached, all offloaded.
        const std::vector<int32_t> victims = {7, 6, 5, 4, 3, 2, 1, 0};
        for (size_t k = 0; k < victims.size(); ++k) {
            SCOPED_TRACE("allocation " + std::to_string(k + 1));
            uint64_t id = 100 + k;
            m.addSequence(kvb::Request(id, {static_cast<int32_t>(10000 + k)}));
            running.insert(id);
            auto [freePrimary, freeSecondary] = m.getNumFreeBlocksPerWindowSize(kWindow);
            EXPECT_EQ(freePrimary, kPrimary - static_cast<int64_t>(k) - 1);
            EXPECT_EQ(freeSecondary, kSecondary);
            EXPECT_EQ(m.getKvCacheStats().offloaded_blocks, k + 1);
            kvb_block_info_t victim = m.getBlockInfo(kWindow, victims[k]);
            EXPECT_EQ(victim.cache_level, KVB_CACHE_LEVEL_SECONDARY);
            EXPECT_TRUE(victim.is_free);
            EXPECT_EQ(victim.priority, victims[k] < 2 ? 90 : victims[k] < 4 ? 60 : 35);
            expectConsistentAccounting(m, running, kPrimary, kSecondary);
        }
        // The allocations that found every host block occupied replaced the oldest host content
        // (the leaves 7..4); the root-side chain 0 -> 1 -> 2 -> 3 is still reusable from host.
        for (uint64_t id : running) m.removeSequence(id, false);
        running.clear();
        expectConsistentAccounting(m, running, kPrimary, kSecondary);
        kvb_admission_t a = m.addSequence(kvb::Request(1, tokenRun(0, 17)));
        EXPECT_EQ(a.prepopulated_prompt_len, 16);
        running.insert(1);
        expectAllPrimary(m, 1);
        EXPECT_EQ(m.getKvCacheStats().onboarded_blocks, 4u);
        expectConsistentAccounting(m, running, kPrimary, kSecondary);
    }

    // Random admissions, generation, releases, timed priorities, explicit offloads.
    constexpr int64_t kRandPrimary = 12;
    constexpr int64_t kRandSecondary = 6;
    kvb::Config cfg = hostTierConfig(kRandPrimary, kRandSecondary);
    cfg.raw.manual_clock = true;
    kvb::Manager m(cfg);
    uint64_t state = 0x05464d15c7573e25ull;
    auto next = [&state](uint32_t n) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return static_cast<uint32_t>((state >> 33) % n);
    };
    std::set<uint64_t> running;
    std::map<uint64_t, int32_t> numTokens;
    std::map<uint64_t, int32_t> inputLength;
    uint64_t nextId = 1;
    uint64_t outOfBlocks = 0;
    for (int step = 0; step < 3000; ++step) {
        SCOPED_TRACE("step " + std::to_string(step));
        uint32_t op = next(10);
        if (op <= 3 && running.size() < 4) {
            // Prompts share prefixes of three families so reuse, onboarding and copies happen.
            int32_t family = static_cast<int32_t>(next(3));
            std::vector<int32_t> tokens =
                tokenRun(family * 1000, 1 + static_cast<int32_t>(next(20)));
            int32_t suffix = static_cast<int32_t>(next(8));
            for (int32_t i = 0; i < suffix; ++i)
                tokens.push_back(50000 + static_cast<int32_t>(next(4)));
            kvb::Request r(nextId, tokens);
            if (next(2) == 0) {
                int32_t end = 1 + static_cast<int32_t>(next(12));
                r.withRange(0, end, static_cast<int32_t>(next(101)),
                            next(2) == 0 ? -1 : static_cast<int64_t>(1 + next(30)));
            }
            if (next(2) == 0) {
                r.withDecodeRetention(static_cast<int32_t>(next(101)),
                                      next(2) == 0 ? -1 : static_cast<int64_t>(1 + next(30)));
            }
            kvb_kv_cache_stats_t before = m.getKvCacheStats();
            kvb_status_t st = statusOf([&] { m.addSequence(r); });
            if (st == KVB_OK) {
                running.insert(nextId);
                numTokens[nextId] = static_cast<int32_t>(tokens.size());
                inputLength[nextId] = static_cast<int32_t>(tokens.size());
            } else {
                ASSERT_EQ(st, KVB_STATUS_OUT_OF_BLOCKS);
                ++outOfBlocks;
                ASSERT_TRUE(sameStats(before, m.getKvCacheStats()))
                    << "failed admission changed stats";
            }
            ++nextId;
        } else if (op <= 5 && !running.empty()) {
            auto it = running.begin();
            std::advance(it, next(static_cast<uint32_t>(running.size())));
            // Released with store: a finished request, its prompt computed (storing stops at
            // the history).
            const bool store = next(4) != 0;
            if (store) kvb_test::markPrefillComputed(m, *it);
            m.removeSequence(*it, store);
            numTokens.erase(*it);
            inputLength.erase(*it);
            running.erase(it);
        } else if (op == 6 && !running.empty()) {
            auto it = running.begin();
            std::advance(it, next(static_cast<uint32_t>(running.size())));
            if (numTokens[*it] < kWindow - 1) {
                kvb_kv_cache_stats_t before = m.getKvCacheStats();
                kvb_status_t st =
                    statusOf([&] { m.addToken(*it, 60000 + static_cast<int32_t>(next(4))); });
                if (st == KVB_OK) {
                    ++numTokens[*it];
                } else {
                    ASSERT_EQ(st, KVB_STATUS_OUT_OF_BLOCKS);
                    ASSERT_TRUE(sameStats(before, m.getKvCacheStats()));
                }
            }
        } else if (op == 7) {
            m.advanceTime(next(12));
            m.refreshBlocks();
        } else if (op == 8) {
            int32_t block = static_cast<int32_t>(next(kRandPrimary + kRandSecondary));
            kvb_block_info_t info = m.getBlockInfo(kWindow, block);
            bool done = false;
            kvb_status_t st = statusOf([&] { done = m.offloadBlock(kWindow, block); });
            ASSERT_EQ(st, KVB_OK);
            if (done) {
                kvb_block_info_t after = m.getBlockInfo(kWindow, block);
                ASSERT_EQ(after.cache_level, KVB_CACHE_LEVEL_SECONDARY);
                ASSERT_EQ(after.ref_count, info.ref_count);
                if (info.ref_count > 0) {
                    // A held block moved to the host tier comes back for its sequences.
                    m.checkInvariants();
                    ASSERT_TRUE(m.onboardBlock(kWindow, block));
                    ASSERT_EQ(m.getBlockInfo(kWindow, block).cache_level, KVB_CACHE_LEVEL_PRIMARY);
                }
            }
        } else if (op == 9 && !running.empty()) {
            auto it = running.begin();
            std::advance(it, next(static_cast<uint32_t>(running.size())));
            m.storeContextBlocks(*it, std::min(inputLength[*it], static_cast<int32_t>(next(24))));
        }
        expectConsistentAccounting(m, running, kRandPrimary, kRandSecondary);
        if (HasFatalFailure()) return;
    }
    kvb_kv_cache_stats_t s = m.getKvCacheStats();
    EXPECT_GT(s.offloaded_blocks, 50u) << "the run must exercise the offload path";
    EXPECT_GT(s.onboarded_blocks, 10u) << "the run must exercise onboarding";
    EXPECT_GT(outOfBlocks, 0u) << "the run must reach out-of-blocks";
    for (uint64_t id : running) m.removeSequence(id);
    running.clear();
    expectConsistentAccounting(m, running, kRandPrimary, kRandSecondary);
}

// offloadBlock moves a free cached primary block to a host row (it stays in the tree and is
// onboarded by reuse); a referenced block cannot be offloaded (INVALID_ARGUMENT, nothing
// changes); a block already on the host, or a manager without host blocks, reports false.
TEST(HostTierOffloadTest, ExplicitOffloadOfFreeBlock) {
    kvb::Manager m(hostTierConfig(4, 2));
    const std::vector<int32_t> prompt = tokenRun(0, 9);
    m.addSequence(kvb::Request(0, prompt));
    kvb_test::markPrefillComputed(m, 0);
    m.removeSequence(0);  // chain 0 -> 1 cached and free

    EXPECT_TRUE(m.offloadBlock(kWindow, 1));
    kvb_block_info_t info = m.getBlockInfo(kWindow, 1);
    EXPECT_EQ(info.cache_level, KVB_CACHE_LEVEL_SECONDARY);
    EXPECT_TRUE(info.in_reuse_tree);
    EXPECT_TRUE(info.is_free);
    EXPECT_EQ(info.parent, 0);
    EXPECT_EQ(m.getNumFreeBlocksPerWindowSize(kWindow), (std::pair<int64_t, int64_t>{4, 2}));
    EXPECT_EQ(m.getKvCacheStats().offloaded_blocks, 1u);
    EXPECT_FALSE(m.offloadBlock(kWindow, 1));  // already on the host
    m.checkInvariants();

    kvb_admission_t a = m.addSequence(kvb::Request(1, prompt));
    EXPECT_EQ(a.prepopulated_prompt_len, 8);
    EXPECT_EQ(m.getKvCacheStats().onboarded_blocks, 1u);
    expectAllPrimary(m, 1);

    // A held block moves too (TensorRT-LLM's offload of a sequence's block) and stays held.
    ASSERT_TRUE(m.offloadBlock(kWindow, 0));
    kvb_block_info_t held = m.getBlockInfo(kWindow, 0);
    EXPECT_EQ(held.cache_level, KVB_CACHE_LEVEL_SECONDARY);
    EXPECT_EQ(held.ref_count, 1);
    EXPECT_EQ(m.getKvCacheStats().offloaded_blocks, 2u);
    m.checkInvariants();
    ASSERT_TRUE(m.onboardBlock(kWindow, 0));
    expectAllPrimary(m, 1);
    kvb_kv_cache_stats_t before = m.getKvCacheStats();
    EXPECT_EQ(statusOf([&] { m.offloadBlock(kWindow, 999); }), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_TRUE(sameStats(before, m.getKvCacheStats()));
    m.checkInvariants();

    kvb::Manager noHost(hostTierConfig(4, 0));
    noHost.addSequence(kvb::Request(0, prompt));
    kvb_test::markPrefillComputed(noHost, 0);
    noHost.removeSequence(0);
    EXPECT_FALSE(noHost.offloadBlock(kWindow, 0));
    EXPECT_EQ(noHost.getBlockInfo(kWindow, 0).cache_level, KVB_CACHE_LEVEL_PRIMARY);
    EXPECT_TRUE(noHost.getBlockInfo(kWindow, 0).in_reuse_tree);
    noHost.checkInvariants();
}
