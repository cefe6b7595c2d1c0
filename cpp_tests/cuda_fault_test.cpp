// Every driver call kvblock makes, made to fail once, on the simulated driver (cpp_tests/sim_cuda,
// its test hooks kvb_sim_cuda_fail / _calls / _live_objects): the failing kvblock call returns a
// documented status with a message naming the driver call, a failure during creation frees
// everything created so far, a failed copy launch poisons the handle (no block is left recorded as
// holding bytes that were never copied), and the next manager works. Runs where
// KVB_SIM_CUDA_LIBRARY names the simulator (ctest's CudaSim.* cases); elsewhere it skips, saying so.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <utility>
#include <string>
#include <vector>

#include "kvblock.h"

namespace {

struct SimHooks {
    int (*fail)(const char*, unsigned, int) = nullptr;
    unsigned long long (*calls)(const char*) = nullptr;
    unsigned long long (*live)() = nullptr;
    // The engine's own driver calls: device 0's primary context current, and copies.
    int (*cuInit)(unsigned) = nullptr;
    int (*cuDeviceGet)(int*, int) = nullptr;
    int (*cuDevicePrimaryCtxRetain)(void**, int) = nullptr;
    int (*cuCtxSetCurrent)(void*) = nullptr;
    int (*cuMemcpyHtoD)(unsigned long long, const void*, size_t) = nullptr;
    int (*cuMemcpyDtoH)(void*, unsigned long long, size_t) = nullptr;

