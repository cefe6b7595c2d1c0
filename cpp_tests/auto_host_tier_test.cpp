// Automatic host tier (kvb_window_config_t::auto_host_tier): the library sizes a window's host
// tier as min(GPU quota, 50% of available host memory / row bytes, 80% of RLIMIT_MEMLOCK / row
// bytes), falling back to the GPU quota when a figure is unknown or the caps round down to no
// block, and reports the size chosen (kvb_manager_get_host_tier_blocks). The policy itself is
// tested on injected figures through kvb_calculate_auto_host_tier_blocks; the managers below use
// this machine's figures with rows so small that only the GPU quota can bind.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kvblock.h"
#include "kvblock.hpp"
#include "test_support.hpp"

namespace {

constexpr int32_t kWindow = 64;
constexpr int32_t kTpb = 4;
constexpr uint64_t kMiB = uint64_t{1} << 20;

int64_t policy(int64_t quota, uint64_t available, uint64_t memlock, uint64_t rowBytes) {
    int64_t blocks = -1;
    kvb::check(kvb_calculate_auto_host_tier_blocks(quota, available, memlock, rowBytes, &blocks));
    return blocks;
}

kvb::Config autoConfig(int32_t primary) {
    kvb::Config c;
    // Row: 1 layer x K|V x 1 head x 4 tokens x 4 elements x 2 bytes = 64 bytes.
    c.addWindowWithAutoHostTier(kWindow, primary, 1, 1, 4);
    c.raw.tokens_per_block = kTpb;
    c.raw.max_sequence_length = kWindow;
    return c;
}

}  // namespace

// min(quota, 50% of memory / row, 80% of memlock / row), rounded down.
TEST(AutoHostTierPolicyTest, SmallestOfQuotaMemoryAndMemlock) {
    EXPECT_EQ(policy(100, 1024 * kMiB, UINT64_MAX, kMiB), 100);  // the quota binds
    EXPECT_EQ(policy(100, 64 * kMiB, UINT64_MAX, kMiB), 32);     // 50% of 64 MiB
    EXPECT_EQ(policy(100, 1024 * kMiB, 50 * kMiB, kMiB), 40);    // 80% of 50 MiB
    EXPECT_EQ(policy(100, 70 * kMiB, 50 * kMiB, kMiB), 35);      // both cap: the smaller
    EXPECT_EQ(policy(100, 3 * kMiB, UINT64_MAX, kMiB), 1);       // 1.5 blocks round down
}

// Unknown (0) figures cap nothing; caps of no block at all, or rows of no bytes, give the quota.
TEST(AutoHostTierPolicyTest, FallsBackToTheGpuQuota) {
    EXPECT_EQ(policy(100, 0, 0, kMiB), 100);
    EXPECT_EQ(policy(100, 0, 50 * kMiB, kMiB), 40);
    EXPECT_EQ(policy(100, 64 * kMiB, 0, kMiB), 32);
    EXPECT_EQ(policy(100, kMiB, UINT64_MAX, kMiB), 100);
    EXPECT_EQ(policy(100, 1024 * kMiB, 64 * 1024, kMiB), 100);
    EXPECT_EQ(policy(7, 64 * kMiB, 50 * kMiB, 0), 7);
}

TEST(AutoHostTierPolicyTest, BadArgumentsAreRefused) {
    int64_t blocks = 5;
    EXPECT_EQ(kvb_calculate_auto_host_tier_blocks(-1, kMiB, kMiB, 1, &blocks),
              KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_STRNE(kvb_last_error_message(), "");
    EXPECT_EQ(blocks, 5);
    EXPECT_EQ(kvb_calculate_auto_host_tier_blocks(1, kMiB, kMiB, 1, nullptr),
              KVB_STATUS_NULL_POINTER);
}

// A window asking for an automatic tier gets one of its GPU quota here (the tiny rows leave
// memory and memlock far from binding), reported by the getter and in the statistics.
TEST(AutoHostTierManagerTest, TierIsCreatedAndReported) {
    kvb::Config c = autoConfig(16);
    c.addWindow(2 * kWindow, 8, 3);  // an explicit tier is reported as given
    c.raw.max_sequence_length = 2 * kWindow;
    kvb::Manager m(c);
    EXPECT_EQ(m.getHostTierBlocks(kWindow), 16);
    EXPECT_EQ(m.getHostTierBlocks(2 * kWindow), 3);
    EXPECT_EQ(m.getNumFreeBlocksPerWindowSize(kWindow), std::make_pair(int64_t{16}, int64_t{16}));
    const kvb_kv_cache_stats_t stats = m.getKvCacheStats();
    EXPECT_EQ(stats.num_secondary_blocks, 19u);
    EXPECT_EQ(stats.free_secondary_blocks, 19u);
    m.checkInvariants();
}

// The tier is usable: with real host pools, a suspended sequence's blocks move to it when a new
// sequence needs the GPU pool, and come back on resume.
TEST(AutoHostTierManagerTest, SuspendedBlocksMoveToTheAutomaticTier) {
    kvb::Config c = autoConfig(4);
    c.raw.copy_backend = KVB_COPY_BACKEND_HOST;
    kvb::Manager m(c);
    ASSERT_EQ(m.getHostTierBlocks(kWindow), 4);

    m.addSequence(kvb::Request(1, kvb_test::tokenRun(0, 16)));  // all 4 GPU blocks
    ASSERT_EQ(kvb_manager_suspend(m.get(), 1), KVB_OK);
    m.addSequence(kvb::Request(2, kvb_test::tokenRun(100, 16)));  // needs the 4 GPU blocks
    for (int32_t b : m.getCacheBlockIds(1, kWindow))
        EXPECT_EQ(m.getBlockInfo(kWindow, b).cache_level, KVB_CACHE_LEVEL_SECONDARY);
    m.removeSequence(2, false);
    bool resumed = false;
    ASSERT_EQ(kvb_manager_resume(m.get(), 1, &resumed), KVB_OK);
    EXPECT_TRUE(resumed);
    for (int32_t b : m.getCacheBlockIds(1, kWindow))
        EXPECT_EQ(m.getBlockInfo(kWindow, b).cache_level, KVB_CACHE_LEVEL_PRIMARY);
    m.checkInvariants();
}

// An automatic tier and explicit secondary blocks are exclusive; the getter checks its window
// and output.
TEST(AutoHostTierManagerTest, BadArgumentsAreRefused) {
    kvb::Config c = autoConfig(16);
    c.windows[0].secondary_blocks = 2;
    kvb_manager_config_t raw = kvb_test::rawConfig(c);
    kvb_manager_t* out = nullptr;
    EXPECT_EQ(kvb_manager_create(&raw, &out), KVB_STATUS_INVALID_CONFIG);
    EXPECT_STRNE(kvb_last_error_message(), "");
    EXPECT_EQ(out, nullptr);

    kvb::Manager m(autoConfig(16));
    int64_t blocks = 0;
    EXPECT_EQ(kvb_manager_get_host_tier_blocks(m.get(), 7, &blocks), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_manager_get_host_tier_blocks(m.get(), -kWindow, &blocks),
              KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_manager_get_host_tier_blocks(m.get(), kWindow, nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_get_host_tier_blocks(nullptr, kWindow, &blocks), KVB_STATUS_NULL_POINTER);
}
