// The pool model: a manager configured with its layers (kvb_manager_config_t::layers) groups them
// into pools per (window, cache type, KV heads, head size, data type); a block owns the same row
// in every pool of its window, and every pool's row moves with the block.
//
// The data-integrity tests use the host-memory backend: the "engine" writes a pattern derived from
// (pool, position, token, slab, byte) into each token's slots of every pool, and whatever the
// manager reuses (shared, offloaded and onboarded, partially copied) must hold that pattern in
// every pool, block-scale pools included.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvblock.h"
#include "kvblock.hpp"
#include "test_support.hpp"

namespace {

using kvb_test::tokenRun;

constexpr int32_t kTokensPerBlock = 4;

uint8_t patternByte(int pool, int32_t pos, int32_t token, int slab, size_t byte) {
    uint32_t v = static_cast<uint32_t>(pos) * 2654435761u ^ static_cast<uint32_t>(token) * 40503u ^
                 static_cast<uint32_t>(slab) * 977u ^ static_cast<uint32_t>(byte) * 131u ^
                 static_cast<uint32_t>(pool) * 7919u;
    v ^= v >> 13;
    return static_cast<uint8_t>(1u + v % 255u);
}

// The engine's view of a manager: every pool and the bytes of a token's slots in it.
class Engine {
  public:
    explicit Engine(kvb::Manager& m) : m_(m) {
        for (int32_t p = 0; p < m.getNumPools(true); ++p) pools_.push_back(m.getPoolInfo(p));
    }

    // Slot `pos` of slab `slab` in pool `p` of `block` (window of the pool).
    uint8_t* slot(int p, int32_t block, int slab, int32_t pos) {
        const kvb_pool_info_t& info = pools_[static_cast<size_t>(p)];
        kvb_block_info_t b = m_.getBlockInfo(info.window_size, block);
        auto [base, rowBytes] =
            m_.getModelPoolPointer(p, static_cast<kvb_cache_level_t>(b.cache_level));
        EXPECT_EQ(rowBytes, info.row_bytes);
        size_t tokenBytes = static_cast<size_t>(info.bytes_per_head_token);
        return base + static_cast<size_t>(b.memory_index) * rowBytes +
               (static_cast<size_t>(slab) * kTokensPerBlock +
                static_cast<size_t>(pos % kTokensPerBlock)) *
                   tokenBytes;
    }

    static int slabs(const kvb_pool_info_t& info) {
        return info.num_layers * info.kv_factor * info.num_kv_heads;
    }

    static bool isState(const kvb_pool_info_t& info) {
        return info.cache_type == KVB_CACHE_TYPE_RECURRENT_STATE;
    }

    // The recurrent state after tokens [0, end): a pattern keyed by the whole prefix.
    static uint8_t stateByte(int pool, const std::vector<int32_t>& tokens, int32_t end, size_t b) {
        uint32_t h = 2166136261u;
        for (int32_t i = 0; i < end; ++i)
            h = (h ^ static_cast<uint32_t>(tokens[size_t(i)])) * 16777619u;
        return patternByte(pool, end, static_cast<int32_t>(h), 0, b);
    }

    // The row of `block` in pool `p`.
    uint8_t* row(int p, int32_t block) {
        const kvb_pool_info_t& info = pools_[static_cast<size_t>(p)];
        kvb_block_info_t b = m_.getBlockInfo(info.window_size, block);
        auto [base, rowBytes] =
            m_.getModelPoolPointer(p, static_cast<kvb_cache_level_t>(b.cache_level));
        return base + static_cast<size_t>(b.memory_index) * rowBytes;
    }

    // The state snapshot the engine restores for a reused prefix of `reused` tokens (the row of
    // the last reused block) holds the state after exactly those tokens, in every state pool.
    ::testing::AssertionResult restoresSnapshot(uint64_t id, const std::vector<int32_t>& tokens,
                                                int32_t reused) {
        for (int p = 0; p < static_cast<int>(pools_.size()); ++p) {
            const kvb_pool_info_t& info = pools_[static_cast<size_t>(p)];
            if (!isState(info)) continue;
            if (reused % kTokensPerBlock != 0 || reused == 0) {
                return ::testing::AssertionFailure() << "reuse of " << reused << " tokens";
            }
            int32_t block =
                m_.getCacheBlockIds(id, info.window_size)[size_t(reused / kTokensPerBlock - 1)];
            const uint8_t* bytes = row(p, block);
            for (size_t b = 0; b < info.row_bytes; ++b) {
                if (bytes[b] != stateByte(p, tokens, reused, b)) {
                    return ::testing::AssertionFailure()
                           << "state pool " << p << " byte " << b << " is not the snapshot after "
                           << reused << " tokens";
                }
            }
        }
        return ::testing::AssertionSuccess();
    }

