// The simulated driver itself (ctest case CudaSim.self): driver semantics kvblock relies on, and
// each of its checks biting (death tests). Needs no NVRTC: the CUBIN is a minimal EM_CUDA ELF
// built here, and the kernel that runs is the simulator's CPU build of kernels/block_copy.cu.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

using CUresult = int;
using CUdeviceptr = unsigned long long;
using CUcontext = void*;
using CUstream = void*;
using CUevent = void*;
using CUmodule = void*;
using CUfunction = void*;

struct Api {
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDriverGetVersion)(int*);
    CUresult (*cuDeviceGet)(int*, int);
    CUresult (*cuDeviceGetAttribute)(int*, int, int);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, int);
    CUresult (*cuDevicePrimaryCtxRelease_v2)(int);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuCtxGetCurrent)(CUcontext*);
    CUresult (*cuCtxPushCurrent_v2)(CUcontext);
    CUresult (*cuCtxPopCurrent_v2)(CUcontext*);
    CUresult (*cuCtxSynchronize)();
    CUresult (*cuMemAlloc_v2)(CUdeviceptr*, size_t);
    CUresult (*cuMemFree_v2)(CUdeviceptr);
    CUresult (*cuMemGetInfo_v2)(size_t*, size_t*);
    CUresult (*cuMemHostAlloc)(void**, size_t, unsigned);
    CUresult (*cuMemFreeHost)(void*);
    CUresult (*cuMemHostGetDevicePointer_v2)(CUdeviceptr*, void*, unsigned);
    CUresult (*cuPointerGetAttribute)(void*, int, CUdeviceptr);
    CUresult (*cuMemcpyHtoD_v2)(CUdeviceptr, const void*, size_t);
    CUresult (*cuMemcpyDtoH_v2)(void*, CUdeviceptr, size_t);
    CUresult (*cuMemcpyHtoDAsync_v2)(CUdeviceptr, const void*, size_t, CUstream);
    CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*cuStreamCreate)(CUstream*, unsigned);
    CUresult (*cuStreamDestroy_v2)(CUstream);
    CUresult (*cuStreamSynchronize)(CUstream);
    CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned);
    CUresult (*cuEventCreate)(CUevent*, unsigned);
    CUresult (*cuEventDestroy_v2)(CUevent);
    CUresult (*cuEventRecord)(CUevent, CUstream);
    CUresult (*cuEventQuery)(CUevent);
    CUresult (*cuEventSynchronize)(CUevent);
    CUresult (*cuModuleLoadData)(CUmodule*, const void*);
    CUresult (*cuModuleUnload)(CUmodule);
    CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, CUstream, void**, void**);
    CUresult (*cuGetErrorName)(CUresult, const char**);
    CUresult (*cuGraphCreate)(void**, unsigned);  // a stub
    int (*kvb_sim_cuda_fail)(const char*, unsigned, int);
};

const Api& api() {
    static Api a = [] {
        Api a{};
        const char* path = std::getenv("KVB_SIM_CUDA_LIBRARY");
        void* h = path ? dlopen(path, RTLD_NOW | RTLD_GLOBAL) : nullptr;
        if (!h) {
            std::fprintf(stderr, "KVB_SIM_CUDA_LIBRARY must name the simulated libcuda.so\n");
            std::abort();
        }
        auto sym = [&](auto& fn, const char* name) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
            if (!fn) {
                std::fprintf(stderr, "missing %s\n", name);
                std::abort();
            }
        };
#define SYM(n) sym(a.n, #n)
        SYM(cuInit);
        SYM(cuDriverGetVersion);
        SYM(cuDeviceGet);
        SYM(cuDeviceGetAttribute);
        SYM(cuDevicePrimaryCtxRetain);
        SYM(cuDevicePrimaryCtxRelease_v2);
        SYM(cuCtxSetCurrent);
        SYM(cuCtxGetCurrent);
        SYM(cuCtxPushCurrent_v2);
        SYM(cuCtxPopCurrent_v2);
        SYM(cuCtxSynchronize);
        SYM(cuMemAlloc_v2);
        SYM(cuMemFree_v2);
        SYM(cuMemGetInfo_v2);
        SYM(cuMemHostAlloc);
        SYM(cuMemFreeHost);
        SYM(cuMemHostGetDevicePointer_v2);
        SYM(cuPointerGetAttribute);
        SYM(cuMemcpyHtoD_v2);
        SYM(cuMemcpyDtoH_v2);
        SYM(cuMemcpyHtoDAsync_v2);
        SYM(cuMemsetD8Async);
        SYM(cuStreamCreate);
        SYM(cuStreamDestroy_v2);
        SYM(cuStreamSynchronize);
        SYM(cuStreamWaitEvent);
        SYM(cuEventCreate);
        SYM(cuEventDestroy_v2);
        SYM(cuEventRecord);
        SYM(cuEventQuery);
        SYM(cuEventSynchronize);
        SYM(cuModuleLoadData);
        SYM(cuModuleUnload);
        SYM(cuModuleGetFunction);
        SYM(cuLaunchKernel);
        SYM(cuGetErrorName);
        SYM(cuGraphCreate);
        SYM(kvb_sim_cuda_fail);
#undef SYM
        return a;
    }();
    return a;
}

