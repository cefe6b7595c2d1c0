// Multimodal content digests (kvb_multimodal_digest) and what they do to reuse: two images behind
// the same placeholder token ids must not share KV blocks, the same image must.
//
// One full-attention window of 128 tokens, tokens_per_block 4. Prompts are 13 tokens: text
// tokens 0..3 (block 0), an image of 8 placeholder tokens at [4, 12) (blocks 1 and 2), one text
// token; reuse keys cover the first 12 tokens, i.e. 3 full blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kvblock.h"
#include "kvblock.hpp"
#include "test_support.hpp"

namespace {

constexpr int32_t kTpb = 4;
constexpr int32_t kWindow = 128;
constexpr int32_t kPlaceholder = 32000;  // the image's placeholder token id, the same for all
constexpr int32_t kImagePosition = 4;
constexpr int32_t kImageLength = 8;

using Digest = std::array<uint8_t, 32>;

std::string hex(const Digest& d) {
    std::string s;
    char buf[3];
    for (uint8_t b : d) {
        std::snprintf(buf, sizeof(buf), "%02x", b);
        s += buf;
    }
    return s;
}

Digest digestOf(const std::vector<uint8_t>& bytes) {
    Digest d{};
    kvb::check(kvb_multimodal_digest(bytes.data(), bytes.size(), d.data()));
    return d;
}

// The raw bytes of a small RGB "image": every byte derived from its index and `seed`.
std::vector<uint8_t> imageBytes(uint8_t seed) {
    std::vector<uint8_t> v(3 * 16 * 16);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i * 7 + seed);
    return v;
}

std::vector<int32_t> promptWithImage() {
    std::vector<int32_t> p = {1, 2, 3, 4};
    p.insert(p.end(), kImageLength, kPlaceholder);
    p.push_back(5);
    return p;
}

kvb::Request imageRequest(uint64_t id, const std::vector<uint8_t>& image) {
    kvb_multimodal_item_t item{};
    const Digest d = digestOf(image);
    std::copy(d.begin(), d.end(), item.digest);
    item.position = kImagePosition;
    item.length = kImageLength;
    return kvb::Request(id, promptWithImage()).withMultimodal(item);
}

kvb::Manager makeManager() {
    return kvb::Manager(kvb_test::windowConfig(kWindow, 16, 0, kTpb, kWindow));
}

}  // namespace

// Fixed digests of the empty input (null data with length 0 is the empty input), "abc", and 1025
// bytes of 0, 1, ..., 250, 0, 1, ... (past the 1024-byte chunk, so the tree mode is covered too).
// The digest is BLAKE3, an unkeyed fixed function, so these values hold in every process and on
// every run (they agree with BLAKE3's standard test values and the Python blake3 package).
TEST(MultimodalDigestTest, MatchesBlake3KnownAnswers) {
    Digest d{};
    ASSERT_EQ(kvb_multimodal_digest(nullptr, 0, d.data()), KVB_OK);
    EXPECT_EQ(hex(d), "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262");

    const uint8_t abc[] = {'a', 'b', 'c'};
    ASSERT_EQ(kvb_multimodal_digest(abc, sizeof(abc), d.data()), KVB_OK);
    EXPECT_EQ(hex(d), "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85");

    std::vector<uint8_t> pattern(1025);
    for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(i % 251);
    EXPECT_EQ(hex(digestOf(pattern)),
              "d00278ae47eb27b34faecf67b4fe263f82d5412916c1ffd97c8cb7fb814b8444");
}

// Null data with a positive length, or a null output, fails and writes nothing.
TEST(MultimodalDigestTest, NullArgumentsFailAndWriteNothing) {
    Digest d;
    d.fill(0x5A);
    EXPECT_EQ(kvb_multimodal_digest(nullptr, 1, d.data()), KVB_STATUS_NULL_POINTER);
    for (uint8_t b : d) EXPECT_EQ(b, 0x5A);
    const uint8_t one = 1;
    EXPECT_EQ(kvb_multimodal_digest(&one, 1, nullptr), KVB_STATUS_NULL_POINTER);
}

// Two different images behind the same placeholder token ids: the second request reuses only the
// text block before the image (4 tokens), never the image's blocks.
TEST(MultimodalReuseTest, DifferentImageBytesWithSamePlaceholdersDoNotReuse) {
    auto m = makeManager();
    const auto imageA = imageBytes(0);
    auto imageB = imageA;
    imageB[100] ^= 1;  // one bit differs
    ASSERT_NE(digestOf(imageA), digestOf(imageB));

    m.addSequence(imageRequest(1, imageA));
    kvb_test::markPrefillComputed(m, 1);
    m.removeSequence(1, true);  // stores blocks 0, 1, 2 for reuse

    auto b = m.addSequence(imageRequest(2, imageB));
    EXPECT_EQ(b.prepopulated_prompt_len, kImagePosition);
    EXPECT_EQ(b.stats.reused_blocks, 1u);
    m.checkInvariants();
    m.removeSequence(2, false);
}

// The same image bytes, digested again, give the same digest and reuse every stored block.
TEST(MultimodalReuseTest, SameImageBytesReuseTheImageBlocks) {
    auto m = makeManager();
    m.addSequence(imageRequest(1, imageBytes(3)));
    kvb_test::markPrefillComputed(m, 1);
    m.removeSequence(1, true);

    auto b = m.addSequence(imageRequest(2, imageBytes(3)));
    EXPECT_EQ(b.prepopulated_prompt_len, 12);
    EXPECT_EQ(b.stats.reused_blocks, 3u);
    m.checkInvariants();
    m.removeSequence(2, false);
}
