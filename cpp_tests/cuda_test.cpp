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
// The engine "computes" a token by writing a pattern derived from (position, token id, layer,
// K|V, head, byte) into the token's slots of its block row, with asynchronous copies on its own
// stream. Whatever the manager reuses (shared, onboarded from the host tier, partially copied)
// must hold exactly that pattern when the engine's next work on its stream reads it.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <unistd.h>
#include <type_traits>
#include <string>
#include <thread>
#include <vector>

#include "kvblock.h"
#include "kvblock.hpp"
#include "test_support.hpp"

namespace {

using kvb_test::tokenRun;

// ---- The engine's side: the CUDA driver API, loaded at run time ------------------------------

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = void*;
using CUstream = void*;

// The simulated driver's path when the tests run on it (KVB_SIM_CUDA_LIBRARY), else null.
const char* simulatedDriver() {
    const char* p = std::getenv("KVB_SIM_CUDA_LIBRARY");
    return p && *p ? p : nullptr;
}

// Loads the simulated driver before anything else can load a real one (static initialization,
// before main and so before kvblock's first driver call).
void* const kSimulatedDriverHandle = [] {
    const char* path = simulatedDriver();
    if (!path) return static_cast<void*>(nullptr);
    void* h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        std::fprintf(stderr, "KVB_SIM_CUDA_LIBRARY=%s cannot be loaded: %s\n", path, dlerror());
        std::abort();
    }
    return h;
}();