    // The simulator's hooks, or null when the tests do not run on it.
    static const SimHooks* get() {
        static SimHooks h;
        static bool ok = [] {
            const char* path = std::getenv("KVB_SIM_CUDA_LIBRARY");
            if (!path || !*path) return false;
            void* lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
            if (!lib) return false;
            h.fail = reinterpret_cast<decltype(h.fail)>(dlsym(lib, "kvb_sim_cuda_fail"));
            h.calls = reinterpret_cast<decltype(h.calls)>(dlsym(lib, "kvb_sim_cuda_calls"));
            h.live = reinterpret_cast<decltype(h.live)>(dlsym(lib, "kvb_sim_cuda_live_objects"));
            h.cuInit = reinterpret_cast<decltype(h.cuInit)>(dlsym(lib, "cuInit"));
            h.cuDeviceGet = reinterpret_cast<decltype(h.cuDeviceGet)>(dlsym(lib, "cuDeviceGet"));
            h.cuDevicePrimaryCtxRetain = reinterpret_cast<decltype(h.cuDevicePrimaryCtxRetain)>(
                dlsym(lib, "cuDevicePrimaryCtxRetain"));
            h.cuCtxSetCurrent =
                reinterpret_cast<decltype(h.cuCtxSetCurrent)>(dlsym(lib, "cuCtxSetCurrent"));
            h.cuMemcpyHtoD =
                reinterpret_cast<decltype(h.cuMemcpyHtoD)>(dlsym(lib, "cuMemcpyHtoD_v2"));
            h.cuMemcpyDtoH =
                reinterpret_cast<decltype(h.cuMemcpyDtoH)>(dlsym(lib, "cuMemcpyDtoH_v2"));
            if (!(h.fail && h.calls && h.live && h.cuInit && h.cuDeviceGet &&
                  h.cuDevicePrimaryCtxRetain && h.cuCtxSetCurrent && h.cuMemcpyHtoD &&
                  h.cuMemcpyDtoH))
                return false;
            // The engine's thread has the primary context current (retained for the process).
            int dev = 0;
            void* ctx = nullptr;
            return h.cuInit(0) == 0 && h.cuDeviceGet(&dev, 0) == 0 &&
                   h.cuDevicePrimaryCtxRetain(&ctx, dev) == 0 && h.cuCtxSetCurrent(ctx) == 0;
        }();
        return ok ? &h : nullptr;
    }
};

// What one run of the scenario saw: the first failing kvblock call, its status and message.
struct Outcome {
    std::string call;
    kvb_status_t status = KVB_OK;
    std::string message;
    bool poisonedAfter = false;
};

constexpr int32_t kWindow = 64;
constexpr int32_t kTokensPerBlock = 4;

// The block ids of request `id`.
std::vector<int32_t> blocks(kvb_manager_t* m, uint64_t id) {
    std::vector<int32_t> ids(16);
    size_t n = 0;
    EXPECT_EQ(kvb_manager_get_cache_block_ids(m, id, kWindow, 0, ids.data(), ids.size(), &n),
              KVB_OK);
    ids.resize(n);
    return ids;
}

// The device address of block `b`'s row in the primary pool, and the row's size.
std::pair<unsigned long long, size_t> row(kvb_manager_t* m, int32_t b) {
    uint8_t* base = nullptr;
    size_t rowBytes = 0;
    EXPECT_EQ(kvb_manager_get_pool_pointer(m, kWindow, KVB_CACHE_LEVEL_PRIMARY, &base, &rowBytes),
              KVB_OK);
    kvb_block_info_t info;
    EXPECT_EQ(kvb_manager_get_block_info(m, kWindow, b, &info), KVB_OK);
    return {reinterpret_cast<unsigned long long>(base) +
                static_cast<unsigned long long>(info.memory_index) * rowBytes,
            rowBytes};
}

kvb_manager_config_t config() {
    static kvb_window_config_t window = {};
    window.window_size = kWindow;
    window.primary_blocks = 4;
    window.secondary_blocks = 8;
    window.num_layers = 2;
    window.num_kv_heads = 2;
    window.size_per_head = 32;
    kvb_manager_config_t c;
    kvb_manager_config_init(&c);
    c.windows = &window;
    c.num_windows = 1;
    c.tokens_per_block = kTokensPerBlock;
    c.max_sequence_length = kWindow;
    c.bytes_per_element = 2;
    c.copy_backend = KVB_COPY_BACKEND_CUDA;
    return c;
}

kvb_request_t request(uint64_t id, const std::vector<int32_t>& tokens) {
    kvb_request_t r;
    kvb_request_init(&r);
    r.request_id = id;
    r.tokens = tokens.data();
    r.num_tokens = r.input_length = static_cast<int32_t>(tokens.size());
    return r;
}

// Creation, admission, store, an eviction that offloads to the host tier, an admission that
// onboards back, the transfers synchronized, destroy: every kind of driver call kvblock makes.
Outcome scenario(const SimHooks& sim) {
    Outcome o;
    auto step = [&](kvb_status_t s, const char* call) {
        if (s == KVB_OK || !o.call.empty()) return s == KVB_OK;
        o.call = call;
        o.status = s;
        o.message = kvb_last_error_message();
        return false;
    };
    kvb_manager_config_t c = config();
    kvb_manager_t* m = nullptr;
    if (!step(kvb_manager_create(&c, &m), "kvb_manager_create")) {
        EXPECT_EQ(m, nullptr) << "a failed create hands out no handle";
        return o;
    }
    std::vector<int32_t> prompt, other;
    for (int32_t t = 0; t < 13; ++t) prompt.push_back(t + 1);
    for (int32_t t = 0; t < 16; ++t) other.push_back(t + 1000);
    kvb_admission_t a;
    kvb_request_t r1 = request(1, prompt), r2 = request(2, other), r3 = request(3, prompt);
    bool ok = step(kvb_manager_add_sequence(m, &r1, &a), "add_sequence") &&
              step(kvb_manager_sync_transfers(m), "sync_transfers");
    if (ok) {
        // The engine computes the prompt: block i's row holds i + 1.
        std::vector<int32_t> ids = blocks(m, 1);
        for (size_t i = 0; i < ids.size(); ++i) {
            auto [address, bytes] = row(m, ids[i]);
            std::vector<uint8_t> fill(bytes, static_cast<uint8_t>(i + 1));
            EXPECT_EQ(sim.cuMemcpyHtoD(address, fill.data(), bytes), 0);
        }
    }
    ok = ok && step(kvb_manager_store_context_blocks(m, 1, 13), "store_context_blocks") &&
         step(kvb_manager_remove_sequence(m, 1, true), "remove_sequence") &&
         step(kvb_manager_add_sequence(m, &r2, &a), "add_sequence (offloads)") &&
         step(kvb_manager_remove_sequence(m, 2, false), "remove_sequence") &&
         step(kvb_manager_add_sequence(m, &r3, &a), "add_sequence (onboards)") &&
         step(kvb_manager_sync_transfers(m), "sync_transfers");
    if (ok) {
        // Whatever failed on the way was absorbed: the reused blocks hold the prompt's bytes.
        EXPECT_EQ(a.prepopulated_prompt_len, 12);
        std::vector<int32_t> ids = blocks(m, 3);
        for (size_t i = 0; i < 3 && i < ids.size(); ++i) {
            auto [address, bytes] = row(m, ids[i]);
            std::vector<uint8_t> got(bytes);
            EXPECT_EQ(sim.cuMemcpyDtoH(got.data(), address, bytes), 0);
            EXPECT_EQ(got, std::vector<uint8_t>(bytes, static_cast<uint8_t>(i + 1)))
                << "block " << i << " of the onboarded prompt lost its bytes";
        }
    } else if (o.status == KVB_STATUS_CUDA) {
        // The handle's bytes can no longer be trusted: every later call is refused.
        kvb_admission_t again;
        kvb_request_t r4 = request(4, prompt);
        o.poisonedAfter = kvb_manager_add_sequence(m, &r4, &again) == KVB_STATUS_POISONED;
    }
    kvb_manager_destroy(m);
    return o;
}

// The driver functions kvblock calls (src/cuda), teardown ones last.
const char* const kDriverCalls[] = {
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuCtxGetCurrent",
    "cuCtxPushCurrent_v2",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuMemAlloc_v2",
    "cuMemHostAlloc",
    "cuMemHostGetDevicePointer_v2",
    "cuPointerGetAttribute",
    "cuStreamCreate",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuStreamWaitEvent",
    "cuStreamSynchronize",
    "cuLaunchKernel",
    "cuCtxSynchronize",
};

}  // namespace

