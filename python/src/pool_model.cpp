// The pool model: CacheType, KvDataType, LayerSpec (kvb_layer_spec_t), PoolInfo
// (kvb_pool_info_t), the bytes-per-token helper, and the KVCacheManager methods that describe and
// expose a manager's pools.
#include "init.hpp"
#include "manager.hpp"

namespace kvb_py {

namespace {

const char* const kModelPoolViewDoc = R"(Zero-copy view of pool ``pool`` at ``cache_level``.

Raw bytes shaped ``[blocks, layers, kv_factor, kv_heads, tokens, bytes_per_head_token]`` (see
:meth:`get_pool_info`; ``tokens`` is 1 for a recurrent-state pool): reinterpret the last axis with
``view.view(dtype)``. A block's row is its ``memory_index`` in every pool of its window. Ownership
and memory kinds as :meth:`pool_view`.)";

}  // namespace

void init_pool_model(nb::module_& m) {
    nb::enum_<kvb_cache_type_t>(m, "CacheType", "What a layer caches per token.")
        .value("SELF", KVB_CACHE_TYPE_SELF, "Self-attention K and V.")
        .value("SELF_K_ONLY", KVB_CACHE_TYPE_SELF_K_ONLY,
               "One row per token, no V half (MLA's latent, an indexer's K cache).")
        .value("CROSS", KVB_CACHE_TYPE_CROSS,
               "Cross-attention K and V of the encoder's output (no reuse).")
        .value("RECURRENT_STATE", KVB_CACHE_TYPE_RECURRENT_STATE,
               "A recurrent layer's state snapshot per block (Mamba, linear attention).")
        .value("INDEXER_K", KVB_CACHE_TYPE_INDEXER_K,
               "A sparse-attention indexer's K cache (DeepSeek-V3.2), in pools after the KV "
               "pools.");
    nb::enum_<kvb_kv_data_type_t>(m, "KvDataType", "Element type of a layer's cache.")
        .value("DEFAULT", KVB_KV_DATA_TYPE_DEFAULT, "The config's bytes_per_element.")
        .value("FP32", KVB_KV_DATA_TYPE_FP32)
        .value("FP16", KVB_KV_DATA_TYPE_FP16)
        .value("BF16", KVB_KV_DATA_TYPE_BF16)
        .value("FP8", KVB_KV_DATA_TYPE_FP8)
        .value("INT8", KVB_KV_DATA_TYPE_INT8)
        .value("NVFP4", KVB_KV_DATA_TYPE_NVFP4,
               "Two elements per byte and a block-scale pool (one FP8 scale per 16).");

    auto layer =
        nb::class_<kvb_layer_spec_t>(m, "LayerSpec", "One layer of the model (kvb_layer_spec_t).")
            .def(
                "__init__",
                [](kvb_layer_spec_t* l, int32_t window_size, kvb_cache_type_t cache_type,
                   int32_t num_kv_heads, int32_t size_per_head, kvb_kv_data_type_t data_type) {
                    new (l) kvb_layer_spec_t{window_size, static_cast<int32_t>(cache_type),
                                             num_kv_heads, size_per_head,
                                             static_cast<int32_t>(data_type)};
                },
                "window_size"_a, "cache_type"_a = KVB_CACHE_TYPE_SELF, "num_kv_heads"_a = 1,
                "size_per_head"_a = 1, "data_type"_a = KVB_KV_DATA_TYPE_DEFAULT)
            .def_rw("window_size", &kvb_layer_spec_t::window_size)
            .def_prop_rw(
                "cache_type",
                [](const kvb_layer_spec_t& l) {
                    return static_cast<kvb_cache_type_t>(l.cache_type);
                },
                [](kvb_layer_spec_t& l, kvb_cache_type_t v) {
                    l.cache_type = static_cast<int32_t>(v);
                })
            .def_rw("num_kv_heads", &kvb_layer_spec_t::num_kv_heads)
            .def_rw("size_per_head", &kvb_layer_spec_t::size_per_head)
            .def_prop_rw(
                "data_type",
                [](const kvb_layer_spec_t& l) {
                    return static_cast<kvb_kv_data_type_t>(l.data_type);
                },
                [](kvb_layer_spec_t& l, kvb_kv_data_type_t v) {
                    l.data_type = static_cast<int32_t>(v);
                });
    add_repr(layer, "LayerSpec",
             {"window_size", "cache_type", "num_kv_heads", "size_per_head", "data_type"});

    auto info =
        nb::class_<kvb_pool_info_t>(m, "PoolInfo", "One pool of a manager (kvb_pool_info_t).")
            .def_ro("window_size", &kvb_pool_info_t::window_size)
            .def_prop_ro("cache_type",
                         [](const kvb_pool_info_t& p) {
                             return static_cast<kvb_cache_type_t>(p.cache_type);
                         })
            .def_prop_ro("data_type",
                         [](const kvb_pool_info_t& p) {
                             return static_cast<kvb_kv_data_type_t>(p.data_type);
                         })
            .def_ro("num_layers", &kvb_pool_info_t::num_layers)
            .def_ro("kv_factor", &kvb_pool_info_t::kv_factor)
            .def_ro("num_kv_heads", &kvb_pool_info_t::num_kv_heads)
            .def_ro("size_per_head", &kvb_pool_info_t::size_per_head)
            .def_ro("bytes_per_head_token", &kvb_pool_info_t::bytes_per_head_token)
            .def_ro("tokens_per_block", &kvb_pool_info_t::tokens_per_block)
            .def_prop_ro("scales_of",
                         [](const kvb_pool_info_t& p) {
                             return p.scales_of < 0 ? std::nullopt
                                                    : std::optional<int32_t>(p.scales_of);
                         })
            .def_ro("row_bytes", &kvb_pool_info_t::row_bytes)
            .def_ro("bytes_per_token", &kvb_pool_info_t::bytes_per_token);
    add_repr(info, "PoolInfo",
             {"window_size", "cache_type", "data_type", "num_layers", "kv_factor", "num_kv_heads",
              "size_per_head", "bytes_per_head_token", "tokens_per_block", "scales_of", "row_bytes",
              "bytes_per_token"});

    m.def(
        "calculate_window_bytes_per_token",
        [](const std::vector<kvb_layer_spec_t>& layers, int32_t default_bytes_per_element,
           int32_t tokens_per_block) {
            size_t n = 0;
            kvb_status_t s = kvb_calculate_window_bytes_per_token(
                layers.data(), layers.size(), default_bytes_per_element, tokens_per_block, nullptr,
                nullptr, 0, &n);
            if (s != KVB_STATUS_BUFFER_TOO_SMALL) kvb::check(s);
            std::vector<int32_t> windows(n);
            std::vector<uint64_t> bytes(n);
            kvb::check(kvb_calculate_window_bytes_per_token(
                layers.data(), layers.size(), default_bytes_per_element, tokens_per_block,
                windows.data(), bytes.data(), n, &n));
            std::vector<std::pair<int32_t, uint64_t>> out;
            for (size_t i = 0; i < n; ++i) out.emplace_back(windows[i], bytes[i]);
            return out;
        },
        "layers"_a, "default_bytes_per_element"_a = 2, "tokens_per_block"_a = 32,
        "``[(window_size, bytes per token)]`` of a model's layers, ascending by window "
        "(``kvb_calculate_window_bytes_per_token``): the ``bytes_per_token`` of "
        ":meth:`KVCacheManager.calculate_max_num_blocks`.");
}

