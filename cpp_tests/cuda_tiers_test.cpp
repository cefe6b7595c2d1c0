// The tiers below the host tier on the CUDA backend: a disk tier under the pinned host tier (its
// writes wait for the GPU copies that fill the rows they read) and the remote tier over GPU
// pools. Runs on the simulated driver in every test run (CudaSim.*) and on a GPU.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "cuda_fixture.hpp"

using namespace kvb_cuda_test;

namespace {

// A fresh directory for a disk tier under the system's temporary directory.
std::filesystem::path freshDiskDir(const std::string& name) {
    std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                ("kvblock-cuda-" + name + "-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    return dir;
}

// GPU and host pools of 4 blocks over a disk tier of 64 slots in `dir`.
kvb::Config cudaDiskConfig(const std::filesystem::path& dir, CUstream stream) {
    kvb::Config c = cudaConfig(4, 4, stream);
    uint64_t slot = kvb::calculateDiskTierBlocks(kTokensPerBlock, kRowBytes, 1).slotBytes;
    c.withDiskTier(dir.string(), 64 * slot);
    return c;
}

// Prefetches `request`'s prefix from disk and waits (bounded) until its reads are placed.
void prefetchFromDisk(kvb::Manager& m, const kvb::Request& request) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    m.diskPoll();
    m.diskPrefetch({request});
    while (m.diskBlocksInFlight(request) > 0) {
        ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "disk reads hang";
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    m.diskPoll();
}

}  // namespace

// The disk tier below a pinned host tier: a block the host tier evicts is written to disk once
// the GPU copy that offloaded it is done (until then the write is dropped, counted, never waited
// for), and a prefix read back from disk is onboarded into GPU memory with the engine's bytes.
TEST_F(CudaBackendTest, ADiskTierKeepsTheEnginesBytesBelowThePinnedHostTier) {
    std::filesystem::path dir = freshDiskDir("disk");
    {
        kvb::Manager m(cudaDiskConfig(dir, stream));
        const std::vector<int32_t> prompt = tokenRun(7, 16);  // the whole 4-block GPU pool
        admitAndCompute(m, 1, prompt);
        m.removeSequence(1);
        // Two more prompts push it through the host tier (offloaded, then evicted to disk).
        for (uint64_t id = 2; id <= 3; ++id) {
            CU_OK(cu->cuStreamSynchronize(stream));  // the offloads are done: rows settle
            admitAndCompute(m, id, tokenRun(50000 + static_cast<int32_t>(id) * 100, 16));
            m.removeSequence(id);
        }
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        kvb_disk_stats_t s{};
        for (;;) {
            m.diskPoll();
            s = m.getDiskStats();
            if (s.writes_queued == 0) break;
            ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "disk writes hang";
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        EXPECT_GE(s.writes, 4u) << "the prompt's blocks reached the disk: drops " << s.write_drops
                                << ", skipped " << s.write_skips << ", policy " << s.policy_skips;
        EXPECT_EQ(s.write_errors, 0u);
        kvb::Request again(4, prompt);
        prefetchFromDisk(m, again);
        EXPECT_GE(m.getDiskStats().hits, 3u);
        enqueueBusyWork();
        kvb_admission_t a = m.addSequence(again);
        m.syncTransfers();
        EXPECT_GE(a.prepopulated_prompt_len, 12);
        EXPECT_TRUE(holdsPattern(m, 4, prompt, a.prepopulated_prompt_len));
        m.checkInvariants();
    }
    std::filesystem::remove_all(dir);
}

// Without waiting for the engine's stream, the host tier evicts rows whose offload copies may
// still be running: those writes are dropped (on the simulator's deferred mode, where stream work
// runs only when the host waits, all of them), and nothing stale reaches the disk.
TEST_F(CudaBackendTest, ADiskWriteOfARowAGpuCopyStillWritesIsDropped) {
    std::filesystem::path dir = freshDiskDir("disk-drop");
    {
        kvb::Manager m(cudaDiskConfig(dir, stream));
        const std::vector<int32_t> prompt = tokenRun(8, 16);
        m.addSequence(kvb::Request(1, prompt));
        compute(m, 1, prompt, 0, 16);  // ends with a stream synchronize: its rows are computed
        m.storeContextBlocks(1, 16);
        m.removeSequence(1);
        // Two admissions back to back, no host wait between: the first offloads the prompt into
        // the host tier, the second evicts it from there at once.
        // (Request 2's own bytes do not matter here: it is stored only so that the third
        // admission offloads it, which evicts the prompt from the host tier.)
        m.addSequence(kvb::Request(2, tokenRun(60000, 16)));
        m.storeContextBlocks(2, 16);
        m.removeSequence(2);
        m.addSequence(kvb::Request(3, tokenRun(61000, 16)));
        kvb_disk_stats_t s = m.getDiskStats();
        const char* mode = std::getenv("KVB_SIM_CUDA_MODE");
        if (simulatedDriver() && mode && std::string(mode) == "deferred") {
            EXPECT_GT(s.write_drops, 0u) << "rows whose offload had not run were read";
        }
        m.removeSequence(3, false);
        CU_OK(cu->cuStreamSynchronize(stream));
        // Whatever was written holds the prompt's bytes.
        kvb::Request again(4, prompt);
        prefetchFromDisk(m, again);
        kvb_admission_t a = m.addSequence(again);
        m.syncTransfers();
        EXPECT_TRUE(holdsPattern(m, 4, prompt, a.prepopulated_prompt_len));
        EXPECT_EQ(m.getDiskStats().verify_failures, 0u);
        m.checkInvariants();
    }
    std::filesystem::remove_all(dir);
}

// The remote tier with GPU pools writes blocks as they leave the (pinned) host tier: writing on
// store would read GPU memory on the host, so that policy is refused at creation, saying why.
// (An unreachable server is not an error at creation: no Redis is needed here.)
TEST_F(CudaBackendTest, TheRemoteTierOnGpuPoolsWritesOnHostEviction) {
    kvb::Config c = cudaConfig(4, 4, stream);
    c.withRemoteTier("redis://127.0.0.1:1", "cuda-model");
    EXPECT_EQ(kvb_test::statusOf([&] { kvb::Manager m(c); }), KVB_STATUS_UNSUPPORTED);
    EXPECT_NE(std::string(kvb_last_error_message()).find("KVB_REMOTE_WRITE_ON_HOST_EVICT"),
              std::string::npos);
    c.withRemoteTier("redis://127.0.0.1:1", "cuda-model", "", false,
                     KVB_REMOTE_WRITE_ON_HOST_EVICT);
    kvb::Manager m(c);
    bool has = false;
    ASSERT_EQ(kvb_manager_has_remote_tier(m.get(), &has), KVB_OK);
    EXPECT_TRUE(has);
}
