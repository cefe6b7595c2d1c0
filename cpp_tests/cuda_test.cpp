// The CUDA backend (KVB_COPY_BACKEND_CUDA): pools in GPU memory and pinned host memory, copies by
// a batched kernel ordered with the engine's stream.
//
// The engine side of these tests talks to the GPU through the CUDA driver library loaded at run
// time, so the suite builds everywhere; where no driver, GPU or NVRTC is usable every GPU test
// skips and says why, and the one test that needs no GPU checks that creating a CUDA manager
// there is a clean KVB_STATUS_UNSUPPORTED.
//
// With KVB_SIM_CUDA_LIBRARY naming the simulated driver (cpp_tests/sim_cuda/, registered by CMake
// as the ctest cases CudaSim.eager, CudaSim.delayed and CudaSim.deferred), that library is
// dlopen()ed by its absolute path before any driver call: its SONAME is libcuda.so, so kvblock's
// loader (cudarc asks for "libcuda.so" first) gets it too, and the GPU tests run on it. There a
// test that cannot run fails instead of skipping.
//
// The engine's side (the driver, the pattern it writes, the fixture) is cuda_fixture.hpp; the
// tiers below the host tier are cuda_tiers_test.cpp, the pool model cuda_pool_model_test.cpp.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "cuda_fixture.hpp"

using namespace kvb_cuda_test;

// Without a CUDA driver, a GPU or NVRTC, asking for the CUDA backend is a clean
// KVB_STATUS_UNSUPPORTED with a message naming what is missing, and no handle.
TEST(CudaUnavailableTest, CreatingACudaManagerWithoutCudaIsUnsupported) {
    std::string why;
    if (Driver::load(why)) GTEST_SKIP() << "skipped: CUDA is usable on this machine";
    kvb::Config c = cudaConfig(4, 4, nullptr);
    kvb_manager_config_t raw = kvb_test::rawConfig(c);
    kvb_manager_t* m = reinterpret_cast<kvb_manager_t*>(0x1);
    EXPECT_EQ(kvb_manager_create(&raw, &m), KVB_STATUS_UNSUPPORTED);
    EXPECT_EQ(m, nullptr);
    std::string message = kvb_last_error_message();
    EXPECT_TRUE(message.find("CUDA") != std::string::npos ||
                message.find("NVRTC") != std::string::npos)
        << message;
}

// Sizing needs the driver, not a GPU kernel: without a driver library it is a clean
// KVB_STATUS_UNSUPPORTED naming CUDA; bad arguments are refused the same everywhere.
TEST(CudaUnavailableTest, FreeMemoryBudgetsWithoutCudaAreUnsupported) {
    uint64_t primary = 1, secondary = 1;
    EXPECT_EQ(kvb_calculate_free_mem_bytes(0, 1.0, 0, 0, &primary, &secondary),
              KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_calculate_free_mem_bytes(-1, 0.5, 0, 0, &primary, &secondary),
              KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_calculate_free_mem_bytes(0, 0.5, 0, 0, nullptr, &secondary),
              KVB_STATUS_NULL_POINTER);
    void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (driver || simulatedDriver()) {
        if (driver) dlclose(driver);
        GTEST_SKIP() << "skipped: a CUDA driver library is present";
    }
    EXPECT_EQ(kvb_calculate_free_mem_bytes(0, 0.5, 0, 0, &primary, &secondary),
              KVB_STATUS_UNSUPPORTED);
    EXPECT_NE(std::string(kvb_last_error_message()).find("CUDA"), std::string::npos)
        << kvb_last_error_message();
    EXPECT_EQ(primary, 1u) << "nothing written on failure";
}

// An unknown transfer mode is a config error, checked before CUDA is touched.
TEST(CudaUnavailableTest, UnknownTransferModeIsInvalidConfig) {
    kvb::Config c = cudaConfig(4, 4, nullptr);
    c.raw.cuda_transfer_mode = 7;
    kvb_manager_config_t raw = kvb_test::rawConfig(c);
    kvb_manager_t* m = nullptr;
    EXPECT_EQ(kvb_manager_create(&raw, &m), KVB_STATUS_INVALID_CONFIG);
    EXPECT_EQ(m, nullptr);
}

