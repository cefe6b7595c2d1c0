//! Status codes and the thread-local last-error message.

use std::cell::RefCell;
use std::ffi::{c_char, CString};

use crate::error::KvError;

/// Result of every kvblock C function. `KVB_OK` (0) is success.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvb_status_t {
    /// Success.
    KVB_OK = 0,
    /// A required pointer argument was null.
    KVB_STATUS_NULL_POINTER = 1,
    /// An argument is out of range (zero or negative size, bad index, ...).
    KVB_STATUS_INVALID_ARGUMENT = 2,
    /// The manager config is inconsistent.
    KVB_STATUS_INVALID_CONFIG = 3,
    /// A struct's `struct_size` does not match a size this library knows.
    KVB_STATUS_STRUCT_SIZE = 4,
    /// No sequence with this request id.
    KVB_STATUS_UNKNOWN_REQUEST = 5,
    /// A sequence with this request id already exists.
    KVB_STATUS_DUPLICATE_REQUEST = 6,
    /// Fewer tokens than the input length.
    KVB_STATUS_TOO_FEW_TOKENS = 7,
    /// Beam width above the configured maximum.
    KVB_STATUS_BEAM_WIDTH_EXCEEDED = 8,
    /// Invalid retention config (priority outside 0..=100, overlapping ranges, ...).
    KVB_STATUS_INVALID_RETENTION = 9,
    /// The sequence would exceed the maximum sequence length.
    KVB_STATUS_SEQUENCE_TOO_LONG = 10,
    /// Not enough free blocks; the manager is unchanged.
    KVB_STATUS_OUT_OF_BLOCKS = 11,
    /// A caller buffer is too small; the needed size was written where the call says.
    KVB_STATUS_BUFFER_TOO_SMALL = 12,
    /// Not supported in this configuration.
    KVB_STATUS_UNSUPPORTED = 13,
    /// `kvb_manager_check_invariants` found a violation (named in the message).
    KVB_STATUS_INVARIANT_VIOLATION = 14,
    /// The handle was destroyed.
    KVB_STATUS_DESTROYED = 15,
    /// An earlier call panicked inside the library; the handle can only be destroyed.
    KVB_STATUS_POISONED = 16,
    /// A bug inside the library (a caught panic). The handle is now poisoned.
    KVB_STATUS_INTERNAL = 17,
    /// A CUDA call failed (the message names it and the driver's error). At creation or in
    /// `kvb_manager_register_pool` / `kvb_manager_set_stream` nothing changed; a failed copy
    /// launch (or a later synchronization) poisons the handle: the bookkeeping of the call moved
    /// on, the bytes in the pools did not.
    KVB_STATUS_CUDA = 18,
    /// Memory for the pools could not be allocated (or their size overflows); nothing was
    /// created.
    KVB_STATUS_OUT_OF_MEMORY = 19,
    /// The copy backend refused a batch of block copies; the call was rolled back: every block
    /// stays where its bytes are, the counters are as before, and the manager keeps working.
    /// Blocks whose rows the call had already overwritten leave the reuse tree.
    KVB_STATUS_COPY_FAILED = 20,
    /// The network transport refused (ZeroMQ: bad endpoint, address in use, ...), or a transfer
    /// backend of disaggregated serving did (an unreachable peer, a refused transfer).
    KVB_STATUS_TRANSPORT = 21,
    /// The sequence is suspended (`kvb_manager_suspend`); resume it before adding tokens,
    /// resizing it or reading its offsets. Nothing changed.
    KVB_STATUS_SEQUENCE_SUSPENDED = 22,
    /// `kvb_manager_end_scheduling_pass`: that many consecutive passes had generation requests
    /// but scheduled nothing and moved no block between the tiers. The message names the cause (no host
    /// tier, host tier too small, a request larger than the pool) and the remedy.
    KVB_STATUS_STALLED = 23,
    /// The sequence is receiving its prompt's KV from another engine
    /// (`kvb_manager_add_sequence_receiving`): only the receive calls, its block ids and its
    /// offsets apply until `kvb_manager_complete_receive` or `kvb_manager_abort_receive`.
    /// Nothing changed.
    KVB_STATUS_SEQUENCE_RECEIVING = 24,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

