// Entry points for memory: device allocations (a first-fit range allocator over the reserved device
// address space, bytes in the shadow), pinned host allocations, pointer attributes, and the copies
// and memsets, which are stream operations checked by the ordering layer.
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <iterator>

#include "sim_cuda_internal.hpp"

using namespace kvb_sim;

// ---- Memory --------------------------------------------------------------------------------------------
KVB_EXPORT CUresult cuMemGetInfo_v2(size_t* freeBytes, size_t* totalBytes) {
    ENTER("cuMemGetInfo_v2");
    NEED_CONTEXT();
    if (!freeBytes || !totalBytes) return kInvalidValue;
    *totalBytes = config().memory;
    *freeBytes = config().memory - s.deviceUsed;
    return kSuccess;
}

KVB_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
    ENTER("cuMemAlloc_v2");
    NEED_CONTEXT();
    if (!dptr || bytes == 0) return kInvalidValue;
    // Page granularity, and a guard page so neighbours are never adjacent.
    uint64_t need = ((bytes + 0xfff) & ~0xfffull) + 0x1000;
    for (auto it = s.freeRanges.begin(); it != s.freeRanges.end(); ++it) {
        if (it->second < need) continue;
        uint64_t off = it->first, left = it->second - need;
        s.freeRanges.erase(it);
        if (left) s.freeRanges[off + need] = left;
        Allocation a;
        a.kind = Kind::Device;
        a.base = s.deviceBase + off;
        a.size = bytes;
        a.reserved = need;
        a.id = s.nextAllocation++;
        a.origin = "cuMemAlloc_v2";
        // Fresh memory holds garbage on a GPU: small allocations get a pattern (large ones stay
        // zero, which costs nothing).
        if (bytes <= (1u << 20)) std::memset(s.shadow + off, 0xcd, bytes);
        s.deviceUsed += need;
        s.allocations[a.base] = a;
        *dptr = a.base;
        return kSuccess;
    }
    return kOutOfMemory;
}

KVB_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    ENTER("cuMemFree_v2");
    NEED_CONTEXT();
    if (dptr == 0) return kSuccess;
    auto it = s.allocations.find(dptr);
    if (it == s.allocations.end() || it->second.kind != Kind::Device) return kInvalidValue;
    // Like the driver, freeing waits for the device's work first.
    synchronizeAll(s, lock);
    it = s.allocations.find(dptr);
    if (it == s.allocations.end()) return kInvalidValue;
    Allocation a = it->second;
    s.allocations.erase(it);
    uint64_t off = a.base - s.deviceBase;
    madvise(s.shadow + off, a.reserved, MADV_DONTNEED);
    untrack(s, a.base, a.base + a.size);
    s.deviceUsed -= a.reserved;
    // Give the range back, merging with its neighbours.
    uint64_t lo = off, size = a.reserved;
    auto next = s.freeRanges.lower_bound(lo);
    if (next != s.freeRanges.end() && next->first == lo + size) {
        size += next->second;
        next = s.freeRanges.erase(next);
    }
    if (next != s.freeRanges.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == lo) {
            prev->second += size;
            return kSuccess;
        }
    }
    s.freeRanges[lo] = size;
    return kSuccess;
}

constexpr unsigned kHostAllocFlags = 0x1 | 0x2 | 0x4;  // PORTABLE | DEVICEMAP | WRITECOMBINED