// The CUDA calls are refused by the other backends with KVB_STATUS_UNSUPPORTED, except the two
// that are no-ops there (sync_transfers: host copies are done when the call returns).
TEST(CudaUnavailableTest, HostBackendsRefuseStreamsAndRegisteredPools) {
    kvb::Config c = kvb_test::windowConfig(kWindow, 4, 4, kTokensPerBlock, kWindow);
    c.raw.copy_backend = KVB_COPY_BACKEND_HOST;
    kvb::Manager m(c);
    EXPECT_EQ(kvb_test::statusOf([&] { m.setStream(nullptr); }), KVB_STATUS_UNSUPPORTED);
    int dummy = 0;
    EXPECT_EQ(kvb_test::statusOf(
                  [&] { m.registerPool(kWindow, KVB_CACHE_LEVEL_PRIMARY, &dummy, sizeof dummy); }),
              KVB_STATUS_UNSUPPORTED);
    EXPECT_EQ(kvb_test::statusOf([&] { m.syncTransfers(); }), KVB_OK);
    EXPECT_EQ(m.copyLaunches(), 0u);
}

// Onboarded blocks hold their bytes before the engine's next work on its stream, even when the
// stream is busy: the copy kernel is enqueued on it. One launch per copying call, a second only
// when an offload and an onboard in the call share a row.
TEST_F(CudaBackendTest, OnboardedBytesArriveBeforeTheEnginesNextWork) {
    kvb::Manager m(cudaConfig(4, 8, stream));
    const std::vector<int32_t> prompt = tokenRun(7, 13);
    admitAndCompute(m, 1, prompt);
    m.removeSequence(1);
    evictEverything(m, 2);
    ASSERT_EQ(m.getKvCacheStats().offloaded_blocks, 3u);

    enqueueBusyWork();
    uint64_t launches = m.copyLaunches();
    kvb_admission_t a = m.addSequence(kvb::Request(3, prompt));
    EXPECT_EQ(a.prepopulated_prompt_len, 12);
    EXPECT_GE(m.copyLaunches() - launches, 1u);
    EXPECT_LE(m.copyLaunches() - launches, 2u);
    EXPECT_TRUE(holdsPattern(m, 3, prompt, 12));
    m.checkInvariants();
}

// A suspended sequence's blocks move to the pinned host tier when another request needs their
// GPU rows, and come back with their bytes on resume, before the engine's next work.
TEST_F(CudaBackendTest, SuspendedBytesSurviveTheHostTierAndResume) {
    kvb::Manager m(cudaConfig(4, 8, stream));
    const std::vector<int32_t> prompt = tokenRun(11, 16);  // the whole 4-block pool
    m.addSequence(kvb::Request(1, prompt));
    compute(m, 1, prompt, 0, 16);
    m.suspend(1);
    m.addSequence(kvb::Request(2, tokenRun(900, 16)));
    for (int32_t b : m.getCacheBlockIds(1, kWindow)) {
        EXPECT_EQ(m.getBlockInfo(kWindow, b).cache_level, KVB_CACHE_LEVEL_SECONDARY) << b;
    }
    m.removeSequence(2, false);
    enqueueBusyWork();
    ASSERT_TRUE(m.resume(1));
    EXPECT_TRUE(holdsPattern(m, 1, prompt, 16));
    m.checkInvariants();
}

// With kvblock's own copy stream, kvb_manager_sync_transfers orders the copies before the
// engine's next work.
TEST_F(CudaBackendTest, CopyStreamCopiesAreOrderedBySyncTransfers) {
    kvb::Manager m(cudaConfig(4, 8, stream, KVB_CUDA_TRANSFER_COPY_STREAM));
    const std::vector<int32_t> prompt = tokenRun(3, 13);
    admitAndCompute(m, 1, prompt);
    m.removeSequence(1);
    evictEverything(m, 2);
    enqueueBusyWork();
    kvb_admission_t a = m.addSequence(kvb::Request(3, prompt));
    m.syncTransfers();
    EXPECT_EQ(a.prepopulated_prompt_len, 12);
    EXPECT_TRUE(holdsPattern(m, 3, prompt, 12));
}

// A partially matching block in use by another request is copied (its first tokens), and the
// copy holds the owner's bytes.
TEST_F(CudaBackendTest, PartialReuseCopiesTheFirstTokensOfEverySlab) {
    kvb::Manager m(cudaConfig(8, 0, stream));
    const std::vector<int32_t> owner = tokenRun(100, 9);  // blocks: [100..103] [104..107] [108]
    admitAndCompute(m, 1, owner);
    std::vector<int32_t> other = tokenRun(100, 6);  // shares 100..105: one full, two partial
    other.insert(other.end(), {9000, 9001, 9002});
    kvb_admission_t a = m.addSequence(kvb::Request(2, other));
    EXPECT_EQ(a.prepopulated_prompt_len, 6);
    EXPECT_TRUE(holdsPattern(m, 2, other, 6));
    EXPECT_NE(m.getCacheBlockIds(2, kWindow)[1], m.getCacheBlockIds(1, kWindow)[1]);
}

