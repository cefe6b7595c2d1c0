// Block-table layout and block accounting of full-attention sequences (the scenarios of
// TensorRT-LLM's tests KVCacheManagerTest, KVCacheManagerBatchTest,
// KVCacheManagerRewindTokensTest).
//
// Offset tables are laid out [pool][slot][K=0|V=1][max_blocks_per_seq]; one pool per window in
// ascending window order. The entry of block b is memory_index(b) * 2 * num_layers (+1 for V);
// the rest of every written row is INT32_MAX.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <utility>
#include <vector>

#include "kvblock.hpp"
#include "test_support.hpp"

namespace {

using kvb_test::statusOf;
using kvb_test::tokenRun;

// Index of entry `block` of row (pool, slot, field) in an offset table.
size_t layoutIndex(int32_t pool, int32_t numSlots, int32_t slot, int32_t field, int32_t maxBlocks,
                   int32_t block) {
    return static_cast<size_t>(((pool * numSlots + slot) * 2 + field) * maxBlocks + block);
}

// Checks that row (pool, slot) of `table` holds exactly the offsets of `ids` (block ids of one
// beam in `window`, whose pool has `numLayers` layers) followed by INT32_MAX.
void expectRowHoldsBlocks(const kvb::Manager& m, const std::vector<int32_t>& table, int32_t pool,
                          int32_t numSlots, int32_t slot, int32_t maxBlocks, int32_t window,
                          int32_t numLayers, const std::vector<int32_t>& ids) {
    for (int32_t field = 0; field < 2; ++field) {
        for (int32_t j = 0; j < maxBlocks; ++j) {
            const int32_t got = table[layoutIndex(pool, numSlots, slot, field, maxBlocks, j)];
            if (j < static_cast<int32_t>(ids.size())) {
                const int32_t mem =
                    m.getBlockInfo(window, ids[static_cast<size_t>(j)]).memory_index;
                EXPECT_EQ(got, mem * 2 * numLayers + field)
                    << "pool " << pool << " slot " << slot << " field " << field << " entry " << j;
            } else {
                EXPECT_EQ(got, INT32_MAX)
                    << "pool " << pool << " slot " << slot << " field " << field << " entry " << j;
            }
        }
    }
}

}  // namespace