    // The engine computes positions [from, to) of `id` in every pool; a block that becomes full
    // gets its recurrent-state snapshot.
    void compute(uint64_t id, const std::vector<int32_t>& tokens, int32_t from, int32_t to) {
        for (int p = 0; p < static_cast<int>(pools_.size()); ++p) {
            const kvb_pool_info_t& info = pools_[static_cast<size_t>(p)];
            std::vector<int32_t> blocks = m_.getCacheBlockIds(id, info.window_size);
            if (isState(info)) {
                for (int32_t end = from + 1; end <= to; ++end) {
                    if (end % kTokensPerBlock != 0) continue;
                    uint8_t* bytes = row(p, blocks[size_t(end / kTokensPerBlock - 1)]);
                    for (size_t b = 0; b < info.row_bytes; ++b)
                        bytes[b] = stateByte(p, tokens, end, b);
                }
                continue;
            }
            for (int32_t pos = from; pos < to; ++pos) {
                int32_t block = blocks[static_cast<size_t>(pos / kTokensPerBlock)];
                for (int s = 0; s < slabs(info); ++s) {
                    uint8_t* bytes = slot(p, block, s, pos);
                    for (size_t b = 0; b < static_cast<size_t>(info.bytes_per_head_token); ++b) {
                        bytes[b] = patternByte(p, pos, tokens[static_cast<size_t>(pos)], s, b);
                    }
                }
            }
        }
    }

    // Positions [0, reused) of `id` hold their pattern in every pool.
    ::testing::AssertionResult holdsPattern(uint64_t id, const std::vector<int32_t>& tokens,
                                            int32_t reused) {
        for (int p = 0; p < static_cast<int>(pools_.size()); ++p) {
            const kvb_pool_info_t& info = pools_[static_cast<size_t>(p)];
            if (isState(info)) continue;
            std::vector<int32_t> blocks = m_.getCacheBlockIds(id, info.window_size);
            for (int32_t pos = 0; pos < reused; ++pos) {
                int32_t block = blocks[static_cast<size_t>(pos / kTokensPerBlock)];
                if (m_.getBlockInfo(info.window_size, block).cache_level !=
                    KVB_CACHE_LEVEL_PRIMARY) {
                    return ::testing::AssertionFailure() << "block " << block << " not on the GPU";
                }
                for (int s = 0; s < slabs(info); ++s) {
                    const uint8_t* bytes = slot(p, block, s, pos);
                    for (size_t b = 0; b < static_cast<size_t>(info.bytes_per_head_token); ++b) {
                        uint8_t want = patternByte(p, pos, tokens[static_cast<size_t>(pos)], s, b);
                        if (bytes[b] != want) {
                            return ::testing::AssertionFailure()
                                   << "pool " << p << " position " << pos << " slab " << s
                                   << " byte " << b << ": got " << int(bytes[b]) << ", want "
                                   << int(want);
                        }
                    }
                }
            }
        }
        return ::testing::AssertionSuccess();
    }

    int32_t admitAndCompute(uint64_t id, const std::vector<int32_t>& tokens) {
        kvb_admission_t a = m_.addSequence(kvb::Request(id, tokens));
        compute(id, tokens, a.prepopulated_prompt_len, static_cast<int32_t>(tokens.size()));
        m_.storeContextBlocks(id, static_cast<int32_t>(tokens.size()));
        return a.prepopulated_prompt_len;
    }

    const std::vector<kvb_pool_info_t>& pools() const { return pools_; }

