// The batched copy kernel (kernels/block_copy.cu) executed on the CPU: the CUDA built-ins it uses
// are defined here and every thread of the grid runs in turn (the kernel has no shared memory and
// no barriers, so sequential threads compute what parallel ones do). This checks the kernel's
// indexing -- whole rows, the first tokens of every slab, the vector and byte paths, slices of a
// copy spread over CTAs, a grid smaller than the work -- on every machine, GPU or not.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace emulated {

struct uint4 {
    unsigned int x, y, z, w;
};
struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};
dim3 blockIdx, threadIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
// (Its `#pragma unroll` is unknown to the host compiler: cpp_tests/CMakeLists.txt passes
// -Wno-unknown-pragmas for this file.)
#include "../kernels/block_copy.cu"
#undef __global__
#undef __device__
#undef __forceinline__

// Runs kvb_copy_blocks<<<grid, threads>>> thread by thread.
void launch(unsigned grid, unsigned threads, const std::vector<kvb_copy_descriptor>& d,
            unsigned slicesPerCopy) {
    gridDim.x = grid;
    blockDim.x = threads;
    for (unsigned b = 0; b < grid; ++b) {
        blockIdx.x = b;
        for (unsigned t = 0; t < threads; ++t) {
            threadIdx.x = t;
            kvb_copy_blocks(d.data(), static_cast<unsigned>(d.size()), slicesPerCopy);
        }
    }
}

}  // namespace emulated

namespace {

using emulated::kvb_copy_descriptor;

// The layout src/cuda/plan.rs writes (`CopyDescriptor`, checked there too).
static_assert(sizeof(kvb_copy_descriptor) == 40, "descriptor size");
static_assert(offsetof(kvb_copy_descriptor, chunk_stride) == 24, "descriptor layout");
static_assert(offsetof(kvb_copy_descriptor, flags) == 36, "descriptor layout");

constexpr unsigned kVectorAligned = 1;

// A pool of `rows` rows of `rowBytes` bytes, each byte a function of (row, offset).
std::vector<uint8_t> pool(size_t rows, size_t rowBytes, uint8_t salt) {
    std::vector<uint8_t> p(rows * rowBytes);
    for (size_t i = 0; i < p.size(); ++i)
        p[i] = static_cast<uint8_t>((i * 131 + i / 7 + salt) & 0xff);
    return p;
}

kvb_copy_descriptor wholeRow(const uint8_t* src, uint8_t* dst, size_t rowBytes) {
    auto aligned =
        ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | rowBytes) % 16) ==
        0;
    return {reinterpret_cast<unsigned long long>(src),
            reinterpret_cast<unsigned long long>(dst),
            rowBytes,
            rowBytes,
            1,
            aligned ? kVectorAligned : 0};
}

kvb_copy_descriptor firstTokens(const uint8_t* src, uint8_t* dst, size_t slabs, size_t slabBytes,
                                size_t tokenBytes, size_t tokens) {
    size_t chunk = tokens * tokenBytes;
    auto aligned =
        ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | chunk | slabBytes) %
         16) == 0;
    return {reinterpret_cast<unsigned long long>(src),
            reinterpret_cast<unsigned long long>(dst),
            chunk,
            slabBytes,
            static_cast<unsigned>(slabs),
            aligned ? kVectorAligned : 0};
}

// Whole rows arrive byte for byte at scattered destinations, whatever the grid and the slicing,
// and nothing outside the destination rows changes.
TEST(CopyKernelEmulationTest, WholeRowsArriveAtScatteredRows) {
    constexpr size_t kRow = 4096 + 48;  // a tail that the unrolled loop does not cover
    for (unsigned grid : {1u, 3u, 64u}) {
        for (unsigned slices : {1u, 2u, 5u}) {
            SCOPED_TRACE("grid " + std::to_string(grid) + " slices " + std::to_string(slices));
            std::vector<uint8_t> host = pool(6, kRow, 1), gpu = pool(8, kRow, 2);
            const std::vector<uint8_t> gpuBefore = gpu;
            const size_t dsts[] = {7, 0, 4};
            std::vector<kvb_copy_descriptor> d;
            for (size_t i = 0; i < 3; ++i) {
                d.push_back(
                    wholeRow(host.data() + (i * 2 + 1) * kRow, gpu.data() + dsts[i] * kRow, kRow));
                EXPECT_EQ(d.back().flags, kVectorAligned);
            }
            emulated::launch(grid, 32, d, slices);
            for (size_t r = 0; r < 8; ++r) {
                const uint8_t* want = gpuBefore.data() + r * kRow;
                for (size_t i = 0; i < 3; ++i) {
                    if (dsts[i] == r) want = host.data() + (i * 2 + 1) * kRow;
                }
                EXPECT_EQ(std::memcmp(gpu.data() + r * kRow, want, kRow), 0) << "row " << r;
            }
        }
    }
}

// A partial copy takes the first n tokens of every slab and leaves the rest of the row alone.
TEST(CopyKernelEmulationTest, PartialCopiesTakeTheFirstTokensOfEverySlab) {
    constexpr size_t kSlabs = 8, kTokens = 4, kTokenBytes = 32, kSlab = kTokens * kTokenBytes;
    constexpr size_t kRow = kSlabs * kSlab;
    for (size_t n : {size_t(1), size_t(3)}) {
        std::vector<uint8_t> p = pool(2, kRow, 5);
        const std::vector<uint8_t> before = p;
        std::vector<kvb_copy_descriptor> d = {
            firstTokens(p.data(), p.data() + kRow, kSlabs, kSlab, kTokenBytes, n)};
        emulated::launch(2, 64, d, 2);
        for (size_t s = 0; s < kSlabs; ++s) {
            for (size_t b = 0; b < kSlab; ++b) {
                uint8_t want =
                    b < n * kTokenBytes ? before[s * kSlab + b] : before[kRow + s * kSlab + b];
                ASSERT_EQ(p[kRow + s * kSlab + b], want)
                    << "n " << n << " slab " << s << " byte " << b;
            }
        }
        EXPECT_EQ(std::memcmp(p.data(), before.data(), kRow), 0) << "the source is untouched";
    }
}

// Sizes that are not multiples of 16 bytes take the byte path and still copy exactly.
TEST(CopyKernelEmulationTest, UnalignedCopiesTakeTheBytePath) {
    constexpr size_t kSlabs = 3, kTokenBytes = 6, kTokens = 4, kSlab = kTokens * kTokenBytes;
    constexpr size_t kRow = kSlabs * kSlab;  // 72 bytes
    std::vector<uint8_t> src = pool(1, kRow, 9), dst(kRow + 1, 0);
    std::vector<uint8_t> partial(kRow, 0);
    std::vector<kvb_copy_descriptor> d = {
        wholeRow(src.data(), dst.data() + 1, kRow),  // misaligned destination
        firstTokens(src.data(), partial.data(), kSlabs, kSlab, kTokenBytes, 3),  // 18-byte runs
    };
    EXPECT_EQ(d[0].flags, 0u);
    EXPECT_EQ(d[1].flags, 0u);
    emulated::launch(1, 16, d, 1);
    EXPECT_EQ(std::memcmp(dst.data() + 1, src.data(), kRow), 0);
    EXPECT_EQ(dst[0], 0);
    for (size_t s = 0; s < kSlabs; ++s) {
        for (size_t b = 0; b < kSlab; ++b) {
            EXPECT_EQ(partial[s * kSlab + b], b < 3 * kTokenBytes ? src[s * kSlab + b] : 0)
                << "slab " << s << " byte " << b;
        }
    }
}

}  // namespace
