// Scheduler-facing estimates and sizing helpers (the scenarios of TensorRT-LLM's tests
// neededBlocksOneStep*, NeededBlocksOneStepTest, RemainingBlocksToCompletionTest,
// FillKvCacheAndCompleteRequestsTest, BlockRequirementsParamTest, CalculateMaxBlockRequirements,
// CalculateMaxAttentionWindow, BlockManagerTestWindowSizeToShare, scheduling simulation and
// countReusableBlocks).
//
// getNeededBlocksOneStep (no sink tokens, so no bubble):
//   first context chunk: L = min(prompt + draft, window + chunk); L / tpb shared blocks plus one
//     per beam for a partial last block; with reuse and the request given, minus the prefix blocks
//     already referenced by running sequences (free cached ones are already in the free count).
//   generation: add = min((twoSteps ? 2 : 1) * (draft + 1), maxNew - generated); 0 when
//     cur + add > maxTokenNum; else (ceil((cur + add) / tpb) - ceil(cur / tpb)) * beam.
//   any other phase: 0.
// getRemainingBlocksToCompletion: ctx = prompt / tpb (admission allocates the whole prompt),
//   total = ceil(max(min(prompt + maxNew, window + temp), prompt) / tpb), where temp is the
//   temporary attention window (min(chunk, maxSeqLen - window) once a chunk size is given, else
//   0); extra = 1 if prompt + maxNew > window and the sequence still crosses a block boundary
//   past both its current length and total; ctx - allocated + (total - ctx + extra) * beam
//   while the context is not allocated, else (total - allocated + extra) * beam.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kvblock.hpp"
#include "test_support.hpp"

namespace {

using kvb_test::statusOf;
using kvb_test::tokenRun;

kvb_request_state_t estState(uint64_t id, kvb_request_phase_t phase, int32_t prompt,
                             int32_t beam = 1) {
    kvb_request_state_t s;
    kvb::check(kvb_request_state_init(&s));
    s.request_id = id;
    s.phase = phase;
    s.prompt_len = prompt;
    s.beam_width = beam;
    s.context_chunk_size = prompt;
    return s;
}

kvb::Config estConfig(int32_t window, int32_t primary, int32_t tpb, int32_t maxSeqLen, bool reuse,
                      int32_t maxBeam = 1) {
    kvb::Config cfg = kvb_test::windowConfig(window, primary, 0, tpb, maxSeqLen);
    cfg.raw.enable_block_reuse = reuse;
    cfg.raw.max_beam_width = maxBeam;
    return cfg;
}

uint64_t allocTotal(const kvb::Manager& m) {
    return m.getKvCacheStats().alloc_total_blocks;
}

// getNeededBlocksOneStep for a generating sequence: tpb 16, full attention with
// max_sequence_length = window = maxSeq, a prompt of `prompt` tokens and `generated` tokens
// added so far.
int32_t generationNeed(int32_t maxSeq, int32_t prompt, int32_t generated, int32_t maxNew,
                       int32_t draft, bool twoSteps, int32_t beam = 1) {
    kvb::Manager m(estConfig(maxSeq, 128, 16, maxSeq, false, 2));
    m.addSequence(kvb::Request(1, tokenRun(0, prompt)).withBeamWidth(beam));
    for (int32_t g = 0; g < generated; ++g) m.addToken(1, 5000 + g);
    kvb_request_state_t s = estState(1, KVB_PHASE_GENERATION, prompt, beam);
    s.max_new_tokens = maxNew;
    s.num_generated_tokens = generated;
    s.num_draft_tokens = draft;
    const int32_t need = m.getNeededBlocksOneStep(s, nullptr, twoSteps, maxSeq);
    m.checkInvariants();
    return need;
}

}  // namespace

