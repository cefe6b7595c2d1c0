//! The block lifecycle of disaggregated prefill/decode (`crate::disagg` moves the bytes):
//!
//! - `send`: a prefill engine's **lease** on a request's computed blocks (pins that outlive
//!   the sequence), posted to a peer and settled by the transfer's outcome;
//! - `receive`: a decode engine's **receiving** sequence, admitted with local reuse as usual,
//!   whose other blocks are neither stored, published, reused nor moved until the engine
//!   completes the receive (or aborts it);
//! - quarantine (both sides): rows a transfer may still read or write after a failure, a
//!   timeout or an abort in doubt stay held by a `HoldId` until the engine releases them or a
//!   later completion proves the transfer over. Only `Done` and `NotSubmitted` end a
//!   transfer's access to memory;
//! - `runs`: the contiguous-run allocation policy and the runs of a request's rows;
//! - `engine`: the transfer backend attached to the manager (every pool registered once), the
//!   layout it exports, posting and polling.

mod engine;
mod receive;
mod runs;
pub use runs::RowRunStats;
mod send;

use std::collections::{BTreeMap, VecDeque};

use crate::disagg::{Region, TransferBackend, XferId};
use crate::premixed::PremixedMap;

/// The rows of one window that a lease or a receive covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowRows {
    pub window_size: usize,
    /// Block index (in the sequence's token order) of `blocks[0]`.
    pub first_block_index: usize,
    pub blocks: Vec<u32>,
    /// The GPU-level row of each block (the same row in every pool of the window).
    pub rows: Vec<u32>,
}

/// How a transfer ended, as the engine or the poll reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferOutcome {
    /// The backend reported completion: the rows are quiescent.
    Done,
    /// Never handed to a backend: the rows are quiescent.
    NotSubmitted,
    /// The backend reported an error: which bytes moved, and whether some still move, is
    /// unknown.
    Failed,
    /// The deadline passed while the transfer was in progress.
    TimedOut,
    /// The engine cannot tell (an abort from the peer, a lost connection).
    InDoubt,
}

impl TransferOutcome {
    /// Only these end a transfer's access to its rows.
    pub fn is_quiescent(self) -> bool {
        matches!(self, TransferOutcome::Done | TransferOutcome::NotSubmitted)
    }
}

/// A lease (send side) or a quarantine (either side): blocks held past their sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HoldId(pub u64);

/// Where a hold stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldState {
    /// A lease taken, nothing posted.
    Leased,
    /// A lease whose transfer is in flight.
    Posted,
    /// Rows a transfer may still touch: never reused until released.
    Quarantined,
}

#[derive(Clone, Debug)]
struct Hold {
    request_id: u64,
    state: HoldState,
    /// Tokens whose KV the lease covers (a receive quarantine: its prompt).
    computed_tokens: usize,
    windows: Vec<WindowRows>,
    /// The transfer posted for it, while the backend still knows it.
    xfer: Option<XferId>,
    deadline_ms: u64,
}

impl Hold {
    fn num_blocks(&self) -> usize {
        self.windows.iter().map(|w| w.blocks.len()).sum()
    }
}

/// A receiving sequence: per window, the block index its receive starts at.
#[derive(Clone, Debug)]
struct Receiving {
    first_block_index: Vec<usize>,
}

/// Counters and gauges of the transfer lifecycle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Leases not yet settled (taken or posted), and their blocks.
    pub active_leases: u64,
    pub leased_blocks: u64,
    /// Sequences receiving now, and their receiving blocks.
    pub receiving_requests: u64,
    pub receiving_blocks: u64,
    /// Holds in quarantine now, and their blocks.
    pub quarantined_holds: u64,
    pub quarantined_blocks: u64,
    /// Cumulative.
    pub transfers_posted: u64,
    pub transfers_done: u64,
    pub transfers_failed: u64,
    pub transfers_timed_out: u64,
    pub bytes_posted: u64,
    /// Descriptors the posted transfers had before merging adjacent ones, and as posted.
    pub descriptors_unmerged: u64,
    pub descriptors_posted: u64,
    pub receives_completed: u64,
    pub receives_aborted: u64,
    pub quarantines_released: u64,
}

/// The backend attached to a manager and what was registered with it.
struct AttachedBackend {
    backend: Box<dyn TransferBackend>,
    regions: Vec<Region>,
    tp_rank: u32,
    tp_size: u32,
    timeout_ms: u64,
}

/// The manager's disaggregation state (empty until used).
#[derive(Default)]
pub(super) struct DisaggState {
    holds: BTreeMap<u64, Hold>,
    next_hold: u64,
    receiving: PremixedMap<u64, Receiving>,
    attached: Option<AttachedBackend>,
    stats: TransferStats,
    /// Notifications taken from the backend and not yet handed out one at a time
    /// (`peek_transfer_notification`); `take_transfer_notifications` drains them first.
    pending_notifications: VecDeque<(String, Vec<u8>)>,
}

impl std::fmt::Debug for DisaggState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DisaggState")
            .field("holds", &self.holds.len())
            .field("receiving", &self.receiving.len())
            .field("attached", &self.attached.is_some())
            .finish()
    }
}

impl DisaggState {
    /// Whether `id` is a receiving sequence.
    fn is_receiving(&self, id: u64) -> bool {
        self.receiving.contains_key(&id)
    }

    fn new_hold(&mut self, hold: Hold) -> HoldId {
        self.next_hold += 1;
        self.holds.insert(self.next_hold, hold);
        HoldId(self.next_hold)
    }
}