KVB_EXPORT CUresult cuMemHostAlloc(void** pp, size_t bytes, unsigned flags) {
    ENTER("cuMemHostAlloc");
    NEED_CONTEXT();
    if (!pp || bytes == 0 || (flags & ~kHostAllocFlags)) return kInvalidValue;
    uint64_t need = (bytes + 0xfff) & ~0xfffull;
    if (need > config().hostMemory - std::min(config().hostMemory, s.hostUsed)) return kOutOfMemory;
    void* p = mmap(nullptr, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return kOutOfMemory;
    Allocation a;
    a.kind = Kind::Pinned;
    a.base = reinterpret_cast<uint64_t>(p);
    a.size = bytes;
    a.reserved = need;
    a.id = s.nextAllocation++;
    a.origin = "cuMemHostAlloc";
    s.hostUsed += need;
    s.allocations[a.base] = a;
    *pp = p;
    return kSuccess;
}

KVB_EXPORT CUresult cuMemAllocHost_v2(void** pp, size_t bytes) {
    // (cuMemHostAlloc with no flags.)
    return cuMemHostAlloc(pp, bytes, 0);
}

KVB_EXPORT CUresult cuMemFreeHost(void* p) {
    ENTER("cuMemFreeHost");
    NEED_CONTEXT();
    auto it = s.allocations.find(reinterpret_cast<uint64_t>(p));
    if (!p || it == s.allocations.end() || it->second.kind != Kind::Pinned) return kInvalidValue;
    synchronizeAll(s, lock);
    it = s.allocations.find(reinterpret_cast<uint64_t>(p));
    if (it == s.allocations.end()) return kInvalidValue;
    Allocation a = it->second;
    s.allocations.erase(it);
    untrack(s, a.base, a.base + a.size);
    s.hostUsed -= a.reserved;
    munmap(p, a.reserved);
    return kSuccess;
}

KVB_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* dptr, void* p, unsigned flags) {
    ENTER("cuMemHostGetDevicePointer_v2");
    NEED_CONTEXT();
    if (!dptr || flags != 0) return kInvalidValue;
    const Allocation* a = findAllocation(s, reinterpret_cast<uint64_t>(p), 0);
    if (!a || a->kind != Kind::Pinned) return kInvalidValue;
    *dptr = reinterpret_cast<uint64_t>(p);  // unified addressing: the same address
    return kSuccess;
}

KVB_EXPORT CUresult cuPointerGetAttribute(void* data, int attribute, CUdeviceptr ptr) {
    ENTER("cuPointerGetAttribute");
    NEED_INIT();
    if (!data) return kInvalidValue;
    const Allocation* a = findAllocation(s, ptr, 0);
    if (!a) return kInvalidValue;  // pageable host memory, or nothing
    switch (attribute) {
        case 1:
            *static_cast<CUcontext*>(data) = &s.primary;
            break;  // CONTEXT
        case 2:
            *static_cast<unsigned*>(data) = a->kind == Kind::Device ? 2 : 1;
            break;  // TYPE
        case 3:
            *static_cast<CUdeviceptr*>(data) = ptr;
            break;  // DEVICE_POINTER
        case 4:     // HOST_POINTER
            if (a->kind == Kind::Device) return kInvalidValue;
            *static_cast<void**>(data) = reinterpret_cast<void*>(ptr);
            break;
        case 8:
            *static_cast<unsigned*>(data) = 0;
            break;  // IS_MANAGED
        case 9:
            *static_cast<int*>(data) = 0;
            break;  // DEVICE_ORDINAL
        case 11:
            *static_cast<CUdeviceptr*>(data) = a->base;
            break;  // RANGE_START_ADDR
        case 12:
            *static_cast<size_t*>(data) = a->size;
            break;  // RANGE_SIZE
        case 13:
            *static_cast<unsigned*>(data) = 1;
            break;  // MAPPED
        default:
            return kInvalidValue;
    }
    return kSuccess;
}