// The needed-blocks estimate, case by case (tpb 16; values worked out from the formula above).
TEST(NeededBlocksOneStepTest, NeededBlocksOneStepTestCorrectlyEstimated) {
    // First context chunk: window 512 (sliding, max length 1024).
    kvb::Manager m(estConfig(512, 64, 16, 1024, false, 2));
    auto ctx = [&](int32_t prompt, int32_t chunk, int32_t beam, int32_t draft) {
        kvb_request_state_t s = estState(1, KVB_PHASE_CONTEXT_INIT, prompt, beam);
        s.context_chunk_size = chunk;
        s.num_draft_tokens = draft;
        return m.getNeededBlocksOneStep(s, nullptr, false, 512);
    };
    EXPECT_EQ(ctx(136, 136, 1, 0), 9) << "8 full blocks + 1 partial";
    EXPECT_EQ(ctx(512, 512, 1, 0), 32);
    EXPECT_EQ(ctx(1024, 1024, 1, 0), 64) << "min(1024, 512 + 1024)";
    EXPECT_EQ(ctx(1024, 256, 1, 0), 48) << "min(1024, 512 + 256) = 768 tokens";
    EXPECT_EQ(ctx(100, 100, 2, 0), 8) << "6 shared + 1 partial block per beam";
    EXPECT_EQ(ctx(96, 96, 2, 0), 6) << "no partial block";
    EXPECT_EQ(ctx(100, 100, 1, 12), 7) << "draft tokens: 112 tokens";

    // Phases that allocate nothing.
    for (kvb_request_phase_t phase : {KVB_PHASE_CONTEXT_CONTINUE, KVB_PHASE_OTHER}) {
        EXPECT_EQ(m.getNeededBlocksOneStep(estState(1, phase, 136), nullptr, false, 512), 0);
    }

    // Generation.
    EXPECT_EQ(generationNeed(1024, 512, 0, 100, 0, false), 1) << "512 -> 513 opens block 33";
    EXPECT_EQ(generationNeed(1024, 512, 8, 100, 0, false), 0) << "520 -> 521 stays in block 33";
    EXPECT_EQ(generationNeed(512, 512, 0, 100, 0, false), 0) << "513 > max token num 512";
    EXPECT_EQ(generationNeed(530, 512, 16, 100, 0, false), 1) << "528 -> 529 <= 530";
    EXPECT_EQ(generationNeed(1024, 128, 15, 100, 0, false), 0) << "143 -> 144 fills block 9";
    EXPECT_EQ(generationNeed(1024, 128, 15, 100, 0, true), 1) << "two steps: 143 -> 145";
    EXPECT_EQ(generationNeed(1024, 128, 14, 100, 3, false), 1) << "142 + 4 draft-step tokens = 146";
    EXPECT_EQ(generationNeed(1024, 128, 10, 100, 3, false), 0) << "138 + 4 = 142";
    EXPECT_EQ(generationNeed(1024, 128, 16, 16, 0, false), 0) << "max new tokens reached";
    EXPECT_EQ(generationNeed(1024, 128, 16, 17, 0, false), 1) << "one more token: 145";
    EXPECT_EQ(generationNeed(1024, 128, 0, 100, 0, false, 2), 2) << "beam 2: one block per beam";
    m.checkInvariants();
}

// For every generation step the estimate equals the alloc_total delta of the following addToken
// (and the two-step estimate that of the next two); the first-chunk estimate equals the
// admission's allocations without reuse. Full attention with beam 1 and 2, and a sliding window.
TEST(NeededBlocksOneStepTest, neededBlocksOneStepMatchesAllocationPerStep) {
    struct Case {
        int32_t window, maxSeq, beam, prompt;
    };
    for (const Case c :
         {Case{40, 40, 1, 5}, Case{40, 40, 2, 5}, Case{40, 40, 2, 8}, Case{8, 40, 1, 9}}) {
        SCOPED_TRACE("window " + std::to_string(c.window) + " beam " + std::to_string(c.beam) +
                     " prompt " + std::to_string(c.prompt));
        kvb::Manager m(estConfig(c.window, 40, 4, c.maxSeq, false, 2));
        kvb_request_state_t s = estState(7, KVB_PHASE_CONTEXT_INIT, c.prompt, c.beam);
        const int32_t first = m.getNeededBlocksOneStep(s, nullptr, false, c.window);
        uint64_t before = allocTotal(m);
        m.addSequence(kvb::Request(7, tokenRun(0, c.prompt)).withBeamWidth(c.beam));
        EXPECT_EQ(static_cast<uint64_t>(first), allocTotal(m) - before);

        const int32_t maxNew = c.maxSeq - c.prompt;
        s.phase = KVB_PHASE_GENERATION;
        s.max_new_tokens = maxNew;
        std::vector<int32_t> twoStep;
        std::vector<uint64_t> delta;
        for (int32_t g = 0; g < maxNew; ++g) {
            s.num_generated_tokens = g;
            const int32_t one = m.getNeededBlocksOneStep(s, nullptr, false, c.window);
            twoStep.push_back(m.getNeededBlocksOneStep(s, nullptr, true, c.window));
            before = allocTotal(m);
            m.addToken(7, 100 + g);
            delta.push_back(allocTotal(m) - before);
            EXPECT_EQ(static_cast<uint64_t>(one), delta.back()) << "step " << g;
        }
        // The two-step look-ahead covers this step and the next (only this one at the end).
        for (size_t g = 0; g < delta.size(); ++g) {
            const uint64_t next = g + 1 < delta.size() ? delta[g + 1] : 0;
            EXPECT_EQ(static_cast<uint64_t>(twoStep[g]), delta[g] + next) << "two steps at " << g;
        }
        EXPECT_EQ(m.getNumTokens(7), c.maxSeq);
        m.checkInvariants();
    }
}

