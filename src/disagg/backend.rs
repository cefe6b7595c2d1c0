//! The transfer-engine seam: what kvblock needs from a backend that moves KV blocks between
//! engine processes (NIXL over UCX in production, an in-process memcpy hub in tests), plus the
//! checks every backend applies before it posts anything.
//!
//! Contract shared by every backend:
//! - Registering a region promises that `[addr, addr + len)` stays valid memory of that kind
//!   until it is deregistered (and no transfer touching it is still unreleased).
//! - `post` checks its descriptors before anything moves: as many local as remote ones, equal
//!   lengths pair by pair, no empty or overflowing range, each local one inside one registered
//!   local region and, where the backend knows the peer's regions (both backends here do: the
//!   metadata blob carries them), each remote one inside one of the peer's regions. A violation
//!   is `KvError::InvalidArgument` and nothing is posted.
//! - An empty `notification` means "no notification".

use crate::error::{KvError, KvResult};

/// Memory a backend can move: host DRAM or a GPU's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemKind {
    Dram,
    Vram { device: i32 },
}

/// A registered range of memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub addr: u64,
    pub len: u64,
    pub kind: MemKind,
}

/// One contiguous range of a transfer (local or remote).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Desc {
    pub addr: u64,
    pub len: u64,
}

/// Direction of a transfer, seen from the agent that posts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XferOp {
    /// local -> remote
    Write,
    /// remote -> local
    Read,
}

/// A posted transfer, unique within the backend that posted it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct XferId(pub u64);

/// Where a posted transfer stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum XferState {
    InProgress,
    Done,
    /// The transfer ended without completing; which bytes landed is unknown.
    Failed(String),
}

/// A transfer engine: registers memory, exchanges metadata with peers, moves descriptor lists
/// and notifications. Single-threaded use (`&mut self`); `Send` so it can move to the thread
/// that owns the manager.
pub trait TransferBackend: Send {
    /// This agent's name, as peers see it.
    fn agent_name(&self) -> &str;
    /// Registers a region. Registering the same (addr, len) again is a no-op; a region that
    /// overlaps a different registered one is refused.
    fn register(&mut self, region: &Region) -> KvResult<()>;
    /// Deregisters a region registered with exactly this (addr, len). Refused while an
    /// unreleased transfer touches it.
    fn deregister(&mut self, region: &Region) -> KvResult<()>;
    /// Opaque blob for the peer (after registration): it names the agent and its regions.
    fn local_metadata(&mut self) -> KvResult<Vec<u8>>;
    /// Loads a peer's blob; returns the peer's agent name. Loading it again updates it.
    fn add_peer(&mut self, metadata: &[u8]) -> KvResult<String>;
    fn remove_peer(&mut self, peer: &str) -> KvResult<()>;
    /// Posts one transfer: `local[i] <-> remote[i]`, same lengths; `notification` is delivered
    /// to the peer after the data (none when empty).
    fn post(
        &mut self,
        op: XferOp,
        local: &[Desc],
        peer: &str,
        remote: &[Desc],
        notification: &[u8],
    ) -> KvResult<XferId>;
    /// Never blocks. An unknown id reads as `Failed`.
    fn state(&mut self, xfer: XferId) -> XferState;
    /// Forgets a transfer. Only legal once its state is Done or Failed: refuses (Err) while
    /// InProgress.
    fn release(&mut self, xfer: XferId) -> KvResult<()>;
    fn send_notification(&mut self, peer: &str, message: &[u8]) -> KvResult<()>;
    /// Every notification received since the last call: (peer agent name, message).
    fn take_notifications(&mut self) -> KvResult<Vec<(String, Vec<u8>)>>;
}

/// End of `[addr, addr + len)`, or an error for an empty or overflowing range.
pub fn desc_end(what: &str, addr: u64, len: u64) -> KvResult<u64> {
    if len == 0 {
        return Err(KvError::InvalidArgument(format!(
            "{what}: empty range at {addr:#x}"
        )));
    }
    addr.checked_add(len).ok_or_else(|| {
        KvError::InvalidArgument(format!(
            "{what}: range {addr:#x} + {len} overflows the address space"
        ))
    })
}

/// The shape checks of `post` that need no region table: at least one pair, as many local as
/// remote descriptors, equal lengths pair by pair, no empty or overflowing range.
pub fn check_pairs(local: &[Desc], remote: &[Desc]) -> KvResult<()> {
    if local.len() != remote.len() {
        return Err(KvError::InvalidArgument(format!(
            "{} local descriptors but {} remote ones",
            local.len(),
            remote.len()
        )));
    }
    if local.is_empty() {
        return Err(KvError::InvalidArgument(
            "a transfer needs at least one descriptor".into(),
        ));
    }
    for (i, (l, r)) in local.iter().zip(remote).enumerate() {
        if l.len != r.len {
            return Err(KvError::InvalidArgument(format!(
                "descriptor {i}: local length {} but remote length {}",
                l.len, r.len
            )));
        }
        desc_end(&format!("local descriptor {i}"), l.addr, l.len)?;
        desc_end(&format!("remote descriptor {i}"), r.addr, r.len)?;
    }
    Ok(())
}

