// cuLaunchKernel: runs kernels/block_copy.cu, compiled here for the CPU, on the stream's worker,
// CTAs in shuffled order, after checking every copy descriptor of the launch. The kernel source is
// included in this file alone, so its CUDA-isms (`__global__`, `blockIdx`) stay out of the others.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "sim_cuda_internal.hpp"

// ---- The copy kernel, compiled for the CPU ------------------------------------------------------
namespace kvbk {
struct uint4 {
    unsigned int x, y, z, w;
};
struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};
// Per worker thread: several streams run kernels at once.
thread_local dim3 blockIdx, threadIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#include "../../kernels/block_copy.cu"
#undef __global__
#undef __device__
#undef __forceinline__
}  // namespace kvbk

using namespace kvb_sim;

namespace {

// ---- The copy kernel's launches -----------------------------------------------------------------
using Descriptor = kvbk::kvb_copy_descriptor;
static_assert(sizeof(Descriptor) == 40, "the layout of src/cuda/plan.rs");

struct Interval {
    uint64_t lo, hi;
    bool write;
    unsigned copy;
};

// Checks the descriptors of a launch; fills `intervals` with every chunk read and written.
void checkDescriptors(Sim& s, const std::string& launch, const Descriptor* d, unsigned n,
                      std::vector<Interval>& intervals) {
    intervals.clear();
    for (unsigned i = 0; i < n; ++i) {
        const Descriptor& c = d[i];
        std::string which = launch + ", descriptor " + std::to_string(i);
        if (c.num_chunks == 0 || c.chunk_bytes == 0) continue;
        if (c.num_chunks > 1 && c.chunk_stride < c.chunk_bytes)
            die(which + ": chunks of " + std::to_string(c.chunk_bytes) + " bytes overlap (stride " +
                std::to_string(c.chunk_stride) + ")");
        uint64_t span = (uint64_t(c.num_chunks) - 1) * c.chunk_stride + c.chunk_bytes;
        for (int side = 0; side < 2; ++side) {
            uint64_t base = side ? c.dst : c.src;
            if (!findAllocation(s, base, span)) {
                const Allocation* a = findAllocation(s, base, 0);
                die(which + ": the " + (side ? "destination" : "source") + " [" +
                    describeAddress(s, base) + ", +" + std::to_string(span) + " bytes) is " +
                    (a ? "not inside its allocation" : "in no live allocation"));
            }
        }
        if ((c.flags & 1u) && ((c.src | c.dst | c.chunk_bytes | c.chunk_stride) % 16) != 0)
            die(which +
                ": the vector path (flags bit 0) with an address or size that is not a "
                "multiple of 16 bytes (src " +
                describeAddress(s, c.src) + ", dst " + describeAddress(s, c.dst) + ", chunk " +
                std::to_string(c.chunk_bytes) + ", stride " + std::to_string(c.chunk_stride) +
                "): a misaligned access on the GPU");
        for (unsigned k = 0; k < c.num_chunks; ++k) {
            uint64_t off = uint64_t(k) * c.chunk_stride;
            intervals.push_back({c.src + off, c.src + off + c.chunk_bytes, false, i});
            intervals.push_back({c.dst + off, c.dst + off + c.chunk_bytes, true, i});
        }
    }
    std::sort(intervals.begin(), intervals.end(),
              [](const Interval& a, const Interval& b) { return a.lo < b.lo; });
    const Interval* maxWrite = nullptr;
    const Interval* maxRead = nullptr;
    for (const Interval& iv : intervals) {
        const Interval* clash = nullptr;
        if (maxWrite && maxWrite->hi > iv.lo) clash = maxWrite;
        if (!clash && iv.write && maxRead && maxRead->hi > iv.lo) clash = maxRead;
        if (clash) {
            die(launch + ": descriptor " + std::to_string(iv.copy) + " " +
                (iv.write ? "writes" : "reads") + " " + describeAddress(s, iv.lo) +
                ", which descriptor " + std::to_string(clash->copy) + " " +
                (clash->write ? "writes" : "reads") +
                " in the same launch: CTAs run in no order, so a destination may not overlap a "
                "source or another destination");
        }
        const Interval*& m = iv.write ? maxWrite : maxRead;
        if (!m || iv.hi > m->hi) m = &iv;
    }
}

void runKernel(const Descriptor* d, unsigned num, unsigned slices, unsigned grid, unsigned block,
               uint64_t seed) {
    std::vector<unsigned> order(grid);
    for (unsigned i = 0; i < grid; ++i) order[i] = i;
    std::mt19937_64 rng(seed);
    std::shuffle(order.begin(), order.end(), rng);
    kvbk::gridDim = kvbk::dim3{grid, 1, 1};
    kvbk::blockDim = kvbk::dim3{block, 1, 1};
    for (unsigned b : order) {
        kvbk::blockIdx = kvbk::dim3{b, 0, 0};
        for (unsigned t = 0; t < block; ++t) {
            kvbk::threadIdx = kvbk::dim3{t, 0, 0};
            kvbk::kvb_copy_blocks(d, num, slices);
        }
    }
}
}  // namespace

