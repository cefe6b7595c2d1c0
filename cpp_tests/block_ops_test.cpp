// Operations on one block by id, outside any sequence (TensorRT-LLM `BlockManager::onboardBlock`,
// `WindowBlockManager::pinBlock` / `unpinBlock`): what a cache transceiver or a prefetcher does to
// cached blocks while the executor goes on. The bytes really move (host copy backend), so each
// test checks the row a block ends up in, not only its bookkeeping.
//
// One full-attention window, 4 tokens per block. Block ids 0..P-1 start with GPU (primary) rows,
// P..P+S-1 with host rows; moving a block between tiers swaps rows, the id keeps its tree place.
#include <gtest/gtest.h>

#include <algorithm>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "kvblock.hpp"
#include "test_support.hpp"

namespace {

constexpr int32_t kWindow = 64;
constexpr int32_t kTokensPerBlock = 4;

using kvb_test::statusOf;
using kvb_test::tokenRun;

kvb::Config dataConfig(int32_t primary, int32_t secondary) {
    kvb::Config c;
    c.addWindow(kWindow, primary, secondary, /*layers=*/2, /*heads=*/2, /*headSize=*/4);
    c.raw.tokens_per_block = kTokensPerBlock;
    c.raw.max_sequence_length = kWindow;
    c.raw.bytes_per_element = 2;
    c.raw.copy_backend = KVB_COPY_BACKEND_HOST;
    return c;
}

// The row block `block` owns now, wherever it is.
std::pair<uint8_t*, size_t> rowOf(const kvb::Manager& m, int32_t block) {
    kvb_block_info_t info = m.getBlockInfo(kWindow, block);
    auto [base, rowBytes] =
        m.getPoolPointer(kWindow, static_cast<kvb_cache_level_t>(info.cache_level));
    return {base + static_cast<size_t>(info.memory_index) * rowBytes, rowBytes};
}

void fillRow(const kvb::Manager& m, int32_t block, uint8_t seed) {
    auto [row, n] = rowOf(m, block);
    for (size_t i = 0; i < n; ++i) row[i] = static_cast<uint8_t>(seed + i * 7);
}

::testing::AssertionResult rowHolds(const kvb::Manager& m, int32_t block, uint8_t seed) {
    auto [row, n] = rowOf(m, block);
    for (size_t i = 0; i < n; ++i) {
        if (row[i] != static_cast<uint8_t>(seed + i * 7)) {
            return ::testing::AssertionFailure()
                   << "block " << block << " byte " << i << ": got " << int(row[i]) << ", want "
                   << int(static_cast<uint8_t>(seed + i * 7));
        }
    }
    return ::testing::AssertionSuccess();
}

// Admits `prompt` as request `id`, writes a distinct pattern into each of its blocks (seed =
// 10 × (index + 1) + id), marks the prompt computed and releases it with storing: its full
// blocks stay cached and free. Returns its block ids.
std::vector<int32_t> cacheRequest(kvb::Manager& m, uint64_t id,
                                  const std::vector<int32_t>& prompt) {
    m.addSequence(kvb::Request(id, prompt));
    std::vector<int32_t> blocks = m.getCacheBlockIds(id, kWindow);
    for (size_t i = 0; i < blocks.size(); ++i)
        fillRow(m, blocks[i], static_cast<uint8_t>(10 * (i + 1) + id));
    kvb_test::markPrefillComputed(m, id);
    m.removeSequence(id);
    return blocks;
}

uint8_t seedOf(uint64_t id, size_t index) {
    return static_cast<uint8_t>(10 * (index + 1) + id);
}

// ---- onboardBlock ---------------------------------------------------------------------------

// A free cached block on the host comes back to a GPU row with its bytes, keeps its place in the
// tree and stays free; reuse then finds it on the GPU without onboarding again.
TEST(OnboardBlockTest, BringsAFreeCachedHostBlockBackToTheGpuWithItsBytes) {
    kvb::Manager m(dataConfig(4, 4));
    const std::vector<int32_t> prompt = tokenRun(0, 9);
    std::vector<int32_t> blocks = cacheRequest(m, 0, prompt);  // 0 -> 1 cached
    ASSERT_TRUE(m.offloadBlock(kWindow, blocks[1]));
    ASSERT_EQ(m.getBlockInfo(kWindow, blocks[1]).cache_level, KVB_CACHE_LEVEL_SECONDARY);
    ASSERT_TRUE(rowHolds(m, blocks[1], seedOf(0, 1)));

    EXPECT_TRUE(m.onboardBlock(kWindow, blocks[1]));
    kvb_block_info_t info = m.getBlockInfo(kWindow, blocks[1]);
    EXPECT_EQ(info.cache_level, KVB_CACHE_LEVEL_PRIMARY);
    EXPECT_TRUE(info.in_reuse_tree);
    EXPECT_TRUE(info.is_free);
    EXPECT_EQ(info.ref_count, 0);
    EXPECT_EQ(info.parent, blocks[0]);
    EXPECT_TRUE(rowHolds(m, blocks[1], seedOf(0, 1)));
    EXPECT_EQ(m.getKvCacheStats().onboarded_blocks, 1u);
    EXPECT_EQ(m.getNumFreeBlocksPerWindowSize(kWindow), (std::pair<int64_t, int64_t>{4, 4}));
    m.checkInvariants();

    EXPECT_FALSE(m.onboardBlock(kWindow, blocks[1])) << "already on the GPU";
    kvb_admission_t a = m.addSequence(kvb::Request(1, prompt));
    EXPECT_EQ(a.prepopulated_prompt_len, 8);
    EXPECT_EQ(m.getKvCacheStats().onboarded_blocks, 1u) << "reuse found it on the GPU";
    EXPECT_EQ(m.getCacheBlockIds(1, kWindow)[1], blocks[1]);
    EXPECT_TRUE(rowHolds(m, blocks[1], seedOf(0, 1)));
}

// Onboarding takes a GPU row as an allocation does: with every GPU row cached, the victim's
// content moves to a free host row, and everything stays reusable with its bytes.
TEST(OnboardBlockTest, TheGpuRowItTakesIsOffloadedLikeAnyEviction) {
    kvb::Manager m(dataConfig(2, 2));
    std::vector<int32_t> first = cacheRequest(m, 0, tokenRun(0, 5));  // one full block
    // Two GPU rows for two blocks: the first request's block goes to the host.
    std::vector<int32_t> second = cacheRequest(m, 1, tokenRun(100, 8));
    ASSERT_EQ(m.getBlockInfo(kWindow, first[0]).cache_level, KVB_CACHE_LEVEL_SECONDARY);
    for (int32_t b : second) ASSERT_TRUE(m.getBlockInfo(kWindow, b).in_reuse_tree);
    const uint64_t offloadedBefore = m.getKvCacheStats().offloaded_blocks;

    EXPECT_TRUE(m.onboardBlock(kWindow, first[0]));
    EXPECT_EQ(m.getBlockInfo(kWindow, first[0]).cache_level, KVB_CACHE_LEVEL_PRIMARY);
    EXPECT_TRUE(rowHolds(m, first[0], seedOf(0, 0)));
    EXPECT_EQ(m.getKvCacheStats().offloaded_blocks, offloadedBefore + 1);
    int onHost = 0;
    for (size_t i = 0; i < second.size(); ++i) {
        kvb_block_info_t info = m.getBlockInfo(kWindow, second[i]);
        EXPECT_TRUE(info.in_reuse_tree) << "block " << second[i];
        EXPECT_TRUE(rowHolds(m, second[i], seedOf(1, i)));
        onHost += info.cache_level == KVB_CACHE_LEVEL_SECONDARY;
    }
    EXPECT_EQ(onHost, 1);
    m.checkInvariants();
}

// The block keeps its retention priority through offload and onboard (eviction order depends on
// it).
TEST(OnboardBlockTest, KeepsTheBlocksPriority) {
    kvb::Manager m(dataConfig(4, 4));
    const std::vector<int32_t> prompt = tokenRun(0, 9);
    m.addSequence(kvb::Request(0, prompt).withRange(0, -1, 80));
    std::vector<int32_t> blocks = m.getCacheBlockIds(0, kWindow);
    kvb_test::markPrefillComputed(m, 0);
    m.removeSequence(0);
    ASSERT_EQ(m.getPriorityByBlockId(kWindow, blocks[1]), 80);
    ASSERT_TRUE(m.offloadBlock(kWindow, blocks[1]));
    ASSERT_TRUE(m.onboardBlock(kWindow, blocks[1]));
    EXPECT_EQ(m.getPriorityByBlockId(kWindow, blocks[1]), 80);
    m.checkInvariants();
}

// What does not move reports false and changes nothing; what cannot move is an error that
// changes nothing.
TEST(OnboardBlockTest, RefusesBadIdsAndReportsWhatDoesNotMove) {
    kvb::Manager m(dataConfig(4, 2));
    const std::vector<int32_t> prompt = tokenRun(0, 9);
    std::vector<int32_t> blocks = cacheRequest(m, 0, prompt);
    ASSERT_TRUE(m.offloadBlock(kWindow, blocks[1]));

    // A host block that holds nothing cached: nothing worth a GPU row.
    int32_t emptyHostBlock = -1;
    for (int32_t b = 0; b < 6; ++b) {
        kvb_block_info_t i = m.getBlockInfo(kWindow, b);
        if (i.cache_level == KVB_CACHE_LEVEL_SECONDARY && !i.in_reuse_tree) emptyHostBlock = b;
    }
    ASSERT_GE(emptyHostBlock, 0);
    EXPECT_FALSE(m.onboardBlock(kWindow, emptyHostBlock));
    EXPECT_EQ(m.getBlockInfo(kWindow, emptyHostBlock).cache_level, KVB_CACHE_LEVEL_SECONDARY);

    // Every GPU row held: the block stays on the host.
    m.addSequence(kvb::Request(1, tokenRun(500, 16)));
    ASSERT_EQ(m.getNumFreeBlocksPerWindowSize(kWindow).first, 0);
    kvb_kv_cache_stats_t before = m.getKvCacheStats();
    EXPECT_FALSE(m.onboardBlock(kWindow, blocks[1]));
    EXPECT_EQ(m.getBlockInfo(kWindow, blocks[1]).cache_level, KVB_CACHE_LEVEL_SECONDARY);
    EXPECT_TRUE(rowHolds(m, blocks[1], seedOf(0, 1)));
    kvb_test::expectSameStats(before, m.getKvCacheStats());

    const int32_t held = m.getCacheBlockIds(1, kWindow)[0];
    EXPECT_FALSE(m.onboardBlock(kWindow, held)) << "a held block on the GPU already";
    EXPECT_EQ(statusOf([&] { m.onboardBlock(kWindow, 6); }), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(statusOf([&] { m.onboardBlock(kWindow + 1, blocks[1]); }),
              KVB_STATUS_INVALID_ARGUMENT);
    kvb_test::expectSameStats(before, m.getKvCacheStats());
    m.checkInvariants();

    kvb::Manager noHost(dataConfig(4, 0));
    std::vector<int32_t> b = cacheRequest(noHost, 0, prompt);
    EXPECT_FALSE(noHost.onboardBlock(kWindow, b[0])) << "on the GPU already, no host tier";
}

// A block a live sequence holds goes to the host tier and back (TensorRT-LLM's offloadBlock and
// onboardBlock on a sequence's block, as its tests use them to read and write a block's bytes on
// the host): the sequence keeps it, its bytes move with it, and its offsets are refused while
// it is on the host.
TEST(OnboardBlockTest, AHeldBlockGoesToTheHostTierAndBackWithItsBytes) {
    kvb::Manager m(dataConfig(4, 2));
    m.addSequence(kvb::Request(1, tokenRun(0, 9)));
    const std::vector<int32_t> ids = m.getCacheBlockIds(1, kWindow);
    fillRow(m, ids[1], 42);
    ASSERT_TRUE(m.offloadBlock(kWindow, ids[1]));
    kvb_block_info_t info = m.getBlockInfo(kWindow, ids[1]);
    EXPECT_EQ(info.cache_level, KVB_CACHE_LEVEL_SECONDARY);
    EXPECT_EQ(info.ref_count, 1);
    EXPECT_EQ(m.getCacheBlockIds(1, kWindow), ids);
    EXPECT_TRUE(rowHolds(m, ids[1], 42));
    auto [maxBlocks, pools] = m.getOffsetTableDimensions();
    std::vector<int32_t> table(static_cast<size_t>(pools) * 2 * maxBlocks, -5);
    int32_t count = 0;
    EXPECT_EQ(kvb_manager_copy_block_offsets(m.get(), table.data(), table.size(), 1, 0, 1, &count),
              KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_TRUE(std::all_of(table.begin(), table.end(), [](int32_t v) { return v == -5; }));
    m.checkInvariants();

    fillRow(m, ids[1], 43);  // the engine writes the host row
    ASSERT_TRUE(m.onboardBlock(kWindow, ids[1]));
    EXPECT_EQ(m.getBlockInfo(kWindow, ids[1]).cache_level, KVB_CACHE_LEVEL_PRIMARY);
    EXPECT_TRUE(rowHolds(m, ids[1], 43));
    EXPECT_EQ(kvb_manager_copy_block_offsets(m.get(), table.data(), table.size(), 1, 0, 1, &count),
              KVB_OK);
    EXPECT_EQ(count, 3);
    m.checkInvariants();
}

// ---- pinBlock / unpinBlock by id ------------------------------------------------------------

// A pinned free block leaves the free queue: allocation cannot evict it, its bytes and tree place
// survive memory pressure, and unpinning makes it free and reusable again.
TEST(PinBlocksByIdTest, APinnedCachedChainSurvivesPressureUntilUnpinned) {
    kvb::Manager m(dataConfig(5, 0));
    const std::vector<int32_t> prompt = tokenRun(0, 9);
    std::vector<int32_t> blocks = cacheRequest(m, 0, prompt);  // 0 -> 1 cached, 2 free
    const std::vector<int32_t> chain{blocks[0], blocks[1]};
    m.pinBlocksById(kWindow, chain);
    EXPECT_EQ(m.getNumFreeBlocksPerWindowSize(kWindow).first, 3);
    EXPECT_EQ(m.getBlockInfo(kWindow, blocks[0]).ref_count, 1);
    EXPECT_FALSE(m.getBlockInfo(kWindow, blocks[0]).is_free);

    // An unrelated prompt takes every free row; the pinned chain is untouched.
    m.addSequence(kvb::Request(1, tokenRun(700, 12)));
    for (int32_t b : m.getCacheBlockIds(1, kWindow)) fillRow(m, b, 200);
    EXPECT_EQ(m.getNumFreeBlocksPerWindowSize(kWindow).first, 0);
    for (size_t i = 0; i < chain.size(); ++i) {
        EXPECT_TRUE(m.getBlockInfo(kWindow, chain[i]).in_reuse_tree);
        EXPECT_TRUE(rowHolds(m, chain[i], seedOf(0, i)));
    }
    EXPECT_EQ(statusOf([&] { m.addSequence(kvb::Request(2, tokenRun(900, 5))); }),
              KVB_STATUS_OUT_OF_BLOCKS)
        << "pinned blocks are not evictable";

    m.unpinBlocksById(kWindow, chain);
    EXPECT_EQ(m.getNumFreeBlocksPerWindowSize(kWindow).first, 2);
    EXPECT_TRUE(m.getBlockInfo(kWindow, blocks[1]).is_free);
    m.removeSequence(1);
    kvb_admission_t a = m.addSequence(kvb::Request(3, prompt));
    EXPECT_EQ(a.prepopulated_prompt_len, 8);
    m.checkInvariants();
}

// A pin is a reference of its own: a sequence's block pinned by id outlives the sequence, and
// each pin needs its own unpin.
TEST(PinBlocksByIdTest, PinsOutliveTheSequenceAndCountOnePerPin) {
    kvb::Manager m(dataConfig(4, 0));
    m.addSequence(kvb::Request(0, tokenRun(0, 6)));
    const int32_t b = m.getCacheBlockIds(0, kWindow)[0];
    fillRow(m, b, 77);
    m.pinBlocksById(kWindow, {b, b});
    EXPECT_EQ(m.getBlockInfo(kWindow, b).ref_count, 3);
    m.removeSequence(0, /*storeForReuse=*/false);
    EXPECT_EQ(m.getBlockInfo(kWindow, b).ref_count, 2);
    EXPECT_FALSE(m.getBlockInfo(kWindow, b).is_free);
    EXPECT_TRUE(rowHolds(m, b, 77));

    m.unpinBlocksById(kWindow, {b});
    EXPECT_FALSE(m.getBlockInfo(kWindow, b).is_free);
    m.unpinBlocksById(kWindow, {b});
    EXPECT_TRUE(m.getBlockInfo(kWindow, b).is_free);
    EXPECT_EQ(statusOf([&] { m.unpinBlocksById(kWindow, {b}); }), KVB_STATUS_INVALID_ARGUMENT);
    m.checkInvariants();
}

// The ids are checked before any pin is taken: a host block or an id out of range fails the whole
// call and leaves the valid ids before it unpinned.
TEST(PinBlocksByIdTest, ABadIdPinsNothing) {
    kvb::Manager m(dataConfig(4, 2));
    std::vector<int32_t> blocks = cacheRequest(m, 0, tokenRun(0, 9));
    ASSERT_TRUE(m.offloadBlock(kWindow, blocks[1]));
    kvb_kv_cache_stats_t before = m.getKvCacheStats();

    EXPECT_EQ(statusOf([&] {
                  m.pinBlocksById(kWindow, {blocks[0], blocks[1]});
              }),
              KVB_STATUS_INVALID_ARGUMENT)
        << "a host block cannot be pinned";
    EXPECT_NE(std::string(kvb_last_error_message()).find("host tier"), std::string::npos)
        << kvb_last_error_message();
    EXPECT_EQ(statusOf([&] {
                  m.pinBlocksById(kWindow, {blocks[0], 6});
              }),
              KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(statusOf([&] {
                  m.pinBlocksById(kWindow, {blocks[0], -1});
              }),
              KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(m.getBlockInfo(kWindow, blocks[0]).ref_count, 0);
    EXPECT_TRUE(m.getBlockInfo(kWindow, blocks[0]).is_free);
    kvb_test::expectSameStats(before, m.getKvCacheStats());

    // Onboarded, it can be pinned.
    ASSERT_TRUE(m.onboardBlock(kWindow, blocks[1]));
    m.pinBlocksById(kWindow, {blocks[0], blocks[1]});
    EXPECT_EQ(m.getBlockInfo(kWindow, blocks[1]).ref_count, 1);
    m.unpinBlocksById(kWindow, {blocks[0], blocks[1]});
    m.checkInvariants();
}

}  // namespace

// ---- storeBlocks: given blocks under given keys ---------------------------------------------

namespace {

// A sequence whose blocks received bytes from elsewhere (a cache transceiver) is made reusable
// under its own tokens; a second request then reuses them with those bytes.
TEST(StoreBlocksTest, GivenBlocksJoinTheTreeUnderTheKeysAndAreReused) {
    kvb::Manager m(dataConfig(8, 0));
    const std::vector<int32_t> prompt = tokenRun(0, 10);
    m.addSequence(kvb::Request(1, prompt));
    std::vector<int32_t> blocks = m.getCacheBlockIds(1, kWindow);
    for (size_t i = 0; i < blocks.size(); ++i) fillRow(m, blocks[i], static_cast<uint8_t>(40 + i));
    EXPECT_EQ(kvb_test::reusableBlocks(m, prompt, kWindow), 0) << "nothing stored by admission";

    auto [stored, pinned] =
        m.storeBlocks(kvb::Request(1, prompt), 8, kWindow, {blocks[0], blocks[1]});
    EXPECT_EQ(stored, 2);
    EXPECT_TRUE(pinned.empty());
    EXPECT_TRUE(m.getBlockInfo(kWindow, blocks[1]).in_reuse_tree);
    EXPECT_EQ(m.getBlockInfo(kWindow, blocks[1]).parent, blocks[0]);
    EXPECT_EQ(m.getBlockInfo(kWindow, blocks[1]).num_tokens, 4);

    kvb_admission_t a = m.addSequence(kvb::Request(2, prompt));
    EXPECT_EQ(a.prepopulated_prompt_len, 8);
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow)[1], blocks[1]);
    EXPECT_TRUE(rowHolds(m, blocks[1], 41));
    m.checkInvariants();
}

// Where the tree already holds a key, the cached block stays and the given one is skipped; the
// walk goes on from the cached block, and pins follow the walked path.
TEST(StoreBlocksTest, CachedKeysKeepTheirBlocksAndPinsFollowThePath) {
    kvb::Manager m(dataConfig(8, 0));
    const std::vector<int32_t> prompt = tokenRun(0, 13);
    std::vector<int32_t> cached = cacheRequest(m, 0, tokenRun(0, 5));  // block for tokens 0..3
    m.addSequence(kvb::Request(1, tokenRun(0, 13)));
    std::vector<int32_t> own = m.getCacheBlockIds(1, kWindow);
    ASSERT_EQ(own[0], cached[0]) << "admission reused the cached first block";
    // Pretend the whole prompt's blocks arrived; give a fresh id list for them.
    auto [stored, pinned] =
        m.storeBlocks(kvb::Request(1, prompt), 12, kWindow, {own[0], own[1], own[2]}, /*pin=*/true);
    EXPECT_EQ(stored, 2) << "blocks 1 and 2 joined; block 0 was cached";
    EXPECT_EQ(pinned, (std::vector<int32_t>{own[0], own[1], own[2]}));
    for (int32_t b : pinned) EXPECT_EQ(m.getBlockInfo(kWindow, b).ref_count, 2) << b;
    m.unpinBlocksById(kWindow, pinned);
    for (int32_t b : pinned) EXPECT_EQ(m.getBlockInfo(kWindow, b).ref_count, 1) << b;

    // A different block offered for a cached key is skipped, not inserted.
    m.addSequence(kvb::Request(2, tokenRun(300, 9)));
    std::vector<int32_t> other = m.getCacheBlockIds(2, kWindow);
    auto second = m.storeBlocks(kvb::Request(3, prompt), 8, kWindow, {other[0], other[1]});
    EXPECT_EQ(second.first, 0);
    EXPECT_FALSE(m.getBlockInfo(kWindow, other[0]).in_reuse_tree);
    m.checkInvariants();
}

// Bad input changes nothing: an id on the host tier or out of range, more tokens than the
// request has, a pin buffer too small.
TEST(StoreBlocksTest, BadInputStoresNothing) {
    kvb::Manager m(dataConfig(4, 2));
    std::vector<int32_t> hostBound = cacheRequest(m, 0, tokenRun(500, 5));
    ASSERT_TRUE(m.offloadBlock(kWindow, hostBound[0]));
    const std::vector<int32_t> prompt = tokenRun(0, 9);
    m.addSequence(kvb::Request(1, prompt));
    std::vector<int32_t> own = m.getCacheBlockIds(1, kWindow);
    EXPECT_EQ(kvb_test::statusOf([&] {
                  m.storeBlocks(kvb::Request(1, prompt), 8, kWindow, {own[0], hostBound[0]});
              }),
              KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_test::statusOf([&] {
                  m.storeBlocks(kvb::Request(1, prompt), 8, kWindow, {own[0], 6});
              }),
              KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(
        kvb_test::statusOf([&] { m.storeBlocks(kvb::Request(1, prompt), 10, kWindow, {own[0]}); }),
        KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_FALSE(m.getBlockInfo(kWindow, own[0]).in_reuse_tree);

    kvb::Request r(1, prompt);
    const int32_t ids[2] = {own[0], own[1]};
    int32_t pinned[1] = {0};
    size_t numPinned = 0;
    int32_t stored = -1;
    r.withC([&](const kvb_request_t* c) {
        EXPECT_EQ(kvb_manager_store_blocks(m.get(), c, 8, kWindow, ids, 2, true, pinned, 1,
                                           &numPinned, &stored),
                  KVB_STATUS_BUFFER_TOO_SMALL);
    });
    EXPECT_EQ(numPinned, 2u);
    EXPECT_EQ(stored, -1);
    EXPECT_FALSE(m.getBlockInfo(kWindow, own[0]).in_reuse_tree);
    EXPECT_EQ(m.getBlockInfo(kWindow, own[0]).ref_count, 1);
    m.checkInvariants();
}

}  // namespace