// The engine may switch streams; later copies are ordered with the new one.
TEST_F(CudaBackendTest, CopiesFollowTheStreamSetLater) {
    kvb::Manager m(cudaConfig(4, 8, nullptr));
    m.setStream(stream);
    const std::vector<int32_t> prompt = tokenRun(11, 13);
    admitAndCompute(m, 1, prompt);
    m.removeSequence(1);
    evictEverything(m, 2);
    enqueueBusyWork();
    m.addSequence(kvb::Request(3, prompt));
    EXPECT_TRUE(holdsPattern(m, 3, prompt, 12));
}

// Destroying a manager while its copies are still queued behind busy engine work waits for them
// before freeing the pools; the stream then completes without a fault.
TEST_F(CudaBackendTest, DestroyWithCopiesInFlight) {
    for (int round = 0; round < 3; ++round) {
        auto* m = new kvb::Manager(cudaConfig(4, 8, stream));
        const std::vector<int32_t> prompt = tokenRun(round * 1000, 13);
        admitAndCompute(*m, 1, prompt);
        m->removeSequence(1);
        enqueueBusyWork();
        evictEverything(*m, 2);  // offload copies queued behind the busy work
        delete m;
        EXPECT_EQ(cu->cuStreamSynchronize(stream), 0);
    }
}

// A pool larger than the GPU is a KVB_STATUS_CUDA error naming cuMemAlloc, and nothing leaks.
TEST_F(CudaBackendTest, ExhaustedGpuMemoryIsAnErrorWithNothingLeaked) {
    { kvb::Manager warm(cudaConfig(4, 8, stream)); }  // module and context set up once
    size_t freeBefore = 0, total = 0;
    CU_OK(cu->cuMemGetInfo(&freeBefore, &total));
    // Rows of 64 layers x K|V x 64 heads x 32 tokens x 128 x 2 bytes = 128 MiB: few blocks
    // (little bookkeeping) for twice the GPU's memory.
    constexpr size_t kBigRow = size_t(64) * 2 * 64 * 32 * 128 * 2;
    kvb::Config c;
    c.addWindow(4096, static_cast<int32_t>(total / kBigRow * 2), 2, 64, 64, 128);
    c.raw.tokens_per_block = 32;
    c.raw.max_sequence_length = 4096;
    c.raw.copy_backend = KVB_COPY_BACKEND_CUDA;
    c.raw.cuda_stream = stream;
    kvb_manager_config_t raw = kvb_test::rawConfig(c);
    kvb_manager_t* m = nullptr;
    EXPECT_EQ(kvb_manager_create(&raw, &m), KVB_STATUS_CUDA);
    EXPECT_EQ(m, nullptr);
    EXPECT_NE(std::string(kvb_last_error_message()).find("cuMemAlloc"), std::string::npos)
        << kvb_last_error_message();
    size_t freeAfter = 0;
    CU_OK(cu->cuMemGetInfo(&freeAfter, &total));
    EXPECT_LE(freeBefore - std::min(freeBefore, freeAfter), size_t(8) << 20);
}

// The engine's own memory can be the pools: admission waits for it (a clear error before), the
// kinds of memory are checked, and the bytes move through it.
TEST_F(CudaBackendTest, RegisteredPoolsAreUsed) {
    kvb::Config c = cudaConfig(4, 8, stream);
    c.raw.cuda_allocate_pools = false;
    // The engine's memory outlives the manager, and the engine frees it afterwards.
    CUdeviceptr primary = 0;
    void* secondary = nullptr;
    struct EngineMemory {
        const Driver* cu;
        CUdeviceptr& primary;
        void*& secondary;
        ~EngineMemory() {
            if (primary) cu->cuMemFree(primary);
            if (secondary) cu->cuMemFreeHost(secondary);
        }
    } engineMemory{cu, primary, secondary};
    kvb::Manager m(c);
    EXPECT_EQ(kvb_test::statusOf([&] { m.addSequence(kvb::Request(1, tokenRun(0, 5))); }),
              KVB_STATUS_UNSUPPORTED);
    EXPECT_EQ(m.getKvCacheStats().free_num_blocks, 4u);

    CU_OK(cu->cuMemAlloc(&primary, 4 * kRowBytes));
    CU_OK(cu->cuMemHostAlloc(&secondary, 8 * kRowBytes, kHostAllocMapped));
    std::vector<uint8_t> pageable(4 * kRowBytes);
    EXPECT_EQ(kvb_test::statusOf([&] {
                  m.registerPool(kWindow, KVB_CACHE_LEVEL_PRIMARY, pageable.data(),
                                 pageable.size());
              }),
              KVB_STATUS_CUDA);  // host memory is no GPU pool
    EXPECT_EQ(kvb_test::statusOf([&] {
                  m.registerPool(kWindow, KVB_CACHE_LEVEL_PRIMARY, reinterpret_cast<void*>(primary),
                                 3 * kRowBytes);
              }),
              KVB_STATUS_CUDA);  // too small
    m.registerPool(kWindow, KVB_CACHE_LEVEL_PRIMARY, reinterpret_cast<void*>(primary),
                   4 * kRowBytes);
    m.registerPool(kWindow, KVB_CACHE_LEVEL_SECONDARY, secondary, 8 * kRowBytes);
    EXPECT_EQ(
        reinterpret_cast<CUdeviceptr>(m.getPoolPointer(kWindow, KVB_CACHE_LEVEL_PRIMARY).first),
        primary);

    const std::vector<int32_t> prompt = tokenRun(21, 13);
    admitAndCompute(m, 1, prompt);
    EXPECT_EQ(kvb_test::statusOf([&] {
                  m.registerPool(kWindow, KVB_CACHE_LEVEL_PRIMARY, reinterpret_cast<void*>(primary),
                                 4 * kRowBytes);
              }),
              KVB_STATUS_UNSUPPORTED);  // the pool holds data now
    m.removeSequence(1);
    evictEverything(m, 2);
    m.addSequence(kvb::Request(3, prompt));
    EXPECT_TRUE(holdsPattern(m, 3, prompt, 12));
    m.removeSequence(3);
    CU_OK(cu->cuStreamSynchronize(stream));
}