// With reuse, a first-chunk estimate given the request does not count prefix blocks that a
// running sequence references (they will be shared, not taken from the free pool), but does
// count free cached blocks (claiming them lowers the free count just like an allocation). In both
// cases the estimate equals the drop of the free count at admission.
TEST(NeededBlocksOneStepTest, neededBlocksOneStepKvCacheBlockReuse) {
    constexpr int32_t kWindow = 64;
    kvb::Manager m(estConfig(kWindow, 20, 4, kWindow, true));
    m.addSequence(kvb::Request(1, tokenRun(0, 13)));
    m.storeContextBlocks(1, 13);  // blocks [0..3], [4..7], [8..11]

    std::vector<int32_t> prompt = tokenRun(0, 13);
    for (int32_t t : {50, 51, 52, 53}) prompt.push_back(t);  // 17 tokens: 4 full + 1 partial
    const kvb::Request b(2, prompt);
    const kvb_request_state_t s = estState(2, KVB_PHASE_CONTEXT_INIT, 17);
    EXPECT_EQ(m.getNeededBlocksOneStep(s, nullptr, false, kWindow), 5)
        << "without the request: no discount";
    EXPECT_EQ(m.getNeededBlocksOneStep(s, &b, false, kWindow), 2)
        << "3 prefix blocks held by sequence 1";
    int64_t freeBefore = m.getNumFreeBlocks();
    uint64_t allocBefore = allocTotal(m);
    const auto admitted = m.addSequence(b);
    EXPECT_EQ(admitted.prepopulated_prompt_len, 12);
    EXPECT_EQ(freeBefore - m.getNumFreeBlocks(), 2);
    EXPECT_EQ(allocTotal(m) - allocBefore, 2u);
    m.checkInvariants();

    // Once both are gone the prefix is cached but free: no discount.
    m.removeSequence(2, /*storeForReuse=*/false);
    m.removeSequence(1);
    const kvb::Request c(3, prompt);
    const kvb_request_state_t sc = estState(3, KVB_PHASE_CONTEXT_INIT, 17);
    EXPECT_EQ(m.countReusableBlocks(c, kWindow), 3);
    EXPECT_EQ(m.getNeededBlocksOneStep(sc, &c, false, kWindow), 5);
    freeBefore = m.getNumFreeBlocks();
    allocBefore = allocTotal(m);
    EXPECT_EQ(m.addSequence(c).prepopulated_prompt_len, 12);
    EXPECT_EQ(freeBefore - m.getNumFreeBlocks(), 5) << "3 cached blocks claimed + 2 allocated";
    EXPECT_EQ(allocTotal(m) - allocBefore, 2u);
    m.checkInvariants();
}

