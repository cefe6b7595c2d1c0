// The scheduler capacity lifecycle through the C ABI: a sequence has a capacity (tokens with KV
// slots), a history (tokens with KV computed) and a committed length (tokens stored for reuse),
// committed <= history <= capacity. A max-utilization scheduler grows the capacity inline
// (resize, generation and context allocations, padding), takes it back when it defers a request
// (the reverts), and frees GPU rows by suspending started requests, whose blocks then move to the
// host tier lazily, when an allocation needs their rows.
//
// One full-attention window of 64 tokens, 4 tokens per block, host copy backend: block ids
// 0..P-1 start with GPU (primary) rows, P..P+S-1 with host rows, and moving a block swaps rows,
// so a block keeps its id while its bytes change tier.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kvblock.h"
#include "kvblock.hpp"
#include "test_support.hpp"

namespace {

constexpr int32_t kWindow = 64;
constexpr int32_t kTokensPerBlock = 4;

using kvb_test::statusOf;
using kvb_test::tokenRun;

kvb::Config lifecycleConfig(int32_t primary, int32_t secondary) {
    kvb::Config c;
    c.addWindow(kWindow, primary, secondary, /*layers=*/1, /*heads=*/1, /*head_size=*/8);
    c.raw.tokens_per_block = kTokensPerBlock;
    c.raw.max_sequence_length = kWindow;
    c.raw.bytes_per_element = 1;
    c.raw.copy_backend = KVB_COPY_BACKEND_HOST;
    c.raw.manual_clock = true;
    return c;
}

// Everything a caller observes about the pool: whole-manager statistics, free blocks per tier,
// and each listed sequence's blocks, their tiers and its lengths.
std::string fingerprint(const kvb::Manager& m, const std::vector<uint64_t>& seqs) {
    kvb_kv_cache_stats_t s = m.getKvCacheStats();
    auto free = m.getNumFreeBlocksPerWindowSize(kWindow);
    std::string out = std::to_string(s.free_num_blocks) + "/" + std::to_string(s.used_num_blocks) +
                      " alloc " + std::to_string(s.alloc_total_blocks) + " off " +
                      std::to_string(s.offloaded_blocks) + " on " +
                      std::to_string(s.onboarded_blocks) + " free " + std::to_string(free.first) +
                      "," + std::to_string(free.second);
    for (uint64_t id : seqs) {
        kvb_sequence_lengths_t l = m.getSequenceLengths(id);
        out += " | " + std::to_string(id) + ": n" + std::to_string(l.num_tokens) + " c" +
               std::to_string(l.capacity) + " h" + std::to_string(l.history) + " k" +
               std::to_string(l.committed) + (l.suspended ? " S" : "");
        for (int32_t b : m.getCacheBlockIds(id, kWindow)) {
            out += " " + std::to_string(b) + "@" +
                   std::to_string(m.getBlockInfo(kWindow, b).cache_level);
        }
    }
    return out;
}

// The row of block `b`, wherever it lives now.
uint8_t* rowOf(const kvb::Manager& m, int32_t b) {
    kvb_block_info_t info = m.getBlockInfo(kWindow, b);
    auto pool = m.getPoolPointer(kWindow, static_cast<kvb_cache_level_t>(info.cache_level));
    return pool.first + static_cast<size_t>(info.memory_index) * pool.second;
}

size_t rowBytes(const kvb::Manager& m) {
    return m.getPoolPointer(kWindow, KVB_CACHE_LEVEL_PRIMARY).second;
}

// The engine's write of a sequence's KV: each block's row filled with `tag + block index`.
void writeKv(kvb::Manager& m, uint64_t id, uint8_t tag) {
    std::vector<int32_t> blocks = m.getCacheBlockIds(id, kWindow);
    for (size_t i = 0; i < blocks.size(); ++i) {
        ASSERT_EQ(m.getBlockInfo(kWindow, blocks[i]).cache_level, KVB_CACHE_LEVEL_PRIMARY);
        std::memset(rowOf(m, blocks[i]), tag + static_cast<int>(i), rowBytes(m));
    }
}

// Expects every row of the sequence to hold what writeKv(tag) wrote, on either tier.
void expectKv(const kvb::Manager& m, uint64_t id, uint8_t tag) {
    std::vector<int32_t> blocks = m.getCacheBlockIds(id, kWindow);
    for (size_t i = 0; i < blocks.size(); ++i) {
        const uint8_t* row = rowOf(m, blocks[i]);
        for (size_t k = 0; k < rowBytes(m); ++k) {
            ASSERT_EQ(row[k], static_cast<uint8_t>(tag + i)) << "block " << i << " byte " << k;
        }
    }
}

int countOnTier(const kvb::Manager& m, uint64_t id, kvb_cache_level_t level) {
    int n = 0;
    for (int32_t b : m.getCacheBlockIds(id, kWindow)) {
        n += m.getBlockInfo(kWindow, b).cache_level == level ? 1 : 0;
    }
    return n;
}

// ---- Capacity: resize -----------------------------------------------------------------------

// Admission gives a sequence capacity for its prompt; resize grows it ahead of the tokens, and
// tokens then fill the reserved slots without allocating.
TEST(LifecycleTest, ResizeReservesSlotsThatTokensFillWithoutAllocating) {
    kvb::Manager m(lifecycleConfig(8, 0));
    m.addSequence(kvb::Request(1, tokenRun(0, 6)));
    kvb_sequence_lengths_t l = m.getSequenceLengths(1);
    EXPECT_EQ(l.num_tokens, 6u);
    EXPECT_EQ(l.capacity, 6u);
    EXPECT_FALSE(l.suspended);

    ASSERT_TRUE(m.resize(1, 16));
    EXPECT_EQ(m.getCacheBlockIds(1, kWindow).size(), 4u);
    const int64_t freeAfterResize = m.getNumFreeBlocks();
    for (int32_t t = 0; t < 10; ++t) m.addToken(1, 100 + t);
    EXPECT_EQ(m.getNumFreeBlocks(), freeAfterResize) << "tokens used the reserved slots";
    EXPECT_EQ(m.getSequenceLengths(1).capacity, 16u);
    m.checkInvariants();
}

// A grow that cannot be satisfied reports false and changes nothing: no block claimed, no
// counter moved, no event.
TEST(LifecycleTest, AFailedGrowChangesNothing) {
    kvb::Config c = lifecycleConfig(8, 0);
    c.raw.max_kv_event_entries = 64;
    kvb::Manager m(c);
    m.addSequence(kvb::Request(1, tokenRun(0, 10)));
    m.getLatestEvents();
    const std::string before = fingerprint(m, {1});
    EXPECT_FALSE(m.resize(1, 40)) << "10 blocks do not fit in 8";
    EXPECT_EQ(fingerprint(m, {1}), before);
    EXPECT_TRUE(m.getLatestEvents().empty());
    m.checkInvariants();
}

// A shrink gives the surplus blocks back but never drops reused, committed or computed tokens:
// asked to, it fails with INVALID_ARGUMENT and nothing changes.
TEST(LifecycleTest, AShrinkNeverDropsCommittedOrReusedTokens) {
    kvb::Manager m(lifecycleConfig(16, 0));
    m.addSequence(kvb::Request(1, tokenRun(0, 9)));
    kvb_test::markPrefillComputed(m, 1);
    m.removeSequence(1, true);
    kvb_admission_t a = m.addSequence(kvb::Request(2, tokenRun(0, 12)));
    ASSERT_EQ(a.prepopulated_prompt_len, 8);

    const std::string before = fingerprint(m, {2});
    bool resized = true;
    EXPECT_EQ(kvb_manager_resize(m.get(), 2, 7, &resized), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(kvb_last_error_message()).find("reused"), std::string::npos)
        << kvb_last_error_message();
    EXPECT_EQ(fingerprint(m, {2}), before);

    m.storeContextBlocks(2, 11);
    kvb_sequence_lengths_t l = m.getSequenceLengths(2);
    EXPECT_EQ(l.history, 11u);
    EXPECT_EQ(l.committed, 8u);
    EXPECT_EQ(statusOf([&] { m.resize(2, 10); }), KVB_STATUS_INVALID_ARGUMENT) << "history 11";
    EXPECT_TRUE(m.resize(2, 11));
    m.checkInvariants();
}

// Tokens past a shrunk capacity are kept: growing again writes them back, so storing the
// sequence stores its real prompt.
TEST(LifecycleTest, TokensPastAShrunkCapacityComeBackWhenItGrows) {
    kvb::Manager m(lifecycleConfig(16, 0));
    m.addSequence(kvb::Request(1, tokenRun(0, 13)));
    ASSERT_TRUE(m.resize(1, 4));
    EXPECT_EQ(m.getCacheBlockIds(1, kWindow).size(), 1u);
    EXPECT_EQ(m.getSequenceLengths(1).num_tokens, 13u);
    ASSERT_TRUE(m.resize(1, 13));
    m.storeContextBlocks(1, 13);
    m.removeSequence(1, true);
    kvb_admission_t a = m.addSequence(kvb::Request(2, tokenRun(0, 13)));
    EXPECT_EQ(a.prepopulated_prompt_len, 12) << "the restored tokens were stored";
    m.checkInvariants();
}

// ---- Generation allocation, padding and their revert ---------------------------------------

// allocate_generation reserves 1 + draft tokens; the CUDA-graph padding joins the same
// allocation; the revert uses what was recorded at allocation, undoing both.
TEST(LifecycleTest, GenerationRevertUndoesTheRecordedDraftAndPadding) {
    kvb::Manager m(lifecycleConfig(16, 0));
    m.addSequence(kvb::Request(1, tokenRun(0, 8)));
    m.storeContextBlocks(1, 8);
    const int64_t free = m.getNumFreeBlocks();

    ASSERT_TRUE(m.allocateGeneration(1, 3));
    EXPECT_EQ(m.getSequenceLengths(1).capacity, 12u);
    ASSERT_TRUE(m.extendCapacityForTokens(1, 2));
    EXPECT_EQ(m.getSequenceLengths(1).capacity, 14u);
    EXPECT_EQ(m.getCacheBlockIds(1, kWindow).size(), 4u);

    EXPECT_TRUE(m.revertAllocateGeneration(1));
    EXPECT_EQ(m.getSequenceLengths(1).capacity, 8u);
    EXPECT_EQ(m.getNumFreeBlocks(), free);
    EXPECT_FALSE(m.revertAllocateGeneration(1)) << "nothing left to revert";
    m.checkInvariants();
}

// The step's first token consumes the allocation: the tokens it reserved slots for are arriving,
// so a revert afterwards changes nothing.
TEST(LifecycleTest, AddingATokenConsumesTheGenerationAllocation) {
    kvb::Manager m(lifecycleConfig(16, 0));
    m.addSequence(kvb::Request(1, tokenRun(0, 8)));
    ASSERT_TRUE(m.allocateGeneration(1, 2));
    m.addToken(1, 50);
    const std::string before = fingerprint(m, {1});
    EXPECT_FALSE(m.revertAllocateGeneration(1));
    EXPECT_EQ(fingerprint(m, {1}), before);
    EXPECT_EQ(m.getSequenceLengths(1).capacity, 11u);
    m.checkInvariants();
}

// ---- Context allocation and its revert ------------------------------------------------------

// A revert with no grown context allocation is a no-op.
TEST(LifecycleTest, ContextRevertIsANoOpWhenNothingGrew) {
    kvb::Manager m(lifecycleConfig(16, 4));
    m.addSequence(kvb::Request(1, tokenRun(0, 8)));
    ASSERT_EQ(m.revertAllocateContext(1), KVB_CONTEXT_REVERT_SUSPENDED);
    ASSERT_TRUE(m.resume(1));
    const std::string before = fingerprint(m, {1});
    EXPECT_EQ(m.revertAllocateContext(1), KVB_CONTEXT_REVERT_NOTHING);
    EXPECT_EQ(fingerprint(m, {1}), before);
}

// Deferred before prefill computed anything past the old capacity: the fresh blocks go back and
// the sequence is suspended; resuming and allocating again continues the prefill.
TEST(LifecycleTest, ContextRevertShrinksAndSuspends) {
    kvb::Manager m(lifecycleConfig(16, 4));
    m.addSequence(kvb::Request(1, tokenRun(0, 10)));
    const int64_t free = m.getNumFreeBlocks();
    ASSERT_EQ(m.revertAllocateContext(1), KVB_CONTEXT_REVERT_SUSPENDED);
    kvb_sequence_lengths_t l = m.getSequenceLengths(1);
    EXPECT_TRUE(l.suspended);
    EXPECT_EQ(l.capacity, 0u);
    EXPECT_EQ(l.num_tokens, 10u);
    EXPECT_EQ(m.getNumFreeBlocks(), free + 3);
    EXPECT_EQ(statusOf([&] { m.addToken(1, 7); }), KVB_STATUS_SEQUENCE_SUSPENDED);
    // A second revert has nothing left to undo: it reports NOTHING (not SEQUENCE_SUSPENDED) and
    // changes nothing.
    const std::string before = fingerprint(m, {});
    EXPECT_EQ(m.revertAllocateContext(1), KVB_CONTEXT_REVERT_NOTHING);
    EXPECT_EQ(fingerprint(m, {}), before);
    EXPECT_TRUE(m.getSequenceLengths(1).suspended);

    ASSERT_TRUE(m.resume(1));
    ASSERT_TRUE(m.allocateContext(1, 10));
    EXPECT_EQ(m.getSequenceLengths(1).capacity, 10u);
    m.checkInvariants();
}

// Deferred after prefill computed past the old capacity: the sequence cannot shrink, so its
// computed blocks are stored for reuse and it is released; admitting it again reuses them.
TEST(LifecycleTest, ContextRevertReleasesWhenPrefillPassedTheOldCapacity) {
    kvb::Manager m(lifecycleConfig(16, 4));
    m.addSequence(kvb::Request(1, tokenRun(20, 13)));
    m.advanceHistory(1, 8);
    ASSERT_EQ(m.revertAllocateContext(1), KVB_CONTEXT_REVERT_RELEASED);
    int32_t tokens = 0;
    EXPECT_EQ(kvb_manager_get_num_tokens(m.get(), 1, &tokens), KVB_STATUS_UNKNOWN_REQUEST);
    kvb_admission_t a = m.addSequence(kvb::Request(2, tokenRun(20, 13)));
    EXPECT_EQ(a.prepopulated_prompt_len, 8);
    m.checkInvariants();
}

// ---- Suspend and resume ---------------------------------------------------------------------

// A suspended sequence takes no tokens and has no offsets (its blocks may be on the host).
TEST(LifecycleTest, ASuspendedSequenceTakesNoTokensAndHasNoOffsets) {
    kvb::Manager m(lifecycleConfig(8, 8));
    m.addSequence(kvb::Request(1, tokenRun(0, 6)));
    m.suspend(1);
    EXPECT_EQ(statusOf([&] { m.suspend(1); }), KVB_STATUS_SEQUENCE_SUSPENDED);
    EXPECT_EQ(statusOf([&] { m.addToken(1, 9); }), KVB_STATUS_SEQUENCE_SUSPENDED);
    EXPECT_EQ(statusOf([&] { m.allocateGeneration(1, 0); }), KVB_STATUS_SEQUENCE_SUSPENDED);
    auto dims = m.getOffsetTableDimensions();
    std::vector<int32_t> table(static_cast<size_t>(dims.first * dims.second * 2));
    EXPECT_EQ(statusOf([&] { m.copyBlockOffsets(table, 1, 0, 1); }), KVB_STATUS_SEQUENCE_SUSPENDED);
    // Suspended before its prefill computed anything: released with store_for_reuse, it stores
    // nothing (storing stops at the history; none of its prompt blocks was ever written).
    m.removeSequence(1, true);
    EXPECT_EQ(kvb_test::reusableBlocks(m, tokenRun(0, 6), kWindow), 0);
    m.checkInvariants();
}

// Suspending moves nothing; an admission that needs GPU rows moves the suspended blocks to the
// host tier (never dropping them), and resume brings them back with the bytes they had.
TEST(LifecycleTest, SuspendedBytesMoveToTheHostLazilyAndComeBackOnResume) {
    kvb::Manager m(lifecycleConfig(8, 8));
    m.addSequence(kvb::Request(1, tokenRun(0, 16)));
    writeKv(m, 1, 0x40);
    m.suspend(1);
    EXPECT_EQ(countOnTier(m, 1, KVB_CACHE_LEVEL_SECONDARY), 0) << "nothing moves at suspend";
    EXPECT_DOUBLE_EQ(m.getGpuUtilization(), 0.0) << "all 4 used blocks are movable";

    m.addSequence(kvb::Request(2, tokenRun(1000, 24)));
    EXPECT_EQ(countOnTier(m, 1, KVB_CACHE_LEVEL_SECONDARY), 2) << "moved only what was needed";
    expectKv(m, 1, 0x40);
    writeKv(m, 2, 0x10);

    EXPECT_FALSE(m.resume(1)) << "the GPU pool is full: utilization 6/8 < 0.97 but no room";
    m.removeSequence(2, false);
    ASSERT_TRUE(m.resume(1));
    EXPECT_EQ(countOnTier(m, 1, KVB_CACHE_LEVEL_SECONDARY), 0);
    expectKv(m, 1, 0x40);
    m.addToken(1, 5);
    m.checkInvariants();
}

// Resume is refused, with no side effects, while GPU utilization is above the configured
// threshold.
TEST(LifecycleTest, ResumeIsRefusedAboveTheUtilizationThreshold) {
    kvb::Config c = lifecycleConfig(8, 8);
    c.raw.max_utilization_for_resume = 0.5;
    kvb::Manager m(c);
    m.addSequence(kvb::Request(1, tokenRun(0, 8)));
    m.suspend(1);
    m.addSequence(kvb::Request(2, tokenRun(100, 20)));
    EXPECT_DOUBLE_EQ(m.getGpuUtilization(), 5.0 / 8.0);
    const std::string before = fingerprint(m, {1, 2});
    EXPECT_FALSE(m.resume(1));
    EXPECT_EQ(fingerprint(m, {1, 2}), before);
    m.removeSequence(2, false);
    EXPECT_TRUE(m.resume(1));
    m.checkInvariants();
}

// ---- Stall detection ------------------------------------------------------------------------

// Passes with generation requests in which nothing is scheduled and no block moves between the
// tiers stall; after the threshold the pass reports STALLED and names the cause. Without a host
// tier, suspending and resuming frees nothing, so it is no progress either.
TEST(LifecycleTest, AStalledSchedulerIsToldWhyWithoutAHostTier) {
    kvb::Config c = lifecycleConfig(8, 0);
    c.raw.stall_pass_threshold = 3;
    kvb::Manager m(c);
    m.addSequence(kvb::Request(1, tokenRun(0, 16)));
    for (int pass = 0; pass < 3; ++pass) {
        m.suspend(1);
        EXPECT_TRUE(m.resume(1));
        EXPECT_EQ(kvb_manager_end_scheduling_pass(m.get(), 1, 0),
                  pass < 2 ? KVB_OK : KVB_STATUS_STALLED)
            << pass;
    }
    const std::string message = kvb_last_error_message();
    EXPECT_NE(message.find("no host tier"), std::string::npos) << message;
    // A pass that schedules something is progress: the count starts again.
    EXPECT_EQ(kvb_manager_end_scheduling_pass(m.get(), 1, 1), KVB_OK);
    EXPECT_EQ(kvb_manager_end_scheduling_pass(m.get(), 1, 0), KVB_OK);
}

// A pass with no generation request is idle, not stalled.
TEST(LifecycleTest, AnIdlePassIsNotAStall) {
    kvb::Config c = lifecycleConfig(8, 0);
    c.raw.stall_pass_threshold = 1;
    kvb::Manager m(c);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(kvb_manager_end_scheduling_pass(m.get(), 0, 0), KVB_OK);
}

// ---- Bad input ------------------------------------------------------------------------------

TEST(LifecycleTest, BadArgumentsReturnAStatusAndChangeNothing) {
    kvb::Manager m(lifecycleConfig(8, 0));
    m.addSequence(kvb::Request(1, tokenRun(0, 6)));
    const std::string before = fingerprint(m, {1});
    bool out = false;
    kvb_context_revert_t outcome = KVB_CONTEXT_REVERT_NOTHING;
    kvb_sequence_lengths_t lengths{};
    double utilization = 0.0;
    EXPECT_EQ(kvb_manager_resize(nullptr, 1, 8, &out), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_resize(m.get(), 1, 8, nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_resize(m.get(), 77, 8, &out), KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_EQ(kvb_manager_resize(m.get(), 1, 1000, &out), KVB_STATUS_SEQUENCE_TOO_LONG);
    EXPECT_EQ(kvb_manager_allocate_generation(m.get(), 1, 0, nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_revert_allocate_context(m.get(), 1, nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_revert_allocate_context(m.get(), 77, &outcome),
              KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_EQ(kvb_manager_get_sequence_lengths(m.get(), 1, nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_get_sequence_lengths(m.get(), 77, &lengths), KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_EQ(kvb_manager_get_gpu_utilization(m.get(), nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_get_gpu_utilization(nullptr, &utilization), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_resume(m.get(), 1, &out), KVB_STATUS_INVALID_ARGUMENT) << "not suspended";
    EXPECT_EQ(kvb_manager_advance_history(m.get(), 1, 7), KVB_STATUS_INVALID_ARGUMENT)
        << "beyond the 6 known tokens";
    EXPECT_EQ(kvb_manager_suspend(m.get(), 77), KVB_STATUS_UNKNOWN_REQUEST);
    EXPECT_EQ(fingerprint(m, {1}), before);
}

// Bad values in the config's lifecycle fields are refused at creation.
TEST(LifecycleTest, LifecycleConfigFieldsAreValidated) {
    for (double threshold : {0.0, -0.5, 1.5}) {
        kvb::Config c = lifecycleConfig(8, 0);
        c.raw.max_utilization_for_resume = threshold;
        kvb_manager_config_t raw = kvb_test::rawConfig(c);
        kvb_manager_t* m = nullptr;
        EXPECT_EQ(kvb_manager_create(&raw, &m), KVB_STATUS_INVALID_CONFIG) << threshold;
        EXPECT_EQ(m, nullptr);
    }
    kvb::Config c = lifecycleConfig(8, 0);
    c.raw.stall_pass_threshold = 0;
    kvb_manager_config_t raw = kvb_test::rawConfig(c);
    kvb_manager_t* m = nullptr;
    EXPECT_EQ(kvb_manager_create(&raw, &m), KVB_STATUS_INVALID_CONFIG);
}

}  // namespace
