// kvblock._kvblock: the Python binding of kvblock (nanobind). It wraps the C ABI (kvblock.h)
// through the C++ RAII header (kvblock.hpp) and implements nothing of its own: every call converts
// its arguments, releases the GIL, calls the library and converts the result. A failing status
// becomes the Python exception of that status (kvblock.Error and subclasses) with the library's
// message.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <kvblock.hpp>

#include <array>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// ---- errors ----------------------------------------------------------------------------------

constexpr int kNumStatuses = KVB_STATUS_STALLED + 1;
// Python exception type per status (index = status value); filled at import.
PyObject* g_error_types[kNumStatuses] = {};

[[noreturn]] void invalid_argument(const std::string& message) {
    throw kvb::Error(KVB_STATUS_INVALID_ARGUMENT, message);
}

/// Runs `f` (calls into the library) with the GIL released.
template <typename F>
auto nogil(F&& f) {
    nb::gil_scoped_release release;
    return f();
}

/// Calls a C function returning a status with the GIL released; raises on failure.
template <typename F>
void call(F&& f) {
    nogil([&] { kvb::check(f()); });
}

/// `repr` of an object as `Name(field=value, ...)`, reading the fields as Python attributes.
void add_repr(nb::handle cls, const char* name, std::initializer_list<const char*> fields) {
    std::vector<const char*> names(fields);
    nb::setattr(cls, "__repr__",
                nb::cpp_function(
                    [name, names](nb::handle self) {
                        std::string out = std::string(name) + "(";
                        for (size_t i = 0; i < names.size(); ++i) {
                            if (i) out += ", ";
                            out += names[i];
                            out += "=";
                            out += nb::repr(self.attr(names[i])).c_str();
                        }
                        return out + ")";
                    },
                    nb::is_method()));
}

// ---- tokens and requests ----------------------------------------------------------------------

using Int32Array = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using UInt64Array = nb::ndarray<const uint64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

/// Token ids viewed without a Python-level loop: a C-contiguous int32 array (numpy, any DLPack
/// or buffer object) is read in place; any other sequence of ints is converted in C++.
struct TokenView {
    const int32_t* data = nullptr;
    size_t size = 0;
    Int32Array array;            // keeps a viewed array alive
    std::vector<int32_t> owned;  // converted tokens

    explicit TokenView(nb::handle tokens) {
        if (nb::try_cast(tokens, array, /*convert=*/false)) {
            data = array.data();
            size = array.shape(0);
            return;
        }
        if (!nb::try_cast(tokens, owned)) {
            throw nb::type_error("tokens must be a sequence of ints or a 1-D int32 array");
        }
        data = owned.data();
        size = owned.size();
    }
};

/// Retention of a request's blocks (TensorRT-LLM `KvCacheRetentionConfig`).
struct RetentionConfig {
    std::vector<kvb_token_range_retention_t> ranges;
    int32_t decode_priority = 35;
    int64_t decode_duration_ms = -1;
};

/// A request to admit: kvb::Request for everything but the tokens, which it owns (Request objects)
/// or views (the keyword form of add_sequence).
struct PyRequest {
    kvb::Request req;
    std::optional<TokenView> view;

    PyRequest(uint64_t request_id, nb::handle tokens, std::optional<int32_t> input_length,
              int32_t beam_width, std::optional<std::vector<uint64_t>> token_extra_ids,
              std::optional<uint64_t> lora_task_id, std::optional<uint64_t> cache_salt,
              std::optional<std::vector<kvb_multimodal_item_t>> mm_items,
              std::optional<RetentionConfig> retention, bool copy_tokens) {
        req.id = request_id;
        view.emplace(tokens);
        if (copy_tokens) {
            req.tokens.assign(view->data, view->data + view->size);
            view.reset();
        }
        req.inputLength = input_length.value_or(-1);
        req.beamWidth = beam_width;
        if (token_extra_ids) req.extraIds = std::move(*token_extra_ids);
        if (lora_task_id) req.withLora(*lora_task_id);
        if (cache_salt) req.withSalt(*cache_salt);
        if (mm_items) req.mmItems = std::move(*mm_items);
        if (retention) {
            req.hasRetention = true;
            req.retentionRanges = retention->ranges;
            req.decodePriority = retention->decode_priority;
            req.decodeDurationMs = retention->decode_duration_ms;
        }
    }

    const int32_t* tokens() const { return view ? view->data : req.tokens.data(); }
    size_t num_tokens() const { return view ? view->size : req.tokens.size(); }

    /// The C view of this request; `retention` must outlive its use.
    void fill(kvb_request_t& r, kvb_retention_config_t& retention) const {
        req.fillC(r, retention);
        r.tokens = tokens();
        r.num_tokens = num_tokens();
        r.input_length = req.inputLength < 0 ? static_cast<int32_t>(num_tokens()) : req.inputLength;
    }
};

/// C views of a list of requests, valid while the list lives.
struct CBatch {
    std::vector<kvb_request_t> requests;
    std::vector<kvb_retention_config_t> retention;

    explicit CBatch(const std::vector<const PyRequest*>& batch)
        : requests(batch.size()), retention(batch.size()) {
        for (size_t i = 0; i < batch.size(); ++i) batch[i]->fill(requests[i], retention[i]);
    }
};

/// Calls `f(const kvb_request_t*)` with a C view of an optional request (null when absent).
template <typename F>
void with_optional_request(const PyRequest* request, F&& f) {
    kvb_request_t r;
    kvb_retention_config_t retention;
    if (request) request->fill(r, retention);
    f(request ? &r : nullptr);
}

kvb_multimodal_item_t make_mm_item(nb::bytes digest, int32_t position, int32_t length) {
    kvb_multimodal_item_t item{};
    if (digest.size() != sizeof(item.digest)) {
        invalid_argument("a multimodal digest has 32 bytes, got " + std::to_string(digest.size()));
    }
    std::memcpy(item.digest, digest.c_str(), sizeof(item.digest));
    item.position = position;
    item.length = length;
    return item;
}

template <size_t N>
nb::bytes digest_bytes(const uint8_t (&digest)[N]) {
    return nb::bytes(reinterpret_cast<const char*>(digest), N);
}

std::optional<int64_t> none_if_negative(int64_t v) {
    return v < 0 ? std::nullopt : std::optional<int64_t>(v);
}

// ---- the manager ------------------------------------------------------------------------------

/// Int32 offset table of a C call: a C-contiguous writable int32 CPU array, else ValueError.
using TableArray = nb::ndarray<int32_t, nb::c_contig, nb::device::cpu>;

struct Manager {
    kvb::Manager m;
    kvb::Config config;  // the pool geometry of pool_view (the C ABI has no config getter)
    int live_views = 0;  // pool views alive (changed with the GIL held); close() refuses while > 0

    explicit Manager(const kvb::Config& c) : m(c), config(c) {}

    kvb_manager_t* h() const { return m.get(); }

    /// Destroys the handle now (later calls raise DestroyedError; a waiting drain returns).
    void close() {
        if (live_views > 0) {
            invalid_argument(std::to_string(live_views) +
                             " pool view(s) of this manager are alive; they read its pools, "
                             "which close() would free: delete them first");
        }
        // The wrapper's destructor destroys again later, which the library answers with a status.
        call([&] { return kvb_manager_destroy(h()); });
    }

    std::pair<int32_t, int32_t> dims() const {
        return nogil([&] { return m.getOffsetTableDimensions(); });
    }

    /// Checks `output` against [num_pools][num_slots][2][max_blocks_per_seq]; returns num_slots.
    TableArray table_of(nb::handle output) const {
        TableArray table;
        auto [max_blocks, pools] = dims();
        const std::string want = "a writable C-contiguous int32 CPU array of shape (" +
                                 std::to_string(pools) + ", num_slots, 2, " +
                                 std::to_string(max_blocks) + ")";
        if (!nb::try_cast(output, table, /*convert=*/false)) {
            throw nb::value_error(
                ("output must be " + want + ", got " + std::string(nb::repr(output.type()).c_str()))
                    .c_str());
        }
        if (table.ndim() != 4 || table.shape(0) != static_cast<size_t>(pools) ||
            table.shape(2) != 2 || table.shape(3) != static_cast<size_t>(max_blocks)) {
            std::string got = "(";
            for (size_t i = 0; i < table.ndim(); ++i)
                got += (i ? ", " : "") + std::to_string(table.shape(i));
            throw nb::value_error(("output must be " + want + ", got shape " + got + ")").c_str());
        }
        return table;
    }
};

// ---- pool views --------------------------------------------------------------------------------

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
    const bool gpu =
        self.config.raw.copy_backend == KVB_COPY_BACKEND_CUDA && level == KVB_CACHE_LEVEL_PRIMARY;
    auto* owner = new ViewOwner{self_obj.ptr()};
    Py_INCREF(owner->manager);
    self.live_views += 1;
    nb::capsule capsule(owner, &release_view_owner);
    if (gpu) {
        return nb::cast(nb::ndarray<>(base, shape.size(), shape.data(), capsule, nullptr, dtype,
                                      nb::device::cuda::value, self.config.raw.cuda_device));
    }
    return nb::cast(nb::ndarray<nb::numpy>(base, shape.size(), shape.data(), capsule, nullptr,
                                           dtype, nb::device::cpu::value, 0));
}