  private:
    kvb::Manager& m_;
    std::vector<kvb_pool_info_t> pools_;
};

kvb::Config hostConfig(int32_t maxSequenceLength) {
    kvb::Config c;
    c.raw.tokens_per_block = kTokensPerBlock;
    c.raw.max_sequence_length = maxSequenceLength;
    c.raw.copy_backend = KVB_COPY_BACKEND_HOST;
    return c;
}

// Reuse, offload + onboard and a partial copy in an 8-block primary pool with 8 host blocks,
// checked in every pool.
void checkEveryMove(kvb::Manager& m) {
    Engine e(m);
    const std::vector<int32_t> prompt = tokenRun(7, 13);
    e.admitAndCompute(1, prompt);
    // Shared while the owner lives: the first 3 full blocks.
    kvb_admission_t shared = m.addSequence(kvb::Request(2, prompt));
    EXPECT_EQ(shared.prepopulated_prompt_len, 12);
    EXPECT_TRUE(e.holdsPattern(2, prompt, 12));
    m.removeSequence(2, false);
    m.removeSequence(1);
    // Another request takes every primary block: the cached ones go to the host tier.
    const std::vector<int32_t> other = tokenRun(5000, 8 * kTokensPerBlock);
    e.admitAndCompute(3, other);
    m.removeSequence(3, false);
    EXPECT_EQ(m.getKvCacheStats().offloaded_blocks, 3u);
    // Onboarded back with their bytes in every pool.
    kvb_admission_t onboarded = m.addSequence(kvb::Request(4, prompt));
    EXPECT_EQ(onboarded.prepopulated_prompt_len, 12);
    EXPECT_TRUE(e.holdsPattern(4, prompt, 12));
    // A partial match of a block in use is copied: its first tokens in every pool.
    std::vector<int32_t> partial = tokenRun(7, 6);
    partial.insert(partial.end(), {9000, 9001});
    kvb_admission_t copied = m.addSequence(kvb::Request(5, partial));
    EXPECT_EQ(copied.prepopulated_prompt_len, 6);
    EXPECT_TRUE(e.holdsPattern(5, partial, 6));
    m.checkInvariants();
}

}  // namespace

// DeepSeek-V3's MLA: 61 layers of one K-only latent row (512 + 64 elements, BF16) per token, no
// V half; offsets list the same entry for K and V.
TEST(PoolModelTest, MlaIsOneKOnlyPool) {
    kvb::Config c = hostConfig(64);
    c.addWindow(64, 8, 8);
    c.addLayers(61, 64, KVB_CACHE_TYPE_SELF_K_ONLY, 1, 576, KVB_KV_DATA_TYPE_BF16);
    kvb::Manager m(c);
    ASSERT_EQ(m.getNumPools(), 1);
    kvb_pool_info_t p = m.getPoolInfo(0);
    EXPECT_EQ(p.kv_factor, 1);
    EXPECT_EQ(p.num_layers, 61);
    EXPECT_EQ(p.bytes_per_head_token, 1152);
    EXPECT_EQ(p.bytes_per_token, 61u * 576u * 2u);  // 70,272
    EXPECT_EQ(p.row_bytes, 61u * 4u * 1152u);
    EXPECT_EQ(p.cache_type, KVB_CACHE_TYPE_SELF_K_ONLY);
    auto map = m.getLayerToPoolMapping();
    ASSERT_EQ(map.size(), 61u);
    EXPECT_EQ(map[60], std::make_pair(0, 60));

    m.addSequence(kvb::Request(1, tokenRun(1, 9)));
    auto [maxBlocks, pools] = m.getOffsetTableDimensions();
    ASSERT_EQ(pools, 1);
    std::vector<int32_t> table(static_cast<size_t>(2 * maxBlocks));
    ASSERT_EQ(m.copyBlockOffsets(table, 1, 0, 1), 3);
    std::vector<int32_t> blocks = m.getCacheBlockIds(1, 64);
    for (size_t i = 0; i < blocks.size(); ++i) {
        int32_t mem = m.getBlockInfo(64, blocks[i]).memory_index;
        EXPECT_EQ(table[i], mem * 61) << i;                                   // K
        EXPECT_EQ(table[static_cast<size_t>(maxBlocks) + i], mem * 61) << i;  // V: the same row
    }
    m.removeSequence(1, false);
    checkEveryMove(m);
}