pub(crate) fn set_last_error(message: &str) {
    let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

pub(crate) fn clear_last_error() {
    // Every call clears it: only allocate when there is something to clear.
    LAST_ERROR.with(|e| {
        if !e.borrow().as_bytes().is_empty() {
            *e.borrow_mut() = CString::default();
        }
    });
}

/// The last-error message of this thread (to pass on the failure of a nested entry point).
pub(crate) fn last_error_string() -> String {
    LAST_ERROR.with(|e| e.borrow().to_string_lossy().into_owned())
}

/// Records `message` and returns `status`.
pub(crate) fn fail(status: kvb_status_t, message: &str) -> kvb_status_t {
    set_last_error(message);
    status
}

pub(crate) fn status_of(err: &KvError) -> kvb_status_t {
    use kvb_status_t::*;
    match err {
        KvError::InvalidArgument(_) => KVB_STATUS_INVALID_ARGUMENT,
        KvError::InvalidConfig(_) => KVB_STATUS_INVALID_CONFIG,
        KvError::UnknownRequest(_) => KVB_STATUS_UNKNOWN_REQUEST,
        KvError::DuplicateRequest(_) => KVB_STATUS_DUPLICATE_REQUEST,
        KvError::TooFewTokens { .. } => KVB_STATUS_TOO_FEW_TOKENS,
        KvError::BeamWidthExceeded { .. } => KVB_STATUS_BEAM_WIDTH_EXCEEDED,
        KvError::InvalidRetention(_) => KVB_STATUS_INVALID_RETENTION,
        KvError::SequenceTooLong { .. } => KVB_STATUS_SEQUENCE_TOO_LONG,
        KvError::OutOfBlocks { .. } => KVB_STATUS_OUT_OF_BLOCKS,
        KvError::Unsupported(_) => KVB_STATUS_UNSUPPORTED,
        KvError::BufferTooSmall { .. } => KVB_STATUS_BUFFER_TOO_SMALL,
        KvError::InvariantViolation(_) => KVB_STATUS_INVARIANT_VIOLATION,
        KvError::Cuda(_) => KVB_STATUS_CUDA,
        KvError::OutOfMemory(_) => KVB_STATUS_OUT_OF_MEMORY,
        KvError::CopyFailed(_) => KVB_STATUS_COPY_FAILED,
        KvError::SequenceSuspended(_) => KVB_STATUS_SEQUENCE_SUSPENDED,
        KvError::Stalled(_) => KVB_STATUS_STALLED,
        KvError::SequenceReceiving(_) => KVB_STATUS_SEQUENCE_RECEIVING,
        // The transfer engines of src/disagg are a transport too.
        KvError::Transfer(_) => KVB_STATUS_TRANSPORT,
    }
}

/// The message of the last failed kvblock call on this thread ("" if none). The pointer stays
/// valid until the next kvblock call on this thread.
#[no_mangle]
pub extern "C" fn kvb_last_error_message() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// A static, human-readable name of a status code (never null; "unknown status" for values
/// this library does not define).
#[no_mangle]
pub extern "C" fn kvb_status_string(status: i32) -> *const c_char {
    use kvb_status_t::*;
    let known = [
        KVB_OK,
        KVB_STATUS_NULL_POINTER,
        KVB_STATUS_INVALID_ARGUMENT,
        KVB_STATUS_INVALID_CONFIG,
        KVB_STATUS_STRUCT_SIZE,
        KVB_STATUS_UNKNOWN_REQUEST,
        KVB_STATUS_DUPLICATE_REQUEST,
        KVB_STATUS_TOO_FEW_TOKENS,
        KVB_STATUS_BEAM_WIDTH_EXCEEDED,
        KVB_STATUS_INVALID_RETENTION,
        KVB_STATUS_SEQUENCE_TOO_LONG,
        KVB_STATUS_OUT_OF_BLOCKS,
        KVB_STATUS_BUFFER_TOO_SMALL,
        KVB_STATUS_UNSUPPORTED,
        KVB_STATUS_INVARIANT_VIOLATION,
        KVB_STATUS_DESTROYED,
        KVB_STATUS_POISONED,
        KVB_STATUS_INTERNAL,
        KVB_STATUS_CUDA,
        KVB_STATUS_OUT_OF_MEMORY,
        KVB_STATUS_COPY_FAILED,
        KVB_STATUS_TRANSPORT,
        KVB_STATUS_SEQUENCE_SUSPENDED,
        KVB_STATUS_STALLED,
        KVB_STATUS_SEQUENCE_RECEIVING,
    ];
    let Some(&status) = known.iter().find(|&&k| k as i32 == status) else {
        return c"unknown status".as_ptr();
    };
    let s: &'static [u8] = match status {
        KVB_OK => b"ok\0",
        KVB_STATUS_NULL_POINTER => b"null pointer\0",
        KVB_STATUS_INVALID_ARGUMENT => b"invalid argument\0",
        KVB_STATUS_INVALID_CONFIG => b"invalid config\0",
        KVB_STATUS_STRUCT_SIZE => b"struct size mismatch\0",
        KVB_STATUS_UNKNOWN_REQUEST => b"unknown request\0",
        KVB_STATUS_DUPLICATE_REQUEST => b"duplicate request\0",
        KVB_STATUS_TOO_FEW_TOKENS => b"too few tokens\0",
        KVB_STATUS_BEAM_WIDTH_EXCEEDED => b"beam width exceeded\0",
        KVB_STATUS_INVALID_RETENTION => b"invalid retention\0",
        KVB_STATUS_SEQUENCE_TOO_LONG => b"sequence too long\0",
        KVB_STATUS_OUT_OF_BLOCKS => b"out of blocks\0",
        KVB_STATUS_BUFFER_TOO_SMALL => b"buffer too small\0",
        KVB_STATUS_UNSUPPORTED => b"unsupported\0",
        KVB_STATUS_INVARIANT_VIOLATION => b"invariant violation\0",
        KVB_STATUS_DESTROYED => b"destroyed handle\0",
        KVB_STATUS_POISONED => b"poisoned handle\0",
        KVB_STATUS_INTERNAL => b"internal error\0",
        KVB_STATUS_CUDA => b"CUDA error\0",
        KVB_STATUS_OUT_OF_MEMORY => b"out of memory\0",
        KVB_STATUS_COPY_FAILED => b"copy failed\0",
        KVB_STATUS_TRANSPORT => b"transport error\0",
        KVB_STATUS_SEQUENCE_SUSPENDED => b"sequence suspended\0",
        KVB_STATUS_STALLED => b"scheduling stalled\0",
        KVB_STATUS_SEQUENCE_RECEIVING => b"sequence receiving\0",
    };
    s.as_ptr().cast()
}
