// Carrying a hybrid model's recurrent state into a sequence's next block
// (kvb_manager_copy_recurrent_state, TensorRT-LLM copyLinearAttentionBlock(Batch)).
//
// The engine of these tests keeps a sequence's running state in the state row of the block that
// holds its next token. When it has processed a whole block, that row is the block's snapshot
// (what prefix reuse restores); the copy starts the next block's row from it. The host copy
// backend moves real bytes, so each test checks rows: the snapshot stays, the next block's state
// row receives it, and no attention row changes.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvblock.h"
#include "kvblock.hpp"
#include "test_support.hpp"

namespace {

using kvb_test::statusOf;
using kvb_test::tokenRun;

constexpr int32_t kWindow = 64;
constexpr int32_t kTokensPerBlock = 4;
constexpr int kAttentionPool = 0;
constexpr int kStatePool = 1;

// Two attention layers and three recurrent layers in one window (Nemotron-H / Jamba style).
kvb::Config hybridConfig() {
    kvb::Config c;
    c.raw.tokens_per_block = kTokensPerBlock;
    c.raw.max_sequence_length = kWindow;
    c.raw.copy_backend = KVB_COPY_BACKEND_HOST;
    c.addWindow(kWindow, 12, 4);
    c.addLayers(2, kWindow, KVB_CACHE_TYPE_SELF, 2, 8, KVB_KV_DATA_TYPE_FP16);
    c.addLayers(3, kWindow, KVB_CACHE_TYPE_RECURRENT_STATE, 4, 16, KVB_KV_DATA_TYPE_FP32);
    return c;
}

class RecurrentStateTest : public ::testing::Test {
  protected:
    RecurrentStateTest() : m_(hybridConfig()) {}

    void SetUp() override {
        ASSERT_EQ(m_.getPoolInfo(kAttentionPool).cache_type, KVB_CACHE_TYPE_SELF);
        ASSERT_EQ(m_.getPoolInfo(kStatePool).cache_type, KVB_CACHE_TYPE_RECURRENT_STATE);
    }

    std::vector<uint8_t> bytes(int pool, int32_t block) {
        kvb_block_info_t b = m_.getBlockInfo(kWindow, block);
        auto [base, rowBytes] =
            m_.getModelPoolPointer(pool, static_cast<kvb_cache_level_t>(b.cache_level));
        const uint8_t* row = base + static_cast<size_t>(b.memory_index) * rowBytes;
        return std::vector<uint8_t>(row, row + rowBytes);
    }

    void fill(int pool, int32_t block, uint8_t seed) {
        kvb_block_info_t b = m_.getBlockInfo(kWindow, block);
        auto [base, rowBytes] =
            m_.getModelPoolPointer(pool, static_cast<kvb_cache_level_t>(b.cache_level));
        uint8_t* row = base + static_cast<size_t>(b.memory_index) * rowBytes;
        for (size_t i = 0; i < rowBytes; ++i) row[i] = static_cast<uint8_t>(seed + 3 * i);
    }

    std::vector<int32_t> blocks(uint64_t id) { return m_.getCacheBlockIds(id, kWindow); }

    // Every row of every block of `id`, attention and state.
    std::vector<std::vector<uint8_t>> snapshot(uint64_t id) {
        std::vector<std::vector<uint8_t>> out;
        for (int32_t b : blocks(id)) {
            out.push_back(bytes(kAttentionPool, b));
            out.push_back(bytes(kStatePool, b));
        }
        return out;
    }

    // Admits `prompt` and gives each of its blocks distinct attention and state bytes.
    void admitAndFill(uint64_t id, const std::vector<int32_t>& prompt) {
        m_.addSequence(kvb::Request(id, prompt));
        std::vector<int32_t> bs = blocks(id);
        for (size_t i = 0; i < bs.size(); ++i) {
            fill(kAttentionPool, bs[i], static_cast<uint8_t>(20 * i + id));
            fill(kStatePool, bs[i], static_cast<uint8_t>(20 * i + id + 100));
        }
    }

