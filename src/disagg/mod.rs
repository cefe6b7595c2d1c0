//! Disaggregated prefill/decode: a request's KV moves between engine processes.
//!
//! - `backend`: the transfer-engine seam (register memory, exchange metadata, post descriptor
//!   lists, poll, notifications) that NIXL and the in-process loopback implement;
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
pub mod runs;
pub mod ticket;
mod wire;

pub use backend::{Desc, MemKind, Region, TransferBackend, XferId, XferOp, XferState};
pub use descriptors::{Descriptors, RowPair};
pub use layout::{Layout, LayoutPlan, PoolLayout};
pub use runs::{count_runs, row_runs, RowRun};
pub use ticket::{ReceiveTicket, TicketWindow};