/// A new numpy int32 array of `shape` owning its memory.
nb::ndarray<nb::numpy, int32_t> new_int32_array(std::initializer_list<size_t> shape) {
    size_t n = 1;
    for (size_t d : shape) n *= d;
    auto* data = new int32_t[n == 0 ? 1 : n];
    nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<int32_t*>(p); });
    return nb::ndarray<nb::numpy, int32_t>(data, shape.size(), shape.begin(), owner);
}

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
    X(max_draft_tokens, int32_t)

#define KVB_REQUEST_STATE_FIELDS(X) \
    X(prompt_len, int32_t)          \
    X(beam_width, int32_t)          \
    X(context_chunk_size, int32_t)  \
    X(num_draft_tokens, int32_t)    \
    X(max_new_tokens, int32_t)      \
    X(num_generated_tokens, int32_t)

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
``cuda_allocate_pools`` (False: register the engine's own memory with ``register_pool``).)";

void bind_errors(nb::module_& m) {
    static const std::array<const char*, kNumStatuses> names = {nullptr,
                                                                "NullPointerError",
                                                                "InvalidArgumentError",
                                                                "InvalidConfigError",
                                                                "StructSizeError",
                                                                "UnknownRequestError",
                                                                "DuplicateRequestError",
                                                                "TooFewTokensError",
                                                                "BeamWidthExceededError",
                                                                "InvalidRetentionError",
                                                                "SequenceTooLongError",
                                                                "OutOfBlocksError",
                                                                "BufferTooSmallError",
                                                                "UnsupportedError",
                                                                "InvariantViolationError",
                                                                "DestroyedError",
                                                                "PoisonedError",
                                                                "InternalError",
                                                                "CudaError",
                                                                "OutOfMemoryError",
                                                                "CopyFailedError",
                                                                "TransportError",
                                                                "SequenceSuspendedError",
                                                                "StalledError"};
    PyObject* base = PyErr_NewExceptionWithDoc(
        "kvblock.Error",
        "A failed kvblock call. ``status`` (a :class:`Status`) names the failure; the message is "
        "the library's.",
        PyExc_RuntimeError, nullptr);
    m.attr("Error") = nb::steal(base);
    nb::object status_enum = m.attr("Status");
    nb::setattr(base, "status", nb::none());
    for (int s = 1; s < kNumStatuses; ++s) {
        // Argument errors are also ValueErrors.
        const bool value_error =
            s == KVB_STATUS_INVALID_ARGUMENT || s == KVB_STATUS_INVALID_CONFIG ||
            s == KVB_STATUS_INVALID_RETENTION || s == KVB_STATUS_TOO_FEW_TOKENS ||
            s == KVB_STATUS_SEQUENCE_TOO_LONG || s == KVB_STATUS_BEAM_WIDTH_EXCEEDED;
        nb::object bases = value_error
                               ? nb::make_tuple(nb::handle(base), nb::handle(PyExc_ValueError))
                               : nb::make_tuple(nb::handle(base));
        const std::string qualified = std::string("kvblock.") + names[s];
        const std::string doc = std::string("Raised on ``") + kvb_status_string(s) + "``.";
        PyObject* type =
            PyErr_NewExceptionWithDoc(qualified.c_str(), doc.c_str(), bases.ptr(), nullptr);
        nb::setattr(type, "status", status_enum(s));
        m.attr(names[s]) = nb::steal(type);
        g_error_types[s] = type;
    }
    nb::register_exception_translator(
        [](const std::exception_ptr& p, void* payload) {
            try {
                std::rethrow_exception(p);
            } catch (const kvb::Error& e) {
                const int s = static_cast<int>(e.status());
                PyObject* type = (s > 0 && s < kNumStatuses) ? g_error_types[s]
                                                             : static_cast<PyObject*>(payload);
                PyErr_SetString(type, e.what());
            }
        },
        base);
}

void bind_enums(nb::module_& m) {
    nb::enum_<kvb_status_t>(m, "Status", "Status of a kvblock call (``kvb_status_t``).")
        .value("OK", KVB_OK)
        .value("NULL_POINTER", KVB_STATUS_NULL_POINTER)
        .value("INVALID_ARGUMENT", KVB_STATUS_INVALID_ARGUMENT)
        .value("INVALID_CONFIG", KVB_STATUS_INVALID_CONFIG)
        .value("STRUCT_SIZE", KVB_STATUS_STRUCT_SIZE)
        .value("UNKNOWN_REQUEST", KVB_STATUS_UNKNOWN_REQUEST)
        .value("DUPLICATE_REQUEST", KVB_STATUS_DUPLICATE_REQUEST)
        .value("TOO_FEW_TOKENS", KVB_STATUS_TOO_FEW_TOKENS)
        .value("BEAM_WIDTH_EXCEEDED", KVB_STATUS_BEAM_WIDTH_EXCEEDED)
        .value("INVALID_RETENTION", KVB_STATUS_INVALID_RETENTION)
        .value("SEQUENCE_TOO_LONG", KVB_STATUS_SEQUENCE_TOO_LONG)
        .value("OUT_OF_BLOCKS", KVB_STATUS_OUT_OF_BLOCKS)
        .value("BUFFER_TOO_SMALL", KVB_STATUS_BUFFER_TOO_SMALL)
        .value("UNSUPPORTED", KVB_STATUS_UNSUPPORTED)
        .value("INVARIANT_VIOLATION", KVB_STATUS_INVARIANT_VIOLATION)
        .value("DESTROYED", KVB_STATUS_DESTROYED)
        .value("POISONED", KVB_STATUS_POISONED)
        .value("INTERNAL", KVB_STATUS_INTERNAL)
        .value("CUDA", KVB_STATUS_CUDA)
        .value("OUT_OF_MEMORY", KVB_STATUS_OUT_OF_MEMORY)
        .value("COPY_FAILED", KVB_STATUS_COPY_FAILED)
        .value("TRANSPORT", KVB_STATUS_TRANSPORT)
        .value("SEQUENCE_SUSPENDED", KVB_STATUS_SEQUENCE_SUSPENDED)
        .value("STALLED", KVB_STATUS_STALLED);
    nb::enum_<kvb_context_revert_t>(m, "ContextRevert",
                                    "What :meth:`Manager.revert_allocate_context` did.")
        .value("NOTHING", KVB_CONTEXT_REVERT_NOTHING,
               "Nothing to undo: no context allocation grew this iteration, it was already "
               "reverted, or prefill is over.")
        .value("SUSPENDED", KVB_CONTEXT_REVERT_SUSPENDED,
               "Shrunk back and suspended: resume and allocate the context again.")
        .value("RELEASED", KVB_CONTEXT_REVERT_RELEASED,
               "Prefill had passed the old capacity: computed blocks stored, sequence released; "
               "admit it again.");
    nb::enum_<kvb_cache_level_t>(m, "CacheLevel", "Cache level of a block's memory row.")
        .value("PRIMARY", KVB_CACHE_LEVEL_PRIMARY, "GPU (primary) memory.")
        .value("SECONDARY", KVB_CACHE_LEVEL_SECONDARY, "Host (secondary) memory.");
    nb::enum_<kvb_copy_backend_t>(m, "CopyBackend", "Where the bytes of the KV pools live.")
        .value("NONE", KVB_COPY_BACKEND_NONE, "Bookkeeping only: no pool memory.")
        .value("HOST", KVB_COPY_BACKEND_HOST,
               "Host buffers owned by the library; copies are memcpy.")
        .value("CUDA", KVB_COPY_BACKEND_CUDA,
               "GPU pools and a pinned host tier; copies by one batched kernel on the engine's "
               "stream.");
    nb::enum_<kvb_cuda_transfer_mode_t>(m, "CudaTransferMode",
                                        "How CUDA copies are ordered against the engine's stream.")
        .value("ENGINE_STREAM", KVB_CUDA_TRANSFER_ENGINE_STREAM,
               "Copies are enqueued on the engine's stream (nothing to call).")
        .value("COPY_STREAM", KVB_CUDA_TRANSFER_COPY_STREAM,
               "Copies run on kvblock's stream; call ``sync_transfers`` before using handed-out "
               "blocks.");
    nb::enum_<kvb_event_type_t>(m, "EventType", "Type of a KV cache event.")
        .value("CREATED", KVB_EVENT_CREATED)
        .value("STORED", KVB_EVENT_STORED)
        .value("REMOVED", KVB_EVENT_REMOVED)
        .value("UPDATED", KVB_EVENT_UPDATED);
    nb::enum_<kvb_request_phase_t>(m, "RequestPhase", "Where a request is in its life.")
        .value("CONTEXT_INIT", KVB_PHASE_CONTEXT_INIT)
        .value("CONTEXT_CONTINUE", KVB_PHASE_CONTEXT_CONTINUE)
        .value("GENERATION", KVB_PHASE_GENERATION)
        .value("OTHER", KVB_PHASE_OTHER);
}

void bind_config(nb::module_& m) {
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
                    "The windows (a copy; assign a list to change).");
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

void bind_request(nb::module_& m) {
    auto range =
        nb::class_<kvb_token_range_retention_t>(m, "TokenRangeRetentionConfig",
                                                "Priority (0..100) and optional duration for "
                                                "prompt tokens ``[token_start, token_end)``.")
            .def(
                "__init__",
                [](kvb_token_range_retention_t* r, int32_t start, std::optional<int32_t> end,
                   int32_t priority, std::optional<int64_t> duration_ms) {
                    new (r) kvb_token_range_retention_t{start, end.value_or(-1), priority,
                                                        duration_ms.value_or(-1)};
                },
                "token_start"_a, "token_end"_a = nb::none(), "priority"_a = 35,
                "duration_ms"_a = nb::none(),
                "``token_end`` None = to the end of the sequence; ``duration_ms`` None = forever.")
            .def_ro("token_start", &kvb_token_range_retention_t::token_start)
            .def_prop_ro(
                "token_end",
                [](const kvb_token_range_retention_t& r) { return none_if_negative(r.token_end); })
            .def_ro("priority", &kvb_token_range_retention_t::priority)
            .def_prop_ro("duration_ms", [](const kvb_token_range_retention_t& r) {
                return none_if_negative(r.duration_ms);
            });
    add_repr(range, "TokenRangeRetentionConfig",
             {"token_start", "token_end", "priority", "duration_ms"});

    auto retention =
        nb::class_<RetentionConfig>(
            m, "KvCacheRetentionConfig",
            "Retention of a request's blocks (TensorRT-LLM ``KvCacheRetentionConfig``).")
            .def(
                "__init__",
                [](RetentionConfig* r, std::vector<kvb_token_range_retention_t> ranges,
                   int32_t decode_priority, std::optional<int64_t> decode_duration_ms) {
                    new (r) RetentionConfig{std::move(ranges), decode_priority,
                                            decode_duration_ms.value_or(-1)};
                },
                "token_range_retention_configs"_a = std::vector<kvb_token_range_retention_t>(),
                "decode_retention_priority"_a = 35, "decode_duration_ms"_a = nb::none(),
                "Prompt ranges, the priority of generated blocks and its duration (None = "
                "forever).")
            .def_ro("token_range_retention_configs", &RetentionConfig::ranges)
            .def_ro("decode_retention_priority", &RetentionConfig::decode_priority)
            .def_prop_ro("decode_duration_ms", [](const RetentionConfig& r) {
                return none_if_negative(r.decode_duration_ms);
            });
    add_repr(retention, "KvCacheRetentionConfig",
             {"token_range_retention_configs", "decode_retention_priority", "decode_duration_ms"});

    auto mm =
        nb::class_<kvb_multimodal_item_t>(m, "MultimodalItem",
                                          "A multimodal item: a 32-byte content digest covering "
                                          "``length`` prompt tokens from ``position``.")
            .def(
                "__init__",
                [](kvb_multimodal_item_t* item, nb::bytes digest, int32_t position,
                   int32_t length) {
                    new (item) kvb_multimodal_item_t(make_mm_item(digest, position, length));
                },
                "digest"_a, "position"_a, "length"_a)
            .def_prop_ro("digest",
                         [](const kvb_multimodal_item_t& i) { return digest_bytes(i.digest); })
            .def_ro("position", &kvb_multimodal_item_t::position)
            .def_ro("length", &kvb_multimodal_item_t::length);
    add_repr(mm, "MultimodalItem", {"digest", "position", "length"});

    auto request =
        nb::class_<PyRequest>(m, "Request",
                              "A request to admit (what TensorRT-LLM reads from ``LlmRequest``). "
                              "The tokens are copied once, "
                              "at construction.")
            .def(
                "__init__",
                [](PyRequest* r, uint64_t request_id, nb::handle tokens,
                   std::optional<int32_t> input_length, int32_t beam_width,
                   std::optional<std::vector<uint64_t>> token_extra_ids,
                   std::optional<uint64_t> lora_task_id, std::optional<uint64_t> cache_salt,
                   std::optional<std::vector<kvb_multimodal_item_t>> mm_items,
                   std::optional<RetentionConfig> retention) {
                    new (r) PyRequest(request_id, tokens, input_length, beam_width,
                                      std::move(token_extra_ids), lora_task_id, cache_salt,
                                      std::move(mm_items), std::move(retention),
                                      /*copy_tokens=*/true);
                },
                "request_id"_a, "tokens"_a, nb::kw_only(), "input_length"_a = nb::none(),
                "beam_width"_a = 1, "token_extra_ids"_a = nb::none(), "lora_task_id"_a = nb::none(),
                "cache_salt"_a = nb::none(), "mm_items"_a = nb::none(), "retention"_a = nb::none(),
                "``tokens``: a sequence of ints or a 1-D int32 array (prompt, plus generated "
                "tokens when "
                "re-admitting). ``input_length`` None = all tokens are prompt. "
                "``token_extra_ids``: one per "
                "token (prompt tuning). ``retention``: a :class:`KvCacheRetentionConfig`.")
            .def_prop_ro("request_id", [](const PyRequest& r) { return r.req.id; })
            .def_prop_ro(
                "tokens",
                [](const PyRequest& r) {
                    auto out = new_int32_array({r.num_tokens()});
                    std::memcpy(out.data(), r.tokens(), r.num_tokens() * sizeof(int32_t));
                    return out;
                },
                nb::rv_policy::automatic, "A copy of the tokens (numpy int32).")
            .def_prop_ro("num_tokens", &PyRequest::num_tokens)
            .def_prop_ro("input_length",
                         [](const PyRequest& r) {
                             return r.req.inputLength < 0 ? static_cast<int32_t>(r.num_tokens())
                                                          : r.req.inputLength;
                         })
            .def_prop_ro("beam_width", [](const PyRequest& r) { return r.req.beamWidth; })
            .def_prop_ro("lora_task_id",
                         [](const PyRequest& r) {
                             return r.req.hasLoraTaskId ? std::optional<uint64_t>(r.req.loraTaskId)
                                                        : std::nullopt;
                         })
            .def_prop_ro("cache_salt",
                         [](const PyRequest& r) {
                             return r.req.hasCacheSalt ? std::optional<uint64_t>(r.req.cacheSalt)
                                                       : std::nullopt;
                         })
            .def_prop_ro("token_extra_ids",
                         [](const PyRequest& r) {
                             return r.req.extraIds.empty()
                                        ? std::nullopt
                                        : std::optional<std::vector<uint64_t>>(r.req.extraIds);
                         })
            .def_prop_ro("mm_items", [](const PyRequest& r) { return r.req.mmItems; });
    add_repr(
        request, "Request",
        {"request_id", "num_tokens", "input_length", "beam_width", "lora_task_id", "cache_salt"});

    auto state =
        nb::class_<kvb_request_state_t>(
            m, "RequestState",
            "Scheduler-side state of a request, for the estimates (``kvb_request_state_t``).")
            .def(
                "__init__",
                [](kvb_request_state_t* s, uint64_t request_id, nb::kwargs kwargs) {
                    new (s) kvb_request_state_t{};
                    kvb::check(kvb_request_state_init(s));
                    s->request_id = request_id;
                    for (auto [key, value] : kwargs) {
                        const std::string k = nb::cast<std::string>(key);
#define X(name, type)                    \
    if (k == #name) {                    \
        s->name = nb::cast<type>(value); \
        continue;                        \
    }
                        KVB_REQUEST_STATE_FIELDS(X)
#undef X
                        if (k != "phase") {
                            throw nb::type_error(
                                ("RequestState() got an unexpected keyword argument '" + k + "'")
                                    .c_str());
                        }
                        s->phase = static_cast<int32_t>(nb::cast<kvb_request_phase_t>(value));
                    }
                },
                "request_id"_a, "kwargs"_a,
                "Library defaults (``kvb_request_state_init``: context-init, beam width 1), then "
                "the named "
                "fields: ``phase`` (:class:`RequestPhase`), ``prompt_len``, ``beam_width``, "
                "``context_chunk_size``, ``num_draft_tokens``, ``max_new_tokens``, "
                "``num_generated_tokens``.")
            .def_rw("request_id", &kvb_request_state_t::request_id)
            .def_prop_rw(
                "phase",
                [](const kvb_request_state_t& s) {
                    return static_cast<kvb_request_phase_t>(s.phase);
                },
                [](kvb_request_state_t& s, kvb_request_phase_t p) {
                    s.phase = static_cast<int32_t>(p);
                });
#define X(name, type) state.def_rw(#name, &kvb_request_state_t::name);
    KVB_REQUEST_STATE_FIELDS(X)
#undef X
    add_repr(state, "RequestState",
             {"request_id", "phase", "prompt_len", "beam_width", "context_chunk_size",
              "num_draft_tokens", "max_new_tokens", "num_generated_tokens"});
}

void bind_results(nb::module_& m) {
    auto rs = nb::class_<kvb_request_stats_t>(
                  m, "RequestStats", "Per-request allocation counters, summed over windows.")
                  .def_ro("alloc_total_blocks", &kvb_request_stats_t::alloc_total_blocks)
                  .def_ro("alloc_new_blocks", &kvb_request_stats_t::alloc_new_blocks)
                  .def_ro("reused_blocks", &kvb_request_stats_t::reused_blocks)
                  .def_ro("missed_blocks", &kvb_request_stats_t::missed_blocks)
                  .def_ro("cache_hit_rate", &kvb_request_stats_t::cache_hit_rate);
    add_repr(rs, "RequestStats",
             {"alloc_total_blocks", "alloc_new_blocks", "reused_blocks", "missed_blocks",
              "cache_hit_rate"});

    auto adm =
        nb::class_<kvb_admission_t>(m, "Admission", "Result of an admission.")
            .def_ro(
                "prepopulated_prompt_len", &kvb_admission_t::prepopulated_prompt_len,
                "Prompt tokens already in the cache: the engine computes from this position on.")
            .def_ro("stats", &kvb_admission_t::stats);
    add_repr(adm, "Admission", {"prepopulated_prompt_len", "stats"});

    auto lengths =
        nb::class_<kvb_sequence_lengths_t>(
            m, "SequenceLengths",
            "A sequence's lengths in tokens: committed <= history <= capacity.")
            .def_ro("num_tokens", &kvb_sequence_lengths_t::num_tokens,
                    "Token ids known: prompt plus generated tokens.")
            .def_ro("capacity", &kvb_sequence_lengths_t::capacity, "Tokens with KV slots.")
            .def_ro("history", &kvb_sequence_lengths_t::history, "Tokens whose KV is computed.")
            .def_ro("committed", &kvb_sequence_lengths_t::committed,
                    "Tokens stored in the reuse tree.")
            .def_ro("reused", &kvb_sequence_lengths_t::reused, "Prompt tokens reused at admission.")
            .def_ro("suspended", &kvb_sequence_lengths_t::suspended);
    add_repr(lengths, "SequenceLengths",
             {"num_tokens", "capacity", "history", "committed", "reused", "suspended"});

    auto est = nb::class_<kvb_batch_estimate_t>(
                   m, "BatchEstimate", "The estimate for one request of a candidate batch.")
                   .def_ro("reusable_tokens", &kvb_batch_estimate_t::reusable_tokens)
                   .def_ro("allocated_blocks", &kvb_batch_estimate_t::allocated_blocks)
                   .def_ro("free_blocks_consumed", &kvb_batch_estimate_t::free_blocks_consumed)
                   .def_ro("reused_blocks", &kvb_batch_estimate_t::reused_blocks)
                   .def_ro("missed_blocks", &kvb_batch_estimate_t::missed_blocks)
                   .def_ro("fits", &kvb_batch_estimate_t::fits,
                           "Whether this request and every one before it fit.");
    add_repr(est, "BatchEstimate",
             {"reusable_tokens", "allocated_blocks", "free_blocks_consumed", "reused_blocks",
              "missed_blocks", "fits"});

    auto stats = nb::class_<kvb_kv_cache_stats_t>(
        m, "KvCacheStats", "Whole-manager statistics (TensorRT-LLM ``KvCacheStats``).");
    // One field per line; clang-format would re-indent the list on every run.
    // clang-format off
#define KVB_STATS_FIELDS(X) \
    X(max_num_blocks)       \
    X(free_num_blocks)      \
    X(used_num_blocks)      \
    X(tokens_per_block)     \
    X(alloc_total_blocks)   \
    X(alloc_new_blocks)     \
    X(reused_blocks)        \
    X(missed_blocks)        \
    X(cache_hit_rate)       \
    X(num_primary_blocks)   \
    X(num_secondary_blocks) \
    X(free_secondary_blocks) \
    X(offloaded_blocks)     \
    X(onboarded_blocks)     \
    X(evicted_blocks)       \
    X(allocated_bytes)
    // clang-format on
#define X(name) stats.def_ro(#name, &kvb_kv_cache_stats_t::name);
    KVB_STATS_FIELDS(X)
#undef X
#define X(name) #name,
    add_repr(stats, "KvCacheStats", {KVB_STATS_FIELDS(X)});
#undef X

    auto info = nb::class_<kvb_block_info_t>(m, "BlockInfo", "Snapshot of one block.")
                    .def_prop_ro("cache_level",
                                 [](const kvb_block_info_t& b) {
                                     return static_cast<kvb_cache_level_t>(b.cache_level);
                                 })
                    .def_ro("memory_index", &kvb_block_info_t::memory_index,
                            "Row index inside the pools of that level.")
                    .def_ro("ref_count", &kvb_block_info_t::ref_count)
                    .def_ro("priority", &kvb_block_info_t::priority)
                    .def_ro("in_reuse_tree", &kvb_block_info_t::in_reuse_tree)
                    .def_ro("is_leaf", &kvb_block_info_t::is_leaf)
                    .def_ro("is_free", &kvb_block_info_t::is_free, "In a free queue (evictable).")
                    .def_ro("num_tokens", &kvb_block_info_t::num_tokens)
                    .def_ro("hash", &kvb_block_info_t::hash,
                            "TensorRT-LLM block hash (valid when in the tree).")
                    .def_ro("parent", &kvb_block_info_t::parent,
                            "Tree parent block id; -1 = the root; -2 = not in the tree.");
    add_repr(info, "BlockInfo",
             {"cache_level", "memory_index", "ref_count", "priority", "in_reuse_tree", "is_leaf",
              "is_free", "num_tokens", "hash", "parent"});
}

void bind_events(nb::module_& m) {
    using Event = kvb::Event;
    auto diff = nb::class_<Event::Diff>(m, "KVCacheEventDiff", "An old and a new value.")
                    .def_ro("old_value", &Event::Diff::oldValue)
                    .def_ro("new_value", &Event::Diff::newValue);
    add_repr(diff, "KVCacheEventDiff", {"old_value", "new_value"});

    auto key = nb::class_<Event::MmKey>(m, "MmKey", "A multimodal key of a stored block.")
                   .def_prop_ro("digest",
                                [](const Event::MmKey& k) {
                                    return nb::bytes(reinterpret_cast<const char*>(k.digest.data()),
                                                     k.digest.size());
                                })
                   .def_ro("start_offset", &Event::MmKey::startOffset,
                           "Where the item starts relative to the block.");
    add_repr(key, "MmKey", {"digest", "start_offset"});

    auto block =
        nb::class_<Event::StoredBlock>(m, "KVCacheStoredBlock", "One block of a Stored event.")
            .def_ro("block_hash", &Event::StoredBlock::hash, "TensorRT-LLM block hash.")
            .def_ro("tokens", &Event::StoredBlock::tokens)
            .def_ro("token_extra_ids", &Event::StoredBlock::extraIds,
                    "Per-token extra ids, or None.")
            .def_ro("lora_task_id", &Event::StoredBlock::loraTaskId)
            .def_ro("cache_level", &Event::StoredBlock::cacheLevel)
            .def_ro("priority", &Event::StoredBlock::priority)
            .def_ro("mm_keys", &Event::StoredBlock::mmKeys)
            .def_ro("cache_salt", &Event::StoredBlock::cacheSalt);
    add_repr(block, "KVCacheStoredBlock",
             {"block_hash", "tokens", "token_extra_ids", "lora_task_id", "cache_level", "priority",
              "mm_keys", "cache_salt"});

    auto event =
        nb::class_<Event>(m, "KVCacheEvent",
                          "One KV cache event (``kvb_event_t``). Only the fields of its "
                          "``event_type`` are set; the others "
                          "are empty or zero.")
            .def_ro("event_id", &Event::id, "Strictly increasing in delivery order.")
            .def_ro("event_type", &Event::type)
            .def_ro("window_size", &Event::windowSize)
            .def_ro("attention_dp_rank", &Event::attentionDpRank)
            .def_ro("num_primary_blocks", &Event::numPrimaryBlocks,
                    "Created: GPU blocks of the window.")
            .def_ro("num_secondary_blocks", &Event::numSecondaryBlocks,
                    "Created: host blocks of the window.")
            .def_ro("parent_hash", &Event::parentHash,
                    "Stored: the first block's tree parent (None = the root).")
            .def_ro("stored_blocks", &Event::storedBlocks,
                    "Stored: the blocks, each the parent of the next.")
            .def_ro("removed_hashes", &Event::removedHashes,
                    "Removed: hashes of the blocks that left the tree.")
            .def_ro("block_hash", &Event::blockHash, "Updated: the block.")
            .def_ro("cache_level", &Event::cacheLevel, "Updated: the cache level change, or None.")
            .def_ro("priority", &Event::priority, "Updated: the priority change, or None.");
    add_repr(event, "KVCacheEvent",
             {"event_id", "event_type", "window_size", "attention_dp_rank", "num_primary_blocks",
              "num_secondary_blocks", "parent_hash", "stored_blocks", "removed_hashes",
              "block_hash", "cache_level", "priority"});
}

const char* const kManagerDoc = R"(A KV-cache block manager (TensorRT-LLM ``KVCacheManager``).

Every method calls the C ABI with the GIL released, so another thread (e.g. one draining events
with :meth:`get_latest_events`) runs meanwhile; calls on one manager are serialized by the
library. A failed call raises a :class:`kvblock.Error` subclass and changes nothing. Use as a
context manager or call :meth:`close` to free the manager before it is garbage collected.)";

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