struct Driver {
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDeviceGetCount)(int*);
    CUresult (*cuDeviceGet)(CUdevice*, int);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuStreamCreate)(CUstream*, unsigned);
    CUresult (*cuStreamDestroy)(CUstream);
    CUresult (*cuStreamSynchronize)(CUstream);
    CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
    CUresult (*cuMemFree)(CUdeviceptr);
    CUresult (*cuMemHostAlloc)(void**, size_t, unsigned);
    CUresult (*cuMemFreeHost)(void*);
    CUresult (*cuMemGetInfo)(size_t*, size_t*);
    CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);
    CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
    CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUcontext context = nullptr;  // device 0's primary context

    // Driver calls need the context current on the calling thread.
    bool enter() const { return cuCtxSetCurrent(context) == 0; }

    // The driver, or null with `why` set.
    static const Driver* load(std::string& why) {
        static Driver d;
        static std::string reason;
        static bool loaded = [] {
            void* lib = kSimulatedDriverHandle ? kSimulatedDriverHandle
                                               : dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
            if (!lib) {
                reason = "no CUDA driver library (libcuda.so.1)";
                return false;
            }
            bool ok = true;
            auto sym = [&](auto& fn, const char* name) {
                fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
                ok = ok && fn != nullptr;
            };
            sym(d.cuInit, "cuInit");
            sym(d.cuDeviceGetCount, "cuDeviceGetCount");
            sym(d.cuDeviceGet, "cuDeviceGet");
            sym(d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
            sym(d.cuCtxSetCurrent, "cuCtxSetCurrent");
            sym(d.cuStreamCreate, "cuStreamCreate");
            sym(d.cuStreamDestroy, "cuStreamDestroy_v2");
            sym(d.cuStreamSynchronize, "cuStreamSynchronize");
            sym(d.cuMemAlloc, "cuMemAlloc_v2");
            sym(d.cuMemFree, "cuMemFree_v2");
            sym(d.cuMemHostAlloc, "cuMemHostAlloc");
            sym(d.cuMemFreeHost, "cuMemFreeHost");
            sym(d.cuMemGetInfo, "cuMemGetInfo_v2");
            sym(d.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
            sym(d.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
            sym(d.cuMemsetD8Async, "cuMemsetD8Async");
            if (!ok) {
                reason = "the CUDA driver library lacks a needed symbol";
                return false;
            }
            int count = 0;
            if (d.cuInit(0) != 0 || d.cuDeviceGetCount(&count) != 0 || count == 0) {
                reason = "no usable CUDA device";
                return false;
            }
            CUdevice dev = 0;
            if (d.cuDeviceGet(&dev, 0) != 0 || d.cuDevicePrimaryCtxRetain(&d.context, dev) != 0) {
                reason = "the primary context of device 0 cannot be retained";
                return false;
            }
            bool libraries = false;
            if (kvb_cuda_libraries_available(&libraries) != KVB_OK || !libraries) {
                reason =
                    "NVRTC (libnvrtc.so.13 or .so.12) is not on the loader path, or the driver is "
                    "older than CUDA 12.4";
                return false;
            }
            return true;
        }();
        why = reason;
        return loaded ? &d : nullptr;
    }
};

// Host memory for a CU_MEMHOSTALLOC_DEVICEMAP allocation.
constexpr unsigned kHostAllocMapped = 0x02;

#define CU_OK(call) ASSERT_EQ((call), 0) << #call

// ---- Geometry and the engine's pattern --------------------------------------------------------

constexpr int32_t kWindow = 64;
constexpr int32_t kTokensPerBlock = 4;
constexpr int kLayers = 2;
constexpr int kHeads = 2;
constexpr int kHeadSize = 64;
constexpr int kBytesPerElement = 2;
constexpr size_t kTokenBytes = static_cast<size_t>(kHeadSize) * kBytesPerElement;
constexpr size_t kRowBytes =
    static_cast<size_t>(kLayers) * 2 * kHeads * kTokensPerBlock * kTokenBytes;  // 4 KiB

size_t slotOffset(int slab, int slot) {
    return (static_cast<size_t>(slab) * kTokensPerBlock + static_cast<size_t>(slot)) * kTokenBytes;
}

uint8_t patternByte(int32_t pos, int32_t token, int slab, size_t byte) {
    uint32_t v = static_cast<uint32_t>(pos) * 2654435761u ^ static_cast<uint32_t>(token) * 40503u ^
                 static_cast<uint32_t>(slab) * 977u ^ static_cast<uint32_t>(byte) * 131u;
    v ^= v >> 13;
    return static_cast<uint8_t>(1u + v % 255u);
}

kvb::Config cudaConfig(int32_t primary, int32_t secondary, CUstream stream,
                       kvb_cuda_transfer_mode_t mode = KVB_CUDA_TRANSFER_ENGINE_STREAM) {
    kvb::Config c;
    c.addWindow(kWindow, primary, secondary, kLayers, kHeads, kHeadSize);
    c.raw.tokens_per_block = kTokensPerBlock;
    c.raw.max_sequence_length = kWindow;
    c.raw.bytes_per_element = kBytesPerElement;
    c.raw.copy_backend = KVB_COPY_BACKEND_CUDA;
    c.raw.cuda_stream = stream;
    c.raw.cuda_transfer_mode = mode;
    return c;
}

class CudaBackendTest : public ::testing::Test {
  protected:
    void SetUp() override {
        std::string why;
        cu = Driver::load(why);
        if (!cu && simulatedDriver()) FAIL() << "on the simulated driver: " << why;
        if (!cu) GTEST_SKIP() << "skipped: " << why;
        // On the simulated driver, "busy" work costs real CPU time: a smaller set suffices (its
        // scheduling modes delay or defer the stream's work anyway).
        busyBytes = simulatedDriver() ? (4u << 20) : kBusyBytes;
        ASSERT_TRUE(cu->enter());
        CU_OK(cu->cuStreamCreate(&stream, 1 /* non-blocking */));
        CU_OK(cu->cuMemHostAlloc(&staging, kStagingBytes, 0));
        CU_OK(cu->cuMemAlloc(&busy, busyBytes));
    }
    void TearDown() override {
        if (!cu) return;
        if (busy) cu->cuMemFree(busy);
        if (staging) cu->cuMemFreeHost(staging);
        if (stream) cu->cuStreamDestroy(stream);
    }

    // Keeps the engine stream busy for a while, so a copy that were not ordered with it would
    // overtake the work queued behind.
    void enqueueBusyWork() {
        for (int i = 0; i < 8; ++i) CU_OK(cu->cuMemsetD8Async(busy, uint8_t(i), busyBytes, stream));
    }

    CUdeviceptr rowAddress(kvb::Manager& m, int32_t block) {
        kvb_block_info_t info = m.getBlockInfo(kWindow, block);
        EXPECT_EQ(info.cache_level, KVB_CACHE_LEVEL_PRIMARY) << "block " << block;
        auto [base, rowBytes] = m.getPoolPointer(kWindow, KVB_CACHE_LEVEL_PRIMARY);
        EXPECT_EQ(rowBytes, kRowBytes);
        return reinterpret_cast<CUdeviceptr>(base) +
               static_cast<size_t>(info.memory_index) * rowBytes;
    }

    // The engine computes positions [from, to) of `id`: it writes their pattern on its stream.
    void compute(kvb::Manager& m, uint64_t id, const std::vector<int32_t>& tokens, int32_t from,
                 int32_t to) {
        std::vector<int32_t> blocks = m.getCacheBlockIds(id, kWindow);
        for (int32_t pos = from; pos < to; ++pos) {
            int32_t block = blocks[static_cast<size_t>(pos / kTokensPerBlock)];
            CUdeviceptr row = rowAddress(m, block);
            for (int slab = 0; slab < kLayers * 2 * kHeads; ++slab) {
                auto* bytes = static_cast<uint8_t*>(staging) + stagingUsed;
                ASSERT_LT(stagingUsed + kTokenBytes, kStagingBytes);
                for (size_t b = 0; b < kTokenBytes; ++b) {
                    bytes[b] = patternByte(pos, tokens[static_cast<size_t>(pos)], slab, b);
                }
                CU_OK(cu->cuMemcpyHtoDAsync(row + slotOffset(slab, pos % kTokensPerBlock), bytes,
                                            kTokenBytes, stream));
                stagingUsed += kTokenBytes;
            }
        }
        CU_OK(cu->cuStreamSynchronize(stream));  // the staging area is reused
        stagingUsed = 0;
    }

    // The engine's next work reads positions [0, reused) of `id` on its stream; they must hold
    // the pattern of their tokens.
    ::testing::AssertionResult holdsPattern(kvb::Manager& m, uint64_t id,
                                            const std::vector<int32_t>& tokens, int32_t reused) {
        std::vector<int32_t> blocks = m.getCacheBlockIds(id, kWindow);
        size_t numBlocks = static_cast<size_t>((reused + kTokensPerBlock - 1) / kTokensPerBlock);
        if (numBlocks * kRowBytes > kStagingBytes)
            return ::testing::AssertionFailure() << "staging";
        for (size_t bi = 0; bi < numBlocks; ++bi) {
            if (cu->cuMemcpyDtoHAsync(static_cast<uint8_t*>(staging) + bi * kRowBytes,
                                      rowAddress(m, blocks[bi]), kRowBytes, stream) != 0) {
                return ::testing::AssertionFailure() << "cuMemcpyDtoHAsync";
            }
        }
        if (cu->cuStreamSynchronize(stream) != 0) return ::testing::AssertionFailure() << "sync";
        for (int32_t pos = 0; pos < reused; ++pos) {
            const uint8_t* row = static_cast<uint8_t*>(staging) +
                                 static_cast<size_t>(pos / kTokensPerBlock) * kRowBytes;
            for (int slab = 0; slab < kLayers * 2 * kHeads; ++slab) {
                const uint8_t* p = row + slotOffset(slab, pos % kTokensPerBlock);
                for (size_t b = 0; b < kTokenBytes; ++b) {
                    uint8_t want = patternByte(pos, tokens[static_cast<size_t>(pos)], slab, b);
                    if (p[b] != want) {
                        return ::testing::AssertionFailure()
                               << "position " << pos << " slab " << slab << " byte " << b
                               << ": got " << int(p[b]) << ", want " << int(want);
                    }
                }
            }
        }
        return ::testing::AssertionSuccess();
    }

    // Admits `tokens` as `id` and lets the engine compute what was not reused.
    int32_t admitAndCompute(kvb::Manager& m, uint64_t id, const std::vector<int32_t>& tokens) {
        kvb_admission_t a = m.addSequence(kvb::Request(id, tokens));
        m.syncTransfers();  // (copy-stream mode) before the engine's work on the blocks
        compute(m, id, tokens, a.prepopulated_prompt_len, static_cast<int32_t>(tokens.size()));
        m.storeContextBlocks(id, static_cast<int32_t>(tokens.size()));
        return a.prepopulated_prompt_len;
    }

    // Offloads every cached block of a 4-block primary pool: another request takes all of them,
    // and the engine computes it, overwriting every row (a copy that was not ordered with the
    // engine's stream, or not made, leaves bytes that differ from what the blocks held).
    void evictEverything(kvb::Manager& m, uint64_t id) {
        const std::vector<int32_t> other = tokenRun(50000 + static_cast<int32_t>(id) * 100, 16);
        m.addSequence(kvb::Request(id, other));
        m.syncTransfers();
        compute(m, id, other, 0, 16);
        m.removeSequence(id, false);
    }

    static constexpr size_t kStagingBytes = 1 << 20;
    static constexpr size_t kBusyBytes = 256u << 20;
    const Driver* cu = nullptr;
    CUstream stream = nullptr;
    void* staging = nullptr;
    size_t stagingUsed = 0;
    CUdeviceptr busy = 0;
    size_t busyBytes = kBusyBytes;
};

}  // namespace

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

// A model of several pools (a K-only latent pool, a GQA pool, NVFP4 data with its block-scale
// pool): every pool's row of a block moves on offload, onboard and partial copy, in the kernel's
// one launch per call, and engine-registered pools of the model are used.
TEST_F(CudaBackendTest, EveryPoolOfAModelMovesOnTheGpu) {
    for (bool registered : {false, true}) {
        kvb::Config c;
        c.addWindow(kWindow, 8, 8);
        c.addLayers(2, kWindow, KVB_CACHE_TYPE_SELF, 2, 64, KVB_KV_DATA_TYPE_FP16);
        c.addLayers(1, kWindow, KVB_CACHE_TYPE_SELF_K_ONLY, 1, 32, KVB_KV_DATA_TYPE_FP16);
        c.addLayers(1, kWindow, KVB_CACHE_TYPE_SELF, 2, 64, KVB_KV_DATA_TYPE_NVFP4);
        c.raw.tokens_per_block = kTokensPerBlock;
        c.raw.max_sequence_length = kWindow;
        c.raw.copy_backend = KVB_COPY_BACKEND_CUDA;
        c.raw.cuda_stream = stream;
        c.raw.cuda_allocate_pools = !registered;
        kvb::Manager m(c);
        ASSERT_EQ(m.getNumPools(), 4);
        std::vector<kvb_pool_info_t> pools;
        for (int32_t p = 0; p < 4; ++p) pools.push_back(m.getPoolInfo(p));
        EXPECT_EQ(pools[3].scales_of, 2);
        std::vector<CUdeviceptr> gpu(4, 0);
        std::vector<void*> host(4, nullptr);
        if (registered) {
            for (size_t p = 0; p < 4; ++p) {
                CU_OK(cu->cuMemAlloc(&gpu[p], 8 * pools[p].row_bytes));
                CU_OK(cu->cuMemHostAlloc(&host[p], 8 * pools[p].row_bytes, kHostAllocMapped));
                m.registerModelPool(static_cast<int32_t>(p), KVB_CACHE_LEVEL_PRIMARY,
                                    reinterpret_cast<void*>(gpu[p]), 8 * pools[p].row_bytes);
                m.registerModelPool(static_cast<int32_t>(p), KVB_CACHE_LEVEL_SECONDARY, host[p],
                                    8 * pools[p].row_bytes);
            }
            EXPECT_EQ(reinterpret_cast<CUdeviceptr>(
                          m.getBlockScalePoolPointers(KVB_CACHE_LEVEL_PRIMARY)[2]),
                      gpu[3]);
        }
        auto slotAddress = [&](size_t p, int32_t block, int slab, int32_t pos) {
            kvb_block_info_t b = m.getBlockInfo(kWindow, block);
            EXPECT_EQ(b.cache_level, KVB_CACHE_LEVEL_PRIMARY);
            auto [base, rowBytes] =
                m.getModelPoolPointer(static_cast<int32_t>(p), KVB_CACHE_LEVEL_PRIMARY);
            return reinterpret_cast<CUdeviceptr>(base) +
                   static_cast<size_t>(b.memory_index) * rowBytes +
                   (static_cast<size_t>(slab) * kTokensPerBlock + size_t(pos % kTokensPerBlock)) *
                       static_cast<size_t>(pools[p].bytes_per_head_token);
        };
        auto slabs = [&](size_t p) {
            return pools[p].num_layers * pools[p].kv_factor * pools[p].num_kv_heads;
        };
        auto byteOf = [](size_t p, int32_t pos, int32_t token, int slab, size_t b) {
            return patternByte(pos, token, slab * 8 + static_cast<int>(p), b);
        };
        auto compute = [&](uint64_t id, const std::vector<int32_t>& tokens, int32_t from,
                           int32_t to) {
            std::vector<int32_t> blocks = m.getCacheBlockIds(id, kWindow);
            for (size_t p = 0; p < 4; ++p) {
                size_t tb = static_cast<size_t>(pools[p].bytes_per_head_token);
                for (int32_t pos = from; pos < to; ++pos) {
                    for (int s = 0; s < slabs(p); ++s) {
                        auto* bytes = static_cast<uint8_t*>(staging) + stagingUsed;
                        ASSERT_LT(stagingUsed + tb, kStagingBytes);
                        for (size_t b = 0; b < tb; ++b) {
                            bytes[b] = byteOf(p, pos, tokens[size_t(pos)], s, b);
                        }
                        CU_OK(cu->cuMemcpyHtoDAsync(
                            slotAddress(p, blocks[size_t(pos / kTokensPerBlock)], s, pos), bytes,
                            tb, stream));
                        stagingUsed += tb;
                    }
                }
            }
            CU_OK(cu->cuStreamSynchronize(stream));
            stagingUsed = 0;
        };
        auto holds = [&](uint64_t id, const std::vector<int32_t>& tokens,
                         int32_t reused) -> ::testing::AssertionResult {
            std::vector<int32_t> blocks = m.getCacheBlockIds(id, kWindow);
            for (size_t p = 0; p < 4; ++p) {
                size_t tb = static_cast<size_t>(pools[p].bytes_per_head_token);
                for (int32_t pos = 0; pos < reused; ++pos) {
                    for (int s = 0; s < slabs(p); ++s) {
                        auto* got = static_cast<uint8_t*>(staging);
                        if (cu->cuMemcpyDtoHAsync(
                                got, slotAddress(p, blocks[size_t(pos / kTokensPerBlock)], s, pos),
                                tb, stream) != 0 ||
                            cu->cuStreamSynchronize(stream) != 0) {
                            return ::testing::AssertionFailure() << "copy back";
                        }
                        for (size_t b = 0; b < tb; ++b) {
                            if (got[b] != byteOf(p, pos, tokens[size_t(pos)], s, b)) {
                                return ::testing::AssertionFailure()
                                       << "pool " << p << " position " << pos << " slab " << s
                                       << " byte " << b;
                            }
                        }
                    }
                }
            }
            return ::testing::AssertionSuccess();
        };

        const std::vector<int32_t> prompt = tokenRun(31, 13);
        m.addSequence(kvb::Request(1, prompt));
        compute(1, prompt, 0, 13);
        m.storeContextBlocks(1, 13);
        m.removeSequence(1);
        const std::vector<int32_t> other = tokenRun(70000, 32);  // every primary block
        m.addSequence(kvb::Request(2, other));
        compute(2, other, 0, 32);
        m.removeSequence(2, false);
        EXPECT_EQ(m.getKvCacheStats().offloaded_blocks, 3u);
        enqueueBusyWork();
        uint64_t launches = m.copyLaunches();
        EXPECT_EQ(m.addSequence(kvb::Request(3, prompt)).prepopulated_prompt_len, 12);
        EXPECT_EQ(m.copyLaunches() - launches, 1u);  // 3 blocks x 4 pools: one launch
        EXPECT_TRUE(holds(3, prompt, 12));
        std::vector<int32_t> partial = tokenRun(31, 6);
        partial.insert(partial.end(), {9000, 9001});
        EXPECT_EQ(m.addSequence(kvb::Request(4, partial)).prepopulated_prompt_len, 6);
        EXPECT_TRUE(holds(4, partial, 6));
        m.checkInvariants();
        m.removeSequence(3, false);
        m.removeSequence(4, false);
        CU_OK(cu->cuStreamSynchronize(stream));
        for (size_t p = 0; p < 4; ++p) {
            if (gpu[p]) cu->cuMemFree(gpu[p]);
            if (host[p]) cu->cuMemFreeHost(host[p]);
        }
    }
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
