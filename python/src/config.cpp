// WindowConfig and ManagerConfig (kvb_window_config_t, kvb_manager_config_t).
#include "init.hpp"

namespace kvb_py {

namespace {

// Plain-valued fields of kvb_manager_config_t settable by keyword (copy_backend and
// attention_dp_rank are converted separately).
#define KVB_CONFIG_FIELDS(X)                   \
    X(tokens_per_block, int32_t)               \
    X(max_beam_width, int32_t)                 \
    X(max_sequence_length, int32_t)            \
    X(enable_block_reuse, bool)                \
    X(enable_partial_reuse, bool)              \
    X(copy_on_partial_reuse, bool)             \
    X(onboard_blocks, bool)                    \
    X(secondary_offload_min_priority, int32_t) \
    X(bytes_per_element, int32_t)              \
    X(manual_clock, bool)                      \
    X(max_kv_event_entries, int32_t)           \
    X(cuda_device, int32_t)                    \
    X(cuda_allocate_pools, bool)               \
    X(max_utilization_for_resume, double)      \
    X(stall_pass_threshold, int32_t)           \
    X(num_extra_kv_tokens, int32_t)            \
    X(max_draft_tokens, int32_t)               \
    X(recurrent_snapshot_interval_tokens, int32_t)

std::optional<int32_t> get_dp_rank(const kvb::Config& c) {
    return c.raw.attention_dp_rank < 0 ? std::nullopt
                                       : std::optional<int32_t>(c.raw.attention_dp_rank);
}
void set_dp_rank(kvb::Config& c, std::optional<int32_t> rank) {
    c.raw.attention_dp_rank = rank.value_or(-1);
}

/// Applies `ManagerConfig(**kwargs)`.
void apply_config_kwargs(kvb::Config& c, const nb::kwargs& kwargs) {
    for (auto [key, value] : kwargs) {
        const std::string k = nb::cast<std::string>(key);
#define X(name, type)                       \
    if (k == #name) {                       \
        c.raw.name = nb::cast<type>(value); \
        continue;                           \
    }
        KVB_CONFIG_FIELDS(X)
#undef X
        if (k == "copy_backend") {
            c.raw.copy_backend = static_cast<int32_t>(nb::cast<kvb_copy_backend_t>(value));
        } else if (k == "cuda_transfer_mode") {
            c.raw.cuda_transfer_mode =
                static_cast<int32_t>(nb::cast<kvb_cuda_transfer_mode_t>(value));
        } else if (k == "cuda_stream") {
            c.raw.cuda_stream = reinterpret_cast<void*>(nb::cast<uintptr_t>(value));
        } else if (k == "layers") {
            c.layers = nb::cast<std::vector<kvb_layer_spec_t>>(value);
        } else if (k == "attention_dp_rank") {
            set_dp_rank(c, nb::cast<std::optional<int32_t>>(value));
        } else {
            throw nb::type_error(
                ("ManagerConfig() got an unexpected keyword argument '" + k + "'").c_str());
        }
    }
}

const char* const kConfigDoc = R"(Manager configuration (``kvb_manager_config_t``).

``ManagerConfig(windows, max_sequence_length, **fields)``: every field not given keeps the
library's default (``kvb_manager_config_init``; ``repr(ManagerConfig())`` shows them). Fields:
``tokens_per_block``, ``max_beam_width``, ``max_sequence_length``, ``enable_block_reuse``,
``enable_partial_reuse``, ``copy_on_partial_reuse``, ``onboard_blocks``,
``secondary_offload_min_priority``, ``bytes_per_element``, ``copy_backend`` (:class:`CopyBackend`),
``manual_clock``, ``max_kv_event_entries`` (0 = events off), ``attention_dp_rank`` (None = none);
for ``CopyBackend.CUDA``: ``cuda_device``, ``cuda_stream`` (the engine's stream as an integer, e.g.
``torch.cuda.current_stream().cuda_stream``), ``cuda_transfer_mode`` (:class:`CudaTransferMode`),
``cuda_allocate_pools`` (False: register the engine's own memory with ``register_pool``);
``layers`` (a list of :class:`LayerSpec`: the pools follow the model's layers, see
:meth:`KVCacheManager.get_pool_info`), ``recurrent_snapshot_interval_tokens``.)";

}  // namespace

void init_config(nb::module_& m) {
    auto window =
        nb::class_<kvb_window_config_t>(m, "WindowConfig",
                                        "One attention-window size and its pool layout.")
            .def(
                "__init__",
                [](kvb_window_config_t* w, int32_t window_size, int32_t primary_blocks,
                   int32_t secondary_blocks, int32_t num_layers, int32_t num_kv_heads,
                   int32_t size_per_head, bool auto_host_tier) {
                    new (w) kvb_window_config_t{window_size,   primary_blocks, secondary_blocks,
                                                num_layers,    num_kv_heads,   size_per_head,
                                                auto_host_tier};
                },
                "window_size"_a, "primary_blocks"_a, "secondary_blocks"_a = 0, "num_layers"_a = 1,
                "num_kv_heads"_a = 1, "size_per_head"_a = 1, "auto_host_tier"_a = false,
                "A window of ``window_size`` tokens with ``primary_blocks`` GPU blocks and "
                "``secondary_blocks`` host blocks; a pool row is layers x 2 x heads x "
                "tokens_per_block x "
                "size_per_head elements. ``auto_host_tier`` (with ``secondary_blocks`` 0) lets "
                "the library size the host tier (``Manager.get_host_tier_blocks`` reports it).")
            .def_rw("window_size", &kvb_window_config_t::window_size, "Attention window in tokens.")
            .def_rw("primary_blocks", &kvb_window_config_t::primary_blocks, "Blocks in GPU memory.")
            .def_rw("secondary_blocks", &kvb_window_config_t::secondary_blocks,
                    "Blocks in host memory.")
            .def_rw("num_layers", &kvb_window_config_t::num_layers, "Layers using this window.")
            .def_rw("num_kv_heads", &kvb_window_config_t::num_kv_heads, "KV heads per layer.")
            .def_rw("size_per_head", &kvb_window_config_t::size_per_head, "Elements per head.")
            .def_rw("auto_host_tier", &kvb_window_config_t::auto_host_tier,
                    "Let the library size the host tier (see ``kvb_window_config_t``).");
    add_repr(window, "WindowConfig",
             {"window_size", "primary_blocks", "secondary_blocks", "num_layers", "num_kv_heads",
              "size_per_head", "auto_host_tier"});

    auto config =
        nb::class_<kvb::Config>(m, "ManagerConfig", kConfigDoc)
            .def(
                "__init__",
                [](kvb::Config* c, std::vector<kvb_window_config_t> windows, nb::kwargs kwargs) {
                    new (c) kvb::Config();
                    c->windows = std::move(windows);
                    apply_config_kwargs(*c, kwargs);
                },
                "windows"_a = std::vector<kvb_window_config_t>(), "kwargs"_a,
                "Library defaults, then ``windows`` and the named fields.")
            .def_rw("windows", &kvb::Config::windows,
                    "The windows (a copy; assign a list to change).")
            .def_rw("layers", &kvb::Config::layers,
                    "The model's layers (:class:`LayerSpec`, a copy; assign a list to change); "
                    "empty: one pool per window from its sizes.");
#define X(name, type)                                           \
    config.def_prop_rw(                                         \
        #name, [](const kvb::Config& c) { return c.raw.name; }, \
        [](kvb::Config& c, type v) { c.raw.name = v; },         \
        "See ``kvb_manager_config_t::" #name "``.");
    KVB_CONFIG_FIELDS(X)
#undef X
    config
        .def_prop_rw(
            "copy_backend",
            [](const kvb::Config& c) {
                return static_cast<kvb_copy_backend_t>(c.raw.copy_backend);
            },
            [](kvb::Config& c, kvb_copy_backend_t v) {
                c.raw.copy_backend = static_cast<int32_t>(v);
            },
            "Where the pool bytes live (:class:`CopyBackend`).")
        .def_prop_rw(
            "cuda_transfer_mode",
            [](const kvb::Config& c) {
                return static_cast<kvb_cuda_transfer_mode_t>(c.raw.cuda_transfer_mode);
            },
            [](kvb::Config& c, kvb_cuda_transfer_mode_t v) {
                c.raw.cuda_transfer_mode = static_cast<int32_t>(v);
            },
            "How CUDA copies are ordered (:class:`CudaTransferMode`).")
        .def_prop_rw(
            "cuda_stream",
            [](const kvb::Config& c) { return reinterpret_cast<uintptr_t>(c.raw.cuda_stream); },
            [](kvb::Config& c, uintptr_t v) { c.raw.cuda_stream = reinterpret_cast<void*>(v); },
            "The engine's CUDA stream as an integer (0 = the legacy default stream).")
        .def_prop_rw("attention_dp_rank", &get_dp_rank, &set_dp_rank,
                     "Attention data-parallel rank carried by every event, or None.");
    init_config_remote(config);
    add_repr(config, "ManagerConfig",
             {"windows",
              "tokens_per_block",
              "max_beam_width",
              "max_sequence_length",
              "enable_block_reuse",
              "enable_partial_reuse",
              "copy_on_partial_reuse",
              "onboard_blocks",
              "secondary_offload_min_priority",
              "bytes_per_element",
              "copy_backend",
              "manual_clock",
              "max_kv_event_entries",
              "attention_dp_rank",
              "cuda_device",
              "cuda_stream",
              "cuda_transfer_mode",
              "cuda_allocate_pools",
              "max_utilization_for_resume",
              "stall_pass_threshold",
              "num_extra_kv_tokens",
              "max_draft_tokens"});
}

}  // namespace kvb_py
