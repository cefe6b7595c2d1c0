//! The transfer backend of a manager: attaching it (every pool registered once), the layout
//! this manager exports, posting a lease to a peer's receive ticket, and polling.

use super::{AttachedBackend, HoldId, HoldState, TransferOutcome, TransferStats};
use crate::disagg::{
    descriptors, layout, Layout, MemKind, PoolLayout, ReceiveTicket, Region, RowPair,
    TransferBackend, XferId, XferOp, XferState,
};
use crate::error::{KvError, KvResult};
use crate::manager::{CopyBackend, KvCacheManager};
use crate::pool::Level;

impl KvCacheManager {
    /// Attaches a transfer backend: every pool of every window, at both levels (GPU pools, the
    /// host tier, scale and recurrent-state pools), is registered with it once. `tp_rank` of
    /// `tp_size` is this manager's tensor-parallel position (its heads are that slice of the
    /// model's); `timeout_ms` bounds every posted transfer (past it, the lease is quarantined).
    /// Only with pools that have bytes (host-memory or CUDA backend). On error nothing stays
    /// registered.
    pub fn attach_transfer_backend(
        &mut self,
        mut backend: Box<dyn TransferBackend>,
        tp_rank: u32,
        tp_size: u32,
        timeout_ms: u64,
    ) -> KvResult<()> {
        if self.disagg.attached.is_some() {
            return Err(KvError::InvalidArgument(
                "a transfer backend is already attached".into(),
            ));
        }
        if tp_size == 0 || tp_rank >= tp_size || timeout_ms == 0 {
            return Err(KvError::InvalidArgument(format!(
                "tensor-parallel rank {tp_rank} of {tp_size}, timeout {timeout_ms} ms: the rank \
                 must be below a positive size and the timeout positive"
            )));
        }
        if self.cfg.copy_backend == CopyBackend::None {
            return Err(KvError::Unsupported(
                "a transfer needs pools with bytes: the host-memory or CUDA copy backend".into(),
            ));
        }
        self.require_pools()?;
        let regions = self.pool_regions()?;
        let mut done: Vec<Region> = Vec::with_capacity(regions.len());
        for r in &regions {
            if let Err(e) = backend.register(r) {
                for d in done.iter().rev() {
                    let _ = backend.deregister(d);
                }
                return Err(e);
            }
            done.push(*r);
        }
        self.disagg.attached = Some(AttachedBackend {
            backend,
            regions,
            tp_rank,
            tp_size,
            timeout_ms,
        });
        Ok(())
    }

    /// Detaches the backend (deregistering every pool) and returns it. Refused while a hold
    /// has a transfer the backend still tracks.
    pub fn detach_transfer_backend(&mut self) -> KvResult<Box<dyn TransferBackend>> {
        if self.disagg.holds.values().any(|h| h.xfer.is_some()) {
            return Err(KvError::InvalidArgument(
                "a posted transfer is still tracked: poll it to its end (or release its \
                 quarantine) first"
                    .into(),
            ));
        }
        self.attached_backend()?;
        let mut a = self.disagg.attached.take().expect("checked");
        for r in a.regions.iter().rev() {
            let _ = a.backend.deregister(r);
        }
        Ok(a.backend)
    }

    fn attached_backend(&mut self) -> KvResult<&mut AttachedBackend> {
        self.disagg
            .attached
            .as_mut()
            .ok_or_else(|| KvError::InvalidArgument("no transfer backend is attached".into()))
    }

    /// The regions of every pool at both levels.
    fn pool_regions(&mut self) -> KvResult<Vec<Region>> {
        let device = match self.cfg.copy_backend {
            CopyBackend::Cuda => Some(self.cfg.cuda.device),
            _ => None,
        };
        let mut out = Vec::new();
        for pool in 0..self.pool_model.pools().len() {
            let info = self.pool_model.pools()[pool];
            let arena = self.windows[info.window_index].arena();
            let (primary, secondary) = (arena.num_primary(), arena.num_secondary());
            for level in [Level::Primary, Level::Secondary] {
                let rows = match level {
                    Level::Primary => primary,
                    Level::Secondary => secondary,
                };
                if rows == 0 {
                    continue;
                }
                let (base, row_bytes) = self.model_pool_pointer(pool, level)?;
                let kind = match (level, device) {
                    (Level::Primary, Some(device)) => MemKind::Vram { device },
                    _ => MemKind::Dram,
                };
                out.push(Region {
                    addr: base as u64,
                    len: (rows * row_bytes) as u64,
                    kind,
                });
            }
        }
        Ok(out)
    }