void bind_manager(nb::module_& m) {
    nb::class_<Manager>(m, "KVCacheManager", kManagerDoc, nb::is_weak_referenceable())
        .def(
            "__init__",
            [](Manager* self, const kvb::Config& config) {
                nogil([&] { new (self) Manager(config); });
            },
            "config"_a, "Creates a manager (``kvb_manager_create``).")
        .def("close", &Manager::close,
             "Destroys the manager now; later calls raise :class:`DestroyedError`, a thread "
             "waiting in "
             ":meth:`get_latest_events` returns an empty list. Closing twice raises.")
        .def(
            "__enter__", [](nb::handle self) { return self; }, nb::rv_policy::reference)
        .def(
            "__exit__",
            [](Manager& self, nb::handle, nb::handle, nb::handle) {
                // With pool views alive, the destroy waits for the manager object's collection
                // (the views hold it), so their memory stays valid.
                if (self.live_views > 0) return;
                nogil([&] { return kvb_manager_destroy(self.h()); });  // closed already: ignored
            },
            "exc_type"_a.none(), "exc_value"_a.none(), "traceback"_a.none(),
            "Closes the manager (deferred to its collection while pool views are alive).")

        // -- admission
        .def(
            "add_sequence",
            [](Manager& self, const PyRequest& request) {
                kvb_admission_t out{};
                kvb_request_t r;
                kvb_retention_config_t retention;
                request.fill(r, retention);
                call([&] { return kvb_manager_add_sequence(self.h(), &r, &out); });
                return out;
            },
            "request"_a,
            "Admits a :class:`Request` (TensorRT-LLM ``addSequence``): reuses cached prefix "
            "blocks, onboards "
            "host blocks, allocates the rest. Raises :class:`OutOfBlocksError` when a window lacks "
            "blocks.")
        .def(
            "add_sequence",
            [](Manager& self, uint64_t request_id, nb::handle tokens,
               std::optional<int32_t> input_length, int32_t beam_width,
               std::optional<std::vector<uint64_t>> token_extra_ids,
               std::optional<uint64_t> lora_task_id, std::optional<uint64_t> cache_salt,
               std::optional<std::vector<kvb_multimodal_item_t>> mm_items,
               std::optional<RetentionConfig> retention) {
                const PyRequest request(request_id, tokens, input_length, beam_width,
                                        std::move(token_extra_ids), lora_task_id, cache_salt,
                                        std::move(mm_items), std::move(retention),
                                        /*copy_tokens=*/false);
                kvb_admission_t out{};
                kvb_request_t r;
                kvb_retention_config_t ret;
                request.fill(r, ret);
                call([&] { return kvb_manager_add_sequence(self.h(), &r, &out); });
                return out;
            },
            "request_id"_a, "tokens"_a, nb::kw_only(), "input_length"_a = nb::none(),
            "beam_width"_a = 1, "token_extra_ids"_a = nb::none(), "lora_task_id"_a = nb::none(),
            "cache_salt"_a = nb::none(), "mm_items"_a = nb::none(), "retention"_a = nb::none(),
            "Admits a request given by its fields (as :class:`Request`); an int32 array of tokens "
            "is read "
            "in place, without a copy on the Python side.")
        .def(
            "add_sequence_batch",
            [](Manager& self, const std::vector<const PyRequest*>& requests, bool longest_prefix) {
                CBatch batch(requests);
                std::vector<kvb_admission_t> out(requests.size());
                size_t admitted = 0;
                call([&] {
                    return kvb_manager_add_sequence_batch(self.h(), batch.requests.data(),
                                                          batch.requests.size(), longest_prefix,
                                                          out.data(), &admitted);
                });
                out.resize(admitted);
                return out;
            },
            "requests"_a, "longest_prefix"_a = false,
            "Admits requests in order (TensorRT-LLM ``addSequenceBatch``), claiming every reusable "
            "block "
            "first, so it delivers what :meth:`estimate_batch` estimated. All or nothing "
            "(:class:`OutOfBlocksError`), or with ``longest_prefix`` the longest prefix that fits; "
            "returns the admissions of the admitted requests.")
        .def(
            "estimate_batch",
            [](Manager& self, const std::vector<const PyRequest*>& requests) {
                CBatch batch(requests);
                std::vector<kvb_batch_estimate_t> out(requests.size());
                call([&] {
                    return kvb_manager_estimate_batch(self.h(), batch.requests.data(),
                                                      batch.requests.size(), out.data());
                });
                return out;
            },
            "requests"_a,
            "The scheduler's estimate for a candidate batch, in order, each counting the ones "
            "before it. "
            "Changes nothing.")

        // -- generation and release
        .def(
            "add_token",
            [](Manager& self, uint64_t id, int32_t token) {
                nogil([&] { self.m.addToken(id, token); });
            },
            "request_id"_a, "token_id"_a,
            "Appends a generated token (TensorRT-LLM ``addToken``); allocates a block at block "
            "boundaries.")
        .def(
            "remove_token",
            [](Manager& self, uint64_t id) { nogil([&] { self.m.removeToken(id); }); },
            "request_id"_a, "Removes the last generated token (TensorRT-LLM ``removeToken``).")
        .def(
            "rewind_kv_cache",
            [](Manager& self, uint64_t id, int32_t n) {
                nogil([&] { self.m.rewindKVCache(id, n); });
            },
            "request_id"_a, "num_tokens"_a,
            "Removes the last ``num_tokens`` generated tokens (TensorRT-LLM ``rewindKVCache``).")
        .def(
            "store_context_blocks",
            [](Manager& self, uint64_t id, int32_t position) {
                nogil([&] { self.m.storeContextBlocks(id, position); });
            },
            "request_id"_a, "context_position"_a,
            "Stores the full prompt blocks computed so far for reuse, after a context chunk "
            "(TensorRT-LLM ``storeContextBlocks``).")
        .def(
            "store_new_block",
            [](Manager& self, uint64_t id) { nogil([&] { self.m.storeNewBlock(id); }); },
            "request_id"_a,
            "Stores the decode block the last token completed (TensorRT-LLM ``storeNewBlock``).")
        .def(
            "store_blocks_for_reuse",
            [](Manager& self, uint64_t id, bool pin, int32_t window_size) {
                // With pin, the first call (no room) only reports how many ids there will be.
                std::vector<int32_t> ids;
                size_t n = 0;
                kvb_status_t s = nogil([&] {
                    return kvb_manager_store_blocks_for_reuse(self.h(), id, pin, window_size,
                                                              nullptr, 0, &n);
                });
                if (pin && s == KVB_STATUS_BUFFER_TOO_SMALL) {
                    ids.resize(n);
                    s = nogil([&] {
                        return kvb_manager_store_blocks_for_reuse(self.h(), id, pin, window_size,
                                                                  ids.data(), ids.size(), &n);
                    });
                    ids.resize(n);
                }
                kvb::check(s);
                return ids;
            },
            "request_id"_a, "pin"_a = false, "window_size"_a = 0,
            "Stores every computed token of a sequence for reuse (TensorRT-LLM "
            "``storeBlocksForReuse``); with "
            "``pin``, pins the stored blocks and returns their ids in ``window_size`` (0 = the "
            "smallest window).")
        .def(
            "get_sequence_lengths",
            [](Manager& self, uint64_t id) {
                return nogil([&] { return self.m.getSequenceLengths(id); });
            },
            "request_id"_a, "The sequence's :class:`SequenceLengths`.")
        .def(
            "resize",
            [](Manager& self, uint64_t id, size_t capacity) {
                return nogil([&] { return self.m.resize(id, capacity); });
            },
            "request_id"_a, "capacity"_a,
            "Resizes a sequence to ``capacity`` tokens. Returns False, changing nothing, when a "
            "grow cannot get its blocks; a shrink below the computed, committed or reused tokens "
            "raises :class:`InvalidArgumentError`.")
        .def(
            "allocate_generation",
            [](Manager& self, uint64_t id, size_t draft) {
                return nogil([&] { return self.m.allocateGeneration(id, draft); });
            },
            "request_id"_a, "num_draft_tokens"_a = 0,
            "Reserves KV slots for ``1 + num_draft_tokens`` tokens; False (nothing changed) when "
            "they cannot be had.")
        .def(
            "revert_allocate_generation",
            [](Manager& self, uint64_t id) {
                return nogil([&] { return self.m.revertAllocateGeneration(id); });
            },
            "request_id"_a,
            "Undoes the last generation allocation (with its padding); False when there is none.")
        .def(
            "extend_capacity_for_tokens",
            [](Manager& self, uint64_t id, size_t n) {
                return nogil([&] { return self.m.extendCapacityForTokens(id, n); });
            },
            "request_id"_a, "num_tokens"_a,
            "Adds ``num_tokens`` padding slots to the generation allocation (CUDA-graph padding).")
        .def(
            "allocate_context",
            [](Manager& self, uint64_t id, size_t n) {
                return nogil([&] { return self.m.allocateContext(id, n); });
            },
            "request_id"_a, "num_tokens"_a,
            "Grows the capacity to the history plus ``num_tokens`` (a prefill chunk).")
        .def(
            "revert_allocate_context",
            [](Manager& self, uint64_t id) {
                return nogil([&] { return self.m.revertAllocateContext(id); });
            },
            "request_id"_a,
            "Undoes the last context allocation of a deferred request (:class:`ContextRevert`).")
        .def(
            "advance_history",
            [](Manager& self, uint64_t id, size_t history) {
                nogil([&] { self.m.advanceHistory(id, history); });
            },
            "request_id"_a, "history"_a, "Marks ``history`` tokens as computed.")
        .def(
            "suspend", [](Manager& self, uint64_t id) { nogil([&] { self.m.suspend(id); }); },
            "request_id"_a,
            "Suspends a sequence: its blocks may move to the host tier when the GPU pool needs "
            "room.")
        .def(
            "resume",
            [](Manager& self, uint64_t id) { return nogil([&] { return self.m.resume(id); }); },
            "request_id"_a,
            "Brings a suspended sequence's blocks back to the GPU, all or none; False (nothing "
            "changed) above the utilization threshold or without room.")
        .def_prop_ro(
            "gpu_utilization",
            [](Manager& self) { return nogil([&] { return self.m.getGpuUtilization(); }); },
            "(total - free - movable) / total primary blocks, the maximum over windows.")
        .def(
            "end_scheduling_pass",
            [](Manager& self, size_t generation, size_t scheduled) {
                nogil([&] { self.m.endSchedulingPass(generation, scheduled); });
            },
            "num_generation_requests"_a, "num_scheduled"_a,
            "Ends a scheduling pass; raises :class:`StalledError` (naming the cause) after "
            "``stall_pass_threshold`` passes in a row without progress.")
        .def(
            "remove_sequence",
            [](Manager& self, uint64_t id, bool store) {
                nogil([&] { self.m.removeSequence(id, store); });
            },
            "request_id"_a, "store_for_reuse"_a = true,
            "Releases a finished sequence (TensorRT-LLM ``removeSequence``), first storing its "
            "computed blocks (up to its history: what ``store_context_blocks``, "
            "``advance_history`` or ``add_token`` reported) for reuse unless "
            "``store_for_reuse`` is False.")
        .def(
            "pin_blocks", [](Manager& self, uint64_t id) { nogil([&] { self.m.pinBlocks(id); }); },
            "request_id"_a, "Pins every block of a sequence (TensorRT-LLM ``pinBlocks``).")
        .def(
            "unpin_blocks_by_id",
            [](Manager& self, int32_t window_size, const std::vector<int32_t>& ids) {
                nogil([&] { self.m.unpinBlocksById(window_size, ids); });
            },
            "window_size"_a, "block_ids"_a,
            "Drops one pin of each block (TensorRT-LLM ``unpinBlocksById``).")

        // -- block tables
        .def(
            "get_cache_block_ids",
            [](Manager& self, uint64_t id, int32_t window_size, int32_t beam) {
                return nogil([&] { return self.m.getCacheBlockIds(id, window_size, beam); });
            },
            "request_id"_a, "window_size"_a, "beam"_a = 0,
            "Block ids of one beam of a sequence in one window (TensorRT-LLM "
            "``getCacheBlockIds``).")
        .def("get_offset_table_dimensions", &Manager::dims,
             "``(max_blocks_per_seq, num_pools)`` of an offset table "
             "``[num_pools][num_slots][2][max_blocks_per_seq]``.")
        .def(
            "get_max_blocks_per_seq",
            [](Manager& self, int32_t w) {
                return nogil([&] { return self.m.getMaxBlocksPerSeq(w); });
            },
            "window_size"_a,
            "The most blocks one beam may list in a window: ``ceil((min(max_sequence_length, "
            "window limit) + num_extra_kv_tokens + max_draft_tokens) / tokens_per_block)``.")
        .def(
            "get_host_tier_blocks",
            [](Manager& self, int32_t w) {
                return nogil([&] { return self.m.getHostTierBlocks(w); });
            },
            "window_size"_a,
            "Host-tier blocks of a window: configured, or chosen for an automatic host tier.")
        .def(
            "copy_block_offsets",
            [](Manager& self, nb::handle output, int32_t output_slot_offset, uint64_t request_id) {
                TableArray table = self.table_of(output);
                int32_t count = 0;
                call([&] {
                    return kvb_manager_copy_block_offsets(self.h(), table.data(), table.size(),
                                                          static_cast<int32_t>(table.shape(1)),
                                                          output_slot_offset, request_id, &count);
                });
                return count;
            },
            "output"_a, "output_slot_offset"_a, "request_id"_a,
            "Writes a sequence's block offsets into ``output`` (int32, shape ``(num_pools, "
            "num_slots, 2, "
            "max_blocks_per_seq)``; numpy or any DLPack CPU tensor, written in place) at slots "
            "``output_slot_offset ..`` (TensorRT-LLM ``copyBlockOffsets``). Returns the most "
            "blocks of any "
            "beam. A wrong dtype, layout or shape raises ValueError.")
        .def(
            "get_block_offsets_of_batch",
            [](Manager& self, const std::vector<uint64_t>& request_ids, int32_t beam_width,
               nb::object output) {
                if (output.is_none()) {
                    auto [max_blocks, pools] = self.dims();
                    output = nb::cast(
                        new_int32_array({static_cast<size_t>(pools),
                                         request_ids.size() * static_cast<size_t>(beam_width), 2,
                                         static_cast<size_t>(max_blocks)}));
                }
                TableArray table = self.table_of(output);
                call([&] {
                    return kvb_manager_get_block_offsets_of_batch(
                        self.h(), table.data(), table.size(), static_cast<int32_t>(table.shape(1)),
                        request_ids.data(), request_ids.size(), beam_width);
                });
                return output;
            },
            "request_ids"_a, "beam_width"_a = 1, "output"_a = nb::none(),
            "Offsets of a batch (TensorRT-LLM ``getBlockOffsetsOfBatch``): request "
            "``request_ids[i]`` at "
            "slots ``i * beam_width ..``. Writes into ``output`` (as in "
            ":meth:`copy_block_offsets`) or a new "
            "numpy array of ``len(request_ids) * beam_width`` slots, and returns it.")

        // -- statistics and queries
        .def(
            "get_kv_cache_stats",
            [](Manager& self) { return nogil([&] { return self.m.getKvCacheStats(); }); },
            "Whole-manager statistics (TensorRT-LLM ``getKvCacheStats``).")
        .def(
            "get_num_free_blocks",
            [](Manager& self) { return nogil([&] { return self.m.getNumFreeBlocks(); }); },
            "Free primary blocks over all windows (TensorRT-LLM ``getNumFreeBlocks``).")
        .def(
            "get_num_free_blocks_per_window_size",
            [](Manager& self, int32_t w) {
                return nogil([&] { return self.m.getNumFreeBlocksPerWindowSize(w); });
            },
            "window_size"_a, "``(primary, secondary)`` free blocks of a window.")
        .def(
            "get_request_stats",
            [](Manager& self, uint64_t id) {
                return nogil([&] { return self.m.getRequestStats(id); });
            },
            "request_id"_a, "The admission result of a live sequence.")
        .def(
            "get_num_tokens",
            [](Manager& self, uint64_t id) {
                return nogil([&] { return self.m.getNumTokens(id); });
            },
            "request_id"_a, "Tokens (prompt + generated) of a sequence.")
        .def_prop_ro(
            "tokens_per_block",
            [](Manager& self) {
                int32_t n = 0;
                call([&] { return kvb_manager_get_tokens_per_block(self.h(), &n); });
                return n;
            },
            "Tokens per block.")
        .def(
            "get_block_info",
            [](Manager& self, int32_t w, int32_t block) {
                return nogil([&] { return self.m.getBlockInfo(w, block); });
            },
            "window_size"_a, "block_id"_a, "A snapshot of one block of a window.")
        .def(
            "get_priority_by_block_id",
            [](Manager& self, int32_t w, int64_t block) {
                return nogil([&] { return self.m.getPriorityByBlockId(w, block); });
            },
            "window_size"_a, "block_id"_a,
            "Retention priority of a block (TensorRT-LLM ``getPriorityByBlockId``).")
        .def(
            "get_last_block_id",
            [](Manager& self, uint64_t id) {
                return nogil([&] { return self.m.getLastBlockId(id); });
            },
            "request_id"_a,
            "Last block of beam 0 in the smallest window (TensorRT-LLM ``getLastBlockId``).")
        .def(
            "offload_block",
            [](Manager& self, int32_t w, int32_t block) {
                return nogil([&] { return self.m.offloadBlock(w, block); });
            },
            "window_size"_a, "block_id"_a,
            "Offloads a free primary block to the host tier; False when no host block is free or "
            "offloading is off.")
        .def(
            "get_pool_pointer",
            [](Manager& self, int32_t w, kvb_cache_level_t level) {
                auto [base, row] = nogil([&] { return self.m.getPoolPointer(w, level); });
                return std::make_pair(reinterpret_cast<uintptr_t>(base), row);
            },
            "window_size"_a, "cache_level"_a,
            "``(address, row_bytes)`` of a window's pool: host memory (host backend) or the device "
            "address (CUDA backend); a block's row is its ``memory_index``.")
        .def("pool_view", &pool_view, "window_size"_a, "cache_level"_a = KVB_CACHE_LEVEL_PRIMARY,
             kPoolViewDoc)
        .def_prop_ro(
            "live_pool_views", [](const Manager& self) { return self.live_views; },
            "Pool views (:meth:`pool_view`) of this manager still alive.")
        .def(
            "set_stream",
            [](Manager& self, uintptr_t stream) {
                nogil([&] { self.m.setStream(reinterpret_cast<void*>(stream)); });
            },
            "stream"_a,
            "CUDA backend: orders later copies with the engine stream ``stream`` (an integer "
            "handle, "
            "e.g. ``torch.cuda.current_stream().cuda_stream``).")
        .def(
            "sync_transfers", [](Manager& self) { nogil([&] { self.m.syncTransfers(); }); },
            "CUDA copy-stream ordering: the engine stream waits (on the GPU) for every copy so "
            "far; "
            "a no-op otherwise.")
        .def(
            "register_pool",
            [](Manager& self, int32_t w, kvb_cache_level_t level, uintptr_t pointer,
               size_t nbytes) {
                nogil([&] {
                    self.m.registerPool(w, level, reinterpret_cast<void*>(pointer), nbytes);
                });
            },
            "window_size"_a, "cache_level"_a, "pointer"_a, "nbytes"_a,
            "CUDA backend: the engine's memory (an address, e.g. ``tensor.data_ptr()``) as the "
            "pool of "
            "a window and level; only before any data is held.")
        .def_prop_ro(
            "copy_launches", [](Manager& self) { return self.m.copyLaunches(); },
            "Batched copy submissions so far (CUDA kernel launches).")

        // -- scheduling and estimates
        .def(
            "start_scheduling", [](Manager& self) { nogil([&] { self.m.startScheduling(); }); },
            "Starts a scheduling simulation (TensorRT-LLM ``startScheduling``).")
        .def(
            "scheduling_remove_sequence",
            [](Manager& self, uint64_t id) { nogil([&] { self.m.schedulingRemoveSequence(id); }); },
            "request_id"_a,
            "In the simulation, frees what removing a sequence would free (TensorRT-LLM "
            "``schedulingRemoveSequence``).")
        .def(
            "scheduling_has_free_blocks",
            [](Manager& self, int32_t n, int32_t w) {
                return nogil([&] { return self.m.schedulingHasFreeBlocks(n, w); });
            },
            "num_blocks"_a, "window_size"_a,
            "Whether the simulation has at least ``num_blocks`` free blocks in a window.")
        .def(
            "get_needed_blocks_one_step",
            [](Manager& self, const kvb_request_state_t& state, bool two_steps, int32_t w,
               const PyRequest* request) {
                int32_t n = 0;
                with_optional_request(request, [&](const kvb_request_t* r) {
                    call([&] {
                        return kvb_manager_get_needed_blocks_one_step(self.h(), &state, r,
                                                                      two_steps, w, &n);
                    });
                });
                return n;
            },
            "state"_a, "two_steps_look_ahead"_a, "window_size"_a, "request"_a = nb::none(),
            "Blocks the next step of a request needs in one window (TensorRT-LLM "
            "``getNeededBlocksOneStep``); "
            "``request`` lets a first context chunk discount prefix blocks other sequences hold.")
        .def(
            "get_remaining_blocks_to_completion",
            [](Manager& self, const kvb_request_state_t& state, int32_t w,
               const PyRequest* request) {
                int32_t n = 0;
                with_optional_request(request, [&](const kvb_request_t* r) {
                    call([&] {
                        return kvb_manager_get_remaining_blocks_to_completion(self.h(), &state, r,
                                                                              w, &n);
                    });
                });
                return n;
            },
            "state"_a, "window_size"_a, "request"_a = nb::none(),
            "Blocks a request still needs in one window until completion (TensorRT-LLM "
            "``getRemainingBlocksToCompletion``).")
        .def(
            "count_reusable_blocks",
            [](Manager& self, const PyRequest& request, int32_t w, bool only_allocated) {
                int32_t n = 0;
                with_optional_request(&request, [&](const kvb_request_t* r) {
                    call([&] {
                        return kvb_manager_count_reusable_blocks(self.h(), r, w, only_allocated,
                                                                 &n);
                    });
                });
                return n;
            },
            "request"_a, "window_size"_a, "only_allocated"_a = false,
            "Consecutive full prompt blocks of ``request`` in a window's reuse tree (TensorRT-LLM "
            "``countReusableBlocks``).")
        .def(
            "get_max_capacity_batch_size",
            [](Manager& self, int32_t in, int32_t out) {
                return nogil([&] { return self.m.getMaxCapacityBatchSize(in, out); });
            },
            "input_length"_a, "output_length"_a,
            "Most concurrent requests of ``input_length + output_length`` tokens the primary pools "
            "hold.")

        // -- iteration, events, checks
        .def(
            "refresh_blocks", [](Manager& self) { nogil([&] { self.m.refreshBlocks(); }); },
            "Expires timed retentions and syncs outstanding copies; call once per iteration.")
        .def(
            "flush_iteration_events",
            [](Manager& self) { nogil([&] { self.m.flushIterationEvents(); }); },
            "Ends the iteration's events (TensorRT-LLM ``flushIterationEvents``): they become "
            "visible to "
            ":meth:`get_latest_events`.")
        .def(
            "get_latest_events",
            [](Manager& self, int64_t timeout_ms) {
                return nogil([&] { return self.m.getLatestEvents(timeout_ms); });
            },
            "timeout_ms"_a = 0,
            "Takes every flushed event, waiting up to ``timeout_ms`` (0 = no wait) for one, "
            "without holding "
            "the GIL (TensorRT-LLM ``getLatestEvents``). Safe from another thread.")
        .def(
            "get_latest_events_and_dropped",
            [](Manager& self, int64_t timeout_ms) {
                uint64_t dropped = 0;
                auto events = nogil([&] { return self.m.getLatestEvents(timeout_ms, &dropped); });
                return std::make_pair(std::move(events), dropped);
            },
            "timeout_ms"_a = 0,
            "As :meth:`get_latest_events`, with the number of events the full buffer dropped since "
            "the "
            "previous drain.")
        .def(
            "check_invariants", [](Manager& self) { nogil([&] { self.m.checkInvariants(); }); },
            "Verifies the manager's invariants; raises :class:`InvariantViolationError` naming the "
            "first "
            "violation.")
        .def(
            "advance_time",
            [](Manager& self, int64_t ms) { nogil([&] { self.m.advanceTime(ms); }); }, "ms"_a,
            "Advances the manual clock (managers created with ``manual_clock``).")
        .def(
            "_debug_trigger_panic",
            [](Manager& self) { call([&] { return kvb_manager_debug_trigger_panic(self.h()); }); },
            "Test hook: panics inside the library (raises :class:`InternalError`; the manager is "
            "then "
            "poisoned).")

        // -- sizing helpers
        .def_static(
            "calculate_max_block_requirements_per_beam",
            [](int32_t sequence_length, int32_t window_size, int32_t tokens_per_block) {
                int32_t n = 0;
                kvb::check(kvb_calculate_max_block_requirements_per_beam(
                    sequence_length, window_size, tokens_per_block, &n));
                return n;
            },
            "sequence_length"_a, "window_size"_a, "tokens_per_block"_a,
            "Blocks one beam needs for ``sequence_length`` tokens under ``window_size``.")
        .def_static(
            "calculate_max_block_requirements",
            [](int32_t input_length, int32_t output_length, int32_t window_size, int32_t beam_width,
               int32_t tokens_per_block) {
                int32_t n = 0;
                kvb::check(kvb_calculate_max_block_requirements(
                    input_length, output_length, window_size, beam_width, tokens_per_block, &n));
                return n;
            },
            "input_length"_a, "output_length"_a, "window_size"_a, "beam_width"_a,
            "tokens_per_block"_a,
            "Blocks a request of ``input_length + output_length`` tokens needs.")
        .def_static(
            "calculate_max_attention_window",
            [](int32_t input_length, int32_t output_length, int32_t capacity_blocks,
               int32_t beam_width, int32_t tokens_per_block) {
                int32_t n = 0;
                kvb::check(kvb_calculate_max_attention_window(input_length, output_length,
                                                              capacity_blocks, beam_width,
                                                              tokens_per_block, &n));
                return n;
            },
            "input_length"_a, "output_length"_a, "capacity_blocks"_a, "beam_width"_a,
            "tokens_per_block"_a,
            "The largest attention window ``capacity_blocks`` allow for one request.")
        .def_static(
            "calculate_window_size_to_share",
            [](const std::vector<int32_t>& window_sizes,
               const std::vector<int32_t>& cache_size_per_token) {
                if (window_sizes.size() != cache_size_per_token.size()) {
                    invalid_argument("window_sizes and cache_size_per_token differ in length");
                }
                std::vector<double> shares(window_sizes.size());
                kvb::check(kvb_calculate_window_size_to_share(window_sizes.data(),
                                                              cache_size_per_token.data(),
                                                              window_sizes.size(), shares.data()));
                return shares;
            },
            "window_sizes"_a, "cache_size_per_token"_a,
            "Memory share of each window, proportional to window x cache bytes per token.")
        .def_static(
            "calculate_max_num_blocks",
            [](const std::vector<uint64_t>& bytes_per_token, uint64_t primary_bytes,
               uint64_t secondary_bytes, int32_t tokens_per_block,
               std::optional<std::vector<double>> shares, uint64_t extra_cost_bytes,
               std::optional<int64_t> max_tokens) {
                if (shares && shares->size() != bytes_per_token.size()) {
                    invalid_argument("shares and bytes_per_token differ in length");
                }
                std::vector<uint64_t> primary(bytes_per_token.size()),
                    secondary(bytes_per_token.size());
                kvb::check(kvb_calculate_max_num_blocks(
                    bytes_per_token.data(), shares ? shares->data() : nullptr,
                    bytes_per_token.size(), primary_bytes, secondary_bytes, extra_cost_bytes,
                    max_tokens.value_or(-1), tokens_per_block, primary.data(), secondary.data()));
                return std::make_pair(primary, secondary);
            },
            "bytes_per_token"_a, "primary_bytes"_a, "secondary_bytes"_a, "tokens_per_block"_a,
            nb::kw_only(), "shares"_a = nb::none(), "extra_cost_bytes"_a = 0,
            "max_tokens"_a = nb::none(),
            "``(primary, secondary)`` blocks per window that the memory budgets allow "
            "(TensorRT-LLM "
            "``calculateMaxNumBlocks`` on one rank); ``bytes_per_token[w]``: KV bytes of one token "
            "in "
            "window w.")
        .def_static(
            "calculate_auto_host_tier_blocks",
            [](int64_t gpu_quota_blocks, uint64_t available_host_bytes,
               uint64_t memlock_limit_bytes, uint64_t row_bytes) {
                int64_t blocks = 0;
                kvb::check(
                    kvb_calculate_auto_host_tier_blocks(gpu_quota_blocks, available_host_bytes,
                                                        memlock_limit_bytes, row_bytes, &blocks));
                return blocks;
            },
            "gpu_quota_blocks"_a, "available_host_bytes"_a, "memlock_limit_bytes"_a, "row_bytes"_a,
            "Host blocks of an automatic host tier: ``min(gpu_quota_blocks, 50% of "
            "available_host_bytes / row_bytes, 80% of memlock_limit_bytes / row_bytes)``; 0 = an "
            "unknown figure (caps nothing), caps of no block fall back to the quota.");
}

}  // namespace

