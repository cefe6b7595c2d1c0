//! The error type of every fallible operation. Each variant maps to one C status code.

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvError {
    /// A size, count or id argument is out of its valid range.
    InvalidArgument(String),
    /// The manager config is inconsistent (zero blocks, duplicate windows, ...).
    InvalidConfig(String),
    /// No sequence with this request id.
    UnknownRequest(u64),
    /// A sequence with this request id already exists.
    DuplicateRequest(u64),
    /// Fewer tokens were given than the input length says.
    TooFewTokens {
        input_length: usize,
        num_tokens: usize,
    },
    /// Beam width above the configured maximum.
    BeamWidthExceeded { beam_width: usize, max: usize },
    /// Invalid retention config (priority out of range, overlapping ranges, ...).
    InvalidRetention(String),
    /// The sequence would exceed the configured maximum sequence length.
    SequenceTooLong { length: usize, max: usize },
    /// Not enough free blocks; nothing was changed.
    OutOfBlocks {
        window_size: usize,
        needed: usize,
        available: usize,
    },
    /// The operation is not supported in this configuration.
    Unsupported(String),
    /// A caller buffer is too small.
    BufferTooSmall { needed: usize, given: usize },
    /// `check_invariants` found a violation.
    InvariantViolation(String),
    /// A CUDA call failed.
    Cuda(String),
    /// Memory for the pools (or another buffer sized by the caller) could not be allocated;
    /// nothing was created.
    OutOfMemory(String),
    /// A batch of block copies could not be submitted; the call's bookkeeping was rolled back
    /// (every block stays where its bytes are).
    CopyFailed(String),
    /// The sequence is suspended: resume it before this operation.
    SequenceSuspended(u64),
    /// Scheduling passes keep making no progress (the message names the cause and the remedy).
    Stalled(String),
    /// The sequence is receiving its prompt's KV from another engine: complete or abort the
    /// receive before this operation.
    SequenceReceiving(u64),
    /// A transfer engine (src/disagg: NIXL, the loopback hub) refused or failed a call; the
    /// message names the call and the engine's status.
    Transfer(String),
}

impl fmt::Display for KvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvError::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            KvError::InvalidConfig(m) => write!(f, "invalid config: {m}"),
            KvError::UnknownRequest(id) => write!(f, "unknown request id {id}"),
            KvError::DuplicateRequest(id) => write!(f, "request id {id} already has a sequence"),
            KvError::TooFewTokens {
                input_length,
                num_tokens,
            } => write!(
                f,
                "input length {input_length} but only {num_tokens} tokens were given"
            ),
            KvError::BeamWidthExceeded { beam_width, max } => {
                write!(f, "beam width {beam_width} exceeds the maximum {max}")
            }
            KvError::InvalidRetention(m) => write!(f, "invalid retention config: {m}"),
            KvError::SequenceTooLong { length, max } => {
                write!(f, "sequence length {length} exceeds the maximum {max}")
            }
            KvError::OutOfBlocks {
                window_size,
                needed,
                available,
            } => write!(
                f,
                "out of blocks in window {window_size}: {needed} needed, {available} free"
            ),
            KvError::Unsupported(m) => write!(f, "unsupported: {m}"),
            KvError::BufferTooSmall { needed, given } => {
                write!(
                    f,
                    "buffer too small: {needed} entries needed, {given} given"
                )
            }
            KvError::InvariantViolation(m) => write!(f, "invariant violated: {m}"),
            KvError::Cuda(m) => write!(f, "CUDA: {m}"),
            KvError::OutOfMemory(m) => write!(f, "out of memory: {m}"),
            KvError::CopyFailed(m) => write!(f, "copy failed: {m}"),
            KvError::SequenceSuspended(id) => {
                write!(f, "sequence {id} is suspended (resume it first)")
            }
            KvError::Stalled(m) => f.write_str(m),
            KvError::SequenceReceiving(id) => write!(
                f,
                "sequence {id} is receiving its KV from another engine (complete or abort the \
                 receive first)"
            ),
            KvError::Transfer(m) => write!(f, "transfer engine: {m}"),
        }
    }
}

impl std::error::Error for KvError {}

pub type KvResult<T> = Result<T, KvError>;

impl From<crate::cuda::CudaError> for KvError {
    fn from(e: crate::cuda::CudaError) -> Self {
        match e {
            crate::cuda::CudaError::Unavailable(m) => KvError::Unsupported(m),
            e @ crate::cuda::CudaError::DriverTooOld { .. } => KvError::Unsupported(e.to_string()),
            crate::cuda::CudaError::Call(m) => KvError::Cuda(m),
        }
    }
}