    /// This manager's layout for the peer: every pool's geometry and GPU-level rows.
    pub fn export_layout(&mut self) -> KvResult<Layout> {
        let (tp_rank, tp_size) = {
            let a = self.attached_backend()?;
            (a.tp_rank, a.tp_size)
        };
        let device = match self.cfg.copy_backend {
            CopyBackend::Cuda => self.cfg.cuda.device,
            _ => -1,
        };
        let mut pools = Vec::new();
        for pool in 0..self.pool_model.pools().len() {
            let info = self.pool_model.pools()[pool];
            let (base, row_bytes) = self.model_pool_pointer(pool, Level::Primary)?;
            let g = info.geometry;
            pools.push(PoolLayout {
                window_size: info.window_size as u64,
                index_in_window: info.index_in_window as u32,
                cache_type: info.cache_type as u32,
                data_type: info.data_type as u32,
                num_layers: g.num_layers as u32,
                kv_factor: g.kv_factor as u32,
                num_kv_heads: g.num_kv_heads as u32,
                size_per_head: g.size_per_head as u32,
                unit_bytes: g.bytes_per_element as u32,
                row_tokens: g.tokens_per_block as u32,
                row_bytes: row_bytes as u64,
                num_rows: self.windows[info.window_index].arena().num_primary() as u64,
                base: base as u64,
                device,
            });
        }
        Ok(Layout {
            tokens_per_block: self.cfg.tokens_per_block as u32,
            tp_rank,
            tp_size,
            pools,
        })
    }

    /// The attached backend's metadata blob for the peer.
    pub fn transfer_metadata(&mut self) -> KvResult<Vec<u8>> {
        self.attached_backend()?.backend.local_metadata()
    }

    /// Loads a peer's metadata blob into the attached backend; returns the peer's name.
    pub fn add_transfer_peer(&mut self, metadata: &[u8]) -> KvResult<String> {
        self.attached_backend()?.backend.add_peer(metadata)
    }

    /// Posts a lease to a peer: the lease's rows written into the rows of the peer's receive
    /// ticket (block index by block index, per window), as few descriptors as both sides'
    /// runs allow; the peer is notified with `notification` after the data. The lease must
    /// cover every block the ticket asks for. The transfer is then the manager's to watch
    /// (`poll_transfers`), with the attached timeout.
    pub fn post_send(
        &mut self,
        hold: HoldId,
        peer: &str,
        peer_layout: &Layout,
        ticket: &ReceiveTicket,
        notification: &[u8],
    ) -> KvResult<XferId> {
        let local_layout = self.export_layout()?;
        let h = self
            .disagg
            .holds
            .get(&hold.0)
            .ok_or_else(|| KvError::InvalidArgument(format!("no hold {}", hold.0)))?;
        if h.state != HoldState::Leased {
            return Err(KvError::InvalidArgument(format!(
                "hold {} is {:?}: only a lease not yet posted can be posted",
                hold.0, h.state
            )));
        }
        if (h.computed_tokens as u64) < ticket.num_tokens {
            return Err(KvError::InvalidArgument(format!(
                "the ticket asks for {} tokens, the lease covers {}",
                ticket.num_tokens, h.computed_tokens
            )));
        }
        let plan = layout::plan(&local_layout, peer_layout);
        let mut pairs = Vec::new();
        for tw in &ticket.windows {
            let Some(lw) = h
                .windows
                .iter()
                .find(|w| w.window_size as u64 == tw.window_size)
            else {
                return Err(KvError::InvalidArgument(format!(
                    "the ticket names window {}, which this manager does not have",
                    tw.window_size
                )));
            };
            for (j, &remote_row) in tw.rows.iter().enumerate() {
                let index = tw.first_block_index + j as u64;
                let local = index
                    .checked_sub(lw.first_block_index as u64)
                    .and_then(|k| lw.rows.get(k as usize));
                let Some(&local_row) = local else {
                    return Err(KvError::InvalidArgument(format!(
                        "the ticket asks for block {index} of window {}; the lease holds blocks \
                         {}..{}",
                        tw.window_size,
                        lw.first_block_index,
                        lw.first_block_index + lw.rows.len()
                    )));
                };
                pairs.push(RowPair {
                    window_size: tw.window_size,
                    local_row,
                    remote_row,
                });
            }
        }
        let d = descriptors::build(&local_layout, peer_layout, &plan, &pairs)?;
        if d.local.is_empty() {
            return Err(KvError::InvalidArgument(
                "the ticket asks for no rows: nothing to post (settle the lease as NotSubmitted)"
                    .into(),
            ));
        }
        let now = self.now_ms();
        let a = self.attached_backend()?;
        let timeout = a.timeout_ms;
        let xfer = a
            .backend
            .post(XferOp::Write, &d.local, peer, &d.remote, notification)?;
        let h = self.disagg.holds.get_mut(&hold.0).expect("checked");
        h.state = HoldState::Posted;
        h.xfer = Some(xfer);
        h.deadline_ms = now.saturating_add(timeout);
        let s = &mut self.disagg.stats;
        s.transfers_posted += 1;
        s.bytes_posted += d.bytes;
        s.descriptors_unmerged += d.unmerged as u64;
        s.descriptors_posted += d.local.len() as u64;
        Ok(xfer)
    }

