//! Calls that may copy, made transactional when a copy backend can fail: a failed submission
//! rolls the whole call back (see `crate::window::WindowSnapshot`), reports the error, and
//! leaves a manager that keeps working.

use super::{absorb, KvCacheManager};
use crate::error::KvError;

impl KvCacheManager {
    /// Runs `f` (a call that may submit copies). When a window's backend can fail, the
    /// bookkeeping is snapshotted first; if a copy submission fails, every window, the sequences
    /// and the iteration's events are restored, blocks whose rows completed copies overwrote
    /// leave the reuse tree, and the copy error is returned. With backends that cannot fail,
    /// this is `f(self)`.
    pub fn transact<T, E: From<KvError>>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, E>,
    ) -> Result<T, E> {
        if !self.windows.iter().any(|w| w.engine().can_fail()) {
            return f(self);
        }
        let windows: Vec<_> = self.windows.iter().map(|w| w.snapshot()).collect();
        let sequences = self.sequences.clone();
        let events = self.events.clone();
        for w in &mut self.windows {
            w.begin_copy_log();
        }
        let result = f(self);
        let logs: Vec<_> = self.windows.iter_mut().map(|w| w.end_copy_log()).collect();
        let Some(error) = logs.iter().find_map(|r| r.error.clone()) else {
            return result;
        };
        self.sequences = sequences;
        self.events = events;
        for ((w, snapshot), record) in self.windows.iter_mut().zip(windows).zip(logs) {
            w.restore(snapshot);
            let repaired = w.repair_moved_rows(&record);
            let lost: Vec<_> = record
                .written
                .iter()
                .filter(|r| !repaired.contains(r))
                .copied()
                .collect();
            w.invalidate_rows(&lost);
            absorb(&mut self.events, w);
        }
        Err(error.into())
    }

    /// A copy submission that failed outside `transact` (nothing to roll back to): the caller
    /// must treat the manager as broken.
    pub fn take_untransacted_copy_error(&mut self) -> Option<KvError> {
        let mut first = None;
        for w in &mut self.windows {
            if let Some(e) = w.take_copy_error() {
                first.get_or_insert(e);
            }
        }
        first
    }
}