// ---- Launches ------------------------------------------------------------------------------------------
KVB_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gridX, unsigned gridY, unsigned gridZ,
                                   unsigned blockX, unsigned blockY, unsigned blockZ,
                                   unsigned sharedMem, CUstream hStream, void** kernelParams,
                                   void** extra) {
    ENTER("cuLaunchKernel");
    NEED_CONTEXT();
    auto* fn = static_cast<std::pair<Module*, std::string>*>(f);
    bool live = false;
    for (auto& [p, m] : s.modules) {
        for (auto& g : m->functions) live = live || &g == fn;
    }
    if (!fn || !live) return kInvalidHandle;
    if (!gridX || !gridY || !gridZ || !blockX || !blockY || !blockZ) return kInvalidValue;
    if (uint64_t(blockX) * blockY * blockZ > 1024 || sharedMem > 48 * 1024) return kInvalidValue;
    if (gridY != 1 || gridZ != 1 || blockY != 1 || blockZ != 1) return kNotSupported;
    if (!kernelParams || extra) return kInvalidValue;
    Stream* st = nullptr;
    if (CUresult rc = resolveStream(s, ctx, hStream, &st); rc != kSuccess) return rc;
    // The arguments are copied now (the caller's variables may change right after).
    uint64_t descriptors = *static_cast<const uint64_t*>(kernelParams[0]);
    unsigned num = *static_cast<const unsigned*>(kernelParams[1]);
    unsigned slices = *static_cast<const unsigned*>(kernelParams[2]);
    uint64_t launchId = s.nextLaunch++;
    char name[200];
    std::snprintf(name, sizeof name,
                  "launch #%llu (kvb_copy_blocks<<<%u, %u>>>, %u copies, %u slices each)",
                  (unsigned long long)launchId, gridX, blockX, num, slices);
    Clock clock;
    Access who = beginOp(s, st, name, clock);
    const std::string launch = *who.what;
    if (num == 0) {
        enqueue(s, st, nullptr);
        return kSuccess;
    }
    if (slices == 0) die(launch + ": slices_per_copy is 0 (the kernel divides by it)");
    uint64_t bytes = uint64_t(num) * sizeof(Descriptor);
    const Allocation* buf = deviceRange(s, descriptors, bytes);
    if (!buf || descriptors % 8 != 0)
        die(launch + ": the descriptor buffer [" + describeAddress(s, descriptors) + ", +" +
            std::to_string(bytes) + " bytes) is " +
            (buf ? "not 8-byte aligned" : "not inside one live allocation"));
    bool pinned = buf->kind == Kind::Pinned;
    // Descriptors in pinned memory (kvblock's case) are read and checked now, in launch order,
    // and again when the kernel runs; device-resident ones only when it runs.
    auto atLaunch = std::make_shared<std::vector<Descriptor>>(num);
    std::vector<Interval> intervals;
    if (pinned) {
        std::memcpy(atLaunch->data(), view(s, *buf, descriptors), bytes);
        trackRange(s, *buf, descriptors, bytes, false, who, clock);
        checkDescriptors(s, launch, atLaunch->data(), num, intervals);
        for (const Interval& iv : intervals) {
            const Allocation* a = findAllocation(s, iv.lo, iv.hi - iv.lo);
            trackRange(s, *a, iv.lo, iv.hi - iv.lo, iv.write, who, clock);
        }
    }
    uint64_t seed = config().seed * 0x2545f4914f6cdd1dull + launchId;
    enqueue(s, st, [=] {
        Sim& sm = sim();
        std::vector<Descriptor> d(num);
        {
            std::lock_guard<std::mutex> g(sm.mu);
            const Allocation* b = deviceRange(sm, descriptors, bytes);
            if (!b)
                die(launch + ": its descriptor buffer was freed before the kernel ran (" +
                    describeAddress(sm, descriptors) + ")");
            std::memcpy(d.data(), view(sm, *b, descriptors), bytes);
            if (pinned && std::memcmp(d.data(), atLaunch->data(), bytes) != 0) {
                unsigned i = 0;
                while (i + 1 < num && std::memcmp(&d[i], &(*atLaunch)[i], sizeof(Descriptor)) == 0)
                    ++i;
                die(launch + ": its descriptor buffer (" + describeAddress(sm, descriptors) +
                    ") was rewritten between the launch and the kernel's execution (descriptor " +
                    std::to_string(i) +
                    " first): the host reused it before the launch's completion event");
            }
            std::vector<Interval> ivs;
            checkDescriptors(sm, launch, d.data(), num, ivs);
            // The kernel runs on the simulator's view of the memory.
            for (Descriptor& c : d) {
                if (c.num_chunks == 0 || c.chunk_bytes == 0) continue;
                c.src = reinterpret_cast<uint64_t>(view(sm, *findAllocation(sm, c.src, 0), c.src));
                c.dst = reinterpret_cast<uint64_t>(view(sm, *findAllocation(sm, c.dst, 0), c.dst));
            }
        }
        runKernel(d.data(), num, slices, gridX, blockX, seed);
    });
    return kSuccess;
}