// getRemainingBlocksToCompletion from the formula, and its consistency with what admission plus
// generation to completion really allocate (full attention) or hold at peak (sliding window).
TEST(RemainingBlocksToCompletionTest, RemainingBlocksToCompletionCorrectlyEstimated) {
    constexpr int32_t kWindow = 1024, kPrimary = 200;
    kvb::Manager m(estConfig(kWindow, kPrimary, 16, kWindow, false, 2));
    auto remaining = [&](uint64_t id, int32_t beam) {
        kvb_request_state_t s = estState(id, KVB_PHASE_CONTEXT_INIT, 100, beam);
        s.max_new_tokens = 60;
        return m.getRemainingBlocksToCompletion(s, nullptr, kWindow);
    };
    // ctx = 100 / 16 = 6, total = ceil(160 / 16) = 10.
    EXPECT_EQ(remaining(1, 1), 10);
    EXPECT_EQ(remaining(2, 2), 6 + 4 * 2);

    for (int32_t beam : {1, 2}) {
        const uint64_t id = static_cast<uint64_t>(beam);
        const int32_t expected = remaining(id, beam);
        const uint64_t before = allocTotal(m);
        m.addSequence(kvb::Request(id, tokenRun(0, 100)).withBeamWidth(beam));
        if (beam == 1) {
            EXPECT_EQ(remaining(id, beam), 10 - 7) << "7 blocks allocated for the prompt";
        }
        for (int32_t g = 0; g < 60; ++g) m.addToken(id, 1000 + g);
        EXPECT_EQ(remaining(id, beam), 0);
        EXPECT_EQ(allocTotal(m) - before, static_cast<uint64_t>(expected)) << "beam " << beam;
        m.removeSequence(id);
    }

    // Sliding window 64: ctx = 40 / 16 = 2, total = ceil(64 / 16) = 4, + 1 extra block because
    // 100 tokens exceed the window: 5 = the most blocks the sequence holds at once.
    kvb::Manager swa(estConfig(64, 20, 16, 1024, false));
    kvb_request_state_t s = estState(1, KVB_PHASE_CONTEXT_INIT, 40);
    s.max_new_tokens = 60;
    EXPECT_EQ(swa.getRemainingBlocksToCompletion(s, nullptr, 64), 5);
    swa.addSequence(kvb::Request(1, tokenRun(0, 40)));
    EXPECT_EQ(swa.getRemainingBlocksToCompletion(s, nullptr, 64), 2) << "(4 - 3 allocated + 1)";
    int64_t minFree = swa.getNumFreeBlocks();
    for (int32_t g = 0; g < 60; ++g) {
        swa.addToken(1, 1000 + g);
        minFree = std::min(minFree, swa.getNumFreeBlocks());
    }
    EXPECT_EQ(20 - minFree, 5);
    m.checkInvariants();
    swa.checkInvariants();

    // A prompt longer than the window: the whole prompt (16 blocks of 64) and one block more for
    // the slide. Given a context chunk size, the estimate also counts the tokens a chunk may
    // hold past the window (TensorRT-LLM's temporary attention window): all 1152 tokens.
    kvb::Manager longPrompt(estConfig(128, 40, 64, 16384, false));
    kvb_request_state_t l = estState(1, KVB_PHASE_CONTEXT_INIT, 1024);
    l.max_new_tokens = 128;
    EXPECT_EQ(longPrompt.getRemainingBlocksToCompletion(l, nullptr, 128), 16 + 1);
    longPrompt.setMaxContextChunkTokens(16384);
    EXPECT_EQ(longPrompt.getRemainingBlocksToCompletion(l, nullptr, 128), 18);
    longPrompt.setMaxContextChunkTokens(512);  // 128 + 512 tokens held at once: 10 blocks
    EXPECT_EQ(longPrompt.getRemainingBlocksToCompletion(l, nullptr, 128), 16 + 1);
    EXPECT_EQ(statusOf([&] { longPrompt.setMaxContextChunkTokens(-1); }),
              KVB_STATUS_INVALID_ARGUMENT);
}

namespace {

struct FillParams {
    int32_t tpb, window, maxSeq, primary;
    bool reuse;
    int32_t prompt, output;
};

class FillKvCacheAndCompleteRequestsTest : public ::testing::TestWithParam<FillParams> {};

}  // namespace

