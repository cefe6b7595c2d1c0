//! Recovery from a failed copy submission: the copy log of a call, and a snapshot of the
//! window's bookkeeping to roll the call back to.
//!
//! A backend that can fail (`CopyEngine::can_fail`) moves nothing of a failed batch beyond the
//! copies it reports as completed. The manager snapshots every window before a call that may
//! copy; when a submission fails it restores the snapshots, so every block is again where its
//! bytes are, and then evicts from the reuse tree the blocks whose rows the call had already
//! overwritten (completed copies), so nothing cached claims bytes it no longer has. Those
//! blocks were free before the call (copies only write rows taken from the free queues), with
//! one exception: a held block (a suspended sequence's) that the call moved between tiers gives
//! its old row to the call, and the restored block owns that row again. Its bytes are in the row
//! it moved to (that copy came first, so it completed before anything overwrote the old row),
//! and the rollback copies them back (`repair_moved_rows`).

use super::{SeqBlocks, WindowBlockManager};
use crate::error::KvError;
use crate::eviction::FreeQueues;
use crate::pool::{BlockArena, MemRow};
use crate::premixed::PremixedMap;
use crate::transfer::{CopyFailure, RowCopy};
use crate::tree::ReuseTree;

use super::WindowStats;
use crate::events::WindowEvent;

/// What the copy submissions of the running call did.
#[derive(Debug, Default)]
pub(super) struct CopyLog {
    /// Record the rows written (only while a snapshot exists to roll back to).
    recording: bool,
    written: Vec<MemRow>,
    /// (old row, new row) of each held block the call moved between tiers, in order.
    moved_held: Vec<(MemRow, MemRow)>,
    error: Option<KvError>,
}

/// What a call's copies did, for its rollback.
#[derive(Debug, Default)]
pub struct CopyRecord {
    /// The submission failure, if any.
    pub error: Option<KvError>,
    /// Rows written by completed copies.
    pub written: Vec<MemRow>,
    /// (old row, new row) of each held block moved between tiers, in order.
    pub moved_held: Vec<(MemRow, MemRow)>,
}

impl CopyLog {
    /// Records that a held block left `old_row` for `new_row` (its copy is queued).
    pub(super) fn note_moved_held(&mut self, old_row: MemRow, new_row: MemRow) {
        if self.recording {
            self.moved_held.push((old_row, new_row));
        }
    }

    /// Whether a submission of this call failed (later ones are skipped).
    pub(super) fn failed(&self) -> bool {
        self.error.is_some()
    }

    pub(super) fn record(&mut self, copies: &[RowCopy], result: Result<(), CopyFailure>) {
        let completed = match &result {
            Ok(()) => copies.len(),
            Err(f) => f.completed.min(copies.len()),
        };
        if self.recording {
            self.written
                .extend(copies[..completed].iter().map(|c| c.dst));
        }
        if let Err(f) = result {
            self.error = Some(f.error);
        }
    }
}

/// The bookkeeping of a window (everything but its configuration, engine and scratch space).
#[derive(Clone, Debug)]
pub struct WindowSnapshot {
    arena: BlockArena,
    queues: FreeQueues,
    tree: ReuseTree,
    seqs: PremixedMap<u64, SeqBlocks>,
    alloc_epoch: Vec<u32>,
    claims: super::plan::BatchClaims,
    stats: WindowStats,
    scheduling_free: usize,
    events: Option<Vec<WindowEvent>>,
    held_on_host: Vec<u32>,
}