// ---- the event publisher ----------------------------------------------------------------------

/// Owns a kvb_event_publisher_t; keeps its manager alive while it runs.
struct Publisher {
    kvb_event_publisher_t* p = nullptr;
    nb::object manager;  // the KVCacheManager it drains (kept alive)

    Publisher(nb::object mgr, const std::string& endpoint, const std::string& topic,
              std::optional<int32_t> dp_rank, int32_t send_hwm,
              std::optional<std::string> replay_endpoint, int32_t replay_buffer_steps,
              uint64_t start_sequence, bool all_blocks_cleared_first, int32_t window_size,
              int32_t linger_ms, uint64_t max_queued_bytes, uint64_t replay_peer_max_bytes,
              int32_t replay_requests_per_second_per_peer, int32_t replay_requests_per_second,
              int32_t max_replay_peers, int32_t max_incoming_message_bytes,
              int32_t slow_peer_timeout_ms)
        : manager(std::move(mgr)) {
        Manager& m = nb::cast<Manager&>(manager);
        kvb_event_publisher_config_t c;
        kvb::check(kvb_event_publisher_config_init(&c));
        c.endpoint = endpoint.c_str();
        c.topic = topic.c_str();
        c.has_dp_rank = dp_rank.has_value();
        c.dp_rank = dp_rank.value_or(0);
        c.send_hwm = send_hwm;
        c.replay_endpoint = replay_endpoint ? replay_endpoint->c_str() : nullptr;
        c.replay_buffer_steps = replay_buffer_steps;
        c.start_sequence = start_sequence;
        c.all_blocks_cleared_first = all_blocks_cleared_first;
        c.window_size = window_size;
        c.linger_ms = linger_ms;
        c.max_queued_bytes = max_queued_bytes;
        c.replay_peer_max_bytes = replay_peer_max_bytes;
        c.replay_requests_per_second_per_peer = replay_requests_per_second_per_peer;
        c.replay_requests_per_second = replay_requests_per_second;
        c.max_replay_peers = max_replay_peers;
        c.max_incoming_message_bytes = max_incoming_message_bytes;
        c.slow_peer_timeout_ms = slow_peer_timeout_ms;
        call([&] { return kvb_event_publisher_create(m.h(), &c, &p); });
    }
    ~Publisher() { close(); }
    void close() {
        if (p) {
            kvb_event_publisher_t* q = p;
            p = nullptr;
            nogil([&] { kvb_event_publisher_destroy(q); });
        }
    }
    kvb_event_publisher_t* live() const {
        if (!p) throw kvb::Error(KVB_STATUS_DESTROYED, "the publisher is closed");
        return p;
    }
    std::string endpoint(bool replay) const {
        std::vector<char> buf(256);
        size_t len = 0;
        kvb_status_t st = nogil([&] {
            return kvb_event_publisher_get_endpoint(live(), replay, buf.data(), buf.size(), &len);
        });
        if (st == KVB_STATUS_BUFFER_TOO_SMALL) {
            buf.resize(len + 1);
            st = nogil([&] {
                return kvb_event_publisher_get_endpoint(live(), replay, buf.data(), buf.size(),
                                                        &len);
            });
        }
        kvb::check(st);
        return std::string(buf.data(), len);
    }
};