bool deferred() {
    const char* m = std::getenv("KVB_SIM_CUDA_MODE");
    return m && std::string(m) == "deferred";
}

// Result codes.
constexpr CUresult kOk = 0, kInvalidValue = 1, kOutOfMemory = 2, kInvalidImage = 200,
                   kInvalidContext = 201, kNoBinaryForGpu = 209, kNotFound = 500, kNotReady = 600,
                   kNotSupported = 801;

#define CU(call) ASSERT_EQ((call), kOk) << #call

// A minimal CUBIN: a 64-bit EM_CUDA ELF for sm_`arch` whose symbol table names `kernel`.
std::vector<uint8_t> cubin(const char* kernel, int arch = 90, uint16_t machine = 190) {
    std::string strtab = std::string("\0", 1) + kernel + std::string("\0", 1);
    const size_t strOff = 64, symOff = (strOff + strtab.size() + 7) & ~size_t(7);
    const size_t shOff = symOff + 48;
    std::vector<uint8_t> img(shOff + 3 * 64, 0);
    auto put = [&](size_t at, auto v) { std::memcpy(img.data() + at, &v, sizeof v); };
    std::memcpy(img.data(),
                "\x7f"
                "ELF",
                4);
    img[4] = 2;     // 64-bit
    img[5] = 1;     // little-endian
    img[6] = 1;     // version
    img[7] = 0x41;  // CUDA OS ABI
    img[8] = 8;     // ABI version: the architecture in e_flags bits 8..15
    put(16, uint16_t(2));
    put(18, machine);
    put(20, uint32_t(1));
    put(40, uint64_t(shOff));
    put(48, uint32_t(arch << 8));
    put(52, uint16_t(64));
    put(58, uint16_t(64));
    put(60, uint16_t(3));
    std::memcpy(img.data() + strOff, strtab.data(), strtab.size());
    put(symOff + 24, uint32_t(1));  // st_name
    img[symOff + 24 + 4] = 0x12;    // STB_GLOBAL, STT_FUNC
    size_t sym = shOff + 64, str = shOff + 128;
    put(sym + 4, uint32_t(2));  // SHT_SYMTAB
    put(sym + 24, uint64_t(symOff));
    put(sym + 32, uint64_t(48));
    put(sym + 40, uint32_t(2));  // link: the string table
    put(sym + 56, uint64_t(24));
    put(str + 4, uint32_t(3));  // SHT_STRTAB
    put(str + 24, uint64_t(strOff));
    put(str + 32, uint64_t(strtab.size()));
    return img;
}

struct Descriptor {
    uint64_t src, dst, chunk_bytes, chunk_stride;
    uint32_t num_chunks, flags;
};
static_assert(sizeof(Descriptor) == 40, "kvb_copy_descriptor");

