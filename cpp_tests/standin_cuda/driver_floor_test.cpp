// Which CUDA drivers kvblock loads, proved without a GPU: each build of this test loads one
// stand-in driver library (standin_cuda.c) reporting STANDIN_CUDA_DRIVER_VERSION and exporting
// only six pre-CUDA-13.0 entry points, then creates a KVB_COPY_BACKEND_CUDA manager.
//
// - 11080 (CUDA 11.8, older than the 12.4 kvblock needs): KVB_STATUS_UNSUPPORTED with the
//   version found and the version needed, before cuInit.
// - 12040 (CUDA 12.4, the oldest supported): the driver loads although it lacks every CUDA 13.0
//   function (cudarc resolves functions when first called), and creation fails only later, for
//   want of a device.
//
// One stand-in per process (the loader keeps the first library named libcuda.so), hence one
// executable per version. The stand-in is loaded by its path before kvblock touches CUDA; its
// SONAME, libcuda.so, is the first name cudarc asks for, so it wins even over a real driver.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "kvblock.h"
#include "kvblock.hpp"
#include "../test_support.hpp"

#ifndef STANDIN_CUDA_PATH
#error "STANDIN_CUDA_PATH must name the stand-in driver library"
#endif
#ifndef STANDIN_CUDA_DRIVER_VERSION
#error "STANDIN_CUDA_DRIVER_VERSION must be the stand-in's version (e.g. 12040)"
#endif

namespace {

// The stand-in, loaded once per process, and its call counters.
struct Standin {
    void* handle = nullptr;
    const int* initCalls = nullptr;
    const int* versionCalls = nullptr;

    static const Standin& get() {
        static Standin s = [] {
            Standin r;
            r.handle = dlopen(STANDIN_CUDA_PATH, RTLD_NOW | RTLD_GLOBAL);
            if (r.handle) {
                r.initCalls = static_cast<const int*>(dlsym(r.handle, "standin_cuda_init_calls"));
                r.versionCalls =
                    static_cast<const int*>(dlsym(r.handle, "standin_cuda_version_calls"));
            }
            return r;
        }();
        return s;
    }
};

// Loads the stand-in (failing the test if it cannot) and checks that the name cudarc asks for
// first now resolves to it.
void loadStandin() {
    const Standin& s = Standin::get();
    ASSERT_NE(s.handle, nullptr) << dlerror();
    ASSERT_NE(s.initCalls, nullptr);
    ASSERT_NE(s.versionCalls, nullptr);
    void* byName = dlopen("libcuda.so", RTLD_NOW | RTLD_NOLOAD);
    ASSERT_EQ(byName, s.handle) << "libcuda.so does not resolve to the stand-in";
    dlclose(byName);
}

kvb::Config cudaConfig() {
    kvb::Config c;
    c.addWindow(64, 4, 4, 1, 1, 8);
    c.raw.tokens_per_block = 16;
    c.raw.max_sequence_length = 64;
    c.raw.bytes_per_element = 2;
    c.raw.copy_backend = KVB_COPY_BACKEND_CUDA;
    return c;
}

// Creates a CUDA manager, which must fail with `expected`; returns the message.
std::string createFails(kvb_status_t expected) {
    kvb::Config c = cudaConfig();
    kvb_manager_config_t raw = kvb_test::rawConfig(c);
    kvb_manager_t* m = reinterpret_cast<kvb_manager_t*>(0x1);
    EXPECT_EQ(kvb_manager_create(&raw, &m), expected);
    EXPECT_EQ(m, nullptr);
    std::string message = kvb_last_error_message();
    std::cout << "kvb_manager_create: " << message << "\n";
    return message;
}

}  // namespace

#if STANDIN_CUDA_DRIVER_VERSION == 11080

TEST(CudaDriverFloor, Driver11080IsRefusedWithTheVersionFoundAndNeeded) {
    ASSERT_NO_FATAL_FAILURE(loadStandin());
    const Standin& s = Standin::get();
    std::string message = createFails(KVB_STATUS_UNSUPPORTED);
    EXPECT_NE(message.find("CUDA driver 11.8 (11080) found; kvblock needs 12.4 (12040) or newer"),
              std::string::npos)
        << message;
    EXPECT_EQ(message.find("no CUDA driver library"), std::string::npos) << message;
    EXPECT_GE(*s.versionCalls, 1) << "the version was not asked of the stand-in";
    EXPECT_EQ(*s.initCalls, 0) << "cuInit was called on a driver below the floor";

    // The probe of the C API says the same: a driver is there, but not one kvblock can use.
    bool available = true;
    ASSERT_EQ(kvb_cuda_libraries_available(&available), KVB_OK);
    EXPECT_FALSE(available);
    // Asking again changes nothing (no state left behind by the refusal).
    std::string again = createFails(KVB_STATUS_UNSUPPORTED);
    EXPECT_EQ(again, message);
}

#elif STANDIN_CUDA_DRIVER_VERSION == 12040

TEST(CudaDriverFloor, Driver12040WithoutCuda13SymbolsLoadsAndLacksOnlyADevice) {
    ASSERT_NO_FATAL_FAILURE(loadStandin());
    const Standin& s = Standin::get();
    std::string message = createFails(KVB_STATUS_UNSUPPORTED);
    EXPECT_NE(message.find("no CUDA device on this machine"), std::string::npos) << message;
    EXPECT_EQ(message.find("no CUDA driver library"), std::string::npos) << message;
    EXPECT_EQ(message.find("kvblock needs"), std::string::npos) << message;
    EXPECT_EQ(message.find("lacks the function"), std::string::npos) << message;
    EXPECT_GE(*s.versionCalls, 1);
    EXPECT_GE(*s.initCalls, 1) << "the driver was not initialized";
}

#else
#error "no test for this STANDIN_CUDA_DRIVER_VERSION"
#endif