// Layers of different KV heads and head sizes over two windows (a Gemma-style sliding window
// beside full attention): pools per (window, heads, head size), ascending; every pool's rows move.
TEST(PoolModelTest, HeterogeneousLayersGroupIntoPoolsPerWindowAndShape) {
    kvb::Config c = hostConfig(64);
    c.addWindow(8, 4, 4).addWindow(64, 4, 4);
    c.addLayers(1, 8, KVB_CACHE_TYPE_SELF, 4, 16);   // layer 0: sliding, 4 heads
    c.addLayers(1, 64, KVB_CACHE_TYPE_SELF, 2, 32);  // layer 1: full, 2 heads x 32
    c.addLayers(1, 8, KVB_CACHE_TYPE_SELF, 4, 16);   // layer 2
    c.addLayers(1, 64, KVB_CACHE_TYPE_SELF, 1, 16);  // layer 3: full, 1 head
    c.addLayers(1, 64, KVB_CACHE_TYPE_SELF, 2, 32);  // layer 4
    kvb::Manager m(c);
    ASSERT_EQ(m.getNumPools(), 3);
    ASSERT_EQ(m.getNumPools(false), 3);
    EXPECT_EQ(m.getPoolInfo(0).window_size, 8);
    EXPECT_EQ(m.getPoolInfo(1).num_kv_heads, 1);
    EXPECT_EQ(m.getPoolInfo(2).num_kv_heads, 2);
    EXPECT_EQ(m.getPoolInfo(2).num_layers, 2);
    auto map = m.getLayerToPoolMapping();
    std::vector<std::pair<int32_t, int32_t>> want = {{0, 0}, {2, 0}, {0, 1}, {1, 0}, {2, 1}};
    EXPECT_EQ(map, want);
    // Offsets per pool: memory index x layers of the pool x 2 (+1 for V).
    m.addSequence(kvb::Request(1, tokenRun(1, 6)));
    auto [maxBlocks, pools] = m.getOffsetTableDimensions();
    ASSERT_EQ(pools, 3);
    std::vector<int32_t> table(static_cast<size_t>(pools * 2 * maxBlocks));
    m.copyBlockOffsets(table, 1, 0, 1);
    for (int32_t pool = 0; pool < pools; ++pool) {
        kvb_pool_info_t info = m.getPoolInfo(pool);
        std::vector<int32_t> blocks = m.getCacheBlockIds(1, info.window_size);
        for (size_t i = 0; i < blocks.size(); ++i) {
            int32_t mem = m.getBlockInfo(info.window_size, blocks[i]).memory_index;
            for (int32_t field = 0; field < 2; ++field) {
                size_t at = static_cast<size_t>((pool * 2 + field) * maxBlocks) + i;
                EXPECT_EQ(table[at], mem * info.num_layers * 2 + field) << pool << " " << i;
            }
        }
    }
    m.removeSequence(1, false);
}

// Every pool of a full-attention window of mixed shapes and element sizes moves with its block.
TEST(PoolModelTest, EveryPoolMovesOnReuseOffloadOnboardAndPartialCopy) {
    kvb::Config c = hostConfig(64);
    c.addWindow(64, 8, 8);
    c.addLayers(2, 64, KVB_CACHE_TYPE_SELF, 2, 8, KVB_KV_DATA_TYPE_FP16);
    c.addLayers(1, 64, KVB_CACHE_TYPE_SELF, 1, 16, KVB_KV_DATA_TYPE_FP8);
    c.addLayers(1, 64, KVB_CACHE_TYPE_SELF_K_ONLY, 1, 24, KVB_KV_DATA_TYPE_FP32);
    kvb::Manager m(c);
    ASSERT_EQ(m.getNumPools(), 3);
    EXPECT_EQ(m.getPoolInfo(0).bytes_per_head_token, 16);  // 1 head x 16 FP8
    EXPECT_EQ(m.getPoolInfo(1).bytes_per_head_token, 96);  // K-only 24 x FP32
    EXPECT_EQ(m.getPoolInfo(2).bytes_per_head_token, 16);  // 8 x FP16
    checkEveryMove(m);
}

// NVFP4: a block-scale pool beside the data pool (one FP8 scale per 16 elements), listed after
// the data pools, not in offset tables; partial copies move both rows whole, as TensorRT-LLM.
TEST(PoolModelTest, Nvfp4HasBlockScalePoolsThatMoveWithTheData) {
    kvb::Config c = hostConfig(64);
    c.addWindow(64, 8, 8);
    c.addLayers(3, 64, KVB_CACHE_TYPE_SELF, 2, 64, KVB_KV_DATA_TYPE_NVFP4);
    kvb::Manager m(c);
    ASSERT_EQ(m.getNumPools(true), 2);
    ASSERT_EQ(m.getNumPools(false), 1);
    EXPECT_EQ(m.getOffsetTableDimensions().second, 1);
    kvb_pool_info_t data = m.getPoolInfo(0), scales = m.getPoolInfo(1);
    EXPECT_EQ(data.bytes_per_head_token, 32);   // 64 FP4 elements
    EXPECT_EQ(scales.bytes_per_head_token, 4);  // 64 / 16 FP8 scales
    EXPECT_EQ(scales.scales_of, 0);
    EXPECT_EQ(data.scales_of, -1);
    EXPECT_EQ(data.row_bytes / 8, scales.row_bytes);
    std::vector<uint8_t*> scalePools = m.getBlockScalePoolPointers(KVB_CACHE_LEVEL_PRIMARY);
    ASSERT_EQ(scalePools.size(), 1u);
    EXPECT_EQ(scalePools[0], m.getModelPoolPointer(1, KVB_CACHE_LEVEL_PRIMARY).first);
    checkEveryMove(m);
}