// Full attention, beam width 4, no reuse: a 10-token prompt at 4 tokens per block needs 3 context
// blocks per beam; the two full ones are shared by all beams, the partial last one is per beam
// (it will be written differently by each beam). Generation allocates one block per beam at each
// block boundary. Offsets follow the TensorRT-LLM table layout, and admissions fail cleanly once
// the cache is exhausted.
TEST(KVCacheManagerTest, FullAttentionBeamSearchLayoutAndExhaustion) {
    constexpr int32_t kWindow = 32, kPrimary = 30, kLayers = 2, kBeam = 4;
    kvb::Config cfg;
    cfg.addWindow(kWindow, kPrimary, 0, kLayers);
    cfg.raw.tokens_per_block = 4;
    cfg.raw.max_sequence_length = kWindow;
    cfg.raw.max_beam_width = kBeam;
    cfg.raw.enable_block_reuse = false;
    kvb::Manager m(cfg);
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary);

    m.addSequence(kvb::Request(0, tokenRun(0, 10)).withBeamWidth(kBeam));
    // 2 shared + 4 per-beam last blocks.
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary - 6);
    for (int32_t b = 0; b < kBeam; ++b) {
        EXPECT_EQ(m.getCacheBlockIds(0, kWindow, b), (std::vector<int32_t>{0, 1, 2 + b})) << b;
    }
    for (int32_t id = 0; id < 6; ++id) {
        EXPECT_EQ(m.getBlockInfo(kWindow, id).memory_index, id) << "fresh primary rows";
    }
    EXPECT_EQ(m.getBlockInfo(kWindow, 0).ref_count, kBeam) << "shared block: one ref per beam";
    EXPECT_EQ(m.getBlockInfo(kWindow, 2).ref_count, 1) << "per-beam block";

    const auto dims = m.getOffsetTableDimensions();
    EXPECT_EQ(dims.first, 8) << "ceil(32 / 4)";
    EXPECT_EQ(dims.second, 1);
    const int32_t maxBlocks = dims.first;
    constexpr int32_t kSlots = 8, kSlotOffset = 4, kSentinel = -5;
    std::vector<int32_t> table(static_cast<size_t>(kSlots * 2 * maxBlocks), kSentinel);
    EXPECT_EQ(m.copyBlockOffsets(table, kSlots, kSlotOffset, 0), 3);
    for (int32_t b = 0; b < kBeam; ++b) {
        // K of block j = memory_index * 2 * layers, V = K + 1; concrete values for beam b.
        const std::vector<int32_t> k{0 * 4, 1 * 4, (2 + b) * 4};
        for (int32_t j = 0; j < 3; ++j) {
            const int32_t want = k[static_cast<size_t>(j)];
            EXPECT_EQ(table[layoutIndex(0, kSlots, kSlotOffset + b, 0, maxBlocks, j)], want);
            EXPECT_EQ(table[layoutIndex(0, kSlots, kSlotOffset + b, 1, maxBlocks, j)], want + 1);
        }
        expectRowHoldsBlocks(m, table, 0, kSlots, kSlotOffset + b, maxBlocks, kWindow, kLayers,
                             m.getCacheBlockIds(0, kWindow, b));
    }
    for (int32_t slot = 0; slot < kSlotOffset; ++slot) {
        for (int32_t field = 0; field < 2; ++field) {
            for (int32_t j = 0; j < maxBlocks; ++j) {
                EXPECT_EQ(table[layoutIndex(0, kSlots, slot, field, maxBlocks, j)], kSentinel)
                    << "slots of other requests are untouched";
            }
        }
    }
    m.checkInvariants();

    // Tokens 11 and 12 fit the last block; token 13 opens a new block in each beam.
    m.addToken(0, 100);
    m.addToken(0, 101);
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary - 6);
    m.addToken(0, 102);
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary - 10);
    for (int32_t b = 0; b < kBeam; ++b) {
        EXPECT_EQ(m.getCacheBlockIds(0, kWindow, b), (std::vector<int32_t>{0, 1, 2 + b, 6 + b}))
            << b;
    }
    EXPECT_EQ(m.copyBlockOffsets(table, kSlots, kSlotOffset, 0), 4);
    for (int32_t b = 0; b < kBeam; ++b) {
        expectRowHoldsBlocks(m, table, 0, kSlots, kSlotOffset + b, maxBlocks, kWindow, kLayers,
                             m.getCacheBlockIds(0, kWindow, b));
    }
    for (int32_t t = 0; t < 3; ++t) m.addToken(0, 103 + t);  // up to 16 tokens: no allocation
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary - 10);
    m.addToken(0, 106);  // token 17
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary - 14);
    m.checkInvariants();

    // Two more beam-4 sequences of 6 blocks each fit in the 16 free blocks; a third does not.
    m.addSequence(kvb::Request(1, tokenRun(1000, 10)).withBeamWidth(kBeam));
    m.addSequence(kvb::Request(2, tokenRun(2000, 10)).withBeamWidth(kBeam));
    EXPECT_EQ(m.getNumFreeBlocks(), 4);
    EXPECT_EQ(
        statusOf([&] { m.addSequence(kvb::Request(3, tokenRun(3000, 10)).withBeamWidth(kBeam)); }),
        KVB_STATUS_OUT_OF_BLOCKS);
    EXPECT_EQ(m.getNumFreeBlocks(), 4) << "a failed admission changes nothing";
    EXPECT_EQ(statusOf([&] { m.getNumTokens(3); }), KVB_STATUS_UNKNOWN_REQUEST);
    m.checkInvariants();

    // A beam-1 sequence of 3 blocks still fits; then sequence 0 cannot open 4 per-beam blocks.
    m.addSequence(kvb::Request(4, tokenRun(4000, 12)));
    EXPECT_EQ(m.getNumFreeBlocks(), 1);
    for (int32_t t = 0; t < 3; ++t) m.addToken(0, 200 + t);  // 18..20 tokens: same block
    EXPECT_EQ(statusOf([&] { m.addToken(0, 203); }), KVB_STATUS_OUT_OF_BLOCKS);
    EXPECT_EQ(m.getNumTokens(0), 20) << "the failed addToken left the sequence as it was";
    EXPECT_EQ(m.getCacheBlockIds(0, kWindow, 0).size(), 5u);
    EXPECT_EQ(m.getNumFreeBlocks(), 1);
    m.checkInvariants();

    for (uint64_t id : {0u, 1u, 2u, 4u}) m.removeSequence(id);
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary);
    m.checkInvariants();
}

