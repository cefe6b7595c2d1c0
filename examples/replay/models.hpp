// replay/models.hpp: `--model` presets, the layers of real model shapes (kvb_layer_spec_t), so the
// replay runs with each model's pools: its windows, cache types, heads, head sizes and data types.
#ifndef KVBLOCK_REPLAY_MODELS_HPP
#define KVBLOCK_REPLAY_MODELS_HPP

#include "common.hpp"

namespace replay {

/// The model of a replay: its name, layers, and the windows (0 stands for the longest sequence).
struct ModelPreset {
    std::string name;
    std::vector<kvb_layer_spec_t> layers;  // window_size 0 = full attention (the longest sequence)
};

inline constexpr const char* kModelNames =
    "uniform, llama-gqa, deepseek-v3-mla, gemma-vswa, hybrid-mamba";

inline void add_layers(std::vector<kvb_layer_spec_t>& out, int n, int32_t window,
                       kvb_cache_type_t type, int32_t heads, int32_t head, kvb_kv_data_type_t dt) {
    for (int i = 0; i < n; ++i) out.push_back({window, type, heads, head, dt});
}

/// The preset `name`; "uniform" (the default) has no layers: one pool of --block-bytes.
inline ModelPreset model_preset(const std::string& name) {
    ModelPreset p{name, {}};
    if (name == "uniform") return p;
    if (name == "llama-gqa") {
        // Llama-3.1-8B: 32 layers, 8 KV heads of 128, BF16 (128 KiB per token).
        add_layers(p.layers, 32, 0, KVB_CACHE_TYPE_SELF, 8, 128, KVB_KV_DATA_TYPE_BF16);
    } else if (name == "deepseek-v3-mla") {
        // DeepSeek-V3.2: 61 layers of one 512 + 64 latent (K only, BF16), and the sparse
        // attention indexer's K cache (per token and layer 128 FP8 elements and their FP32
        // scale: 132 bytes), in pools after the latent's.
        add_layers(p.layers, 61, 0, KVB_CACHE_TYPE_SELF_K_ONLY, 1, 576, KVB_KV_DATA_TYPE_BF16);
        add_layers(p.layers, 61, 0, KVB_CACHE_TYPE_INDEXER_K, 1, 132, KVB_KV_DATA_TYPE_FP8);
    } else if (name == "gemma-vswa") {
        // Gemma-3-27B: 62 layers, five sliding (1024 tokens) to one global, 16 KV heads of 128.
        for (int l = 0; l < 62; ++l) {
            add_layers(p.layers, 1, (l + 1) % 6 == 0 ? 0 : 1024, KVB_CACHE_TYPE_SELF, 16, 128,
                       KVB_KV_DATA_TYPE_BF16);
        }
    } else if (name == "hybrid-mamba") {
        // Nemotron-H-8B-like: 4 attention layers (8 KV heads of 128, BF16) and 24 Mamba-2 layers
        // whose state (128 heads x 64 x 128, FP32) is snapshotted per block.
        add_layers(p.layers, 4, 0, KVB_CACHE_TYPE_SELF, 8, 128, KVB_KV_DATA_TYPE_BF16);
        add_layers(p.layers, 24, 0, KVB_CACHE_TYPE_RECURRENT_STATE, 128, 64 * 128,
                   KVB_KV_DATA_TYPE_FP32);
    } else {
        throw std::runtime_error("--model expects one of " + std::string(kModelNames) + ", got '" +
                                 name + "'");
    }
    return p;
}

/// The preset's layers with full-attention windows set to `max_sequence_length`, and its windows
/// (ascending) of `primary` and `secondary` blocks each.
inline void model_windows(const ModelPreset& p, int32_t max_sequence_length, int32_t primary,
                          int32_t secondary, std::vector<kvb_layer_spec_t>& layers,
                          std::vector<kvb_window_config_t>& windows) {
    layers = p.layers;
    std::vector<int32_t> sizes;
    for (auto& l : layers) {
        if (l.window_size == 0 || l.window_size > max_sequence_length)
            l.window_size = max_sequence_length;
        if (std::find(sizes.begin(), sizes.end(), l.window_size) == sizes.end())
            sizes.push_back(l.window_size);
    }
    std::sort(sizes.begin(), sizes.end());
    windows.clear();
    for (int32_t s : sizes) windows.push_back({s, primary, secondary, 0, 0, 0, false});
}

}  // namespace replay

#endif