// A cross-attention cache (the encoder's output per request) never reuses blocks.
TEST(PoolModelTest, CrossAttentionBlocksAreNotReused) {
    kvb::Config c = hostConfig(64);
    c.addWindow(64, 8, 0);
    c.addLayers(2, 64, KVB_CACHE_TYPE_CROSS, 2, 8);
    kvb::Manager m(c);
    EXPECT_EQ(m.getPoolInfo(0).cache_type, KVB_CACHE_TYPE_CROSS);
    EXPECT_EQ(m.getPoolInfo(0).kv_factor, 2);
    const std::vector<int32_t> encoder = tokenRun(1, 9);
    m.addSequence(kvb::Request(1, encoder));
    kvb_test::markPrefillComputed(m, 1);
    m.removeSequence(1);
    EXPECT_EQ(m.addSequence(kvb::Request(2, encoder)).prepopulated_prompt_len, 0);
}

// Inconsistent layer sets are config errors and create nothing.
TEST(PoolModelTest, InvalidLayersAreRefused) {
    auto status = [](auto edit) {
        kvb::Config c = hostConfig(64);
        c.addWindow(64, 4, 0);
        edit(c);
        return kvb_test::statusOf([&] { kvb::Manager m(c); });
    };
    EXPECT_EQ(status([](kvb::Config& c) { c.addLayers(1, 32, KVB_CACHE_TYPE_SELF, 1, 8); }),
              KVB_STATUS_INVALID_CONFIG);  // window 32 is not configured, window 64 has no layer
    EXPECT_EQ(status([](kvb::Config& c) {
                  c.addLayers(1, 64, KVB_CACHE_TYPE_SELF, 1, 24, KVB_KV_DATA_TYPE_NVFP4);
              }),
              KVB_STATUS_INVALID_CONFIG);  // 24 is not a multiple of 16
    EXPECT_EQ(status([](kvb::Config& c) {
                  c.addLayers(1, 64, KVB_CACHE_TYPE_SELF, 1, 16);
                  c.addLayers(1, 64, KVB_CACHE_TYPE_CROSS, 1, 16);
              }),
              KVB_STATUS_INVALID_CONFIG);  // cross beside self layers
    EXPECT_EQ(status([](kvb::Config& c) {
                  c.layers.push_back(kvb_layer_spec_t{64, 7, 1, 16, 0});
              }),
              KVB_STATUS_INVALID_CONFIG);  // unknown cache type
    EXPECT_EQ(status([](kvb::Config& c) { c.addLayers(1, 64, KVB_CACHE_TYPE_SELF, 0, 16); }),
              KVB_STATUS_INVALID_CONFIG);
}

// Without layers nothing changes: one pool per window, its layers window after window; and a
// caller built against version 1 of the config (whose struct_size ends before `layers`) is
// served as before.
TEST(PoolModelTest, ConfigsWithoutLayersKeepOnePoolPerWindow) {
    kvb::Config c = hostConfig(64);
    c.addWindow(64, 4, 4, 3, 2, 8).addWindow(16, 4, 0, 2, 1, 8);
    kvb::Manager m(c);
    ASSERT_EQ(m.getNumPools(), 2);
    EXPECT_EQ(m.getPoolInfo(0).window_size, 16);
    EXPECT_EQ(m.getPoolInfo(1).row_bytes, 3u * 2u * 2u * 4u * 8u * 2u);
    auto map = m.getLayerToPoolMapping();
    std::vector<std::pair<int32_t, int32_t>> want = {{0, 0}, {0, 1}, {1, 0}, {1, 1}, {1, 2}};
    EXPECT_EQ(map, want);
    EXPECT_EQ(m.getModelPoolPointer(1, KVB_CACHE_LEVEL_PRIMARY),
              m.getPoolPointer(64, KVB_CACHE_LEVEL_PRIMARY));

    kvb_manager_config_t v1 = kvb_test::rawConfig(c);
    v1.struct_size = static_cast<uint32_t>(offsetof(kvb_manager_config_t, layers));
    v1.layers = reinterpret_cast<const kvb_layer_spec_t*>(0x1);  // beyond version 1: not read
    v1.num_layers = 99;
    kvb_manager_t* h = nullptr;
    ASSERT_EQ(kvb_manager_create(&v1, &h), KVB_OK) << kvb_last_error_message();
    int32_t pools = 0;
    EXPECT_EQ(kvb_manager_get_num_pools(h, true, &pools), KVB_OK);
    EXPECT_EQ(pools, 2);
    kvb_manager_destroy(h);
}