const char* const kPublisherDoc =
    R"(Publishes a manager's KV events over ZeroMQ in the vLLM / Dynamo
wire format (``kvb_event_publisher_*``), from a thread of its own, so that KV-aware routers
(Dynamo's KV router or indexer, vLLM's production stack) see what this engine caches. The manager
needs events on (``max_kv_event_entries`` > 0) and the publisher is then their only consumer.
Use as a context manager or call :meth:`close`.)";

void bind_publisher(nb::module_& m) {
    auto stats = nb::class_<kvb_event_publisher_stats_t>(m, "EventPublisherStats",
                                                         "Counters of an :class:`EventPublisher`.")
                     .def_ro("batches", &kvb_event_publisher_stats_t::batches)
                     .def_ro("events", &kvb_event_publisher_stats_t::events)
                     .def_ro("dropped_events", &kvb_event_publisher_stats_t::dropped_events)
                     .def_ro("gaps", &kvb_event_publisher_stats_t::gaps)
                     .def_ro("subscriptions", &kvb_event_publisher_stats_t::subscriptions)
                     .def_ro("replay_requests", &kvb_event_publisher_stats_t::replay_requests)
                     .def_ro("next_sequence", &kvb_event_publisher_stats_t::next_sequence);
    add_repr(stats, "EventPublisherStats",
             {"batches", "events", "dropped_events", "gaps", "subscriptions", "replay_requests",
              "next_sequence"});
    nb::class_<Publisher>(m, "EventPublisher", kPublisherDoc)
        .def(nb::init<nb::object, const std::string&, const std::string&, std::optional<int32_t>,
                      int32_t, std::optional<std::string>, int32_t, uint64_t, bool, int32_t,
                      int32_t, uint64_t, uint64_t, int32_t, int32_t, int32_t, int32_t, int32_t>(),
             "manager"_a, "endpoint"_a, "topic"_a = "", "dp_rank"_a = nb::none(),
             "send_hwm"_a = 100000, "replay_endpoint"_a = nb::none(),
             "replay_buffer_steps"_a = 10000, "start_sequence"_a = 0,
             "all_blocks_cleared_first"_a = false, "window_size"_a = 0, "linger_ms"_a = 1000,
             "max_queued_bytes"_a = uint64_t{64} << 20,
             "replay_peer_max_bytes"_a = uint64_t{4} << 20,
             "replay_requests_per_second_per_peer"_a = 10, "replay_requests_per_second"_a = 100,
             "max_replay_peers"_a = 64, "max_incoming_message_bytes"_a = 256,
             "slow_peer_timeout_ms"_a = 10000,
             "Binds ``endpoint`` (``tcp://HOST:PORT`` with PORT 1-65535 or ``*`` for a free one, "
             "or ``ipc://PATH``) and starts publishing ``manager``'s flushed events; "
             "``replay_endpoint`` adds the ROUTER socket that answers replay requests. The "
             "service limits bound what peers can make the publisher queue and ask (see "
             "``kvb_event_publisher_config_t``). Raises :class:`TransportError` for a refused "
             "endpoint or a failed bind, :class:`InvalidArgumentError` (a ValueError) for a "
             "setting out of range (``start_sequence`` at or above 2**63, a non-positive "
             "limit), :class:`UnsupportedError` when the manager already has a publisher.")
        .def("close", &Publisher::close,
             "Publishes what was flushed, stops the thread and releases the sockets.")
        .def(
            "__enter__", [](nb::handle self) { return self; }, nb::rv_policy::reference)
        .def("__exit__", [](Publisher& self, nb::args) { self.close(); })
        .def_prop_ro(
            "endpoint", [](const Publisher& self) { return self.endpoint(false); },
            "The PUB socket's bound endpoint (with the port actually chosen).")
        .def_prop_ro(
            "replay_endpoint", [](const Publisher& self) { return self.endpoint(true); },
            "The replay socket's bound endpoint.")
        .def(
            "wait_for_subscribers",
            [](const Publisher& self, uint64_t n, int64_t timeout_ms) {
                uint64_t got = 0;
                call([&] {
                    return kvb_event_publisher_wait_for_subscribers(self.live(), n, timeout_ms,
                                                                    &got);
                });
                return got;
            },
            "min_subscriptions"_a = 1, "timeout_ms"_a = -1,
            "Waits (GIL released) until ``min_subscriptions`` subscriptions arrived or the "
            "timeout; "
            "returns the count received.")
        .def_prop_ro(
            "stats",
            [](const Publisher& self) {
                kvb_event_publisher_stats_t out{};
                call([&] { return kvb_event_publisher_get_stats(self.live(), &out); });
                return out;
            },
            "The publisher's counters (:class:`EventPublisherStats`).");
}

NB_MODULE(_kvblock, m) {
    m.doc() =
        "kvblock: a KV-cache block manager for LLM inference (the C ABI, wrapped with nanobind).";
    bind_enums(m);
    bind_errors(m);
    bind_config(m);
    bind_request(m);
    bind_results(m);
    bind_events(m);
    bind_manager(m);
    bind_publisher(m);
    m.def(
        "multimodal_digest",
        [](nb::bytes content) {
            uint8_t digest[32];
            call([&] {
                return kvb_multimodal_digest(reinterpret_cast<const uint8_t*>(content.c_str()),
                                             content.size(), digest);
            });
            return digest_bytes(digest);
        },
        "content"_a,
        "The 32-byte content digest of a multimodal item's raw bytes (BLAKE3, "
        "``kvb_multimodal_digest``), for :class:`MultimodalItem`.");
    m.def(
        "version",
        [] {
            uint32_t major = 0, minor = 0, patch = 0;
            kvb::check(kvb_version(&major, &minor, &patch));
            return std::make_tuple(major, minor, patch);
        },
        "``(major, minor, patch)`` of the loaded libkvblock (``kvb_version``).");
}
