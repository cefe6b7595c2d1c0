// Entry points for what exists before any memory or stream: error names, the driver version,
// cuInit, the one simulated device and its attributes, the primary context and the per-thread
// context stack.
#include <cstdio>

#include "sim_cuda_internal.hpp"

using namespace kvb_sim;

namespace {
struct ErrorText {
    CUresult code;
    const char* name;
    const char* text;
};
const ErrorText kErrors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {34, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU",
     "no kernel image is available for execution on the device"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {709, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};
}  // namespace

KVB_EXPORT CUresult cuGetErrorName(CUresult error, const char** pStr) {
    if (!pStr) return kInvalidValue;
    for (const ErrorText& e : kErrors) {
        if (e.code == error) {
            *pStr = e.name;
            return kSuccess;
        }
    }
    *pStr = nullptr;
    return kInvalidValue;
}

KVB_EXPORT CUresult cuGetErrorString(CUresult error, const char** pStr) {
    if (!pStr) return kInvalidValue;
    for (const ErrorText& e : kErrors) {
        if (e.code == error) {
            *pStr = e.text;
            return kSuccess;
        }
    }
    *pStr = nullptr;
    return kInvalidValue;
}

KVB_EXPORT CUresult cuDriverGetVersion(int* version) {
    if (!version) return kInvalidValue;
    *version = config().version;
    return kSuccess;
}

KVB_EXPORT CUresult cuInit(unsigned flags) {
    ENTER("cuInit");
    if (flags != 0) return kInvalidValue;
    s.cuInitDone = true;
    return kSuccess;
}

KVB_EXPORT CUresult cuDeviceGetCount(int* count) {
    ENTER("cuDeviceGetCount");
    NEED_INIT();
    if (!count) return kInvalidValue;
    *count = 1;
    return kSuccess;
}

KVB_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
    ENTER("cuDeviceGet");
    NEED_INIT();
    if (!device) return kInvalidValue;
    if (ordinal != 0) return kInvalidDevice;
    *device = 0;
    return kSuccess;
}

KVB_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
    ENTER("cuDeviceGetName");
    NEED_INIT();
    if (dev != 0) return kInvalidDevice;
    if (!name || len <= 0) return kInvalidValue;
    std::snprintf(name, static_cast<size_t>(len), "kvblock simulated GPU (sm_%d)", config().arch);
    return kSuccess;
}

KVB_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
    ENTER("cuDeviceTotalMem_v2");
    NEED_INIT();
    if (dev != 0) return kInvalidDevice;
    if (!bytes) return kInvalidValue;
    *bytes = config().memory;
    return kSuccess;
}

KVB_EXPORT CUresult cuDeviceGetAttribute(int* value, int attrib, CUdevice dev) {
    ENTER("cuDeviceGetAttribute");
    NEED_INIT();
    if (dev != 0) return kInvalidDevice;
    if (!value || attrib <= 0 || attrib > 200) return kInvalidValue;
    const Config& c = config();
    switch (attrib) {
        case 1:
            *value = 1024;
            break;  // MAX_THREADS_PER_BLOCK
        case 2:
        case 3:
            *value = 1024;
            break;  // MAX_BLOCK_DIM_X/Y
        case 4:
            *value = 64;
            break;  // MAX_BLOCK_DIM_Z
        case 5:
            *value = 2147483647;
            break;  // MAX_GRID_DIM_X
        case 6:
        case 7:
            *value = 65535;
            break;  // MAX_GRID_DIM_Y/Z
        case 8:
            *value = 48 * 1024;
            break;  // MAX_SHARED_MEMORY_PER_BLOCK
        case 10:
            *value = 32;
            break;  // WARP_SIZE
        case 16:
            *value = c.sms;
            break;  // MULTIPROCESSOR_COUNT
        case 19:
            *value = 1;
            break;  // CAN_MAP_HOST_MEMORY
        case 41:
            *value = 1;
            break;  // UNIFIED_ADDRESSING
        case 75:
            *value = c.arch / 10;
            break;  // COMPUTE_CAPABILITY_MAJOR
        case 76:
            *value = c.arch % 10;
            break;  // COMPUTE_CAPABILITY_MINOR
        default:
            *value = 0;
            break;
    }
    return kSuccess;
}

KVB_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
    ENTER("cuDevicePrimaryCtxRetain");
    NEED_INIT();
    if (dev != 0) return kInvalidDevice;
    if (!pctx) return kInvalidValue;
    ++s.primary.refs;
    *pctx = &s.primary;
    return kSuccess;
}

KVB_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    ENTER("cuDevicePrimaryCtxRelease_v2");
    NEED_INIT();
    if (dev != 0) return kInvalidDevice;
    if (s.primary.refs <= 0) return kInvalidContext;
    --s.primary.refs;
    return kSuccess;
}

KVB_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    ENTER("cuCtxSetCurrent");
    NEED_INIT();
    if (ctx && ctx != &s.primary) return kInvalidContext;
    if (ctx == nullptr) {
        if (!t_contexts.empty()) t_contexts.pop_back();
    } else if (t_contexts.empty()) {
        t_contexts.push_back(ctx);
    } else {
        t_contexts.back() = ctx;
    }
    return kSuccess;
}

KVB_EXPORT CUresult cuCtxGetCurrent(CUcontext* pctx) {
    ENTER("cuCtxGetCurrent");
    NEED_INIT();
    if (!pctx) return kInvalidValue;
    *pctx = t_contexts.empty() ? nullptr : t_contexts.back();
    return kSuccess;
}

KVB_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    ENTER("cuCtxPushCurrent_v2");
    NEED_INIT();
    if (ctx != &s.primary) return kInvalidContext;
    t_contexts.push_back(ctx);
    return kSuccess;
}

KVB_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
    ENTER("cuCtxPopCurrent_v2");
    NEED_INIT();
    if (t_contexts.empty()) return kInvalidContext;
    if (pctx) *pctx = t_contexts.back();
    t_contexts.pop_back();
    return kSuccess;
}

KVB_EXPORT CUresult cuCtxSynchronize() {
    ENTER("cuCtxSynchronize");
    NEED_CONTEXT();
    synchronizeAll(s, lock);
    return kSuccess;
}
