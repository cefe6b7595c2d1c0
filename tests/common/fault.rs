//! A fault-injecting copy backend: host-memory pools whose `submit` fails the submission chosen
//! by a shared `FaultPlan` (after executing a chosen number of its copies), and can fail pool
//! allocation.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use kvblock::error::{KvError, KvResult};
use kvblock::pool::{BlockLayout, Level};
use kvblock::transfer::{CopyEngine, CopyFailure, HostMemoryEngine, RowCopy};

/// Which submission fails, shared by every window's engine of a manager.
#[derive(Debug, Default)]
pub struct FaultPlan {
    /// Submissions so far (every window together).
    pub submissions: AtomicU64,
    /// The submission number that fails (`u64::MAX` = none).
    pub fail_at: AtomicU64,
    /// Copies of the failing submission executed before it fails.
    pub complete_before_failing: AtomicUsize,
    /// Failures injected so far, and copies they had completed in total.
    pub injected: AtomicU64,
    pub completed_in_failures: AtomicU64,
}

impl FaultPlan {
    pub fn new() -> Arc<Self> {
        let p = FaultPlan::default();
        p.fail_at.store(u64::MAX, Ordering::Relaxed);
        Arc::new(p)
    }

    /// Fails the next submission after executing `completed` of its copies.
    pub fn fail_next(&self, completed: usize) {
        self.complete_before_failing
            .store(completed, Ordering::Relaxed);
        self.fail_at
            .store(self.submissions.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

pub struct FaultyEngine {
    inner: HostMemoryEngine,
    plan: Arc<FaultPlan>,
}

impl FaultyEngine {
    pub fn new(
        plan: Arc<FaultPlan>,
        layout: impl Into<BlockLayout>,
        primary: usize,
        secondary: usize,
    ) -> KvResult<Self> {
        Ok(FaultyEngine {
            inner: HostMemoryEngine::try_new(layout, primary, secondary)?,
            plan,
        })
    }
}

impl CopyEngine for FaultyEngine {
    fn submit(&mut self, copies: &[RowCopy]) -> Result<(), CopyFailure> {
        let n = self.plan.submissions.fetch_add(1, Ordering::Relaxed);
        if n != self.plan.fail_at.load(Ordering::Relaxed) {
            return self.inner.submit(copies);
        }
        let completed = self
            .plan
            .complete_before_failing
            .load(Ordering::Relaxed)
            .min(copies.len());
        self.inner.submit(&copies[..completed])?;
        self.plan.injected.fetch_add(1, Ordering::Relaxed);
        self.plan
            .completed_in_failures
            .fetch_add(completed as u64, Ordering::Relaxed);
        Err(CopyFailure {
            completed,
            error: KvError::CopyFailed(format!("injected failure of submission {n}")),
        })
    }

    fn can_fail(&self) -> bool {
        true
    }

    fn pool_base(&mut self, level: Level, pool: usize) -> Option<*mut u8> {
        self.inner.pool_base(level, pool)
    }
}