// Sizing with pool configurations against hand-computed figures: bytes per token per window,
// then TensorRT-LLM's calculateMaxNumBlocks.
TEST(PoolModelTest, SizingFollowsThePools) {
    auto perToken = [](const std::vector<kvb_layer_spec_t>& layers) {
        std::vector<int32_t> windows(4);
        std::vector<uint64_t> bytes(4);
        size_t n = 0;
        EXPECT_EQ(kvb_calculate_window_bytes_per_token(layers.data(), layers.size(), 2, 64,
                                                       windows.data(), bytes.data(), 4, &n),
                  KVB_OK)
            << kvb_last_error_message();
        windows.resize(n);
        bytes.resize(n);
        return std::make_pair(windows, bytes);
    };
    // DeepSeek-V3 MLA: 61 layers x (512 + 64) BF16 = 70,272 bytes per token; with its indexer K
    // cache (one 128-element FP8 head per layer, K only): + 61 x 128 = 7,808.
    kvb::Config mla;
    mla.addLayers(61, 4096, KVB_CACHE_TYPE_SELF_K_ONLY, 1, 576, KVB_KV_DATA_TYPE_BF16);
    EXPECT_EQ(perToken(mla.layers).second, std::vector<uint64_t>{70272});
    mla.addLayers(61, 4096, KVB_CACHE_TYPE_SELF_K_ONLY, 1, 128, KVB_KV_DATA_TYPE_FP8);
    EXPECT_EQ(perToken(mla.layers).second, std::vector<uint64_t>{78080});
    // Llama-3-8B GQA: 32 layers x K|V x 8 heads x 128 x FP16 = 131,072 bytes per token.
    kvb::Config llama;
    llama.addLayers(32, 8192, KVB_CACHE_TYPE_SELF, 8, 128, KVB_KV_DATA_TYPE_FP16);
    auto [windows, bytes] = perToken(llama.layers);
    EXPECT_EQ(windows, std::vector<int32_t>{8192});
    ASSERT_EQ(bytes, std::vector<uint64_t>{131072});
    // 40 GiB of GPU memory at 131,072 bytes per token: 327,680 tokens = 5,120 blocks of 64.
    uint64_t primary = 0, secondary = 0;
    ASSERT_EQ(kvb_calculate_max_num_blocks(bytes.data(), nullptr, 1, 40ull << 30, 0, 0, -1, 64,
                                           &primary, &secondary),
              KVB_OK);
    EXPECT_EQ(primary, 5120u);
    // The same model in NVFP4: 32 x 2 x 8 x (64 + 8) bytes = 36,864 per token.
    kvb::Config fp4;
    fp4.addLayers(32, 8192, KVB_CACHE_TYPE_SELF, 8, 128, KVB_KV_DATA_TYPE_NVFP4);
    EXPECT_EQ(perToken(fp4.layers).second, std::vector<uint64_t>{36864});
    // Nemotron-H-8B, a hybrid: 4 attention layers (8 KV heads x 128, BF16: 4 x 2 x 8 x 128 x 2 =
    // 16,384 bytes per token) and 24 Mamba-2 layers, each with an SSM state of 128 heads x (64
    // head dim x 128 state) FP32 (4 MiB) and a convolution state of (8,192 + 2 x 8 x 128) x 3 =
    // 30,720 BF16 elements (61,440 bytes), per block: 24 x 4,255,744 = 102,137,856 bytes per
    // 64-token block, 1,595,904 per token.
    kvb::Config hybrid;
    hybrid.addLayers(4, 8192, KVB_CACHE_TYPE_SELF, 8, 128, KVB_KV_DATA_TYPE_BF16);
    for (int i = 0; i < 24; ++i) {
        hybrid.addLayers(1, 8192, KVB_CACHE_TYPE_RECURRENT_STATE, 128, 64 * 128,
                         KVB_KV_DATA_TYPE_FP32);
        hybrid.addLayers(1, 8192, KVB_CACHE_TYPE_RECURRENT_STATE, 1, 30720, KVB_KV_DATA_TYPE_BF16);
    }
    EXPECT_EQ(perToken(hybrid.layers).second, std::vector<uint64_t>{16384 + 1595904});
    // Gemma-3-27B, two windows: 62 layers of 16 KV heads x 128 BF16 (8,192 bytes per token a
    // layer), every sixth global (10 layers: 81,920 bytes per token), the other 52 on a
    // 1,024-token sliding window (425,984).
    kvb::Config gemma;
    for (int i = 0; i < 62; ++i) {
        gemma.addLayers(1, i % 6 == 5 ? 131072 : 1024, KVB_CACHE_TYPE_SELF, 16, 128,
                        KVB_KV_DATA_TYPE_BF16);
    }
    auto [gemmaWindows, gemmaBytes] = perToken(gemma.layers);
    EXPECT_EQ(gemmaWindows, (std::vector<int32_t>{1024, 131072}));
    EXPECT_EQ(gemmaBytes, (std::vector<uint64_t>{425984, 81920}));
}

