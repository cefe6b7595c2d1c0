// Zero-copy views of the pools: numpy for host memory, DLPack for GPU memory.
#include "manager.hpp"

namespace kvb_py {

namespace {

/// What a pool view's owner capsule holds: a strong reference to the KVCacheManager object, so
/// the pools outlive every view, and the count close() checks.
struct ViewOwner {
    PyObject* manager;
};

void release_view_owner(void* p) noexcept {
    auto* owner = static_cast<ViewOwner*>(p);
    nb::inst_ptr<Manager>(nb::handle(owner->manager))->live_views -= 1;
    Py_DECREF(owner->manager);
    delete owner;
}

/// The element type of a view for `bytes_per_element`, and whether a trailing byte axis is
/// needed (sizes numpy has no float type of: the raw bytes, one axis per element).
std::pair<nb::dlpack::dtype, bool> view_dtype(int32_t bytes_per_element) {
    using nb::dlpack::dtype_code;
    switch (bytes_per_element) {
        case 1:
            return {{static_cast<uint8_t>(dtype_code::UInt), 8, 1}, false};
        case 2:
            return {{static_cast<uint8_t>(dtype_code::Float), 16, 1}, false};
        case 4:
            return {{static_cast<uint8_t>(dtype_code::Float), 32, 1}, false};
        case 8:
            return {{static_cast<uint8_t>(dtype_code::Float), 64, 1}, false};
        default:
            return {{static_cast<uint8_t>(dtype_code::UInt), 8, 1}, true};
    }
}

}  // namespace

/// Zero-copy view of the pool of (`window`, `level`): [blocks, layers, 2 (K|V), kv heads,
/// tokens per block, head size] (TensorRT-LLM's pool layout; one row per block). Host memory
/// (the host backend's pools, the CUDA backend's pinned host tier) is a numpy array; the CUDA
/// backend's GPU pool is a DLPack tensor on the manager's device. The array's owner holds the
/// manager object.
nb::object pool_view(nb::handle self_obj, int32_t window, kvb_cache_level_t level) {
    Manager& self = *nb::inst_ptr<Manager>(self_obj);
    const kvb_window_config_t* w = nullptr;
    for (const auto& c : self.config.windows)
        if (c.window_size == window) w = &c;
    if (w == nullptr) invalid_argument("pool_view: no window of size " + std::to_string(window));
    if (!self.config.layers.empty()) {
        invalid_argument(
            "pool_view: this manager's pools come from its layers: use model_pool_view");
    }
    auto [base, row] = nogil([&] { return self.m.getPoolPointer(window, level); });
    const int64_t blocks = level == KVB_CACHE_LEVEL_PRIMARY
                               ? w->primary_blocks
                               : nogil([&] { return self.m.getHostTierBlocks(window); });
    const int32_t bpe = self.config.raw.bytes_per_element;
    auto [dtype, byte_axis] = view_dtype(bpe);
    std::vector<size_t> shape = {static_cast<size_t>(blocks),
                                 static_cast<size_t>(w->num_layers),
                                 2,
                                 static_cast<size_t>(w->num_kv_heads),
                                 static_cast<size_t>(self.config.raw.tokens_per_block),
                                 static_cast<size_t>(w->size_per_head)};
    if (byte_axis) shape.push_back(static_cast<size_t>(bpe));
    size_t elements = 1;
    for (size_t i = 1; i < shape.size(); ++i) elements *= shape[i];
    if (elements * (byte_axis ? 1 : static_cast<size_t>(bpe)) != row) {
        throw kvb::Error(KVB_STATUS_INTERNAL, "pool_view: row bytes " + std::to_string(row) +
                                                  " differ from the configured geometry");
    }
    return wrap_pool_memory(self_obj, base, shape, dtype, level);
}

/// A view of `base` shaped `shape`, owned by the manager object (see pool_view).
nb::object wrap_pool_memory(nb::handle self_obj, void* base, const std::vector<size_t>& shape,
                            nb::dlpack::dtype dtype, kvb_cache_level_t level) {
    Manager& self = *nb::inst_ptr<Manager>(self_obj);
    const bool gpu =
        self.config.raw.copy_backend == KVB_COPY_BACKEND_CUDA && level == KVB_CACHE_LEVEL_PRIMARY;
    auto* owner = new ViewOwner{self_obj.ptr()};
    Py_INCREF(owner->manager);
    self.live_views += 1;
    nb::capsule capsule(owner, &release_view_owner);
    if (gpu) {
        // An object with __dlpack__ / __dlpack_device__ (not a bare capsule, which a consumer
        // can take only once): torch.from_dlpack, cupy.from_dlpack, jax.dlpack.from_dlpack.
        return nb::cast(nb::ndarray<nb::array_api>(base, shape.size(), shape.data(), capsule,
                                                   nullptr, dtype, nb::device::cuda::value,
                                                   self.config.raw.cuda_device));
    }
    return nb::cast(nb::ndarray<nb::numpy>(base, shape.size(), shape.data(), capsule, nullptr,
                                           dtype, nb::device::cpu::value, 0));
}

extern const char* const kPoolViewDoc;
const char* const kPoolViewDoc =
    R"(Zero-copy view of the pool of window ``window_size`` at ``cache_level``.

Shaped ``[blocks, layers, 2, kv_heads, tokens_per_block, size_per_head]`` (TensorRT-LLM's pool
layout: one row per block, K at index 0 and V at 1 of the third axis; a block's row is its
``memory_index``, and offset-table entry ``e`` of layer ``l`` is ``view.reshape(-1, kv_heads,
tokens_per_block, size_per_head)[e + 2 * l]``). The element type follows ``bytes_per_element``:
4 float32, 2 float16 (reinterpret for bfloat16, e.g. ``view.view(ml_dtypes.bfloat16)``), 8
float64, 1 uint8 (fp8/int8: reinterpret); any other size is uint8 with a trailing axis of
``bytes_per_element`` bytes. Host memory (the host backend's pools, the CUDA backend's pinned host
tier, whose device address is its host address under unified addressing) is a writable
``numpy.ndarray``; the CUDA backend's GPU pool is a DLPack tensor on ``cuda:cuda_device``
(``torch.from_dlpack(view)``). The view keeps this manager object alive, so the memory outlives
it; :meth:`close` raises :class:`InvalidArgumentError` while views are alive, and leaving a
``with`` block with live views defers the destroy to when the last view (and the manager object)
is gone. :class:`UnsupportedError` where the pool has no memory (copy backend ``NONE``, an empty
host tier, a GPU pool not registered yet).)";

}  // namespace kvb_py