void init_manager_pools(ManagerClass& cls) {
    cls.def(
           "get_num_pools",
           [](const Manager& self, bool include_block_scale_pools) {
               return nogil([&] { return self.m.getNumPools(include_block_scale_pools); });
           },
           "include_block_scale_pools"_a = true,
           "Pools (TensorRT-LLM ``getNumPools``); without block-scale pools: offset-table pools.")
        .def(
            "get_pool_info",
            [](const Manager& self, int32_t pool) {
                return nogil([&] { return self.m.getPoolInfo(pool); });
            },
            "pool"_a, "The description of pool ``pool`` (:class:`PoolInfo`).")
        .def(
            "get_layer_to_pool_mapping",
            [](const Manager& self) {
                return nogil([&] { return self.m.getLayerToPoolMapping(); });
            },
            "``[(pool, index in pool)]`` per layer (TensorRT-LLM ``getLayerToPoolMapping``).")
        .def(
            "get_model_pool_pointer",
            [](Manager& self, int32_t pool, kvb_cache_level_t level) {
                auto [base, row] = nogil([&] { return self.m.getModelPoolPointer(pool, level); });
                return std::make_pair(reinterpret_cast<uintptr_t>(base), row);
            },
            "pool"_a, "cache_level"_a = KVB_CACHE_LEVEL_PRIMARY,
            "``(address, row_bytes)`` of pool ``pool`` (:meth:`get_pool_info`) at a cache level: "
            "host memory, or the device address with the CUDA backend; a block's row is its "
            "``memory_index``. ``UnsupportedError`` where the level has no memory.")
        .def(
            "get_block_scale_pool_pointers",
            [](const Manager& self, kvb_cache_level_t level) {
                std::vector<uint8_t*> p =
                    nogil([&] { return self.m.getBlockScalePoolPointers(level); });
                std::vector<uintptr_t> out;
                for (uint8_t* x : p) out.push_back(reinterpret_cast<uintptr_t>(x));
                return out;
            },
            "cache_level"_a = KVB_CACHE_LEVEL_PRIMARY,
            "Address of each data pool's block-scale pool (0 where none; TensorRT-LLM "
            "``getBlockScalePoolPointers``).")
        .def(
            "model_pool_view",
            [](nb::handle self_obj, int32_t pool, kvb_cache_level_t level) {
                Manager& self = *nb::inst_ptr<Manager>(self_obj);
                kvb_pool_info_t info = nogil([&] { return self.m.getPoolInfo(pool); });
                auto [base, row] = nogil([&] { return self.m.getModelPoolPointer(pool, level); });
                int64_t blocks = 0;
                for (const auto& w : self.config.windows) {
                    if (w.window_size == info.window_size) blocks = w.primary_blocks;
                }
                if (level != KVB_CACHE_LEVEL_PRIMARY) {
                    blocks = nogil([&] { return self.m.getHostTierBlocks(info.window_size); });
                }
                std::vector<size_t> shape = {static_cast<size_t>(blocks),
                                             static_cast<size_t>(info.num_layers),
                                             static_cast<size_t>(info.kv_factor),
                                             static_cast<size_t>(info.num_kv_heads),
                                             static_cast<size_t>(info.tokens_per_block),
                                             static_cast<size_t>(info.bytes_per_head_token)};
                size_t bytes = 1;
                for (size_t i = 1; i < shape.size(); ++i) bytes *= shape[i];
                if (bytes != row) {
                    throw kvb::Error(KVB_STATUS_INTERNAL, "model_pool_view: row bytes differ");
                }
                nb::dlpack::dtype u8{static_cast<uint8_t>(nb::dlpack::dtype_code::UInt), 8, 1};
                return wrap_pool_memory(self_obj, base, shape, u8, level);
            },
            "pool"_a, "cache_level"_a = KVB_CACHE_LEVEL_PRIMARY, kModelPoolViewDoc);
}

}  // namespace kvb_py
