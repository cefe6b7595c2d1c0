// The engine's side of the CUDA GoogleTests (cuda_*_test.cpp): the CUDA driver API loaded at
// run time (the simulated driver first when KVB_SIM_CUDA_LIBRARY names it), the block geometry
// and token pattern the engine writes, and the CudaBackendTest fixture (a stream, a staging
// area, busy work to queue copies behind).
//
// The engine "computes" a token by writing a pattern derived from (position, token id, layer,
// K|V, head, byte) into the token's slots of its block row, with asynchronous copies on its own
// stream. Whatever the manager reuses (shared, onboarded from the host tier, partially copied)
// must hold exactly that pattern when the engine's next work on its stream reads it.
#ifndef KVBLOCK_CUDA_FIXTURE_HPP
#define KVBLOCK_CUDA_FIXTURE_HPP

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "kvblock.h"
#include "kvblock.hpp"
#include "test_support.hpp"

namespace kvb_cuda_test {

using kvb_test::tokenRun;

// ---- The engine's side: the CUDA driver API, loaded at run time ------------------------------

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = void*;
using CUstream = void*;

// The simulated driver's path when the tests run on it (KVB_SIM_CUDA_LIBRARY), else null.
inline const char* simulatedDriver() {
    const char* p = std::getenv("KVB_SIM_CUDA_LIBRARY");
    return p && *p ? p : nullptr;
}

// Loads the simulated driver before anything else can load a real one (static initialization,
// before main and so before kvblock's first driver call).
inline void* const kSimulatedDriverHandle = [] {
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

inline size_t slotOffset(int slab, int slot) {
    return (static_cast<size_t>(slab) * kTokensPerBlock + static_cast<size_t>(slot)) * kTokenBytes;
}

inline uint8_t patternByte(int32_t pos, int32_t token, int slab, size_t byte) {
    uint32_t v = static_cast<uint32_t>(pos) * 2654435761u ^ static_cast<uint32_t>(token) * 40503u ^
                 static_cast<uint32_t>(slab) * 977u ^ static_cast<uint32_t>(byte) * 131u;
    v ^= v >> 13;
    return static_cast<uint8_t>(1u + v % 255u);
}

inline kvb::Config cudaConfig(int32_t primary, int32_t secondary, CUstream stream,
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

}  // namespace kvb_cuda_test

#endif  // KVBLOCK_CUDA_FIXTURE_HPP