/// Merges neighbours that are adjacent on BOTH sides (`local[i]` ends where `local[i+1]` starts
/// and `remote[i]` ends where `remote[i+1]` starts) into one pair. Order is kept; only consecutive
/// pairs merge. `(local.len(), merged.len())` is the "descriptors before/after merging"
/// statistic. The inputs should satisfy `check_pairs`; pairs of unequal lengths are never
/// merged (so the output is no less valid than the input).
pub fn merge_descriptors(local: &[Desc], remote: &[Desc]) -> (Vec<Desc>, Vec<Desc>) {
    let n = local.len().min(remote.len());
    let mut out_l: Vec<Desc> = Vec::with_capacity(n);
    let mut out_r: Vec<Desc> = Vec::with_capacity(n);
    for (l, r) in local[..n].iter().zip(&remote[..n]) {
        if let (Some(pl), Some(pr)) = (out_l.last_mut(), out_r.last_mut()) {
            let adjacent = pl.len == pr.len
                && l.len == r.len
                && pl.addr.checked_add(pl.len) == Some(l.addr)
                && pr.addr.checked_add(pr.len) == Some(r.addr);
            if adjacent {
                if let Some(len) = pl.len.checked_add(l.len) {
                    pl.len = len;
                    pr.len = len;
                    continue;
                }
            }
        }
        out_l.push(*l);
        out_r.push(*r);
    }
    (out_l, out_r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(addr: u64, len: u64) -> Desc {
        Desc { addr, len }
    }

    #[test]
    fn merges_only_when_adjacent_on_both_sides() {
        let local = [d(0, 16), d(16, 16), d(32, 16), d(64, 16), d(80, 16)];
        let remote = [
            d(1000, 16),
            d(1016, 16),
            d(2000, 16),
            d(2016, 16),
            d(2032, 16),
        ];
        let (l, r) = merge_descriptors(&local, &remote);
        // 0+1 merge; 2 is adjacent locally (32 after 16+16) but not remotely; 3 is adjacent
        // remotely to 2 but not locally; 3+4 merge.
        assert_eq!(l, vec![d(0, 32), d(32, 16), d(64, 32)]);
        assert_eq!(r, vec![d(1000, 32), d(2000, 16), d(2016, 32)]);
    }

    #[test]
    fn one_run_merges_into_one_pair_and_counts_are_reported() {
        let local: Vec<Desc> = (0..1000).map(|i| d(4096 * i, 4096)).collect();
        let remote: Vec<Desc> = (0..1000).map(|i| d((1 << 40) + 4096 * i, 4096)).collect();
        let (l, r) = merge_descriptors(&local, &remote);
        assert_eq!((local.len(), l.len()), (1000, 1));
        assert_eq!(l[0], d(0, 4096 * 1000));
        assert_eq!(r[0], d(1 << 40, 4096 * 1000));
    }

    #[test]
    fn nothing_merges_for_reversed_or_every_other_blocks() {
        let local: Vec<Desc> = (0..8).map(|i| d(64 * i, 64)).collect();
        let reversed: Vec<Desc> = (0..8).rev().map(|i| d(64 * i, 64)).collect();
        assert_eq!(merge_descriptors(&local, &reversed).0.len(), 8);
        let every_other: Vec<Desc> = (0..8).map(|i| d(128 * i, 64)).collect();
        assert_eq!(merge_descriptors(&local, &every_other).0.len(), 8);
        assert_eq!(merge_descriptors(&[], &[]), (vec![], vec![]));
    }

    #[test]
    fn mixed_lengths_and_overflow_never_merge_wrongly() {
        // Adjacent on both sides with different lengths per pair: still one pair.
        let (l, r) = merge_descriptors(&[d(0, 8), d(8, 24)], &[d(100, 8), d(108, 24)]);
        assert_eq!((l, r), (vec![d(0, 32)], vec![d(100, 32)]));
        // A pair of unequal lengths (invalid input) is left alone.
        let (l, _) = merge_descriptors(&[d(0, 8), d(8, 8)], &[d(100, 8), d(108, 4)]);
        assert_eq!(l.len(), 2);
        // At the top of the address space: no wrap-around.
        let top = u64::MAX - 7;
        let (l, _) = merge_descriptors(&[d(top, 8), d(0, 8)], &[d(0, 8), d(8, 8)]);
        assert_eq!(l.len(), 2);
    }

    #[test]
    fn merged_lists_move_the_same_bytes() {
        let local = [d(0, 4), d(4, 4), d(12, 4), d(16, 4), d(20, 4)];
        let remote = [d(40, 4), d(44, 4), d(48, 4), d(52, 4), d(60, 4)];
        let pairs = |l: &[Desc], r: &[Desc]| -> Vec<(u64, u64)> {
            l.iter()
                .zip(r)
                .flat_map(|(a, b)| (0..a.len).map(move |k| (a.addr + k, b.addr + k)))
                .collect()
        };
        let (ml, mr) = merge_descriptors(&local, &remote);
        assert_eq!(pairs(&local, &remote), pairs(&ml, &mr));
        assert_eq!(ml.len(), 3);
    }

    #[test]
    fn check_pairs_refuses_bad_lists() {
        assert!(check_pairs(&[d(0, 8)], &[d(8, 8)]).is_ok());
        for (l, r) in [
            (vec![], vec![]),
            (vec![d(0, 8)], vec![]),
            (vec![d(0, 8)], vec![d(8, 4)]),
            (vec![d(0, 0)], vec![d(8, 0)]),
            (vec![d(u64::MAX, 2)], vec![d(8, 2)]),
            (vec![d(0, 2)], vec![d(u64::MAX - 1, 2)]),
        ] {
            let e = check_pairs(&l, &r).unwrap_err();
            assert!(matches!(e, KvError::InvalidArgument(_)), "{e}");
        }
    }
}
