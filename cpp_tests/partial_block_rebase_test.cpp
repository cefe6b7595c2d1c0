// PartialBlockRebaseGuard: a sequence may alias a block another sequence holds only if it never
// writes that block again. A block it reuses partially (its prompt ends inside it) will receive
// its own next tokens, so it must be a private copy; otherwise the second sequence's KV would
// overwrite the first one's.
//
// Shown with real bytes (KVB_COPY_BACKEND_HOST): the test writes every token's K and V rows into
// the pool as an engine would, through the offset table, with a pattern derived from (request,
// token, layer, K|V, byte), and checks that B's writes leave A's bytes intact.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kvblock.h"
#include "kvblock.hpp"
#include "test_support.hpp"

namespace {

constexpr int32_t kTpb = 8;
constexpr int32_t kWindow = 64;
constexpr int32_t kLayers = 2;
constexpr int32_t kHeads = 1;
constexpr int32_t kHeadSize = 4;
constexpr int32_t kBytesPerElement = 2;
constexpr size_t kTokenBytes = static_cast<size_t>(kHeadSize * kBytesPerElement);
// Bytes of one (block, layer, K|V) slab: heads x tokens_per_block x head size elements.
constexpr size_t kSlabBytes = static_cast<size_t>(kHeads * kTpb) * kTokenBytes;

// The byte an engine writes for byte `i` of (request, token position, layer, K|V).
uint8_t patternByte(uint64_t request, int32_t token, int32_t layer, int32_t field, size_t i) {
    return static_cast<uint8_t>(request * 97 + static_cast<uint64_t>(token) * 31 +
                                static_cast<uint64_t>(layer) * 7 +
                                static_cast<uint64_t>(field) * 3 + i);
}

// Writes and reads token rows of one sequence through its offset table, as attention kernels do.
class KvWriter {
  public:
    explicit KvWriter(kvb::Manager& m) : m_(m) {
        const auto pool = m.getPoolPointer(kWindow, KVB_CACHE_LEVEL_PRIMARY);
        base_ = pool.first;
        EXPECT_EQ(pool.second, kSlabBytes * 2 * kLayers) << "row = layers x K|V slabs";
    }

    // The K|V offsets of sequence `id` (one slot, one pool): entry j is block j's first slab.
    std::vector<int32_t> offsets(uint64_t id, int32_t field) const {
        const auto dims = m_.getOffsetTableDimensions();
        std::vector<int32_t> table(static_cast<size_t>(dims.second * 2 * dims.first));
        m_.copyBlockOffsets(table, 1, 0, id);
        const auto begin = table.begin() + static_cast<std::ptrdiff_t>(field * dims.first);
        return std::vector<int32_t>(begin, begin + dims.first);
    }

    uint8_t* tokenRow(uint64_t id, int32_t token, int32_t layer, int32_t field) const {
        const int32_t slab = offsets(id, field)[static_cast<size_t>(token / kTpb)] + 2 * layer;
        return base_ + static_cast<size_t>(slab) * kSlabBytes +
               static_cast<size_t>(token % kTpb) * kTokenBytes;
    }

    // Writes request `owner`'s pattern for tokens [begin, end) of sequence `id`.
    void write(uint64_t id, uint64_t owner, int32_t begin, int32_t end) const {
        for (int32_t t = begin; t < end; ++t)
            for (int32_t l = 0; l < kLayers; ++l)
                for (int32_t f = 0; f < 2; ++f) {
                    uint8_t* row = tokenRow(id, t, l, f);
                    for (size_t i = 0; i < kTokenBytes; ++i)
                        row[i] = patternByte(owner, t, l, f, i);
                }
    }

    // Whether tokens [begin, end) of sequence `id` hold request `owner`'s pattern.
    ::testing::AssertionResult holds(uint64_t id, uint64_t owner, int32_t begin,
                                     int32_t end) const {
        for (int32_t t = begin; t < end; ++t)
            for (int32_t l = 0; l < kLayers; ++l)
                for (int32_t f = 0; f < 2; ++f) {
                    const uint8_t* row = tokenRow(id, t, l, f);
                    for (size_t i = 0; i < kTokenBytes; ++i) {
                        if (row[i] != patternByte(owner, t, l, f, i)) {
                            return ::testing::AssertionFailure()
                                   << "sequence " << id << " token " << t << " layer " << l
                                   << " field " << f << " byte " << i << " is not request " << owner
                                   << "'s";
                        }
                    }
                }
        return ::testing::AssertionSuccess();
    }

  private:
    kvb::Manager& m_;
    uint8_t* base_ = nullptr;
};

// One window of 8 blocks whose bytes live in host memory, so the tests can read them.
kvb::Config hostConfig() {
    kvb::Config cfg;
    cfg.addWindow(kWindow, 8, 0, kLayers, kHeads, kHeadSize);
    cfg.raw.tokens_per_block = kTpb;
    cfg.raw.max_sequence_length = kWindow;
    cfg.raw.bytes_per_element = kBytesPerElement;
    cfg.raw.copy_backend = KVB_COPY_BACKEND_HOST;
    return cfg;
}

}  // namespace