impl WindowBlockManager {
    /// A copy of the bookkeeping, to roll a failed call back to.
    pub fn snapshot(&self) -> WindowSnapshot {
        // Exhaustive: a new field must be added here (or named as not bookkeeping).
        let WindowBlockManager {
            cfg: _,
            arena,
            queues,
            tree,
            engine: _,
            seqs,
            alloc_epoch,
            claims,
            pending_copies: _,
            stats,
            scheduling_free,
            mm_scratch: _,
            events,
            copy_log: _,
            suspend_clock: _,
            num_suspended: _,
            // Not rolled back: their state follows I/O already started. A write queued by a
            // rolled-back call stores content the restored tree still caches (same key, same
            // bytes), read destinations were claimed before the call and stay claimed, and
            // remote batches already queued stay queued.
            lower: _,
            // Not rolled back: forgotten at a restore (`restore`).
            digests: _,
            // A hint for the next allocation, not bookkeeping.
            last_alloc_row: _,
            held_on_host,
        } = self;
        WindowSnapshot {
            arena: arena.clone(),
            queues: queues.clone(),
            tree: tree.clone(),
            seqs: seqs.clone(),
            alloc_epoch: alloc_epoch.clone(),
            claims: claims.clone(),
            stats: *stats,
            scheduling_free: *scheduling_free,
            events: events.clone(),
            held_on_host: held_on_host.clone(),
        }
    }

    /// Puts the bookkeeping of `snapshot` back.
    pub fn restore(&mut self, snapshot: WindowSnapshot) {
        self.digests.forget_all();
        let WindowSnapshot {
            arena,
            queues,
            tree,
            seqs,
            alloc_epoch,
            claims,
            stats,
            scheduling_free,
            events,
            held_on_host,
        } = snapshot;
        self.held_on_host = held_on_host;
        self.arena = arena;
        self.queues = queues;
        self.tree = tree;
        self.seqs = seqs;
        self.num_suspended = self
            .seqs
            .values()
            .filter(|s| s.suspended_at.is_some())
            .count();
        self.alloc_epoch = alloc_epoch;
        self.claims = claims;
        self.stats = stats;
        self.scheduling_free = scheduling_free;
        self.events = events;
        self.pending_copies.clear();
    }

    /// Starts recording the rows the copies of a call write.
    pub fn begin_copy_log(&mut self) {
        self.copy_log = CopyLog {
            recording: true,
            ..CopyLog::default()
        };
    }

    /// Ends the call's copy log: its failure, if any, the rows written and the held blocks
    /// moved to the host tier.
    pub fn end_copy_log(&mut self) -> CopyRecord {
        let log = std::mem::take(&mut self.copy_log);
        CopyRecord {
            error: log.error,
            written: log.written,
            moved_held: log.moved_held,
        }
    }

    /// After a rollback: copies back the bytes of held blocks whose old rows the call
    /// overwrote after moving them (their bytes are in the rows they moved to; moves are undone
    /// last first, so a block moved twice comes back too). Returns the rows that now hold their
    /// restored held owner's bytes. A failed repair leaves the copy error for the caller (the
    /// manager is broken).
    pub fn repair_moved_rows(&mut self, record: &CopyRecord) -> Vec<MemRow> {
        let copies: Vec<RowCopy> = record
            .moved_held
            .iter()
            .rev()
            .filter(|(old, _)| record.written.contains(old))
            .map(|&(old, new)| RowCopy {
                src: new,
                dst: old,
                num_tokens: 0,
            })
            .collect();
        if copies.is_empty() {
            return Vec::new();
        }
        if let Err(f) = self.engine.submit(&copies) {
            self.copy_log.error = Some(f.error);
        }
        (0..self.arena.len() as u32)
            .filter(|&b| self.arena.ref_count(b) > 0)
            .map(|b| self.arena.row(b))
            .filter(|row| copies.iter().any(|c| c.dst == *row))
            .collect()
    }

    /// A failed submission outside a logged call (nothing to roll back to).
    pub fn take_copy_error(&mut self) -> Option<KvError> {
        self.copy_log.error.take()
    }

    /// After a rollback: the blocks owning `rows` lose their cached content (the rows were
    /// overwritten by copies of the rolled-back call): they leave the reuse tree, and their
    /// content counts as replaced, so a sequence that detached one (a sliding window) does not
    /// store it back.
    pub fn invalidate_rows(&mut self, rows: &[MemRow]) {
        if rows.is_empty() {
            return;
        }
        for b in 0..self.arena.len() as u32 {
            if rows.contains(&self.arena.row(b)) {
                self.evict_from_tree(b);
                self.bump_epoch(b);
            }
        }
    }
}