class SimCudaTest : public ::testing::Test {
  protected:
    void SetUp() override {
        const Api& a = api();
        CU(a.cuInit(0));
        int dev = -1;
        CU(a.cuDeviceGet(&dev, 0));
        CU(a.cuDevicePrimaryCtxRetain(&ctx, dev));
        CU(a.cuCtxSetCurrent(ctx));
        CU(a.cuStreamCreate(&stream, 1));
    }
    void TearDown() override {
        const Api& a = api();
        if (function) a.cuModuleUnload(module);
        for (void* p : pinned) a.cuMemFreeHost(p);
        for (CUdeviceptr d : device) a.cuMemFree_v2(d);
        if (stream) a.cuStreamDestroy_v2(stream);
        a.cuDevicePrimaryCtxRelease_v2(0);
    }
    CUdeviceptr alloc(size_t n) {
        CUdeviceptr d = 0;
        EXPECT_EQ(api().cuMemAlloc_v2(&d, n), kOk);
        device.push_back(d);
        return d;
    }
    uint8_t* hostAlloc(size_t n) {
        void* p = nullptr;
        EXPECT_EQ(api().cuMemHostAlloc(&p, n, 0x2), kOk);
        pinned.push_back(p);
        return static_cast<uint8_t*>(p);
    }
    void loadKernel() {
        std::vector<uint8_t> image = cubin("kvb_copy_blocks");
        ASSERT_EQ(api().cuModuleLoadData(&module, image.data()), kOk);
        ASSERT_EQ(api().cuModuleGetFunction(&function, module, "kvb_copy_blocks"), kOk);
    }
    CUresult launch(const Descriptor* d, unsigned n, CUstream s, unsigned grid = 3) {
        CUdeviceptr descriptors = reinterpret_cast<CUdeviceptr>(d);
        unsigned num = n, slices = 2;
        void* params[] = {&descriptors, &num, &slices};
        return api().cuLaunchKernel(function, grid, 1, 1, 64, 1, 1, 0, s, params, nullptr);
    }
    static Descriptor row(uint64_t src, uint64_t dst, uint64_t bytes) {
        return Descriptor{src, dst, bytes, bytes, 1, (src | dst | bytes) % 16 == 0 ? 1u : 0u};
    }
    CUcontext ctx = nullptr;
    CUstream stream = nullptr;
    CUmodule module = nullptr;
    CUfunction function = nullptr;
    std::vector<void*> pinned;
    std::vector<CUdeviceptr> device;
};

TEST(SimCudaBasics, VersionStubsAndErrorNames) {
    const Api& a = api();
    int v = 0;
    CU(a.cuDriverGetVersion(&v));
    EXPECT_GE(v, 12040);
    const char* name = nullptr;
    CU(a.cuGetErrorName(kInvalidContext, &name));
    EXPECT_STREQ(name, "CUDA_ERROR_INVALID_CONTEXT");
    void* graph = nullptr;
    EXPECT_EQ(a.cuGraphCreate(&graph, 0), kNotSupported);  // exported, not simulated
}

TEST_F(SimCudaTest, CallsNeedInitAndACurrentContextOnTheCallingThread) {
    const Api& a = api();
    CUresult other = -1, afterSet = -1;
    std::thread([&] {
        CUdeviceptr d = 0;
        other = a.cuMemAlloc_v2(&d, 64);
        a.cuCtxSetCurrent(ctx);
        afterSet = a.cuMemAlloc_v2(&d, 64);
        a.cuMemFree_v2(d);
    }).join();
    EXPECT_EQ(other, kInvalidContext);
    EXPECT_EQ(afterSet, kOk);
    // Push and pop nest on the thread's stack.
    CUcontext popped = nullptr, current = nullptr;
    CU(a.cuCtxPushCurrent_v2(ctx));
    CU(a.cuCtxPopCurrent_v2(&popped));
    EXPECT_EQ(popped, ctx);
    CU(a.cuCtxGetCurrent(&current));
    EXPECT_EQ(current, ctx);
    int major = 0, sms = 0;
    CU(a.cuDeviceGetAttribute(&major, 75, 0));
    CU(a.cuDeviceGetAttribute(&sms, 16, 0));
    EXPECT_GE(major, 8);
    EXPECT_GT(sms, 0);
}

TEST_F(SimCudaTest, MemoryIsBoundedAndPinnedMemoryHasOneAddress) {
    const Api& a = api();
    size_t freeBytes = 0, total = 0;
    CU(a.cuMemGetInfo_v2(&freeBytes, &total));
    CUdeviceptr d = 0;
    EXPECT_EQ(a.cuMemAlloc_v2(&d, total + 1), kOutOfMemory);
    CUdeviceptr small = alloc(4096);
    uint8_t* p = hostAlloc(4096);
    CUdeviceptr mapped = 0;
    CU(a.cuMemHostGetDevicePointer_v2(&mapped, p + 16, 0));
    EXPECT_EQ(mapped, reinterpret_cast<CUdeviceptr>(p + 16));
    unsigned type = 0;
    CU(a.cuPointerGetAttribute(&type, 2, small + 100));
    EXPECT_EQ(type, 2u);  // CU_MEMORYTYPE_DEVICE
    CU(a.cuPointerGetAttribute(&type, 2, reinterpret_cast<CUdeviceptr>(p)));
    EXPECT_EQ(type, 1u);  // CU_MEMORYTYPE_HOST
    int pageable = 0;
    EXPECT_EQ(a.cuPointerGetAttribute(&type, 2, reinterpret_cast<CUdeviceptr>(&pageable)),
              kInvalidValue);
    // Fault injection: the next allocation fails.
    a.kvb_sim_cuda_fail("cuMemAlloc_v2", 1, 0);
    EXPECT_EQ(a.cuMemAlloc_v2(&d, 64), kOutOfMemory);
}

