// Python exceptions per kvb_status_t and the translator from kvb::Error.
#include "init.hpp"

namespace kvb_py {

namespace {

// The highest status + 1.
constexpr int kNumStatuses = KVB_STATUS_SEQUENCE_RECEIVING + 1;
// Python exception type per status (index = status value); filled at import.
PyObject* g_error_types[kNumStatuses] = {};

}  // namespace

void init_errors(nb::module_& m) {
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
                                                                "StalledError",
                                                                "SequenceReceivingError"};
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
                PyObject* type = (s > 0 && s < kNumStatuses && g_error_types[s])
                                     ? g_error_types[s]
                                     : static_cast<PyObject*>(payload);
                PyErr_SetString(type, e.what());
            }
        },
        base);
}

}  // namespace kvb_py