// getBlockOffsetsOfBatch writes request i of the batch at slots i * beamWidth .. and produces the
// same rows as copyBlockOffsets per request. Beam 2, no reuse: a prompt that ends on a block
// boundary shares all its blocks, otherwise the last block is per beam.
TEST(KVCacheManagerBatchTest, BlockOffsetsOfBatchLayout) {
    constexpr int32_t kWindow = 64, kLayers = 3, kBeam = 2;
    kvb::Config cfg;
    cfg.addWindow(kWindow, 40, 0, kLayers);
    cfg.raw.tokens_per_block = 4;
    cfg.raw.max_sequence_length = kWindow;
    cfg.raw.max_beam_width = kBeam;
    cfg.raw.enable_block_reuse = false;
    kvb::Manager m(cfg);

    m.addSequence(kvb::Request(10, tokenRun(0, 5)).withBeamWidth(kBeam));    // 1 shared + 2
    m.addSequence(kvb::Request(11, tokenRun(100, 8)).withBeamWidth(kBeam));  // 2 shared
    m.addSequence(kvb::Request(12, tokenRun(200, 9)).withBeamWidth(kBeam));  // 2 shared + 2
    EXPECT_EQ(m.getCacheBlockIds(10, kWindow, 0), (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(m.getCacheBlockIds(10, kWindow, 1), (std::vector<int32_t>{0, 2}));
    EXPECT_EQ(m.getCacheBlockIds(11, kWindow, 0), (std::vector<int32_t>{3, 4}));
    EXPECT_EQ(m.getCacheBlockIds(11, kWindow, 1), (std::vector<int32_t>{3, 4}));
    EXPECT_EQ(m.getCacheBlockIds(12, kWindow, 0), (std::vector<int32_t>{5, 6, 7}));
    EXPECT_EQ(m.getCacheBlockIds(12, kWindow, 1), (std::vector<int32_t>{5, 6, 8}));
    EXPECT_EQ(m.getNumFreeBlocks(), 40 - 9);

    const int32_t maxBlocks = m.getOffsetTableDimensions().first;
    ASSERT_EQ(maxBlocks, 16);
    // The batch order decides the slots, not the request ids.
    const std::vector<uint64_t> batch{12, 10, 11};
    const int32_t numSlots = static_cast<int32_t>(batch.size()) * kBeam;
    std::vector<int32_t> table(static_cast<size_t>(numSlots * 2 * maxBlocks), -1);
    m.getBlockOffsetsOfBatch(table, numSlots, batch, kBeam);
    for (size_t i = 0; i < batch.size(); ++i) {
        for (int32_t b = 0; b < kBeam; ++b) {
            expectRowHoldsBlocks(m, table, 0, numSlots, static_cast<int32_t>(i) * kBeam + b,
                                 maxBlocks, kWindow, kLayers,
                                 m.getCacheBlockIds(batch[i], kWindow, b));
        }
    }
    // Request 12 (first in the batch), beam 1: blocks 5, 6, 8 at stride 2 * 3 layers.
    EXPECT_EQ(table[layoutIndex(0, numSlots, 1, 0, maxBlocks, 2)], 8 * 6);
    EXPECT_EQ(table[layoutIndex(0, numSlots, 1, 1, maxBlocks, 2)], 8 * 6 + 1);
    // Request 11 (third), beam 0: blocks 3, 4.
    EXPECT_EQ(table[layoutIndex(0, numSlots, 4, 0, maxBlocks, 1)], 4 * 6);
    EXPECT_EQ(table[layoutIndex(0, numSlots, 4, 0, maxBlocks, 2)], INT32_MAX);

    // Same rows as one copyBlockOffsets per request at slot i * beamWidth.
    std::vector<int32_t> single(table.size(), -1);
    for (size_t i = 0; i < batch.size(); ++i) {
        m.copyBlockOffsets(single, numSlots, static_cast<int32_t>(i) * kBeam, batch[i]);
    }
    EXPECT_EQ(single, table);

    // A batch beam width below a request's beam width cannot hold its beams.
    EXPECT_EQ(statusOf([&] { m.getBlockOffsetsOfBatch(table, numSlots, batch, 1); }),
              KVB_STATUS_INVALID_ARGUMENT);
    m.checkInvariants();
}

// rewindKVCache / removeToken give back the blocks that generated tokens no longer need: free
// counts rise and block ids shrink; the released blocks go to the front of the free queue (the
// next allocation takes the last released block). The prompt cannot be rewound: such a call
// fails with KVB_STATUS_INVALID_ARGUMENT and changes nothing.
TEST(KVCacheManagerRewindTokensTest, RewindReturnsBlocks) {
    constexpr int32_t kWindow = 64, kPrimary = 16;
    kvb::Config cfg;
    cfg.addWindow(kWindow, kPrimary);
    cfg.raw.tokens_per_block = 4;
    cfg.raw.max_sequence_length = kWindow;
    cfg.raw.enable_block_reuse = false;
    kvb::Manager m(cfg);

    m.addSequence(kvb::Request(1, tokenRun(0, 6)));
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary - 2);
    for (int32_t t = 0; t < 7; ++t) m.addToken(1, 100 + t);  // 13 tokens: blocks at 9 and 13
    EXPECT_EQ(m.getNumTokens(1), 13);
    EXPECT_EQ(m.getCacheBlockIds(1, kWindow), (std::vector<int32_t>{0, 1, 2, 3}));
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary - 4);

    m.rewindKVCache(1, 4);  // 9 tokens: 3 blocks
    EXPECT_EQ(m.getNumTokens(1), 9);
    EXPECT_EQ(m.getCacheBlockIds(1, kWindow), (std::vector<int32_t>{0, 1, 2}));
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary - 3);
    m.checkInvariants();

    m.removeToken(1);  // 8 tokens: 2 blocks
    EXPECT_EQ(m.getNumTokens(1), 8);
    EXPECT_EQ(m.getCacheBlockIds(1, kWindow), (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary - 2);
    m.checkInvariants();

    // Only 2 generated tokens remain: rewinding 3 would cut into the prompt.
    EXPECT_EQ(statusOf([&] { m.rewindKVCache(1, 3); }), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(m.getNumTokens(1), 8);
    EXPECT_EQ(m.getCacheBlockIds(1, kWindow), (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary - 2);
    m.rewindKVCache(1, 2);  // back to the prompt exactly
    EXPECT_EQ(m.getNumTokens(1), 6);
    EXPECT_EQ(statusOf([&] { m.removeToken(1); }), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(m.getNumTokens(1), 6);
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary - 2);
    m.checkInvariants();

    // Block 2 was released last (by removeToken), so it is at the front of the queue.
    for (int32_t t = 0; t < 3; ++t) m.addToken(1, 200 + t);  // 9 tokens
    EXPECT_EQ(m.getCacheBlockIds(1, kWindow), (std::vector<int32_t>{0, 1, 2}));
    for (int32_t t = 0; t < 4; ++t) m.addToken(1, 300 + t);  // 13 tokens
    EXPECT_EQ(m.getCacheBlockIds(1, kWindow), (std::vector<int32_t>{0, 1, 2, 3}));
    m.checkInvariants();
}

// getOffsetTableDimensions: max blocks per sequence (ceil(max_sequence_length / tpb)) and one pool
// per window; copyBlockOffsets writes the pools in ascending window order whatever the order of
// the config, each with its own layer count in the stride.
TEST(KVCacheManagerTest, OffsetTableDimensionsWithSeveralWindows) {
    kvb::Config cfg;
    cfg.addWindow(32, 12, 0, /*layers=*/1);
    cfg.addWindow(8, 10, 0, /*layers=*/2);
    cfg.addWindow(16, 11, 0, /*layers=*/3);
    cfg.raw.tokens_per_block = 4;
    cfg.raw.max_sequence_length = 30;
    kvb::Manager m(cfg);
    const auto dims = m.getOffsetTableDimensions();
    EXPECT_EQ(dims.first, 8) << "ceil(30 / 4)";
    EXPECT_EQ(dims.second, 3);
    EXPECT_EQ(m.getNumFreeBlocks(), 12 + 10 + 11);

    m.addSequence(kvb::Request(7, tokenRun(0, 6)));
    const int32_t maxBlocks = dims.first;
    constexpr int32_t kSlots = 1;
    std::vector<int32_t> table(static_cast<size_t>(dims.second * kSlots * 2 * maxBlocks), -1);
    EXPECT_EQ(m.copyBlockOffsets(table, kSlots, 0, 7), 2);
    const int32_t windows[] = {8, 16, 32};
    const int32_t layers[] = {2, 3, 1};
    for (int32_t pool = 0; pool < 3; ++pool) {
        EXPECT_EQ(m.getCacheBlockIds(7, windows[pool]), (std::vector<int32_t>{0, 1}));
        expectRowHoldsBlocks(m, table, pool, kSlots, 0, maxBlocks, windows[pool], layers[pool],
                             m.getCacheBlockIds(7, windows[pool]));
    }
    // Block 1 (row 1): 1 * 2 * layers of the pool's window.
    EXPECT_EQ(table[layoutIndex(0, kSlots, 0, 0, maxBlocks, 1)], 4);
    EXPECT_EQ(table[layoutIndex(1, kSlots, 0, 0, maxBlocks, 1)], 6);
    EXPECT_EQ(table[layoutIndex(2, kSlots, 0, 1, maxBlocks, 1)], 3);

    // A table smaller than pools * slots * 2 * max blocks is refused.
    std::vector<int32_t> small(table.size() - 1, -1);
    EXPECT_EQ(statusOf([&] { m.copyBlockOffsets(small, kSlots, 0, 7); }),
              KVB_STATUS_BUFFER_TOO_SMALL);

    kvb::Config single;
    single.addWindow(64, 4);
    single.raw.tokens_per_block = 16;
    single.raw.max_sequence_length = 64;
    kvb::Manager one(single);
    EXPECT_EQ(one.getOffsetTableDimensions(), (std::pair<int32_t, int32_t>{4, 1}));
    m.checkInvariants();
}