    kvb::Manager m_;
};

// At a block boundary the finished block's state row is copied into the next block's state
// row; the finished block keeps its snapshot and no attention row changes.
TEST_F(RecurrentStateTest, AtABoundaryTheNextBlockStartsFromTheSnapshot) {
    admitAndFill(1, tokenRun(0, 13));
    std::vector<int32_t> bs = blocks(1);
    ASSERT_EQ(bs.size(), 4u);
    std::vector<uint8_t> snapshotAfter8 = bytes(kStatePool, bs[1]);
    std::vector<uint8_t> attention2 = bytes(kAttentionPool, bs[2]);
    std::vector<uint8_t> attention1 = bytes(kAttentionPool, bs[1]);
    ASSERT_NE(bytes(kStatePool, bs[2]), snapshotAfter8);

    EXPECT_EQ(m_.copyRecurrentState({1}, {8}), 1u);
    EXPECT_EQ(bytes(kStatePool, bs[2]), snapshotAfter8);
    EXPECT_EQ(bytes(kStatePool, bs[1]), snapshotAfter8) << "the snapshot stays";
    EXPECT_EQ(bytes(kAttentionPool, bs[2]), attention2) << "attention rows are not state";
    EXPECT_EQ(bytes(kAttentionPool, bs[1]), attention1);
    m_.checkInvariants();
}

// Off a boundary, at position 0, or past the sequence's last block, nothing is copied.
TEST_F(RecurrentStateTest, OffABoundaryNothingMoves) {
    admitAndFill(1, tokenRun(0, 13));
    const auto before = snapshot(1);
    for (int32_t position : {0, 1, 5, 7, 11, 16, 20}) {
        EXPECT_EQ(m_.copyRecurrentState({1}, {position}), 0u) << "position " << position;
    }
    EXPECT_EQ(snapshot(1), before);
}

// A batch goes out together; each request copies at its own boundary, others not at all.
TEST_F(RecurrentStateTest, ABatchCopiesEachRequestAtItsOwnBoundary) {
    admitAndFill(1, tokenRun(0, 13));
    admitAndFill(2, tokenRun(500, 9));
    admitAndFill(3, tokenRun(900, 9));
    std::vector<int32_t> a = blocks(1), b = blocks(2);
    const auto third = snapshot(3);
    EXPECT_EQ(m_.copyRecurrentState({1, 2, 3}, {4, 8, 6}), 2u);
    EXPECT_EQ(bytes(kStatePool, a[1]), bytes(kStatePool, a[0]));
    EXPECT_EQ(bytes(kStatePool, b[2]), bytes(kStatePool, b[1]));
    EXPECT_EQ(snapshot(3), third);
}

// A block in the reuse tree is another sequence's content: never a destination.
TEST_F(RecurrentStateTest, ACachedBlockIsNeverWritten) {
    const std::vector<int32_t> prompt = tokenRun(0, 13);
    admitAndFill(1, prompt);
    kvb_test::markPrefillComputed(m_, 1);
    m_.removeSequence(1);  // blocks 0..2 cached
    EXPECT_EQ(m_.addSequence(kvb::Request(2, prompt)).prepopulated_prompt_len, 12);
    std::vector<int32_t> bs = blocks(2);
    const auto before = snapshot(2);
    EXPECT_EQ(m_.copyRecurrentState({2}, {4}), 0u) << "block 1 is cached";
    EXPECT_EQ(m_.copyRecurrentState({2}, {8}), 0u) << "block 2 is cached";
    EXPECT_EQ(snapshot(2), before);
    EXPECT_EQ(m_.copyRecurrentState({2}, {12}), 1u) << "block 3 is the sequence's own";
    EXPECT_EQ(bytes(kStatePool, bs[3]), bytes(kStatePool, bs[2]));
}

// Bad input fails the whole call, before anything is copied.
TEST_F(RecurrentStateTest, AnUnknownRequestOrANegativePositionCopiesNothing) {
    admitAndFill(1, tokenRun(0, 13));
    const auto before = snapshot(1);
    EXPECT_EQ(statusOf([&] {
                  m_.copyRecurrentState({1, 99}, {4, 4});
              }),
              KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(statusOf([&] {
                  m_.copyRecurrentState({1, 1}, {4, -4});
              }),
              KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(statusOf([&] { m_.copyRecurrentState({1}, {}); }), KVB_STATUS_INVALID_ARGUMENT);
    size_t n = 7;
    EXPECT_EQ(kvb_manager_copy_recurrent_state(m_.get(), nullptr, nullptr, 1, &n),
              KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(snapshot(1), before);
    EXPECT_EQ(m_.copyRecurrentState({}, {}), 0u);
}

// A model without recurrent layers has nothing to carry.
TEST(RecurrentStateWithoutStatePoolsTest, AnAttentionOnlyModelCopiesNothing) {
    kvb::Manager m(kvb_test::windowConfig(kWindow, 8, 0, kTokensPerBlock, kWindow));
    m.addSequence(kvb::Request(1, tokenRun(0, 13)));
    EXPECT_EQ(m.copyRecurrentState({1}, {4}), 0u);
}

}  // namespace