// ---- Copies and sets --------------------------------------------------------------------------------
namespace {

enum class Copy { HtoD, DtoH };

// Enqueues a copy between host memory `host` and device-visible `dev` on `st`; `sync`: the host
// waits for it (a synchronous copy, or an async one to pageable memory).
CUresult copyOp(Sim& s, std::unique_lock<std::mutex>& lock, Stream* st, Copy dir, void* host,
                uint64_t dev, size_t bytes, bool syncCall, const char* name) {
    if (bytes == 0) return kSuccess;
    if (!host) return kInvalidValue;
    const Allocation* d = deviceRange(s, dev, bytes);
    if (!d) return kInvalidValue;
    const Allocation* h = findAllocation(s, reinterpret_cast<uint64_t>(host), bytes);
    if (h && h->kind != Kind::Pinned) h = nullptr;
    std::string what = std::string(name) + " #" + std::to_string(s.nextOp++) + " of " +
                       std::to_string(bytes) + " bytes";
    Clock clock;
    Access who = beginOp(s, st, what, clock);
    trackRange(s, *d, dev, bytes, dir == Copy::HtoD, who, clock);
    if (h)
        trackRange(s, *h, reinterpret_cast<uint64_t>(host), bytes, dir == Copy::DtoH, who, clock);
    uint8_t* dv = view(s, *d, dev);
    bool pageable = h == nullptr;
    if (dir == Copy::HtoD) {
        // Pageable sources are staged at the call (the driver's behaviour); pinned ones are read
        // when the copy runs, and must not have changed since the call.
        auto staged = std::make_shared<std::vector<uint8_t>>(
            static_cast<const uint8_t*>(host), static_cast<const uint8_t*>(host) + bytes);
        const uint8_t* src = static_cast<const uint8_t*>(host);
        auto desc = who.what;
        enqueue(s, st, [=] {
            if (!pageable && std::memcmp(src, staged->data(), bytes) != 0)
                die("the source of " + *desc +
                    " (pinned host memory) was modified between the call and the copy: the host "
                    "must wait for the copy (stream or event synchronization) before reusing it");
            std::memcpy(dv, staged->data(), bytes);
        });
    } else {
        uint8_t* dstp = static_cast<uint8_t*>(host);
        enqueue(s, st, [=] { std::memcpy(dstp, dv, bytes); });
    }
    if (syncCall || (pageable && dir == Copy::DtoH)) {
        uint64_t seq = st->enqueued;
        hostWait(s, lock, st, seq);
        s.host.join(clock);
    }
    return kSuccess;
}

}  // namespace

KVB_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes,
                                         CUstream hStream) {
    ENTER("cuMemcpyHtoDAsync_v2");
    NEED_CONTEXT();
    Stream* st = nullptr;
    if (CUresult rc = resolveStream(s, ctx, hStream, &st); rc != kSuccess) return rc;
    return copyOp(s, lock, st, Copy::HtoD, const_cast<void*>(src), dst, bytes, false,
                  "cuMemcpyHtoDAsync");
}

KVB_EXPORT CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes,
                                         CUstream hStream) {
    ENTER("cuMemcpyDtoHAsync_v2");
    NEED_CONTEXT();
    Stream* st = nullptr;
    if (CUresult rc = resolveStream(s, ctx, hStream, &st); rc != kSuccess) return rc;
    return copyOp(s, lock, st, Copy::DtoH, dst, src, bytes, false, "cuMemcpyDtoHAsync");
}

KVB_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
    ENTER("cuMemcpyHtoD_v2");
    NEED_CONTEXT();
    return copyOp(s, lock, legacyStream(s, ctx), Copy::HtoD, const_cast<void*>(src), dst, bytes,
                  true, "cuMemcpyHtoD");
}

KVB_EXPORT CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes) {
    ENTER("cuMemcpyDtoH_v2");
    NEED_CONTEXT();
    return copyOp(s, lock, legacyStream(s, ctx), Copy::DtoH, dst, src, bytes, true, "cuMemcpyDtoH");
}

namespace {
CUresult memsetOp(Sim& s, std::unique_lock<std::mutex>& lock, Stream* st, uint64_t dst,
                  unsigned char value, size_t bytes, bool syncCall) {
    if (bytes == 0) return kSuccess;
    const Allocation* d = deviceRange(s, dst, bytes);
    if (!d) return kInvalidValue;
    Clock clock;
    Access who = beginOp(
        s, st,
        "cuMemsetD8 #" + std::to_string(s.nextOp++) + " of " + std::to_string(bytes) + " bytes",
        clock);
    trackRange(s, *d, dst, bytes, true, who, clock);
    uint8_t* p = view(s, *d, dst);
    enqueue(s, st, [=] { std::memset(p, value, bytes); });
    if (syncCall) {
        hostWait(s, lock, st, st->enqueued);
        s.host.join(clock);
    }
    return kSuccess;
}
}  // namespace

KVB_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n,
                                    CUstream hStream) {
    ENTER("cuMemsetD8Async");
    NEED_CONTEXT();
    Stream* st = nullptr;
    if (CUresult rc = resolveStream(s, ctx, hStream, &st); rc != kSuccess) return rc;
    return memsetOp(s, lock, st, dst, value, n, false);
}

KVB_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n) {
    ENTER("cuMemsetD8_v2");
    NEED_CONTEXT();
    return memsetOp(s, lock, legacyStream(s, ctx), dst, value, n, true);
}
