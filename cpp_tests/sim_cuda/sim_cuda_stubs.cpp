// Everything else of the driver API. cudarc 0.18 resolves every function of the driver's symbol set
// when it loads the library, so each one it lists and the simulator does not implement is exported
// as a stub answering CUDA_ERROR_NOT_SUPPORTED: the functions of CUDA 12.4 always, those new in
// 13.0 unless KVB_SIM_CUDA_12040_SYMBOLS builds the 12.4 library.
#include <cstdio>

#include "sim_cuda_internal.hpp"

using namespace kvb_sim;

// ---- Everything else of the driver API: stubs ----------------------------------------------------------
namespace {
CUresult notSimulated(const char* name) {
    std::fprintf(stderr, "sim-cuda: %s is not simulated (CUDA_ERROR_NOT_SUPPORTED)\n", name);
    return kNotSupported;
}
}  // namespace

#define KVB_SIM_STUB(name)          \
    KVB_EXPORT CUresult name() {    \
        return notSimulated(#name); \
    }
#define KVB_SIM_STUB_12040(name) KVB_SIM_STUB(name)
#ifdef KVB_SIM_CUDA_12040_SYMBOLS
#define KVB_SIM_STUB_13000(name)
#else
#define KVB_SIM_STUB_13000(name) KVB_SIM_STUB(name)
#endif
#include "sim_cuda_stubs.inc"