namespace {

// A hybrid model (Nemotron-H / Jamba style): attention layers and recurrent layers whose state
// snapshots are blocks of the same window.
kvb::Config hybridConfig(int32_t snapshotIntervalTokens) {
    kvb::Config c = hostConfig(64);
    c.addWindow(64, 8, 8);
    c.addLayers(2, 64, KVB_CACHE_TYPE_SELF, 2, 8, KVB_KV_DATA_TYPE_FP16);
    c.addLayers(3, 64, KVB_CACHE_TYPE_RECURRENT_STATE, 4, 16, KVB_KV_DATA_TYPE_FP32);
    c.raw.recurrent_snapshot_interval_tokens = snapshotIntervalTokens;
    return c;
}

}  // namespace

// A reused prefix restores the recurrent-state snapshot of exactly that prefix, after sharing,
// offload and onboard; a prefix that ends between snapshots reuses up to the last snapshot.
TEST(PoolModelTest, HybridReuseRestoresTheSnapshotOfTheReusedPrefix) {
    kvb::Manager m(hybridConfig(0));
    ASSERT_EQ(m.getNumPools(), 2);
    kvb_pool_info_t state = m.getPoolInfo(1);
    ASSERT_EQ(state.cache_type, KVB_CACHE_TYPE_RECURRENT_STATE);
    EXPECT_EQ(state.kv_factor, 1);
    EXPECT_EQ(state.tokens_per_block, 1);
    EXPECT_EQ(state.row_bytes, 3u * 4u * 16u * 4u);  // 3 layers x 4 heads x 16 FP32
    Engine e(m);
    const std::vector<int32_t> prompt = tokenRun(7, 13);
    e.admitAndCompute(1, prompt);  // snapshots after 4, 8 and 12 tokens
    m.removeSequence(1);
    EXPECT_EQ(m.addSequence(kvb::Request(2, prompt)).prepopulated_prompt_len, 12);
    EXPECT_TRUE(e.restoresSnapshot(2, prompt, 12));
    EXPECT_TRUE(e.holdsPattern(2, prompt, 12));
    // 10 shared tokens: attention alone could reuse 10, the state only up to its snapshot at 8.
    std::vector<int32_t> branch = tokenRun(7, 10);
    branch.insert(branch.end(), {800, 801, 802});
    EXPECT_EQ(m.addSequence(kvb::Request(3, branch)).prepopulated_prompt_len, 8);
    EXPECT_TRUE(e.restoresSnapshot(3, branch, 8));
    m.removeSequence(2, false);
    m.removeSequence(3, false);
    // Offloaded with every other block, onboarded with its snapshot.
    const std::vector<int32_t> other = tokenRun(5000, 8 * kTokensPerBlock);
    e.admitAndCompute(4, other);
    m.removeSequence(4, false);
    EXPECT_GE(m.getKvCacheStats().offloaded_blocks, 3u);
    EXPECT_EQ(m.addSequence(kvb::Request(5, prompt)).prepopulated_prompt_len, 12);
    EXPECT_TRUE(e.restoresSnapshot(5, prompt, 12));
    EXPECT_TRUE(e.holdsPattern(5, prompt, 12));
    m.checkInvariants();
}