// The GPU budget follows the device's free memory: half of it with a fraction of 0.5, less by
// half of what the engine allocates, plus the engine's memory pool's free bytes.
TEST_F(CudaBackendTest, FreeMemoryBudgetsFollowTheDevicesFreeBytes) {
    // Allocation granularity (and, on a real GPU, other processes) moves free memory a little.
    const uint64_t slack = simulatedDriver() ? (1u << 20) : (256u << 20);
    size_t free = 0, total = 0;
    CU_OK(cu->cuMemGetInfo(&free, &total));
    auto [primary, secondary] = kvb::calculateFreeMemBytes(0, 0.5, 0, 12345);
    EXPECT_EQ(secondary, 12345u);
    EXPECT_NEAR(double(primary), double(free) * 0.5, double(slack) + 1.0);
    CUdeviceptr held = 0;
    const size_t engineBytes = 64u << 20;
    CU_OK(cu->cuMemAlloc(&held, engineBytes));
    uint64_t after = kvb::calculateFreeMemBytes(0, 0.5, 0, 0).first;
    EXPECT_NEAR(double(after), double(free - engineBytes) * 0.5, double(slack) + 1.0);
    uint64_t withPool = kvb::calculateFreeMemBytes(0, 0.5, engineBytes, 0).first;
    EXPECT_NEAR(double(withPool), double(after) + double(engineBytes) * 0.5, double(slack) + 1.0);
    cu->cuMemFree(held);
    EXPECT_EQ(kvb_test::statusOf([&] { kvb::calculateFreeMemBytes(0, 0.5, total, 0); }),
              KVB_STATUS_INVALID_ARGUMENT)
        << "free bytes beyond the device's memory";
}

// Two engine threads, each with its own stream and manager, move bytes at the same time.
TEST_F(CudaBackendTest, TwoManagersOnTwoStreamsFromTwoThreads) {
    auto worker = [this](int seed, bool* ok) {
        CUstream s = nullptr;
        if (!cu->enter() || cu->cuStreamCreate(&s, 1) != 0) return;
        try {
            kvb::Manager m(cudaConfig(
                4, 8, s,
                seed % 2 ? KVB_CUDA_TRANSFER_COPY_STREAM : KVB_CUDA_TRANSFER_ENGINE_STREAM));
            bool good = true;
            for (int round = 0; round < 20 && good; ++round) {
                const std::vector<int32_t> prompt = tokenRun(seed * 100000 + round * 100, 13);
                m.addSequence(kvb::Request(1, prompt));
                m.storeContextBlocks(1, 13);
                m.removeSequence(1);
                m.addSequence(kvb::Request(2, tokenRun(seed * 100000 + 90000 + round * 100, 16)));
                m.removeSequence(2, false);
                kvb_admission_t a = m.addSequence(kvb::Request(3, prompt));
                m.syncTransfers();
                good = good && a.prepopulated_prompt_len == 12;
                m.removeSequence(3);
            }
            m.checkInvariants();
            *ok = good && cu->cuStreamSynchronize(s) == 0;
        } catch (const kvb::Error&) { *ok = false; }
        cu->cuStreamDestroy(s);
    };
    bool ok1 = false, ok2 = false;
    std::thread t1(worker, 1, &ok1), t2(worker, 2, &ok2);
    t1.join();
    t2.join();
    EXPECT_TRUE(ok1);
    EXPECT_TRUE(ok2);
}