// Admit requests while the sum of their remaining blocks fits the primary pool, then generate
// each to completion with addToken and remove it. No call may fail, and at the end every primary
// block is free. With reuse, requests share half of their prompt and store their context, so
// later estimates discount the prefix blocks held by earlier requests.
TEST_P(FillKvCacheAndCompleteRequestsTest, FillKvCacheWithRequestsAndCompleteOneByOne) {
    const FillParams p = GetParam();
    kvb::Manager m(estConfig(p.window, p.primary, p.tpb, p.maxSeq, p.reuse));
    std::vector<uint64_t> admitted;
    int64_t reserved = 0;
    for (uint64_t id = 0; id < 200; ++id) {
        std::vector<int32_t> prompt = tokenRun(0, p.prompt / 2);
        for (int32_t t = p.prompt / 2; t < p.prompt; ++t) {
            prompt.push_back(static_cast<int32_t>(id) * 1000 + t);
        }
        const kvb::Request r(id, prompt);
        kvb_request_state_t s = estState(id, KVB_PHASE_CONTEXT_INIT, p.prompt);
        s.max_new_tokens = p.output;
        const int32_t need = m.getRemainingBlocksToCompletion(s, &r, p.window);
        ASSERT_GT(need, 0);
        if (reserved + need > p.primary) break;
        reserved += need;
        ASSERT_NO_THROW(m.addSequence(r)) << "request " << id;
        if (p.reuse) { ASSERT_NO_THROW(m.storeContextBlocks(id, p.prompt)); }
        admitted.push_back(id);
    }
    ASSERT_FALSE(admitted.empty());
    m.checkInvariants();
    for (uint64_t id : admitted) {
        for (int32_t g = 0; g < p.output; ++g) {
            ASSERT_NO_THROW(m.addToken(id, 90000 + g)) << "request " << id << " token " << g;
        }
        ASSERT_NO_THROW(m.removeSequence(id, p.reuse));
        m.checkInvariants();
    }
    EXPECT_EQ(m.getNumFreeBlocks(), p.primary);
}

INSTANTIATE_TEST_SUITE_P(
    Lengths, FillKvCacheAndCompleteRequestsTest,
    ::testing::Values(
        // full attention
        FillParams{4, 64, 64, 40, false, 10, 20}, FillParams{4, 64, 64, 40, true, 12, 20},
        FillParams{1, 32, 32, 100, true, 8, 8}, FillParams{16, 256, 256, 60, false, 128, 128},
        FillParams{16, 256, 256, 60, true, 100, 100},
        FillParams{64, 2048, 2048, 40, true, 130, 500},
        // sliding windows: output crossing the window, window not a block multiple, window < tpb
        FillParams{4, 16, 64, 30, false, 12, 30}, FillParams{4, 16, 64, 30, true, 16, 30},
        FillParams{4, 6, 32, 20, false, 4, 20}, FillParams{4, 3, 16, 10, false, 2, 14},
        FillParams{16, 128, 256, 60, true, 100, 100},
        FillParams{64, 128, 512, 20, false, 64, 300}));

namespace {

struct PerBeamCase {
    int32_t sequenceLength, window, tpb, expected;
};

class BlockRequirementsParamTest : public ::testing::TestWithParam<PerBeamCase> {};

}  // namespace

// calculateMaxBlockRequirementsPerBeam = ceil(min(len, window) / tpb) + (len > window ? 1 : 0).
TEST_P(BlockRequirementsParamTest, TestCaculateMaxBlocksRequirement) {
    const PerBeamCase c = GetParam();
    int32_t out = -1;
    kvb::check(
        kvb_calculate_max_block_requirements_per_beam(c.sequenceLength, c.window, c.tpb, &out));
    EXPECT_EQ(out, c.expected);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BlockRequirementsParamTest,
    ::testing::Values(PerBeamCase{100, 1000, 16, 7}, PerBeamCase{100, 64, 16, 4 + 1},
                      PerBeamCase{64, 64, 16, 4}, PerBeamCase{65, 64, 16, 4 + 1},
                      PerBeamCase{1, 1024, 64, 1}, PerBeamCase{128, 128, 64, 2},
                      PerBeamCase{129, 128, 64, 2 + 1}, PerBeamCase{1000, 100, 1, 100 + 1},
                      PerBeamCase{10, 3, 4, 1 + 1}, PerBeamCase{3, 3, 4, 1},
                      PerBeamCase{4096, 2048, 64, 32 + 1}, PerBeamCase{2048, 4096, 64, 32}));