// Snapshots kept every 2 blocks: reuse ends on the last kept snapshot.
TEST(PoolModelTest, HybridReuseEndsOnTheLastKeptSnapshot) {
    kvb::Manager m(hybridConfig(2 * kTokensPerBlock));
    Engine e(m);
    const std::vector<int32_t> prompt = tokenRun(40, 14);
    e.admitAndCompute(1, prompt);
    m.removeSequence(1);
    // 13 reusable tokens: 3 full blocks, of which the snapshot after 2 is the last kept one.
    EXPECT_EQ(m.addSequence(kvb::Request(2, prompt)).prepopulated_prompt_len, 8);
    EXPECT_TRUE(e.restoresSnapshot(2, prompt, 8));
    EXPECT_TRUE(e.holdsPattern(2, prompt, 8));
    // An interval that is not a multiple of the block size is a config error.
    EXPECT_EQ(kvb_test::statusOf([] { kvb::Manager bad(hybridConfig(6)); }),
              KVB_STATUS_INVALID_CONFIG);
}

// Bad arguments of the pool calls are statuses, and change nothing.
TEST(PoolModelTest, BadArgumentsAreStatuses) {
    kvb::Config c = hostConfig(64);
    c.addWindow(64, 4, 0);
    c.addLayers(3, 64, KVB_CACHE_TYPE_SELF, 2, 32, KVB_KV_DATA_TYPE_NVFP4);
    kvb::Manager m(c);
    kvb_manager_t* h = m.get();
    kvb_pool_info_t info;
    ASSERT_EQ(kvb_pool_info_init(&info), KVB_OK);
    EXPECT_EQ(kvb_manager_get_pool_info(h, 2, &info), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_manager_get_pool_info(h, -1, &info), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_manager_get_pool_info(h, 0, nullptr), KVB_STATUS_NULL_POINTER);
    info.struct_size = 8;
    EXPECT_EQ(kvb_manager_get_pool_info(h, 0, &info), KVB_STATUS_STRUCT_SIZE);

    std::vector<int32_t> pools(2), index(2);
    size_t n = 0;
    EXPECT_EQ(kvb_manager_get_layer_to_pool_mapping(h, pools.data(), index.data(), 2, &n),
              KVB_STATUS_BUFFER_TOO_SMALL);
    EXPECT_EQ(n, 3u);
    EXPECT_EQ(kvb_manager_get_layer_to_pool_mapping(h, nullptr, index.data(), 3, &n),
              KVB_STATUS_NULL_POINTER);

    uint8_t* base = nullptr;
    size_t row = 0;
    EXPECT_EQ(kvb_manager_get_model_pool_pointer(h, 0, 7, &base, &row),
              KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb_manager_get_model_pool_pointer(h, 0, KVB_CACHE_LEVEL_SECONDARY, &base, &row),
              KVB_STATUS_UNSUPPORTED);  // no host tier
    std::vector<uint8_t*> scales(1);
    EXPECT_EQ(
        kvb_manager_get_block_scale_pool_pointers(h, KVB_CACHE_LEVEL_PRIMARY, scales.data(), 0, &n),
        KVB_STATUS_BUFFER_TOO_SMALL);
    EXPECT_EQ(n, 1u);
    int dummy = 0;
    EXPECT_EQ(kvb_manager_register_model_pool(h, 0, KVB_CACHE_LEVEL_PRIMARY, &dummy, sizeof dummy),
              KVB_STATUS_UNSUPPORTED);  // the CUDA backend's only
    EXPECT_EQ(kvb_test::statusOf([&] { m.registerPool(64, KVB_CACHE_LEVEL_PRIMARY, &dummy, 4); }),
              KVB_STATUS_INVALID_ARGUMENT);  // two pools: register each by its index
    EXPECT_EQ(kvb_manager_get_pool_pointer(h, 64, KVB_CACHE_LEVEL_PRIMARY, &base, &row),
              KVB_STATUS_INVALID_ARGUMENT);  // and address each by its index

    std::vector<kvb_layer_spec_t> bad = {{64, KVB_CACHE_TYPE_SELF, 1, 16, 42}};
    std::vector<int32_t> windows(1);
    std::vector<uint64_t> bytes(1);
    EXPECT_EQ(kvb_calculate_window_bytes_per_token(bad.data(), 1, 2, 32, windows.data(),
                                                   bytes.data(), 1, &n),
              KVB_STATUS_INVALID_CONFIG);  // unknown data type
    EXPECT_EQ(kvb_calculate_window_bytes_per_token(nullptr, 1, 2, 32, windows.data(), bytes.data(),
                                                   1, &n),
              KVB_STATUS_NULL_POINTER);
    m.checkInvariants();
}
