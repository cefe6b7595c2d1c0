// kvb_manager_add_token_batch: one decode step for many sequences is the same as add_token +
// store_new_block per sequence, in order; it stops at the first sequence that lacks a block and
// leaves that one and the rest unchanged.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "test_support.hpp"

using kvb_test::tokenRun;
using kvb_test::windowConfig;

namespace {

constexpr int32_t kWindow = 256;
constexpr int32_t kTpb = 4;

// Three prompts of 6 tokens (two blocks each), then `steps` decode steps.
void runDecode(kvb::Manager& m, bool batched, int steps) {
    for (uint64_t id = 1; id <= 3; ++id) {
        m.addSequence(kvb::Request(id, tokenRun(static_cast<int32_t>(id) * 1000, 6)));
        m.storeContextBlocks(id, 6);
    }
    for (int s = 0; s < steps; ++s) {
        std::vector<uint64_t> ids{1, 2, 3};
        std::vector<int32_t> tokens{7 + s, 8 + s, 9 + s};
        if (batched) {
            ASSERT_EQ(m.addTokenBatch(ids, tokens), 3u);
        } else {
            for (size_t i = 0; i < ids.size(); ++i) {
                m.addToken(ids[i], tokens[i]);
                m.storeNewBlock(ids[i]);
            }
        }
    }
}

}  // namespace

TEST(DecodeBatchTest, IsTheSameAsOneCallPerSequence) {
    kvb::Manager one(windowConfig(kWindow, 64, 0, kTpb, kWindow));
    kvb::Manager batch(windowConfig(kWindow, 64, 0, kTpb, kWindow));
    runDecode(one, false, 11);
    runDecode(batch, true, 11);
    for (uint64_t id = 1; id <= 3; ++id) {
        EXPECT_EQ(batch.getNumTokens(id), one.getNumTokens(id));
        EXPECT_EQ(batch.getCacheBlockIds(id, kWindow), one.getCacheBlockIds(id, kWindow));
    }
    EXPECT_EQ(batch.getNumFreeBlocks(), one.getNumFreeBlocks());
    // The decode blocks were stored: a prompt repeating sequence 2's tokens reuses them.
    std::vector<int32_t> again = tokenRun(2000, 6);
    for (int s = 0; s < 11; ++s) again.push_back(8 + s);
    again.push_back(-1);
    EXPECT_EQ(batch.countReusableBlocks(kvb::Request(9, again), kWindow),
              one.countReusableBlocks(kvb::Request(9, again), kWindow));
    EXPECT_EQ(batch.countReusableBlocks(kvb::Request(9, again), kWindow), 4);
    batch.checkInvariants();
}

TEST(DecodeBatchTest, StopsAtTheFirstSequenceWithoutABlock) {
    // 7 blocks: two for each prompt, one left. Sequence 1 (8 tokens) needs a block at once, so
    // does sequence 2; sequence 3 (7 tokens) does not.
    kvb::Manager m(windowConfig(kWindow, 7, 0, kTpb, kWindow));
    m.addSequence(kvb::Request(1, tokenRun(100, 8)));
    m.addSequence(kvb::Request(2, tokenRun(200, 8)));
    m.addSequence(kvb::Request(3, tokenRun(300, 7)));
    ASSERT_EQ(m.getNumFreeBlocks(), 1);
    const auto blocks2 = m.getCacheBlockIds(2, kWindow);
    const uint64_t ids[] = {1, 2, 3};
    const int32_t tokens[] = {1, 2, 3};
    kvb_status_t statuses[3] = {KVB_STATUS_INTERNAL, KVB_STATUS_INTERNAL, KVB_STATUS_INTERNAL};
    size_t done = 99;
    EXPECT_EQ(kvb_manager_add_token_batch(m.get(), ids, tokens, 3, true, statuses, &done),
              KVB_STATUS_OUT_OF_BLOCKS);
    EXPECT_EQ(done, 1u);
    EXPECT_EQ(statuses[0], KVB_OK);
    EXPECT_EQ(statuses[1], KVB_STATUS_OUT_OF_BLOCKS);
    EXPECT_EQ(statuses[2], KVB_STATUS_INTERNAL) << "not written past the failing sequence";
    EXPECT_EQ(m.getNumTokens(1), 9);
    EXPECT_EQ(m.getNumTokens(2), 8);
    EXPECT_EQ(m.getNumTokens(3), 7) << "sequences after the failure are untouched";
    EXPECT_EQ(m.getCacheBlockIds(2, kWindow), blocks2);
    EXPECT_EQ(m.getNumFreeBlocks(), 0);
    // Free a block and go on from the failing sequence.
    m.removeSequence(1, false);
    EXPECT_EQ(m.addTokenBatch({2, 3}, {2, 3}), 2u);
    EXPECT_EQ(m.getNumTokens(2), 9);
    EXPECT_EQ(m.getNumTokens(3), 8);
    m.checkInvariants();
}

TEST(DecodeBatchTest, RejectsBadArgumentsWithoutChangingAnything) {
    kvb::Manager m(windowConfig(kWindow, 8, 0, kTpb, kWindow));
    m.addSequence(kvb::Request(1, tokenRun(0, 5)));
    const uint64_t ids[] = {1, 42};
    const int32_t tokens[] = {5, 6};
    size_t done = 99;
    EXPECT_EQ(kvb_manager_add_token_batch(m.get(), ids, tokens, 2, true, nullptr, nullptr),
              KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_add_token_batch(m.get(), nullptr, tokens, 2, true, nullptr, &done),
              KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(m.getNumTokens(1), 5);
    // An unknown id stops the batch there; the ones before it got their token.
    EXPECT_EQ(kvb_manager_add_token_batch(m.get(), ids, tokens, 2, true, nullptr, &done),
              KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_EQ(done, 1u);
    EXPECT_EQ(m.getNumTokens(1), 6);
    EXPECT_EQ(kvb_manager_add_token_batch(m.get(), nullptr, nullptr, 0, true, nullptr, &done),
              KVB_OK);
    EXPECT_EQ(done, 0u);
    m.checkInvariants();
}
