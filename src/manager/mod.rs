//! `KvCacheManager`: sequences and their tokens over one `WindowBlockManager` per attention-window
//! size. Admission, generation, store for reuse, release, block tables, stats, scheduling
//! simulation and estimates.
//!
//! Every public operation validates its arguments and checks capacity in every window before it
//! changes anything: a failed call leaves the manager exactly as it was.
//!
//! This file holds the manager's state and accessors; the operations live in their own files:
//! `config` (configuration and construction), `request` (requests and admission results),
//! `admission` (batch planning, estimates and admission), `sequences` (tokens, store for reuse,
//! release, pins), `tables` (block ids and offset tables), `stats`, `scheduling` (scheduling
//! simulation and block estimates), `iteration` (refresh, offload, events), `inspect`
//! (snapshots) and `invariants`.

mod admission;
mod config;
mod disagg;
mod disk;
mod faults;
mod inspect;
mod invariants;
mod iteration;
mod iteration_stats;
mod lifecycle;
mod lower;
mod recurrent;
mod remote;
mod request;
mod reuse_tree;
mod scheduling;
mod sequences;
mod stall;
mod stats;
mod tables;
mod transfers;

pub use admission::BatchEstimate;
pub use config::{CopyBackend, EngineFactory, ManagerConfig, WindowSpec};
pub use disagg::{HoldId, HoldState, RowRunStats, TransferOutcome, TransferStats, WindowRows};
pub use disk::{
    disk_file_name, free_bytes, slot_layout, DiskTierConfig, DEFAULT_DISK_FREE_SPACE_SHARE,
};
pub use inspect::{BlockInfo, TreeEntry};
pub use iteration_stats::IterationStats;
pub use lifecycle::{ContextRevert, SequenceLengths};
pub use remote::RemoteTierConfig;
pub use request::{Admission, Request, RequestRef, RequestStats};
pub use scheduling::{RequestPhase, RequestState};
pub use stall::SchedulingPass;
pub use stats::KvCacheStats;
pub use tables::NO_BLOCK_OFFSET;

use std::sync::Arc;
use std::time::Instant;

use crate::error::{KvError, KvResult};
use crate::events::{EventDelivery, EventQueue};
use crate::key::MultimodalItem;
use crate::premixed::PremixedMap;
use crate::retention::RetentionConfig;
use crate::tree::SlotKeyAttrs;
use crate::window::{SeqKeyAttrs, WindowBlockManager};

#[derive(Clone, Debug)]
struct Sequence {
    input_length: usize,
    beam_width: usize,
    /// Key attributes of its blocks; its tokens themselves are kept only in its blocks' key
    /// slots (written at admission and by `add_token`, read when storing).
    key_attrs: SlotKeyAttrs,
    mm_items: Vec<MultimodalItem>,
    retention: RetentionConfig,
    num_tokens: usize,
    admission: Admission,
    /// The scheduler lifecycle: capacity, history, committed length, suspension, recorded
    /// allocations (`lifecycle`).
    life: lifecycle::SeqLifecycle,
}

impl Sequence {
    fn key_attrs(&self) -> SeqKeyAttrs<'_> {
        SeqKeyAttrs {
            slot: self.key_attrs,
            mm_items: &self.mm_items,
        }
    }
}

#[derive(Clone, Debug)]
struct Clock {
    start: Instant,
    manual_ms: Option<u64>,
}

impl Clock {
    fn now_ms(&self) -> u64 {
        self.manual_ms
            .unwrap_or_else(|| self.start.elapsed().as_millis() as u64)
    }
}

/// The KV-cache manager.
#[derive(Debug)]
pub struct KvCacheManager {
    cfg: ManagerConfig,
    /// Ascending window size.
    windows: Vec<WindowBlockManager>,
    sequences: PremixedMap<u64, Sequence>,
    clock: Clock,
    /// Some admitted request had a retention with a duration: operations read the clock (until
    /// then no block can expire, so they skip it).
    timed_retention: bool,
    /// Planning buffers of admission, reused from call to call.
    plans: Vec<admission::RequestPlan>,
    /// The iteration's events (`None` when events are off).
    events: Option<EventQueue>,
    delivery: Arc<EventDelivery>,
    /// The GPU of the CUDA backend (shared with the windows' engines).
    cuda: Option<Arc<crate::cuda::CudaDevice>>,
    /// Pools the engine still has to register (CUDA backend without own allocation).
    unregistered_pools: Vec<(usize, usize, crate::pool::Level)>,
    /// The pools of the model and its layer map.
    pool_model: crate::pool_model::PoolModel,
    /// Consecutive scheduling passes without progress (`stall`).
    stall: stall::StallDetector,
    /// Each window's counters at the previous `take_iteration_stats`.
    iteration_baseline: Vec<crate::window::WindowStats>,
    /// `refresh_blocks` calls so far: the iteration a growth's step belongs to (0: the engine
    /// never marked an iteration, each growth is a step).
    iteration: u64,
    /// The disk tier's I/O workers (declared last: dropped after the windows, so that it
    /// finishes their queued writes before it stops).
    disk_io: Option<Arc<crate::tier::io::IoPool>>,
    /// The remote tier's worker threads.
    remote_workers: Option<Arc<crate::remote::RemoteWorkers>>,
    /// Leases, receiving sequences, quarantines and the transfer backend (`disagg`).
    disagg: disagg::DisaggState,
}