TEST(CudaSimFaultTest, EveryDriverCallThatFailsIsReportedAndLeavesNothingBehind) {
    const SimHooks* sim = SimHooks::get();
    if (!sim) GTEST_SKIP() << "skipped: needs the simulated driver (KVB_SIM_CUDA_LIBRARY)";
    // Twice: the process-wide set-up (driver, context, module) happens once, in the first.
    ASSERT_TRUE(scenario(*sim).call.empty()) << "the scenario runs clean";
    ASSERT_TRUE(scenario(*sim).call.empty());
    int failuresInjected = 0, absorbed = 0;
    for (const char* name : kDriverCalls) {
        unsigned long long before = sim->calls(name);
        ASSERT_TRUE(scenario(*sim).call.empty());
        unsigned long long perRun = sim->calls(name) - before;
        // First and last call of the run (one-time set-up calls happen only in the first run).
        std::vector<unsigned long long> nths;
        if (perRun > 0) nths.push_back(1);
        if (perRun > 1) nths.push_back(perRun);
        for (unsigned long long nth : nths) {
            SCOPED_TRACE(std::string(name) + " call " + std::to_string(nth) + " of " +
                         std::to_string(perRun));
            ASSERT_EQ(sim->fail(name, static_cast<unsigned>(nth), 0), 0);
            unsigned long long callsBefore = sim->calls(name);
            const unsigned long long liveBefore = sim->live();
            Outcome o = scenario(*sim);
            if (std::getenv("KVB_FAULT_TABLE"))
                std::fprintf(stderr, "FAULT %s %llu/%llu -> %s %s | live %+lld | %s\n", name, nth,
                             perRun, o.call.c_str(),
                             o.call.empty() ? "" : kvb_status_string(o.status),
                             static_cast<long long>(sim->live() - liveBefore), o.message.c_str());
            if (sim->calls(name) - callsBefore < nth) {
                // This run made fewer calls (lazily created descriptor buffers and events depend
                // on timing): nothing was injected; disarm and go on.
                ASSERT_EQ(sim->fail(name, 0, 0), 0);
                continue;
            }
            ++failuresInjected;
            if (o.call.empty()) {
                // Absorbed: a fallback (descriptor buffers in chunks) or teardown; the scenario
                // checked that every onboarded byte is right.
                ++absorbed;
            } else {
                EXPECT_TRUE(o.status == KVB_STATUS_CUDA || o.status == KVB_STATUS_OUT_OF_MEMORY ||
                            o.status == KVB_STATUS_UNSUPPORTED)
                    << o.call << " returned " << kvb_status_string(o.status) << ": " << o.message;
                std::string base(name);
                if (base.size() > 3 && base.compare(base.size() - 3, 3, "_v2") == 0)
                    base.resize(base.size() - 3);
                EXPECT_NE(o.message.find(base), std::string::npos)
                    << o.call << ": the message names the failed driver call: " << o.message;
                if (o.status == KVB_STATUS_CUDA && o.call != "kvb_manager_create") {
                    EXPECT_TRUE(o.poisonedAfter)
                        << o.call << ": a failed launch poisons the handle";
                }
            }
            EXPECT_EQ(sim->live(), liveBefore)
                << "allocations, streams, events or modules left behind after " << o.call;
            // The next manager works.
            Outcome clean = scenario(*sim);
            EXPECT_TRUE(clean.call.empty()) << clean.call << ": " << clean.message;
        }
    }
    EXPECT_GE(failuresInjected, 20) << "kvblock's driver calls were exercised";
    EXPECT_LT(absorbed, failuresInjected / 2) << "most failures are reported";
}
