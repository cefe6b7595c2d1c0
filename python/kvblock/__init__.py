"""kvblock: a KV-cache block manager for LLM inference, with TensorRT-LLM V1 semantics.

The classes wrap libkvblock's C ABI (bundled beside this package); see
``help(kvblock.KVCacheManager)``. One engine iteration::

    import numpy as np, kvblock

    config = kvblock.ManagerConfig([kvblock.WindowConfig(4096, primary_blocks=1024)],
                                   max_sequence_length=4096, tokens_per_block=32)
    with kvblock.KVCacheManager(config) as m:
        admission = m.add_sequence(7, np.arange(100, dtype=np.int32))  # prefill from
        m.store_context_blocks(7, 100)                                 # admission.prepopulated_prompt_len
        m.add_token(7, 42)
        offsets = m.get_block_offsets_of_batch([7])
        m.refresh_blocks()
        m.remove_sequence(7)
        m.flush_iteration_events()
"""

from ._kvblock import (
    Admission,
    BatchEstimate,
    BeamWidthExceededError,
    BlockInfo,
    BufferTooSmallError,
    CacheLevel,
    CopyBackend,
    CudaError,
    CudaTransferMode,
    CopyFailedError,
    EventPublisher,
    EventPublisherStats,
    OutOfMemoryError,
    TransportError,
    SequenceSuspendedError,
    StalledError,
    DestroyedError,
    DuplicateRequestError,
    Error,
    EventType,
    InternalError,
    InvalidArgumentError,
    InvalidConfigError,
    InvalidRetentionError,
    InvariantViolationError,
    KvCacheRetentionConfig,
    KvCacheStats,
    KVCacheEvent,
    KVCacheEventDiff,
    KVCacheManager,
    KVCacheStoredBlock,
    ManagerConfig,
    MmKey,
    MultimodalItem,
    NullPointerError,
    OutOfBlocksError,
    PoisonedError,
    Request,
    RequestPhase,
    RequestState,
    RequestStats,
    SequenceTooLongError,
    Status,
    StructSizeError,
    TokenRangeRetentionConfig,
    TooFewTokensError,
    UnknownRequestError,
    UnsupportedError,
    WindowConfig,
    version,
)

__version__ = "{}.{}.{}".format(*version())

__all__ = [
    "Admission",
    "BatchEstimate",
    "BeamWidthExceededError",
    "BlockInfo",
    "BufferTooSmallError",
    "CacheLevel",
    "CopyBackend",
    "CudaError",
    "CudaTransferMode",
    "CopyFailedError",
    "EventPublisher",
    "EventPublisherStats",
    "OutOfMemoryError",
    "TransportError",
    "SequenceSuspendedError",
    "StalledError",
    "DestroyedError",
    "DuplicateRequestError",
    "Error",
    "EventType",
    "InternalError",
    "InvalidArgumentError",
    "InvalidConfigError",
    "InvalidRetentionError",
    "InvariantViolationError",
    "KvCacheRetentionConfig",
    "KvCacheStats",
    "KVCacheEvent",
    "KVCacheEventDiff",
    "KVCacheManager",
    "KVCacheStoredBlock",
    "ManagerConfig",
    "MmKey",
    "MultimodalItem",
    "NullPointerError",
    "OutOfBlocksError",
    "PoisonedError",
    "Request",
    "RequestPhase",
    "RequestState",
    "RequestStats",
    "SequenceTooLongError",
    "Status",
    "StructSizeError",
    "TokenRangeRetentionConfig",
    "TooFewTokensError",
    "UnknownRequestError",
    "UnsupportedError",
    "WindowConfig",
    "version",
]