/// Moves a window's raw events into the iteration queue, in order.
fn absorb(events: &mut Option<EventQueue>, w: &mut WindowBlockManager) {
    if let Some(q) = events {
        q.absorb(w.window_size(), w.take_events());
    }
}

impl KvCacheManager {
    pub fn config(&self) -> &ManagerConfig {
        &self.cfg
    }

    pub fn tokens_per_block(&self) -> usize {
        self.cfg.tokens_per_block
    }

    /// Host-tier (secondary) blocks of a window: the configured ones, or the size chosen for
    /// an automatic host tier (`WindowSpec::auto_host_tier`).
    pub fn host_tier_blocks(&self, window_size: usize) -> KvResult<usize> {
        Ok(self.window(window_size)?.config().num_secondary)
    }

    /// The most tokens a sequence may have KV slots for (its capacity): the maximum sequence
    /// length plus the configured extra KV tokens and draft tokens. Known tokens stay within
    /// the maximum sequence length.
    pub fn max_kv_tokens(&self) -> usize {
        // Checked when the manager was created.
        config::max_kv_tokens(&self.cfg).expect("validated at creation")
    }

    /// Window sizes in ascending order.
    pub fn window_sizes(&self) -> Vec<usize> {
        self.windows.iter().map(|w| w.window_size()).collect()
    }

    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The time an operation stamps expiries with. Only blocks with a timed retention ever
    /// expire, so until a request brought one the clock is not read (0 is never used then).
    fn op_now_ms(&self) -> u64 {
        if self.timed_retention || self.clock.manual_ms.is_some() {
            self.now_ms()
        } else {
            0
        }
    }

    /// Notes timed retentions of requests about to be admitted (see `op_now_ms`).
    fn note_retentions(&mut self, reqs: &[RequestRef<'_>]) {
        if !self.timed_retention {
            self.timed_retention = reqs.iter().any(|r| r.retention.has_duration());
        }
    }

    /// Moves the manual clock forward.
    pub fn advance_time(&mut self, ms: u64) -> KvResult<()> {
        match &mut self.clock.manual_ms {
            Some(t) => {
                *t = t.saturating_add(ms);
                Ok(())
            }
            None => Err(KvError::Unsupported(
                "advance_time needs a manager created with manual_clock".into(),
            )),
        }
    }

    fn window_index(&self, window_size: usize) -> KvResult<usize> {
        self.windows
            .iter()
            .position(|w| w.window_size() == window_size)
            .ok_or_else(|| KvError::InvalidArgument(format!("no window of size {window_size}")))
    }

    pub fn window(&self, window_size: usize) -> KvResult<&WindowBlockManager> {
        Ok(&self.windows[self.window_index(window_size)?])
    }

    pub fn window_mut(&mut self, window_size: usize) -> KvResult<&mut WindowBlockManager> {
        let i = self.window_index(window_size)?;
        Ok(&mut self.windows[i])
    }

    /// A sequence the ordinary calls may act on: a receiving one is refused until its receive
    /// completes or aborts (`disagg`).
    fn sequence(&self, id: u64) -> KvResult<&Sequence> {
        match self.sequences.get(&id) {
            Some(seq) if seq.life.receiving => Err(KvError::SequenceReceiving(id)),
            Some(seq) => Ok(seq),
            None => Err(KvError::UnknownRequest(id)),
        }
    }

    pub fn has_sequence(&self, id: u64) -> bool {
        self.sequences.contains_key(&id)
    }

    pub fn num_sequences(&self) -> usize {
        self.sequences.len()
    }

    /// Tokens (prompt + generated) of a sequence.
    pub fn num_tokens(&self, id: u64) -> KvResult<usize> {
        Ok(self.sequence(id)?.num_tokens)
    }
}