    /// Reads every watched transfer without blocking and settles what ended: `Done` releases
    /// the lease (or a quarantine whose transfer finally completed), `Failed` quarantines it,
    /// a transfer past its deadline is quarantined as `TimedOut` (and still watched: its later
    /// `Done` releases it). Returns the holds whose state changed, with the outcome.
    pub fn poll_transfers(&mut self) -> Vec<(HoldId, TransferOutcome)> {
        let Some(a) = self.disagg.attached.as_mut() else {
            return Vec::new();
        };
        let now = self.clock.now_ms();
        let mut changes = Vec::new();
        for (&id, h) in self.disagg.holds.iter_mut() {
            let Some(x) = h.xfer else { continue };
            match a.backend.state(x) {
                XferState::Done => changes.push((HoldId(id), TransferOutcome::Done)),
                XferState::Failed(_) => {
                    // Ended: the backend forgets it; the rows stay quarantined.
                    let _ = a.backend.release(x);
                    h.xfer = None;
                    if h.state != HoldState::Quarantined {
                        changes.push((HoldId(id), TransferOutcome::Failed));
                    }
                }
                XferState::InProgress => {
                    if h.state == HoldState::Posted && now >= h.deadline_ms {
                        changes.push((HoldId(id), TransferOutcome::TimedOut));
                    }
                }
            }
        }
        for &(hold, outcome) in &changes {
            match outcome {
                TransferOutcome::Done => {
                    let quarantined = self.disagg.holds[&hold.0].state == HoldState::Quarantined;
                    self.end_hold(hold);
                    self.disagg.stats.transfers_done += 1;
                    if quarantined {
                        self.disagg.stats.quarantines_released += 1;
                    }
                }
                TransferOutcome::Failed => {
                    self.quarantine(hold);
                    self.disagg.stats.transfers_failed += 1;
                }
                _ => {
                    self.quarantine(hold);
                    self.disagg.stats.transfers_timed_out += 1;
                }
            }
        }
        changes
    }

    /// Notifications the attached backend received since the last call: (peer, message). Those
    /// already fetched by `peek_transfer_notification` and not popped come first.
    pub fn take_transfer_notifications(&mut self) -> KvResult<Vec<(String, Vec<u8>)>> {
        let fresh = self.attached_backend()?.backend.take_notifications()?;
        let mut out: Vec<_> = self.disagg.pending_notifications.drain(..).collect();
        out.extend(fresh);
        Ok(out)
    }

    /// The oldest notification not yet handed out, (peer, message), left in place: the C ABI
    /// hands them out one at a time and keeps one whose buffer was too small. Fetches what the
    /// backend received when nothing is pending.
    pub fn peek_transfer_notification(&mut self) -> KvResult<Option<&(String, Vec<u8>)>> {
        if self.disagg.pending_notifications.is_empty() {
            let fresh = self.attached_backend()?.backend.take_notifications()?;
            self.disagg.pending_notifications.extend(fresh);
        } else {
            self.attached_backend()?;
        }
        Ok(self.disagg.pending_notifications.front())
    }

    /// Drops the notification `peek_transfer_notification` returned (once delivered).
    pub fn pop_transfer_notification(&mut self) -> Option<(String, Vec<u8>)> {
        self.disagg.pending_notifications.pop_front()
    }

    /// The transfer lifecycle's counters.
    pub fn transfer_stats(&self) -> TransferStats {
        self.disagg.stats
    }
}
