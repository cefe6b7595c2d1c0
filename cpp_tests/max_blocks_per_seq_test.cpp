// max_blocks_per_seq (the last dimension of offset tables) counts the extra KV tokens and the
// draft tokens a sequence may hold past its maximum length, after clamping that length to the
// window's limit: ceil((min(max_sequence_length, window limit) + num_extra_kv_tokens +
// max_draft_tokens) / tokens_per_block). A sequence grown to its limit with the largest draft
// fits the table sized from it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kvblock.h"
#include "kvblock.hpp"
#include "test_support.hpp"

namespace {

constexpr int32_t kTpb = 8;
constexpr int32_t kMaxLen = 30;
constexpr int32_t kExtra = 2;
constexpr int32_t kDraft = 5;
constexpr int32_t kFull = 40;     // wider than the maximum length
constexpr int32_t kSliding = 16;  // a sliding window

kvb::Config config(int32_t extra, int32_t draft) {
    kvb::Config c;
    c.addWindow(kSliding, 16);
    c.addWindow(kFull, 16);
    c.raw.tokens_per_block = kTpb;
    c.raw.max_sequence_length = kMaxLen;
    c.raw.num_extra_kv_tokens = extra;
    c.raw.max_draft_tokens = draft;
    return c;
}

int32_t maxBlocksPerSeq(const kvb::Manager& m, int32_t window) {
    int32_t n = -1;
    kvb::check(kvb_manager_get_max_blocks_per_seq(m.get(), window, &n));
    return n;
}

kvb_sequence_lengths_t lengths(const kvb::Manager& m, uint64_t id) {
    kvb_sequence_lengths_t l{};
    kvb::check(kvb_manager_get_sequence_lengths(m.get(), id, &l));
    return l;
}

// Sequence 1 at the maximum length: a 29-token prompt and one generated token.
void growToMaxLength(kvb::Manager& m) {
    m.addSequence(kvb::Request(1, kvb_test::tokenRun(0, 29)));
    m.addToken(1, 1000);
    EXPECT_EQ(kvb_manager_add_token(m.get(), 1, 1001), KVB_STATUS_SEQUENCE_TOO_LONG);
}

// Entries holding a block in each pool's K row of sequence 1's offsets, written into a table
// sized from kvb_manager_get_offset_table_dimensions.
std::vector<int32_t> blocksInTable(const kvb::Manager& m) {
    const auto dims = m.getOffsetTableDimensions();
    std::vector<int32_t> table(static_cast<size_t>(dims.second * 2 * dims.first));
    m.copyBlockOffsets(table, 1, 0, 1);
    std::vector<int32_t> counts;
    for (int32_t pool = 0; pool < dims.second; ++pool) {
        const auto row = table.begin() + static_cast<std::ptrdiff_t>(pool * 2 * dims.first);
        counts.push_back(static_cast<int32_t>(
            std::count_if(row, row + dims.first, [](int32_t o) { return o != INT32_MAX; })));
    }
    return counts;
}

}  // namespace

// ceil((30 + 2 + 5) / 8) = 5 blocks in both windows (4 without extra and draft tokens).
TEST(MaxBlocksPerSeqTest, CountsExtraKvAndDraftTokens) {
    kvb::Manager m(config(kExtra, kDraft));
    EXPECT_EQ(maxBlocksPerSeq(m, kSliding), 5);
    EXPECT_EQ(maxBlocksPerSeq(m, kFull), 5);
    EXPECT_EQ(m.getOffsetTableDimensions(), std::make_pair(5, 2));

    kvb::Manager plain(config(0, 0));
    EXPECT_EQ(maxBlocksPerSeq(plain, kFull), 4);
    EXPECT_EQ(plain.getOffsetTableDimensions(), std::make_pair(4, 2));
}

// At the maximum length, the largest draft reserves 30 + 1 + 5 = 36 tokens of slots (5 blocks);
// padding reaches the limit 30 + 2 + 5 = 37 and no further. The table holds every block.
TEST(MaxBlocksPerSeqTest, SequenceAtItsLimitFitsItsOffsetTable) {
    kvb::Manager m(config(kExtra, kDraft));
    growToMaxLength(m);
    bool done = false;
    ASSERT_EQ(kvb_manager_allocate_generation(m.get(), 1, kDraft, &done), KVB_OK);
    ASSERT_TRUE(done);
    EXPECT_EQ(lengths(m, 1).capacity, 36u);
    EXPECT_EQ(m.getCacheBlockIds(1, kFull).size(), 5u);
    EXPECT_EQ(blocksInTable(m), (std::vector<int32_t>{5, 5}));

    ASSERT_EQ(kvb_manager_resize(m.get(), 1, 37, &done), KVB_OK);
    ASSERT_TRUE(done);
    EXPECT_EQ(kvb_manager_resize(m.get(), 1, 38, &done), KVB_STATUS_SEQUENCE_TOO_LONG);
    EXPECT_EQ(kvb_manager_extend_capacity_for_tokens(m.get(), 1, 1, &done),
              KVB_STATUS_SEQUENCE_TOO_LONG);
    EXPECT_EQ(lengths(m, 1).capacity, 37u);
    EXPECT_EQ(blocksInTable(m), (std::vector<int32_t>{5, 5}));
    m.checkInvariants();
}

// Without extra or draft tokens a draft at the maximum length is capped there (4 blocks).
TEST(MaxBlocksPerSeqTest, WithoutExtraTokensTheCapacityStopsAtTheMaximumLength) {
    kvb::Manager m(config(0, 0));
    growToMaxLength(m);
    bool done = false;
    ASSERT_EQ(kvb_manager_allocate_generation(m.get(), 1, kDraft, &done), KVB_OK);
    ASSERT_TRUE(done);
    EXPECT_EQ(lengths(m, 1).capacity, static_cast<size_t>(kMaxLen));
    EXPECT_EQ(blocksInTable(m), (std::vector<int32_t>{4, 4}));
    m.checkInvariants();
}

// Negative counts, a total past INT32_MAX, an unknown window and a null output are refused.
TEST(MaxBlocksPerSeqTest, BadArgumentsAreRefused) {
    for (auto [extra, draft] : {std::pair{-1, 0}, std::pair{0, -1}, std::pair{INT32_MAX, 0},
                                std::pair{0, INT32_MAX - kMaxLen + 1}}) {
        SCOPED_TRACE(::testing::Message() << extra << " " << draft);
        kvb::Config c = config(extra, draft);
        kvb_manager_config_t raw = kvb_test::rawConfig(c);
        kvb_manager_t* out = nullptr;
        EXPECT_EQ(kvb_manager_create(&raw, &out), KVB_STATUS_INVALID_CONFIG);
        EXPECT_STRNE(kvb_last_error_message(), "");
        EXPECT_EQ(out, nullptr);
    }
    kvb::Manager m(config(0, INT32_MAX - kMaxLen));  // exactly INT32_MAX tokens is allowed
    int32_t n = 0;
    EXPECT_EQ(kvb_manager_get_max_blocks_per_seq(m.get(), 17, &n), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_manager_get_max_blocks_per_seq(m.get(), -1, &n), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_manager_get_max_blocks_per_seq(m.get(), kFull, nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_get_max_blocks_per_seq(nullptr, kFull, &n), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(maxBlocksPerSeq(m, kFull), INT32_MAX / kTpb + 1);
}
