//! The shared remote tier seen from the manager: its configuration, attaching one
//! `RemoteTier` per window over one store connection and one set of worker threads, and the
//! scheduler-facing calls (prefetch, readiness, poll, counters). Nothing here waits on the
//! network except creation, which makes one bounded attempt (`connect_timeout`) so that refused
//! credentials are a clear error; a store that cannot be reached at creation is not an error
//! (its lookups and writes fail, counted, until it answers).

use std::sync::Arc;

use super::lower::LowerKind;
use super::KvCacheManager;
use crate::error::{KvError, KvResult};
use crate::manager::slot_layout;
use crate::manager::RequestRef;
use crate::remote::{
    Namespace, RedisConfig, RedisStore, RemoteLimits, RemoteStats, RemoteStore, RemoteTier,
    RemoteWorkers, StoreError,
};
use crate::window::{
    KeySource, RemotePrefetch, RemoteWritePolicy, WindowBlockManager, WindowRemote,
};

/// The shared remote tier's configuration (off unless `redis` is set).
#[derive(Clone, Debug, Default)]
pub struct RemoteTierConfig {
    /// The Redis / Valkey server or cluster. `None`: no remote tier.
    pub redis: Option<RedisConfig>,
    /// What makes two engines' KV interchangeable (model name and revision, quantisation,
    /// tensor-parallel rank...), given by the engine: part of every key and checked in every
    /// value. Required.
    pub model_id: String,
    pub write_policy: RemoteWritePolicy,
    /// Worker threads (0: 2).
    pub threads: usize,
    pub limits: RemoteLimits,
}

fn invalid(msg: String) -> KvError {
    KvError::InvalidConfig(msg)
}

/// Validates the configuration, connects and attaches one tier per window.
pub(super) fn attach_remote_tiers(
    cfg: &RemoteTierConfig,
    enable_reuse: bool,
    windows: &mut [WindowBlockManager],
) -> KvResult<Option<Arc<RemoteWorkers>>> {
    let Some(redis) = &cfg.redis else {
        return Ok(None);
    };
    if !enable_reuse {
        return Err(invalid("the remote tier needs block reuse".into()));
    }
    if cfg.model_id.is_empty() {
        return Err(invalid(
            "the remote tier needs a model id (what makes two engines' KV interchangeable)".into(),
        ));
    }
    let l = &cfg.limits;
    if l.max_writes_queued == 0
        || l.max_reads_in_flight == 0
        || l.max_lookups_in_flight == 0
        || l.max_known == 0
    {
        return Err(invalid("remote tier limits must be positive".into()));
    }
    for w in windows.iter() {
        if w.config().num_secondary == 0 {
            return Err(invalid(format!(
                "window {}: the remote tier fetches into the host tier, which has no blocks",
                w.window_size()
            )));
        }
        if !w.engine().host_rows_visible() {
            return Err(KvError::Unsupported(
                "the remote tier needs a copy backend whose rows it can read (host memory or \
                 none)"
                    .into(),
            ));
        }
        if cfg.write_policy == RemoteWritePolicy::OnStore && !w.engine().primary_rows_visible() {
            return Err(KvError::Unsupported(
                "with the CUDA backend the remote tier writes blocks as they leave the host tier: \
                 set the write policy to KVB_REMOTE_WRITE_ON_HOST_EVICT (stored blocks are in \
                 GPU memory, which kvblock does not read back on the host)"
                    .into(),
            ));
        }
    }
    let store = RedisStore::connect(redis.clone()).map_err(|e| match e {
        StoreError::Auth(m) => invalid(format!(
            "remote tier: the store refused the credentials: {m}"
        )),
        other => invalid(format!("remote tier: {other}")),
    })?;
    let store: Arc<dyn RemoteStore> = Arc::new(store);
    let threads = if cfg.threads == 0 { 2 } else { cfg.threads };
    let workers = Arc::new(
        RemoteWorkers::new(threads)
            .map_err(|e| KvError::OutOfMemory(format!("remote tier threads: {e}")))?,
    );
    for w in windows.iter_mut() {
        let ns = Namespace::new(
            &cfg.model_id,
            &slot_layout(w.window_size(), &w.config().layout),
        );
        let tier = RemoteTier::new(ns, store.clone(), workers.clone(), cfg.limits);
        w.attach_remote(WindowRemote::new(tier, cfg.write_policy));
    }
    Ok(Some(workers))
}

/// The remote tier behind the manager's lower-tier calls.
pub(super) struct Remote;

impl LowerKind for Remote {
    type Prefetch = RemotePrefetch;
    type Stats = RemoteStats;
    fn has(w: &WindowBlockManager) -> bool {
        w.has_remote()
    }
    fn poll(w: &mut WindowBlockManager, now_ms: u64) -> usize {
        w.remote_poll(now_ms)
    }
    fn prefetch(w: &mut WindowBlockManager, src: &KeySource<'_>, len: usize) -> RemotePrefetch {
        w.remote_prefetch(src, len)
    }
    fn pending(w: &mut WindowBlockManager, src: &KeySource<'_>, len: usize) -> usize {
        w.remote_blocks_pending(src, len)
    }
    fn stats(w: &WindowBlockManager) -> RemoteStats {
        w.remote_stats()
    }
    fn add(a: &mut RemoteStats, b: &RemoteStats) {
        a.add(b);
    }
}

impl KvCacheManager {
    /// Whether the manager has a remote tier.
    pub fn has_remote_tier(&self) -> bool {
        self.has_lower::<Remote>()
    }

    /// Collects finished remote batches: lookups and writes update what the tier knows,
    /// verified fetches become free host blocks of the reuse tree (the rest are dropped,
    /// counted). Returns the blocks placed.
    pub fn remote_poll(&mut self) -> usize {
        self.poll_lower::<Remote>()
    }

    /// For each waiting request: one pipelined lookup of the part of its reusable prefix past
    /// the tree (and the disk), and one pipelined fetch of the leading blocks found, into
    /// claimed host blocks (after a `remote_poll`). Summed over windows. Never waits.
    pub fn remote_prefetch(&mut self, reqs: &[RequestRef<'_>]) -> KvResult<Vec<RemotePrefetch>> {
        self.prefetch_lower::<Remote>(reqs)
    }

    /// Blocks of a request's reusable prefix still being looked up or fetched, summed over
    /// windows (after a `remote_poll`); 0 means admitting it now reuses all that arrived.
    pub fn remote_blocks_pending(&mut self, req: &RequestRef<'_>) -> KvResult<usize> {
        self.pending_lower::<Remote>(req)
    }

    /// Worker threads of the remote tier (0 without one).
    pub fn remote_threads(&self) -> usize {
        self.remote_workers.as_ref().map_or(0, |w| w.num_threads())
    }

    /// The remote tier's counters summed over windows (zeros without one).
    pub fn remote_stats(&self) -> RemoteStats {
        self.lower_stats::<Remote>()
    }
}