TEST_F(SimCudaTest, DeviceMemoryFaultsOnTheHost) {
    CUdeviceptr d = alloc(4096);
    EXPECT_DEATH({ std::printf("%d", *reinterpret_cast<volatile uint8_t*>(d)); },
                 "dereferenced simulated device address");
}

TEST_F(SimCudaTest, NeverRecordedEventsAreComplete) {
    const Api& a = api();
    CUevent e = nullptr;
    CU(a.cuEventCreate(&e, 2));
    EXPECT_EQ(a.cuEventQuery(e), kOk);
    CU(a.cuEventSynchronize(e));
    CU(a.cuStreamWaitEvent(stream, e, 0));
    CU(a.cuStreamSynchronize(stream));
    CU(a.cuEventDestroy_v2(e));
}

TEST_F(SimCudaTest, ModulesAreCubinsForThisDevice) {
    const Api& a = api();
    CUmodule m = nullptr;
    const char ptx[] = "//\n.version 8.0\n.target sm_90\n";
    EXPECT_EQ(a.cuModuleLoadData(&m, ptx), kInvalidImage);
    EXPECT_EQ(a.cuModuleLoadData(&m, cubin("kvb_copy_blocks", 90, 62).data()), kInvalidImage);
    EXPECT_EQ(a.cuModuleLoadData(&m, cubin("kvb_copy_blocks", 100).data()), kNoBinaryForGpu);
    loadKernel();
    CUfunction f = nullptr;
    EXPECT_EQ(a.cuModuleGetFunction(&f, module, "other_kernel"), kNotFound);
}

TEST_F(SimCudaTest, TheKernelCopiesRowsBetweenDeviceAndPinnedMemory) {
    loadKernel();
    const Api& a = api();
    constexpr size_t kRow = 4096 + 32;
    uint8_t* host = hostAlloc(3 * kRow);
    for (size_t i = 0; i < 3 * kRow; ++i) host[i] = static_cast<uint8_t>(i * 7 + 1);
    CUdeviceptr gpu = alloc(3 * kRow);
    Descriptor* d = reinterpret_cast<Descriptor*>(hostAlloc(3 * sizeof(Descriptor)));
    auto h = [&](size_t r) { return reinterpret_cast<uint64_t>(host) + r * kRow; };
    d[0] = row(h(0), gpu + 2 * kRow, kRow);
    d[1] = row(h(2), gpu, kRow);
    d[2] = Descriptor{h(1) + 1, gpu + kRow + 1, 100, 200, 3, 0};  // byte path, 3 chunks
    ASSERT_EQ(launch(d, 3, stream), kOk);
    CU(a.cuStreamSynchronize(stream));
    std::vector<uint8_t> back(3 * kRow);
    CU(a.cuMemcpyDtoH_v2(back.data(), gpu, back.size()));
    EXPECT_EQ(std::memcmp(back.data() + 2 * kRow, host, kRow), 0);
    EXPECT_EQ(std::memcmp(back.data(), host + 2 * kRow, kRow), 0);
    for (size_t k = 0; k < 3; ++k)
        EXPECT_EQ(std::memcmp(back.data() + kRow + 1 + k * 200, host + kRow + 1 + k * 200, 100), 0);
}

// ---- Each check bites --------------------------------------------------------------------------
TEST_F(SimCudaTest, OverlappingDescriptorsAbort) {
    loadKernel();
    CUdeviceptr gpu = alloc(8192);
    Descriptor* d = reinterpret_cast<Descriptor*>(hostAlloc(2 * sizeof(Descriptor)));
    d[0] = row(gpu, gpu + 4096, 4096);
    d[1] = row(gpu + 4096, gpu, 16);  // reads what descriptor 0 writes
    EXPECT_DEATH(launch(d, 2, stream), "launch #[0-9]+ .*destination may not overlap a source");
}

TEST_F(SimCudaTest, MisalignedVectorCopiesAbort) {
    loadKernel();
    CUdeviceptr gpu = alloc(8192);
    Descriptor* d = reinterpret_cast<Descriptor*>(hostAlloc(sizeof(Descriptor)));
    d[0] = Descriptor{gpu + 8, gpu + 4096, 64, 64, 1, 1};
    EXPECT_DEATH(launch(d, 1, stream), "vector path .* not a multiple of 16");
}

TEST_F(SimCudaTest, CopiesOutsideAnAllocationAbort) {
    loadKernel();
    CUdeviceptr gpu = alloc(4096);
    Descriptor* d = reinterpret_cast<Descriptor*>(hostAlloc(sizeof(Descriptor)));
    d[0] = row(gpu, gpu + 2048, 4096);
    EXPECT_DEATH(launch(d, 1, stream), "destination .* not inside its allocation");
}

