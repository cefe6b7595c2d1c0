//! Disaggregated prefill/decode: moving a request's KV blocks between engine processes.
//!
//! - `backend`: the transfer-engine seam (`TransferBackend`: register memory, exchange
//!   metadata, post descriptor lists, poll, notifications) and `merge_descriptors`;
//! - `regions`: an agent's registered regions and the metadata envelope that carries them, so
//!   every backend checks remote descriptors as well as local ones before posting;
//! - `loopback`: an in-process memcpy backend with fault injection, for lifecycle tests;
//! - `layout`: the layout handshake (each side's pools) and the plan (identical, head-sliced,
//!   or unsupported with the reason);
//! - `ticket`: what the decode side sends the prefill side (its receiving rows);
//! - `descriptors`: rows to descriptors, merged where both sides are runs;
//! - `runs`: runs of consecutive rows.
//!
//! The block lifecycle (leases, receiving sequences, quarantine) is the manager's
//! (`manager::disagg`).

pub mod backend;
pub mod descriptors;
pub mod layout;
pub mod loopback;
pub mod nixl;
pub mod regions;
pub mod runs;
pub mod ticket;
mod wire;

pub use backend::{
    merge_descriptors, Desc, MemKind, Region, TransferBackend, XferId, XferOp, XferState,
};
pub use descriptors::{Descriptors, RowPair};
pub use layout::{Layout, LayoutPlan, PoolLayout};
pub use loopback::{LoopbackAgent, LoopbackHub};
pub use runs::{count_runs, row_runs, RowRun};
pub use ticket::{ReceiveTicket, TicketWindow};
