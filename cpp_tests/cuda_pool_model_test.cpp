// The pool model on the CUDA backend: every pool of a model (K-only latent, GQA, NVFP4 with its
// block scales, recurrent state) moves on the GPU in the kernel's one launch per call. Runs on the
// simulated driver in every test run (CudaSim.*) and on a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "cuda_fixture.hpp"

using namespace kvb_cuda_test;

// A model of several pools (a K-only latent pool, a GQA pool, NVFP4 data with its block-scale
// pool): every pool's row of a block moves on offload, onboard and partial copy, in the kernel's
// one launch per call, and engine-registered pools of the model are used.
TEST_F(CudaBackendTest, EveryPoolOfAModelMovesOnTheGpu) {
    for (bool registered : {false, true}) {
        kvb::Config c;
        c.addWindow(kWindow, 8, 8);
        c.addLayers(2, kWindow, KVB_CACHE_TYPE_SELF, 2, 64, KVB_KV_DATA_TYPE_FP16);
        c.addLayers(1, kWindow, KVB_CACHE_TYPE_SELF_K_ONLY, 1, 32, KVB_KV_DATA_TYPE_FP16);
        c.addLayers(1, kWindow, KVB_CACHE_TYPE_SELF, 2, 64, KVB_KV_DATA_TYPE_NVFP4);
        c.raw.tokens_per_block = kTokensPerBlock;
        c.raw.max_sequence_length = kWindow;
        c.raw.copy_backend = KVB_COPY_BACKEND_CUDA;
        c.raw.cuda_stream = stream;
        c.raw.cuda_allocate_pools = !registered;
        kvb::Manager m(c);
        ASSERT_EQ(m.getNumPools(), 4);
        std::vector<kvb_pool_info_t> pools;
        for (int32_t p = 0; p < 4; ++p) pools.push_back(m.getPoolInfo(p));
        EXPECT_EQ(pools[3].scales_of, 2);
        std::vector<CUdeviceptr> gpu(4, 0);
        std::vector<void*> host(4, nullptr);
        if (registered) {
            for (size_t p = 0; p < 4; ++p) {
                CU_OK(cu->cuMemAlloc(&gpu[p], 8 * pools[p].row_bytes));
                CU_OK(cu->cuMemHostAlloc(&host[p], 8 * pools[p].row_bytes, kHostAllocMapped));
                m.registerModelPool(static_cast<int32_t>(p), KVB_CACHE_LEVEL_PRIMARY,
                                    reinterpret_cast<void*>(gpu[p]), 8 * pools[p].row_bytes);
                m.registerModelPool(static_cast<int32_t>(p), KVB_CACHE_LEVEL_SECONDARY, host[p],
                                    8 * pools[p].row_bytes);
            }
            EXPECT_EQ(reinterpret_cast<CUdeviceptr>(
                          m.getBlockScalePoolPointers(KVB_CACHE_LEVEL_PRIMARY)[2]),
                      gpu[3]);
        }
        auto slotAddress = [&](size_t p, int32_t block, int slab, int32_t pos) {
            kvb_block_info_t b = m.getBlockInfo(kWindow, block);
            EXPECT_EQ(b.cache_level, KVB_CACHE_LEVEL_PRIMARY);
            auto [base, rowBytes] =
                m.getModelPoolPointer(static_cast<int32_t>(p), KVB_CACHE_LEVEL_PRIMARY);
            return reinterpret_cast<CUdeviceptr>(base) +
                   static_cast<size_t>(b.memory_index) * rowBytes +
                   (static_cast<size_t>(slab) * kTokensPerBlock + size_t(pos % kTokensPerBlock)) *
                       static_cast<size_t>(pools[p].bytes_per_head_token);
        };
        auto slabs = [&](size_t p) {
            return pools[p].num_layers * pools[p].kv_factor * pools[p].num_kv_heads;
        };
        auto byteOf = [](size_t p, int32_t pos, int32_t token, int slab, size_t b) {
            return patternByte(pos, token, slab * 8 + static_cast<int>(p), b);
        };
        auto compute = [&](uint64_t id, const std::vector<int32_t>& tokens, int32_t from,
                           int32_t to) {
            std::vector<int32_t> blocks = m.getCacheBlockIds(id, kWindow);
            for (size_t p = 0; p < 4; ++p) {
                size_t tb = static_cast<size_t>(pools[p].bytes_per_head_token);
                for (int32_t pos = from; pos < to; ++pos) {
                    for (int s = 0; s < slabs(p); ++s) {
                        auto* bytes = static_cast<uint8_t*>(staging) + stagingUsed;
                        ASSERT_LT(stagingUsed + tb, kStagingBytes);
                        for (size_t b = 0; b < tb; ++b) {
                            bytes[b] = byteOf(p, pos, tokens[size_t(pos)], s, b);
                        }
                        CU_OK(cu->cuMemcpyHtoDAsync(
                            slotAddress(p, blocks[size_t(pos / kTokensPerBlock)], s, pos), bytes,
                            tb, stream));
                        stagingUsed += tb;
                    }
                }
            }
            CU_OK(cu->cuStreamSynchronize(stream));
            stagingUsed = 0;
        };
        auto holds = [&](uint64_t id, const std::vector<int32_t>& tokens,
                         int32_t reused) -> ::testing::AssertionResult {
            std::vector<int32_t> blocks = m.getCacheBlockIds(id, kWindow);
            for (size_t p = 0; p < 4; ++p) {
                size_t tb = static_cast<size_t>(pools[p].bytes_per_head_token);
                for (int32_t pos = 0; pos < reused; ++pos) {
                    for (int s = 0; s < slabs(p); ++s) {
                        auto* got = static_cast<uint8_t*>(staging);
                        if (cu->cuMemcpyDtoHAsync(
                                got, slotAddress(p, blocks[size_t(pos / kTokensPerBlock)], s, pos),
                                tb, stream) != 0 ||
                            cu->cuStreamSynchronize(stream) != 0) {
                            return ::testing::AssertionFailure() << "copy back";
                        }
                        for (size_t b = 0; b < tb; ++b) {
                            if (got[b] != byteOf(p, pos, tokens[size_t(pos)], s, b)) {
                                return ::testing::AssertionFailure()
                                       << "pool " << p << " position " << pos << " slab " << s
                                       << " byte " << b;
                            }
                        }
                    }
                }
            }
            return ::testing::AssertionSuccess();
        };

        const std::vector<int32_t> prompt = tokenRun(31, 13);
        m.addSequence(kvb::Request(1, prompt));
        compute(1, prompt, 0, 13);
        m.storeContextBlocks(1, 13);
        m.removeSequence(1);
        const std::vector<int32_t> other = tokenRun(70000, 32);  // every primary block
        m.addSequence(kvb::Request(2, other));
        compute(2, other, 0, 32);
        m.removeSequence(2, false);
        EXPECT_EQ(m.getKvCacheStats().offloaded_blocks, 3u);
        enqueueBusyWork();
        uint64_t launches = m.copyLaunches();
        EXPECT_EQ(m.addSequence(kvb::Request(3, prompt)).prepopulated_prompt_len, 12);
        EXPECT_EQ(m.copyLaunches() - launches, 1u);  // 3 blocks x 4 pools: one launch
        EXPECT_TRUE(holds(3, prompt, 12));
        std::vector<int32_t> partial = tokenRun(31, 6);
        partial.insert(partial.end(), {9000, 9001});
        EXPECT_EQ(m.addSequence(kvb::Request(4, partial)).prepopulated_prompt_len, 6);
        EXPECT_TRUE(holds(4, partial, 6));
        m.checkInvariants();
        m.removeSequence(3, false);
        m.removeSequence(4, false);
        CU_OK(cu->cuStreamSynchronize(stream));
        for (size_t p = 0; p < 4; ++p) {
            if (gpu[p]) cu->cuMemFree(gpu[p]);
            if (host[p]) cu->cuMemFreeHost(host[p]);
        }
    }
}

