//! Disaggregated prefill/decode: moving a request's KV blocks between engine processes.
//!
//! - `backend`: the transfer-engine seam (`TransferBackend`: register memory, exchange
//!   metadata, post descriptor lists, poll, notifications) and `merge_descriptors`;
//! - `regions`: an agent's registered regions and the metadata envelope that carries them, so
//!   every backend checks remote descriptors as well as local ones before posting;
//! - `loopback`: an in-process memcpy backend with fault injection, for lifecycle tests;
//! - `nixl`: NIXL's C API (`libnixl_capi.so`) loaded at run time; UCX moves the bytes.
//!
//! No C entry point yet; the block lifecycle (leases, receiving blocks, quarantine) is built on
//! the seam elsewhere.

pub mod backend;
pub mod loopback;
pub mod nixl;
pub mod regions;

pub use backend::{
    merge_descriptors, Desc, MemKind, Region, TransferBackend, XferId, XferOp, XferState,
};
pub use loopback::{LoopbackAgent, LoopbackHub};