namespace {

int32_t maxBlockRequirements(int32_t in, int32_t out, int32_t window, int32_t beam, int32_t tpb) {
    int32_t n = -1;
    kvb::check(kvb_calculate_max_block_requirements(in, out, window, beam, tpb, &n));
    return n;
}

int32_t perBeam(int32_t len, int32_t window, int32_t tpb) {
    int32_t n = -1;
    kvb::check(kvb_calculate_max_block_requirements_per_beam(len, window, tpb, &n));
    return n;
}

int32_t maxAttentionWindow(int32_t in, int32_t out, int32_t capacity, int32_t beam, int32_t tpb) {
    int32_t n = -1;
    kvb::check(kvb_calculate_max_attention_window(in, out, capacity, beam, tpb, &n));
    return n;
}

}  // namespace

// Beam width 1: the per-beam requirement of the whole sequence.
TEST(CalculateMaxBlockRequirements, BeamWidthOneEqualRequirementsPerBeam) {
    for (int32_t window : {64, 1000, 4096}) {
        EXPECT_EQ(maxBlockRequirements(100, 60, window, 1, 16), perBeam(160, window, 16)) << window;
        EXPECT_EQ(maxBlockRequirements(1000, 1000, window, 1, 64), perBeam(2000, window, 64))
            << window;
    }
    EXPECT_EQ(maxBlockRequirements(100, 60, 64, 1, 16), 5);
}

// A window no larger than the output: every beam needs the window's blocks (+1) on its own.
TEST(CalculateMaxBlockRequirements, AttentionWindowFitsOutputEqualSingleBeamTimesBeamWidth) {
    EXPECT_EQ(maxBlockRequirements(100, 200, 128, 4, 16), perBeam(200, 128, 16) * 4);
    EXPECT_EQ(maxBlockRequirements(100, 200, 128, 4, 16), 36) << "(8 + 1) * 4";
    EXPECT_EQ(maxBlockRequirements(10, 128, 128, 2, 64), 4)
        << "window == output: 2 blocks per beam";
}

// Window overlapping input and output: the context part of the window is shared, the rest per beam.
TEST(CalculateMaxBlockRequirements, AttentionWindowOverlapsInputAndOutputReferenceResult) {
    // window 96 over 100 + 20 tokens, beam 2, tpb 16: 76 context tokens in the window = 4 full
    // blocks + 12 left over; per beam ceil((20 + 12) / 16) + 1 = 3 blocks.
    EXPECT_EQ(maxBlockRequirements(100, 20, 96, 2, 16), 4 + 3 * 2);
    // window 4096 over 1000 + 1000 tokens, beam 4, tpb 64: 1000 context tokens = 15 blocks + 40;
    // per beam ceil(1040 / 64) = 17 blocks.
    EXPECT_EQ(maxBlockRequirements(1000, 1000, 4096, 4, 64), 15 + 17 * 4);
}

// Capacity below the output's needs: the window is what the capacity covers per beam.
TEST(CalculateMaxAttentionWindow, OutputTooLargeForCapacity) {
    EXPECT_EQ(maxAttentionWindow(1024, 1024, 3, 1, 64), 192) << "3 blocks * 64";
    EXPECT_EQ(maxAttentionWindow(1024, 1024, 7, 2, 64), 192) << "7 / 2 blocks per beam * 64";
}

// Enough capacity: the whole sequence, or the output plus what the spare blocks hold.
TEST(CalculateMaxAttentionWindow, CapacityIsEnoughForWholeSequence) {
    EXPECT_EQ(maxAttentionWindow(100, 200, 1000, 1, 16), 300);
    EXPECT_EQ(maxAttentionWindow(1000, 128, 4, 1, 64), 128 + 2 * 64) << "2 spare blocks";
}

