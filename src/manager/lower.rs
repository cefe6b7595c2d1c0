//! The lower tiers (disk, remote) seen from the manager, once: polling every window, the
//! prefetch and readiness of waiting requests summed over windows, and counters summed over
//! windows. A tier plugs in through `LowerKind`, which names its window calls; the tier's own
//! file keeps only its configuration, its creation and its public entry points.

use std::ops::AddAssign;

use super::{absorb, KvCacheManager, RequestRef};
use crate::error::{KvError, KvResult};
use crate::window::{KeySource, WindowBlockManager};

/// One lower tier's calls on a window.
pub(super) trait LowerKind {
    /// What a prefetch did for one request (summed over windows).
    type Prefetch: Default + AddAssign;
    /// The tier's counters (summed over windows).
    type Stats: Default;
    /// Whether the window has this tier.
    fn has(w: &WindowBlockManager) -> bool;
    /// Places the window's finished reads; returns the blocks placed.
    fn poll(w: &mut WindowBlockManager, now_ms: u64) -> usize;
    /// Starts the reads of a waiting request's prefix in the window.
    fn prefetch(w: &mut WindowBlockManager, src: &KeySource<'_>, len: usize) -> Self::Prefetch;
    /// Blocks of a request's prefix the window still waits for.
    fn pending(w: &mut WindowBlockManager, src: &KeySource<'_>, len: usize) -> usize;
    /// The window's counters.
    fn stats(w: &WindowBlockManager) -> Self::Stats;
    /// Adds `b` to `a`.
    fn add(a: &mut Self::Stats, b: &Self::Stats);
}

/// Checks that a request names its input tokens (and extra ids) for a prefix walk.
fn check_request(req: &RequestRef<'_>) -> KvResult<()> {
    if req.input_length == 0 || req.token_ids.len() < req.input_length {
        return Err(KvError::InvalidArgument(format!(
            "request {}: input_length {} with {} tokens",
            req.id,
            req.input_length,
            req.token_ids.len()
        )));
    }
    if req.extra_ids.is_some_and(|e| e.len() < req.input_length) {
        return Err(KvError::InvalidArgument(format!(
            "request {}: fewer extra ids than input tokens",
            req.id
        )));
    }
    Ok(())
}

impl KvCacheManager {
    /// Whether any window has the tier `T`.
    pub(super) fn has_lower<T: LowerKind>(&self) -> bool {
        self.windows.iter().any(T::has)
    }

    /// Places the finished reads of tier `T` in every window. Returns the blocks placed.
    pub(super) fn poll_lower<T: LowerKind>(&mut self) -> usize {
        let now = self.op_now_ms();
        let mut placed = 0;
        for w in &mut self.windows {
            placed += T::poll(w, now);
            absorb(&mut self.events, w);
        }
        placed
    }

    /// Prefetches each waiting request's prefix from tier `T` (after a poll), summed over
    /// windows.
    pub(super) fn prefetch_lower<T: LowerKind>(
        &mut self,
        reqs: &[RequestRef<'_>],
    ) -> KvResult<Vec<T::Prefetch>> {
        for r in reqs {
            check_request(r)?;
        }
        self.poll_lower::<T>();
        let mut out = Vec::with_capacity(reqs.len());
        for r in reqs {
            let src = r.key_source();
            let mut sum = T::Prefetch::default();
            if r.disable_reuse {
                // It reuses nothing: nothing to bring back.
                out.push(sum);
                continue;
            }
            for w in &mut self.windows {
                sum += T::prefetch(w, &src, r.input_length);
                absorb(&mut self.events, w);
            }
            out.push(sum);
        }
        Ok(out)
    }

    /// Blocks of a request's prefix tier `T` still brings back (after a poll), summed over
    /// windows.
    pub(super) fn pending_lower<T: LowerKind>(&mut self, req: &RequestRef<'_>) -> KvResult<usize> {
        check_request(req)?;
        self.poll_lower::<T>();
        if req.disable_reuse {
            return Ok(0);
        }
        let src = req.key_source();
        Ok(self
            .windows
            .iter_mut()
            .map(|w| T::pending(w, &src, req.input_length))
            .sum())
    }

    /// The counters of tier `T` summed over windows (zeros without it).
    pub(super) fn lower_stats<T: LowerKind>(&self) -> T::Stats {
        let mut s = T::Stats::default();
        for w in self.windows.iter().filter(|w| T::has(w)) {
            T::add(&mut s, &T::stats(w));
        }
        s
    }
}