TEST_F(SimCudaTest, UnorderedStreamsAbortNamingBothOperations) {
    loadKernel();
    const Api& a = api();
    CUstream other = nullptr;
    CU(a.cuStreamCreate(&other, 1));
    CUdeviceptr gpu = alloc(8192);
    Descriptor* d = reinterpret_cast<Descriptor*>(hostAlloc(sizeof(Descriptor)));
    d[0] = row(gpu, gpu + 4096, 4096);
    CU(a.cuMemsetD8Async(gpu, 7, 4096, stream));
    // The kernel on `other` reads what the memset on `stream` writes, with no event between.
    EXPECT_DEATH(
        launch(d, 1, other),
        "ordering violation: launch #[0-9]+ .* reads .*which cuMemsetD8 #[0-9]+ .* writes");
    // With the event, it is ordered.
    CUevent e = nullptr;
    CU(a.cuEventCreate(&e, 2));
    CU(a.cuEventRecord(e, stream));
    CU(a.cuStreamWaitEvent(other, e, 0));
    ASSERT_EQ(launch(d, 1, other), kOk);
    CU(a.cuStreamSynchronize(other));
    CU(a.cuEventDestroy_v2(e));
    CU(a.cuStreamDestroy_v2(other));
}

TEST_F(SimCudaTest, ADescriptorBufferReusedBeforeItsEventAborts) {
    loadKernel();
    const Api& a = api();
    CUdeviceptr gpu = alloc(3 * 4096);
    Descriptor* d = reinterpret_cast<Descriptor*>(hostAlloc(sizeof(Descriptor)));
    d[0] = row(gpu, gpu + 4096, 4096);
    ASSERT_EQ(launch(d, 1, stream), kOk);
    CUevent done = nullptr;
    CU(a.cuEventCreate(&done, 2));
    CU(a.cuEventRecord(done, stream));
    // Seen at the next launch (every mode; in delayed mode the kernel may run between the rewrite
    // and that launch, and sees it first) ...
    EXPECT_DEATH(
        {
            d[0] = row(gpu, gpu + 8192, 4096);
            launch(d, 1, stream);
        },
        "the host .* rewrote pinned memory .* which launch #[0-9]+ .* reads|"
        "descriptor buffer .* was rewritten between the launch and the kernel");
    // ... and when the kernel runs after the rewrite (deferred mode: it has not run yet).
    if (deferred()) {
        EXPECT_DEATH(
            {
                d[0] = row(gpu, gpu + 8192, 4096);
                a.cuStreamSynchronize(stream);
            },
            "launch #[0-9]+ .* descriptor buffer .* was rewritten between the launch and the "
            "kernel's execution");
    }
    // Waiting for the event first makes the reuse correct.
    CU(a.cuEventSynchronize(done));
    d[0] = row(gpu, gpu + 8192, 4096);
    ASSERT_EQ(launch(d, 1, stream), kOk);
    CU(a.cuStreamSynchronize(stream));
    CU(a.cuEventDestroy_v2(done));
}

// Deferred mode: work runs when the host waits for it (a repeated query counts); in the other
// modes the work completes by itself.
TEST_F(SimCudaTest, WorkRunsWhenWaitedFor) {
    const Api& a = api();
    CUdeviceptr gpu = alloc(4096);
    uint8_t* host = hostAlloc(4096);
    std::memset(host, 9, 4096);
    CU(a.cuMemcpyHtoDAsync_v2(gpu, host, 4096, stream));
    CUevent e = nullptr;
    CU(a.cuEventCreate(&e, 2));
    CU(a.cuEventRecord(e, stream));
    if (deferred()) {
        EXPECT_EQ(a.cuEventQuery(e), kNotReady);  // the first query runs nothing
        EXPECT_EQ(a.cuEventQuery(e), kOk);        // polling makes progress
    } else {
        while (a.cuEventQuery(e) == kNotReady) std::this_thread::yield();
    }
    std::vector<uint8_t> back(4096);
    CU(a.cuMemcpyDtoH_v2(back.data(), gpu, back.size()));
    EXPECT_EQ(std::memcmp(back.data(), host, 4096), 0);
    CU(a.cuEventDestroy_v2(e));
}

TEST_F(SimCudaTest, LeaksFailTheProcess) {
    EXPECT_EXIT(
        {
            CUdeviceptr d = 0;
            api().cuMemAlloc_v2(&d, 100);
            std::exit(0);
        },
        ::testing::ExitedWithCode(1), "still live at exit");
}

}  // namespace