// Blocks per window from memory budgets: (primary bytes - extra cost) * share / bytes per token,
// in blocks rounded up; host blocks rounded down; a token cap applies to a single window only.
TEST(CalculateMaxNumBlocks, BlocksFromMemoryBudgets) {
    uint64_t primary = 0, secondary = 0;
    const uint64_t kib = 1024;
    // 1 KiB per token, tpb 16: (1 MiB - 64 KiB) / 1 KiB = 960 tokens = 60 blocks; 2 MiB host = 128.
    kvb::check(kvb_calculate_max_num_blocks(&kib, nullptr, 1, 1 << 20, 2 << 20, 64 << 10, -1, 16,
                                            &primary, &secondary));
    EXPECT_EQ(primary, 60u);
    EXPECT_EQ(secondary, 128u);
    kvb::check(kvb_calculate_max_num_blocks(&kib, nullptr, 1, 1 << 20, 0, 0, 100, 16, &primary,
                                            &secondary));
    EXPECT_EQ(primary, 7u) << "capped at 100 tokens, rounded up";

    // Two windows, shares 1:3 (normalised); the token cap does not apply to several windows.
    const std::vector<uint64_t> perToken{1024, 1024};
    const std::vector<double> shares{1.0, 3.0};
    std::vector<uint64_t> p(2), s(2);
    kvb::check(kvb_calculate_max_num_blocks(perToken.data(), shares.data(), 2, 1 << 20, 1 << 20, 0,
                                            10, 16, p.data(), s.data()));
    EXPECT_EQ(p, (std::vector<uint64_t>{16, 48}));
    EXPECT_EQ(s, (std::vector<uint64_t>{16, 48}));

    const uint64_t zero = 0;
    EXPECT_EQ(kvb_calculate_max_num_blocks(&zero, nullptr, 1, 1 << 20, 0, 0, -1, 16, &primary,
                                           &secondary),
              KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(
        kvb_calculate_max_num_blocks(&kib, nullptr, 1, 1 << 20, 0, 0, -1, 16, nullptr, &secondary),
        KVB_STATUS_NULL_POINTER);
}

// Memory share of each window is proportional to window * cache bytes per token.
TEST(BlockManagerTestWindowSizeToShare, SharesProportionalToWindowTimesCacheSize) {
    std::vector<double> shares(3, -1.0);
    const std::vector<int32_t> windows{128, 512, 1024};
    const std::vector<int32_t> equalSizes{1, 1, 1};
    kvb::check(
        kvb_calculate_window_size_to_share(windows.data(), equalSizes.data(), 3, shares.data()));
    EXPECT_NEAR(shares[0], 128.0 / 1664.0, 1e-9);   // 0.0769
    EXPECT_NEAR(shares[1], 512.0 / 1664.0, 1e-9);   // 0.3077
    EXPECT_NEAR(shares[2], 1024.0 / 1664.0, 1e-9);  // 0.6154

    const std::vector<int32_t> w2{100, 200, 400};
    const std::vector<int32_t> s2{4, 2, 1};
    kvb::check(kvb_calculate_window_size_to_share(w2.data(), s2.data(), 3, shares.data()));
    for (double s : shares) EXPECT_NEAR(s, 1.0 / 3.0, 1e-9) << "equal contributions";

    double one = -1.0;
    const int32_t single = 4096, size = 7;
    kvb::check(kvb_calculate_window_size_to_share(&single, &size, 1, &one));
    EXPECT_EQ(one, 1.0);
}

// getMaxCapacityBatchSize: primary blocks / blocks one request needs, minimum over windows.
TEST(CalculateMaxBlockRequirements, MaxCapacityBatchSize) {
    kvb::Config cfg;
    cfg.addWindow(1024, 100);
    cfg.raw.tokens_per_block = 16;
    cfg.raw.max_sequence_length = 1024;
    EXPECT_EQ(kvb::Manager(cfg).getMaxCapacityBatchSize(100, 60), 10) << "100 / ceil(160 / 16)";
    cfg.raw.max_beam_width = 2;
    EXPECT_EQ(kvb::Manager(cfg).getMaxCapacityBatchSize(100, 60), 7) << "100 / (6 + 4 * 2)";
    cfg.raw.max_beam_width = 1;
    cfg.addWindow(64, 20);
    EXPECT_EQ(kvb::Manager(cfg).getMaxCapacityBatchSize(100, 60), 4) << "window 64: 20 / (4 + 1)";
}

// Scheduling simulation: startScheduling snapshots free counts and references;
// schedulingRemoveSequence counts what removing a sequence would free, so a block shared by two
// sequences only counts once both are removed. The real manager does not change.
TEST(KVCacheManagerSchedulingTest, SchedulingSimulationCountsSharedBlocksOnce) {
    constexpr int32_t kWindow = 64, kPrimary = 10;
    kvb::Manager m(estConfig(kWindow, kPrimary, 4, kWindow, true));
    m.addSequence(kvb::Request(1, tokenRun(0, 9)));
    m.storeContextBlocks(1, 9);  // 2 full blocks in the tree
    const auto b = m.addSequence(kvb::Request(2, tokenRun(0, 9)));
    EXPECT_EQ(b.prepopulated_prompt_len, 8);
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary - 4) << "2 shared + 1 own block each";

    m.startScheduling();
    EXPECT_TRUE(m.schedulingHasFreeBlocks(6, kWindow));
    EXPECT_FALSE(m.schedulingHasFreeBlocks(7, kWindow));
    m.schedulingRemoveSequence(2);
    EXPECT_TRUE(m.schedulingHasFreeBlocks(7, kWindow)) << "only sequence 2's own block";
    EXPECT_FALSE(m.schedulingHasFreeBlocks(8, kWindow));
    m.schedulingRemoveSequence(1);
    EXPECT_TRUE(m.schedulingHasFreeBlocks(10, kWindow)) << "shared blocks free once both are gone";
    EXPECT_FALSE(m.schedulingHasFreeBlocks(11, kWindow));
    EXPECT_EQ(m.getNumFreeBlocks(), kPrimary - 4) << "the simulation changes nothing";

    m.startScheduling();  // a new simulation starts from the real state
    EXPECT_FALSE(m.schedulingHasFreeBlocks(7, kWindow));
    m.schedulingRemoveSequence(1);
    EXPECT_TRUE(m.schedulingHasFreeBlocks(7, kWindow));
    EXPECT_FALSE(m.schedulingHasFreeBlocks(8, kWindow));
    EXPECT_EQ(statusOf([&] { m.schedulingRemoveSequence(99); }), KVB_STATUS_UNKNOWN_REQUEST);
    m.checkInvariants();
}

