//! The bodies of the lower tiers' C entry points (disk, remote), once: poll, prefetch and
//! readiness. Each tier's file keeps its own `extern "C"` functions (the ABI names and their
//! documentation) and hands its manager call and its output struct to these helpers.

use super::handle::{kvb_manager_t, require_out, slice_arg_mut, with_manager, write_out};
use super::status::kvb_status_t;
use super::types::request_array;
use super::types::{kvb_request_t, request};
use crate::error::KvResult;
use crate::manager::{KvCacheManager, RequestRef};

/// Runs a tier's poll; `out_placed` (may be null) receives the blocks placed.
pub(super) fn poll(
    manager: *mut kvb_manager_t,
    out_placed: *mut i64,
    poll: impl FnOnce(&mut KvCacheManager) -> usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        let placed = poll(m);
        if !out_placed.is_null() {
            write_out(out_placed, placed as i64, "out_placed")?;
        }
        Ok(())
    })
}

/// Runs a tier's prefetch of `num_requests` requests; `out` (may be null) receives one entry
/// per request, converted by `to_c`.
pub(super) fn prefetch<P, C>(
    manager: *mut kvb_manager_t,
    requests_ptr: *const kvb_request_t,
    num_requests: usize,
    out: *mut C,
    prefetch: impl FnOnce(&mut KvCacheManager, &[RequestRef<'_>]) -> KvResult<Vec<P>>,
    to_c: impl Fn(P) -> C,
) -> kvb_status_t {
    with_manager(manager, |m| {
        let reqs = request_array(requests_ptr, num_requests)?;
        let out = if out.is_null() {
            None
        } else {
            Some(slice_arg_mut(out, num_requests, "out")?)
        };
        let refs: Vec<_> = reqs.iter().map(|r| r.as_ref()).collect();
        let done = prefetch(m, &refs)?;
        if let Some(out) = out {
            for (slot, p) in out.iter_mut().zip(done) {
                *slot = to_c(p);
            }
        }
        Ok(())
    })
}

/// Runs a tier's readiness query of one request into `out_blocks`.
pub(super) fn pending(
    manager: *mut kvb_manager_t,
    request_ptr: *const kvb_request_t,
    out_blocks: *mut i64,
    pending: impl FnOnce(&mut KvCacheManager, &RequestRef<'_>) -> KvResult<usize>,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out_blocks, "out_blocks")?;
        let req = request(request_ptr)?;
        let n = pending(m, &req.as_ref())?;
        write_out(out_blocks, n as i64, "out_blocks")
    })
}