// A commits a 13-token prompt and generates until its second block is full and stored (a block
// is stored by store_new_block once the next token opens a new block: 17 tokens). B's prompt
// shares A's first 12 tokens, so B reuses block 0 whole and 4 tokens of A's (full, shared)
// block 1, then computes its own tokens from position 12 on in that same block. B's block 1 must
// be a private copy holding A's first 4 tokens, and none of B's writes may change A's bytes.
TEST(PartialBlockRebaseGuard, PartialTailBlockIsPrivateAndKeepsTheOwnersBytes) {
    kvb::Manager m(hostConfig());
    KvWriter kv(m);

    const auto promptA = kvb_test::tokenRun(100, 13);
    ASSERT_EQ(m.addSequence(kvb::Request(1, promptA)).prepopulated_prompt_len, 0);
    kv.write(1, 1, 0, 13);  // A's prefill
    m.storeContextBlocks(1, 13);
    for (int32_t t = 13; t < 17; ++t) {  // A's decode fills block 1, token 16 opens block 2
        m.addToken(1, 500 + t);
        kv.write(1, 1, t, t + 1);
        m.storeNewBlock(1);
    }
    ASSERT_TRUE(kv.holds(1, 1, 0, 17));
    const auto blocksA = m.getCacheBlockIds(1, kWindow);
    ASSERT_EQ(blocksA.size(), 3u);
    ASSERT_EQ(
        kvb_test::reusableBlocks(m, kvb_test::concatTokens(promptA, {513, 514, 515, 516}), kWindow),
        2)
        << "blocks 0 and 1 are stored, block 1 with A's generated tokens 13..15";

    // B: A's first 12 tokens, then tokens of its own.
    auto promptB = std::vector<int32_t>(promptA.begin(), promptA.begin() + 12);
    promptB.push_back(900);
    const auto admittedB = m.addSequence(kvb::Request(2, promptB));
    EXPECT_EQ(admittedB.prepopulated_prompt_len, 12);
    const auto blocksB = m.getCacheBlockIds(2, kWindow);
    ASSERT_EQ(blocksB.size(), 2u);
    EXPECT_EQ(blocksB[0], blocksA[0]) << "the full block is shared";
    EXPECT_NE(blocksB[1], blocksA[1]) << "the partially reused tail block is private";
    EXPECT_EQ(m.getBlockInfo(kWindow, blocksA[1]).ref_count, 1);
    // The library copied A's first 4 tokens of block 1 into B's block: B reads them as its own.
    EXPECT_TRUE(kv.holds(2, 1, 0, 12));

    // B computes token 12 and generates into its block 1 and a block 2.
    kv.write(2, 2, 12, 13);
    m.storeContextBlocks(2, 13);
    for (int32_t t = 13; t < 20; ++t) {
        m.addToken(2, 900 + t);
        kv.write(2, 2, t, t + 1);
        m.storeNewBlock(2);
    }
    EXPECT_TRUE(kv.holds(2, 2, 12, 20));
    EXPECT_TRUE(kv.holds(2, 1, 0, 12)) << "B's reused prefix is intact";
    EXPECT_TRUE(kv.holds(1, 1, 0, 17)) << "B's writes never reach A's bytes";
    EXPECT_EQ(m.getCacheBlockIds(1, kWindow), blocksA);
    m.checkInvariants();
}

// The same guard when A has already finished: its stored tail block is free (reference count 0)
// and may be taken over by B only because nobody else will read it; a later request with A's
// whole prompt then misses that block instead of reading B's tokens as A's.
TEST(PartialBlockRebaseGuard, TakenOverTailBlockLeavesTheTree) {
    kvb::Manager m(hostConfig());
    KvWriter kv(m);

    const auto promptA = kvb_test::tokenRun(100, 17);
    m.addSequence(kvb::Request(1, promptA));
    kv.write(1, 1, 0, 17);
    kvb_test::markPrefillComputed(m, 1);
    m.removeSequence(1, true);  // stores blocks [0, 8) and [8, 16)

    auto promptB = std::vector<int32_t>(promptA.begin(), promptA.begin() + 12);
    promptB.push_back(900);
    EXPECT_EQ(m.addSequence(kvb::Request(2, promptB)).prepopulated_prompt_len, 12);
    kv.write(2, 2, 12, 13);
    for (int32_t t = 13; t < 16; ++t) {
        m.addToken(2, 900 + t);
        kv.write(2, 2, t, t + 1);
    }
    EXPECT_TRUE(kv.holds(2, 1, 0, 12));
    EXPECT_TRUE(kv.holds(2, 2, 12, 16));

    // A's prompt again: block 1 with A's tokens is gone (B writes it), so only block 0 is reused
    // and request 3 computes tokens 8.. into a block of its own.
    const auto again = m.addSequence(kvb::Request(3, promptA));
    EXPECT_EQ(again.prepopulated_prompt_len, 8);
    EXPECT_TRUE(kv.holds(3, 1, 0, 8));
    EXPECT_NE(m.getCacheBlockIds(3, kWindow)[1], m.getCacheBlockIds(2, kWindow)[1]);
    kv.write(3, 3, 8, 17);
    EXPECT_TRUE(kv.holds(2, 2, 12, 16)) << "request 3's prefill left B's block alone";
    EXPECT_TRUE(kv.holds(2, 1, 0, 12));
    m.checkInvariants();
}
