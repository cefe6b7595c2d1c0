// The disk tier below the host tier, through the public header: blocks the host tier evicts
// are written to disk, a waiting request's prefix is prefetched back (the estimate then equals
// what admission delivers, with the right bytes), a restarted manager reuses the files, and bad
// configuration fails at creation. The files live in a fresh directory under the system's
// temporary directory.
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "kvblock.hpp"
#include "test_support.hpp"

namespace {

namespace fs = std::filesystem;

constexpr int32_t kWindow = 64;
constexpr int32_t kTokensPerBlock = 4;
constexpr int kHeadSize = 4;
constexpr size_t kRowBytes = 2 * kTokensPerBlock * kHeadSize;  // 1 layer, 1 head, 1 byte
constexpr uint64_t kBudget = 64 * 4096;                        // 64 slots of 4 KiB

using kvb_test::tokenRun;

// A fresh directory for one test.
fs::path scratchDir(const std::string& name) {
    fs::path dir = fs::temp_directory_path() /
                   ("kvblock-disk-test-" + name + "-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    return dir;
}

kvb::Config diskConfig(const fs::path& dir, int32_t primary = 8, int32_t secondary = 4) {
    kvb::Config c;
    c.addWindow(kWindow, primary, secondary, 1, 1, kHeadSize);
    c.raw.tokens_per_block = kTokensPerBlock;
    c.raw.max_sequence_length = kWindow;
    c.raw.bytes_per_element = 1;
    c.raw.copy_backend = KVB_COPY_BACKEND_HOST;
    c.withDiskTier(dir.string(), kBudget);
    return c;
}

uint8_t patternByte(int32_t token, size_t byte) {
    return static_cast<uint8_t>(1u + (static_cast<uint32_t>(token) * 31u + byte * 7u) % 251u);
}

uint8_t* rowOf(const kvb::Manager& m, int32_t block) {
    kvb_block_info_t info = m.getBlockInfo(kWindow, block);
    EXPECT_EQ(info.cache_level, KVB_CACHE_LEVEL_PRIMARY);
    auto [base, rowBytes] = m.getPoolPointer(kWindow, KVB_CACHE_LEVEL_PRIMARY);
    EXPECT_EQ(rowBytes, kRowBytes);
    return base + static_cast<size_t>(info.memory_index) * rowBytes;
}

// Row layout [K|V][token][element]: token t of a block owns bytes t*kHeadSize of each half.
void writePattern(const kvb::Manager& m, uint64_t id, const std::vector<int32_t>& tokens) {
    std::vector<int32_t> blocks = m.getCacheBlockIds(id, kWindow);
    for (size_t pos = 0; pos < tokens.size(); ++pos) {
        uint8_t* row = rowOf(m, blocks[pos / kTokensPerBlock]);
        size_t t = pos % kTokensPerBlock;
        for (size_t kv = 0; kv < 2; ++kv)
            for (size_t e = 0; e < kHeadSize; ++e) {
                size_t at = kv * kTokensPerBlock * kHeadSize + t * kHeadSize + e;
                row[at] = patternByte(tokens[pos], at);
            }
    }
}

void expectPattern(const kvb::Manager& m, uint64_t id, const std::vector<int32_t>& tokens,
                   int32_t numTokens) {
    std::vector<int32_t> blocks = m.getCacheBlockIds(id, kWindow);
    for (int32_t pos = 0; pos < numTokens; ++pos) {
        uint8_t* row = rowOf(m, blocks[static_cast<size_t>(pos / kTokensPerBlock)]);
        size_t t = static_cast<size_t>(pos % kTokensPerBlock);
        for (size_t kv = 0; kv < 2; ++kv)
            for (size_t e = 0; e < kHeadSize; ++e) {
                size_t at = kv * kTokensPerBlock * kHeadSize + t * kHeadSize + e;
                ASSERT_EQ(row[at], patternByte(tokens[static_cast<size_t>(pos)], at))
                    << "token " << pos;
            }
    }
}

// Admit, compute, store for reuse, release.
void serve(kvb::Manager& m, uint64_t id, const std::vector<int32_t>& tokens) {
    m.addSequence(kvb::Request(id, tokens));
    writePattern(m, id, tokens);
    m.storeContextBlocks(id, static_cast<int32_t>(tokens.size()));
    m.removeSequence(id, true);
}

void settle(kvb::Manager& m) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
        m.diskPoll();
        kvb_disk_stats_t s = m.getDiskStats();
        if (s.writes_queued == 0 && s.reads_in_flight == 0) return;
        ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "disk I/O hangs";
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
}

// Serves a prompt, then unrelated prompts until its blocks left GPU and host for the disk.
std::vector<int32_t> pushToDisk(kvb::Manager& m) {
    std::vector<int32_t> a = tokenRun(1000, 17);
    serve(m, 1, a);
    for (int i = 0; i < 6; ++i) {
        serve(m, 100 + static_cast<uint64_t>(i), tokenRun(5000 + 100 * i, 17));
        settle(m);
    }
    return a;
}

void waitReady(kvb::Manager& m, const kvb::Request& r) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (m.diskBlocksInFlight(r) > 0) {
        ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "disk reads hang";
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
}

TEST(DiskTier, APrefixEvictedFromHostComesBackFromDiskWithItsBytes) {
    fs::path dir = scratchDir("round-trip");
    kvb::Manager m(diskConfig(dir));
    ASSERT_TRUE(m.hasDiskTier());
    std::vector<int32_t> a = pushToDisk(m);
    kvb_disk_stats_t s = m.getDiskStats();
    EXPECT_GE(s.writes, 4u);
    EXPECT_EQ(s.slot_bytes, 4096u);
    kvb::Request again(2, a);
    EXPECT_EQ(m.estimateBatch({again})[0].reused_blocks, 0);
    std::vector<kvb_disk_prefetch_t> p = m.diskPrefetch({again});
    EXPECT_EQ(p[0].started, 4);
    waitReady(m, again);
    kvb_batch_estimate_t est = m.estimateBatch({again})[0];
    kvb_admission_t adm = m.addSequence(again);
    EXPECT_EQ(est.reusable_tokens, adm.prepopulated_prompt_len);
    EXPECT_EQ(adm.prepopulated_prompt_len, 16);
    expectPattern(m, 2, a, 16);
    EXPECT_EQ(m.getDiskStats().hits, 4u);
    fs::remove_all(dir);
}

// Through the C ABI: a block evicted to disk is Removed from the tree, then Stored with
// disk_tier set, at KVB_CACHE_LEVEL_DISK, under the hash it had in the tree.
TEST(DiskTier, EventsSayWhenABlockMovesToDisk) {
    fs::path dir = scratchDir("events");
    kvb::Config c = diskConfig(dir);
    c.raw.max_kv_event_entries = 100000;
    kvb::Manager m(c);
    pushToDisk(m);
    m.flushIterationEvents();
    std::vector<kvb::Event> events = m.getLatestEvents();
    std::set<uint64_t> inTree, leftTree, onDisk;
    for (const kvb::Event& e : events) {
        if (e.type == KVB_EVENT_STORED && !e.diskTier) {
            for (const auto& b : e.storedBlocks) inTree.insert(b.hash);
        } else if (e.type == KVB_EVENT_REMOVED && !e.diskTier) {
            leftTree.insert(e.removedHashes.begin(), e.removedHashes.end());
        } else if (e.type == KVB_EVENT_STORED && e.diskTier) {
            ASSERT_EQ(e.storedBlocks.size(), 1u);
            const auto& b = e.storedBlocks[0];
            EXPECT_EQ(b.cacheLevel, KVB_CACHE_LEVEL_DISK);
            EXPECT_TRUE(inTree.count(b.hash)) << "stored in the tree first, same hash";
            EXPECT_TRUE(leftTree.count(b.hash)) << "left the tree before disk";
            onDisk.insert(b.hash);
        }
    }
    EXPECT_EQ(onDisk.size(), m.getDiskStats().writes);
    EXPECT_GE(onDisk.size(), 4u);
    fs::remove_all(dir);
}

TEST(DiskTier, ARestartedManagerReusesTheDiskCache) {
    fs::path dir = scratchDir("restart");
    std::vector<int32_t> a;
    uint64_t written = 0;
    {
        kvb::Manager m(diskConfig(dir));
        a = pushToDisk(m);
        written = m.getDiskStats().slots_used;
    }
    kvb::Manager m(diskConfig(dir));
    EXPECT_EQ(m.getDiskStats().recovered, written);
    kvb::Request again(2, a);
    m.diskPrefetch({again});
    waitReady(m, again);
    EXPECT_EQ(m.addSequence(again).prepopulated_prompt_len, 16);
    expectPattern(m, 2, a, 16);
    fs::remove_all(dir);
}

TEST(DiskTier, TheSizingHelperGivesTheSlotsAManagerGets) {
    fs::path dir = scratchDir("sizing");
    kvb::Config c = diskConfig(dir);
    c.disk.bytes_per_window = 10 * 4096 + 4095;  // not a multiple of a slot
    kvb::DiskTierSize size =
        kvb::calculateDiskTierBlocks(kTokensPerBlock, kRowBytes, c.disk.bytes_per_window);
    {
        kvb::Manager m(c);
        kvb_disk_stats_t s = m.getDiskStats();
        EXPECT_EQ(s.slots, static_cast<uint64_t>(size.blocks));
        EXPECT_EQ(s.slot_bytes, size.slotBytes);
    }
    EXPECT_EQ(size.slotBytes % 4096, 0u);
    // A row past one aligned unit takes the next one; bad arguments are statuses.
    kvb::DiskTierSize big = kvb::calculateDiskTierBlocks(kTokensPerBlock, 4096, 1 << 20);
    EXPECT_EQ(big.slotBytes, 2 * 4096u);
    EXPECT_EQ(big.blocks, (1 << 20) / (2 * 4096));
    int64_t blocks = 0;
    uint64_t slot = 0;
    EXPECT_EQ(kvb_calculate_disk_tier_blocks(0, kRowBytes, kBudget, &blocks, &slot),
              KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_calculate_disk_tier_blocks(kTokensPerBlock, kRowBytes, kBudget, nullptr, &slot),
              KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_calculate_disk_tier_blocks(kTokensPerBlock, kRowBytes, kBudget, &blocks, nullptr),
              KVB_STATUS_NULL_POINTER);
    fs::remove_all(dir);
}

TEST(DiskTier, BadConfigurationFailsAtCreation) {
    fs::path dir = scratchDir("config");
    auto statusOf = [](const kvb::Config& c) {
        try {
            kvb::Manager m(c);
        } catch (const kvb::Error& e) { return e.status(); }
        return KVB_OK;
    };
    EXPECT_EQ(statusOf(diskConfig(dir / "missing")), KVB_STATUS_INVALID_CONFIG);
    kvb::Config small = diskConfig(dir);
    small.disk.bytes_per_window = 100;
    EXPECT_EQ(statusOf(small), KVB_STATUS_INVALID_CONFIG);
    EXPECT_EQ(statusOf(diskConfig(dir, 8, 0)), KVB_STATUS_INVALID_CONFIG);
    kvb::Config policy = diskConfig(dir);
    policy.disk.write_policy = static_cast<kvb_disk_write_policy_t>(7);
    EXPECT_EQ(statusOf(policy), KVB_STATUS_INVALID_CONFIG);
    kvb::Config threads = diskConfig(dir);
    threads.disk.io_threads = 0;
    EXPECT_EQ(statusOf(threads), KVB_STATUS_INVALID_CONFIG);
    fs::remove_all(dir);
}

TEST(DiskTier, AConfigOfTheVersionBeforeTheDiskTierIsAccepted) {
    kvb::Config c = kvb_test::windowConfig(kWindow, 8, 4, kTokensPerBlock, kWindow);
    kvb_manager_config_t raw = kvb_test::rawConfig(c);
    raw.struct_size = static_cast<uint32_t>(offsetof(kvb_manager_config_t, disk));
    raw.disk = reinterpret_cast<const kvb_disk_tier_config_t*>(0x1);  // never read
    kvb_manager_t* m = nullptr;
    ASSERT_EQ(kvb_manager_create(&raw, &m), KVB_OK);
    bool has = true;
    ASSERT_EQ(kvb_manager_has_disk_tier(m, &has), KVB_OK);
    EXPECT_FALSE(has);
    kvb_manager_destroy(m);
}

TEST(DiskTier, CallsValidateTheirArguments) {
    fs::path dir = scratchDir("args");
    kvb::Manager m(diskConfig(dir));
    EXPECT_EQ(kvb_manager_disk_blocks_in_flight(m.get(), nullptr, nullptr),
              KVB_STATUS_NULL_POINTER);
    kvb_disk_stats_t s{};
    s.struct_size = 3;
    EXPECT_EQ(kvb_manager_get_disk_stats(m.get(), &s), KVB_STATUS_STRUCT_SIZE);
    EXPECT_EQ(kvb_manager_disk_prefetch(m.get(), nullptr, 2, nullptr), KVB_STATUS_NULL_POINTER);
    EXPECT_EQ(kvb_manager_disk_poll(nullptr, nullptr), KVB_STATUS_NULL_POINTER);
    fs::remove_all(dir);
}

}  // namespace