// The recurrent state of a hybrid model carried into the next block on the GPU: a batch of
// requests at block boundaries goes out in one launch, each next block's state row receives its
// predecessor's snapshot, and no attention row changes.
TEST_F(CudaBackendTest, RecurrentStateCarriesIntoTheNextBlockInOneLaunch) {
    kvb::Config c;
    c.addWindow(kWindow, 16, 4);
    c.addLayers(2, kWindow, KVB_CACHE_TYPE_SELF, 2, 64, KVB_KV_DATA_TYPE_FP16);
    c.addLayers(3, kWindow, KVB_CACHE_TYPE_RECURRENT_STATE, 4, 48, KVB_KV_DATA_TYPE_FP32);
    c.raw.tokens_per_block = kTokensPerBlock;
    c.raw.max_sequence_length = kWindow;
    c.raw.copy_backend = KVB_COPY_BACKEND_CUDA;
    c.raw.cuda_stream = stream;
    kvb::Manager m(c);
    ASSERT_EQ(m.getNumPools(), 2);
    ASSERT_EQ(m.getPoolInfo(1).cache_type, KVB_CACHE_TYPE_RECURRENT_STATE);
    auto rowAddressIn = [&](int32_t pool, int32_t block) {
        kvb_block_info_t b = m.getBlockInfo(kWindow, block);
        auto [base, rowBytes] = m.getModelPoolPointer(pool, KVB_CACHE_LEVEL_PRIMARY);
        return reinterpret_cast<CUdeviceptr>(base) + size_t(b.memory_index) * rowBytes;
    };
    const size_t rowBytes[2] = {m.getPoolInfo(0).row_bytes, m.getPoolInfo(1).row_bytes};
    ASSERT_LE(4 * (rowBytes[0] + rowBytes[1]) * 2, kStagingBytes);
    // Every row of the first blocks gets distinct bytes through the engine's stream.
    auto* bytes = static_cast<uint8_t*>(staging);
    size_t used = 0;
    std::vector<std::pair<CUdeviceptr, size_t>> written;  // (address, staging offset)
    for (uint64_t id : {1, 2}) {
        m.addSequence(kvb::Request(id, tokenRun(int32_t(id) * 1000, 10)));
        for (int32_t block : m.getCacheBlockIds(id, kWindow)) {
            for (int32_t p = 0; p < 2; ++p) {
                for (size_t i = 0; i < rowBytes[p]; ++i)
                    bytes[used + i] = static_cast<uint8_t>(block * 31 + p * 7 + i);
                CU_OK(cu->cuMemcpyHtoDAsync(rowAddressIn(p, block), bytes + used, rowBytes[p],
                                            stream));
                used += rowBytes[p];
            }
        }
    }
    CU_OK(cu->cuStreamSynchronize(stream));
    enqueueBusyWork();
    const uint64_t launches = m.copyLaunches();
    EXPECT_EQ(m.copyRecurrentState({1, 2}, {4, 8}), 2u);
    EXPECT_EQ(m.copyLaunches() - launches, 1u);
    // Read back on the engine's stream: ordered after the copies.
    auto read = [&](int32_t pool, int32_t block) {
        std::vector<uint8_t> out(rowBytes[pool]);
        auto* dst = static_cast<uint8_t*>(staging) + used;
        EXPECT_EQ(cu->cuMemcpyDtoHAsync(dst, rowAddressIn(pool, block), rowBytes[pool], stream), 0);
        EXPECT_EQ(cu->cuStreamSynchronize(stream), 0);
        std::copy(dst, dst + rowBytes[pool], out.begin());
        return out;
    };
    auto expected = [&](int32_t pool, int32_t block) {
        std::vector<uint8_t> out(rowBytes[pool]);
        for (size_t i = 0; i < out.size(); ++i)
            out[i] = static_cast<uint8_t>(block * 31 + pool * 7 + i);
        return out;
    };
    std::vector<int32_t> a = m.getCacheBlockIds(1, kWindow), b = m.getCacheBlockIds(2, kWindow);
    EXPECT_EQ(read(1, a[1]), expected(1, a[0]));
    EXPECT_EQ(read(1, a[0]), expected(1, a[0]));
    EXPECT_EQ(read(0, a[1]), expected(0, a[1])) << "attention rows are not state";
    EXPECT_EQ(read(1, b[2]), expected(1, b[1]));
    EXPECT_EQ(read(0, b[2]), expected(0, b[2]));
    EXPECT_EQ(read(1, b[1]), expected(1, b[1]));
    m.checkInvariants();
}
