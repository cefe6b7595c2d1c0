/* A minimal stand-in for the CUDA driver library, for the driver-version tests only
 * (driver_floor_test.cpp): it exports the six entry points kvblock calls before it needs a
 * device, plus two call counters, and nothing else, so a test process that loads it sees a
 * driver of STANDIN_CUDA_DRIVER_VERSION (a CMake build variant: 12040 or 11080) without a GPU
 * and without any CUDA 13.0 symbol. Not a simulated driver: it has no device, memory or
 * streams.
 *
 * Linked with the SONAME libcuda.so: once a test has dlopen'ed it by its path, glibc hands it
 * out for the name `libcuda.so`, the first one cudarc asks for. */
#include <stddef.h>

#ifndef STANDIN_CUDA_DRIVER_VERSION
#error "STANDIN_CUDA_DRIVER_VERSION must be defined (e.g. 12040)"
#endif

#define STANDIN_EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
};

/* How often kvblock called cuInit and cuDriverGetVersion here: proof that the calls reached the
 * stand-in, and in which order. */
STANDIN_EXPORT int standin_cuda_init_calls = 0;
STANDIN_EXPORT int standin_cuda_version_calls = 0;

static int initialized = 0;

STANDIN_EXPORT CUresult cuDriverGetVersion(int* version) {
    standin_cuda_version_calls++;
    if (version == NULL) return CUDA_ERROR_INVALID_VALUE;
    *version = STANDIN_CUDA_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuInit(unsigned int flags) {
    standin_cuda_init_calls++;
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    initialized = 1;
    return CUDA_SUCCESS;
}

/* A machine whose driver has no device. */
STANDIN_EXPORT CUresult cuDeviceGetCount(int* count) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (count == NULL) return CUDA_ERROR_INVALID_VALUE;
    *count = 0;
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
    (void)ordinal;
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_ERROR_INVALID_DEVICE;
}

static const char* error_name(CUresult error) {
    switch (error) {
        case CUDA_SUCCESS:
            return "CUDA_SUCCESS";
        case CUDA_ERROR_INVALID_VALUE:
            return "CUDA_ERROR_INVALID_VALUE";
        case CUDA_ERROR_NOT_INITIALIZED:
            return "CUDA_ERROR_NOT_INITIALIZED";
        case CUDA_ERROR_INVALID_DEVICE:
            return "CUDA_ERROR_INVALID_DEVICE";
        default:
            return NULL;
    }
}

static const char* error_string(CUresult error) {
    switch (error) {
        case CUDA_SUCCESS:
            return "no error";
        case CUDA_ERROR_INVALID_VALUE:
            return "invalid argument";
        case CUDA_ERROR_NOT_INITIALIZED:
            return "initialization error";
        case CUDA_ERROR_INVALID_DEVICE:
            return "invalid device ordinal";
        default:
            return NULL;
    }
}

STANDIN_EXPORT CUresult cuGetErrorName(CUresult error, const char** name) {
    if (name == NULL) return CUDA_ERROR_INVALID_VALUE;
    *name = error_name(error);
    return *name ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

STANDIN_EXPORT CUresult cuGetErrorString(CUresult error, const char** text) {
    if (text == NULL) return CUDA_ERROR_INVALID_VALUE;
    *text = error_string(error);
    return *text ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