// countReusableBlocks: consecutive exact full-block matches of the prompt's first input - 1
// tokens; with only_allocated, only matched blocks that some sequence references.
TEST(KVCacheManagerReuseAccountingTest, CountReusableBlocksWithAndWithoutOnlyAllocated) {
    constexpr int32_t kWindow = 64;
    kvb::Manager m(estConfig(kWindow, 20, 4, kWindow, true));
    const kvb::Request full(10, tokenRun(0, 13));
    EXPECT_EQ(m.countReusableBlocks(full, kWindow), 0) << "empty tree";

    m.addSequence(kvb::Request(1, tokenRun(0, 13)));
    EXPECT_EQ(m.countReusableBlocks(full, kWindow), 0) << "not stored yet";
    m.storeContextBlocks(1, 13);  // 3 full blocks
    EXPECT_EQ(m.countReusableBlocks(full, kWindow), 3);
    EXPECT_EQ(m.countReusableBlocks(full, kWindow, true), 3) << "sequence 1 holds them";
    EXPECT_EQ(m.countReusableBlocks(kvb::Request(11, tokenRun(0, 12)), kWindow), 2)
        << "12 tokens: the last token is never reused, so only 11 are looked up";
    std::vector<int32_t> diverging = tokenRun(0, 6);
    for (int32_t t : {70, 71, 72, 73, 74, 75, 76}) diverging.push_back(t);
    EXPECT_EQ(m.countReusableBlocks(kvb::Request(12, diverging), kWindow), 1)
        << "partial matches do not count";
    EXPECT_EQ(m.countReusableBlocks(kvb::Request(13, tokenRun(1, 13)), kWindow), 0);

    m.removeSequence(1);
    EXPECT_EQ(m.countReusableBlocks(full, kWindow), 3) << "still cached";
    EXPECT_EQ(m.countReusableBlocks(full, kWindow, true), 0) << "but free";

    m.addSequence(kvb::Request(2, tokenRun(0, 9)));  // reuses the first two blocks
    EXPECT_EQ(m.countReusableBlocks(full, kWindow), 3);
    EXPECT_EQ(m.countReusableBlocks(full, kWindow, true), 2);
    m.checkInvariants();
}
