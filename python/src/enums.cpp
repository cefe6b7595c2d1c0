// The C enums as Python enums.
#include "init.hpp"

namespace kvb_py {

void init_enums(nb::module_& m) {
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
        .value("STALLED", KVB_STATUS_STALLED)
        .value("SEQUENCE_RECEIVING", KVB_STATUS_SEQUENCE_RECEIVING);
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
        .value("SECONDARY", KVB_CACHE_LEVEL_SECONDARY, "Host (secondary) memory.")
        .value("DISK", KVB_CACHE_LEVEL_DISK, "The disk tier (events only).");
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

}  // namespace kvb_py
