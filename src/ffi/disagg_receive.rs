//! C entry points of disaggregated prefill/decode, the decode (receiving) side: receiving
//! sequences, their tickets, completing or aborting a receive; and the contiguous-run policy
//! both sides share.

use super::disagg_transport::{bytes_out, outcome_arg};
use super::handle::{
    copy_out, i32_result, kvb_manager_t, require_out, with_manager, with_manager_tx, write_out,
    FfiResult,
};
use super::status::kvb_status_t;
use super::types::{kvb_admission_t, kvb_request_t, request};

/// Admits a request whose prompt's KV will arrive from another engine (the decode side of
/// disaggregated serving). Local reuse works as for `kvb_manager_add_sequence`; the receive
/// starts at the reused prefix rounded down to whole blocks (the ticket says where). Until
/// `kvb_manager_complete_receive` or `kvb_manager_abort_receive`, the sequence answers only
/// the receive calls, its block ids and its offsets: every other call on it (adding a token,
/// storing, removing, suspending) fails with `KVB_STATUS_SEQUENCE_RECEIVING`. `out` (may be
/// null) receives the admission result, as for `kvb_manager_add_sequence`. Fails as
/// `kvb_manager_add_sequence` does, and with `KVB_STATUS_UNSUPPORTED` for a beam width above 1;
/// a failed call changes nothing.
#[no_mangle]
pub extern "C" fn kvb_manager_add_sequence_receiving(
    manager: *mut kvb_manager_t,
    request: *const kvb_request_t,
    out: *mut kvb_admission_t,
) -> kvb_status_t {
    with_manager_tx(manager, |m| {
        let req = self::request(request)?.to_request();
        let admission = m.add_sequence_receiving(&req)?;
        if !out.is_null() {
            write_out(out, admission.into(), "out")?;
        }
        Ok(())
    })
}

/// Copies the receive ticket of receiving sequence `request_id` (its id, the tokens the sender
/// skips, the prompt's length and, per window, the rows that receive the KV) into `buf` of
/// `capacity` bytes, for the prefill engine's `kvb_manager_post_send`. `*out_len` receives its
/// size; `KVB_STATUS_BUFFER_TOO_SMALL` when it is above `capacity` (`buf` may be null for
/// `capacity` 0). `KVB_STATUS_UNKNOWN_REQUEST`, `KVB_STATUS_INVALID_ARGUMENT` for a sequence
/// that is not receiving, `KVB_STATUS_NULL_POINTER`.
#[no_mangle]
pub extern "C" fn kvb_manager_get_receive_ticket(
    manager: *mut kvb_manager_t,
    request_id: u64,
    buf: *mut u8,
    capacity: usize,
    out_len: *mut usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out_len, "out_len")?;
        let blob = m.receive_ticket(request_id)?.encode();
        bytes_out(&blob, buf, capacity, out_len)
    })
}

/// The prompt's KV of receiving sequence `request_id` has landed (the engine saw the sender's
/// notification): the history covers the prompt, its full blocks are stored for reuse (their
/// events are emitted now, not before), and the sequence becomes an ordinary one whose first
/// generated token is the engine's to add. `KVB_STATUS_UNKNOWN_REQUEST`,
/// `KVB_STATUS_INVALID_ARGUMENT` for a sequence that is not receiving (nothing changes).
#[no_mangle]
pub extern "C" fn kvb_manager_complete_receive(
    manager: *mut kvb_manager_t,
    request_id: u64,
) -> kvb_status_t {
    with_manager(manager, |m| {
        m.complete_receive(request_id)?;
        Ok(())
    })
}

/// Gives up the receive of sequence `request_id` and removes the sequence (nothing stored for
/// reuse). `outcome` (a `kvb_transfer_outcome_t`) is what the engine knows of the transfer:
/// `KVB_TRANSFER_DONE` (without the data wanted) or `KVB_TRANSFER_NOT_SUBMITTED` release every
/// block at once and `*out_hold_id` is 0; any other outcome (a transfer may still write the
/// rows) keeps the receiving rows in quarantine under the hold written to `*out_hold_id`, never
/// reused until `kvb_manager_release_quarantine`. The reused prefix is released either way.
/// Fails with `KVB_STATUS_UNKNOWN_REQUEST`, `KVB_STATUS_INVALID_ARGUMENT` for a sequence that
/// is not receiving or an outcome value outside `kvb_transfer_outcome_t`,
/// `KVB_STATUS_NULL_POINTER`. Nothing changes on failure.
#[no_mangle]
pub extern "C" fn kvb_manager_abort_receive(
    manager: *mut kvb_manager_t,
    request_id: u64,
    outcome: i32,
    out_hold_id: *mut u64,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out_hold_id, "out_hold_id")?;
        let outcome = outcome_arg(outcome)?;
        let hold = m.abort_receive(request_id, outcome)?;
        write_out(out_hold_id, hold.map_or(0, |h| h.0), "out_hold_id")
    })
}

/// Turns the contiguous-run allocation preference on or off for every window (the config's
/// `contiguous_runs`): with it, blocks allocated together prefer consecutive rows, so that a
/// transfer moves them in fewer descriptors. It orders future allocations only.
#[no_mangle]
pub extern "C" fn kvb_manager_set_contiguous_runs(
    manager: *mut kvb_manager_t,
    on: bool,
) -> kvb_status_t {
    with_manager(manager, |m| {
        m.set_contiguous_runs(on);
        Ok(())
    })
}

/// The rows of one window of a sequence (`kvb_manager_get_row_runs`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct kvb_row_runs_t {
    /// The window.
    pub window_size: i32,
    /// GPU-level blocks of beam 0 the sequence holds in it (front-detached ones not counted).
    pub blocks: i32,
    /// Maximal runs of consecutive rows among them, in token order (each run moves as one
    /// descriptor per pool when the peer's rows are a run too).
    pub runs: i32,
}

/// How the rows of sequence `request_id` (beam 0; a receiving sequence included) fall into runs
/// of consecutive rows, one entry per window into `out` of `capacity` entries; `*out_count` =
/// the number of windows. `KVB_STATUS_BUFFER_TOO_SMALL` when above `capacity`;
/// `KVB_STATUS_UNKNOWN_REQUEST`; `KVB_STATUS_NULL_POINTER`.
#[no_mangle]
pub extern "C" fn kvb_manager_get_row_runs(
    manager: *mut kvb_manager_t,
    request_id: u64,
    out: *mut kvb_row_runs_t,
    capacity: usize,
    out_count: *mut usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out_count, "out_count")?;
        let runs = m
            .row_runs(request_id)?
            .into_iter()
            .map(|r| {
                Ok(kvb_row_runs_t {
                    window_size: i32_result(r.window_size, "window_size")?,
                    blocks: i32_result(r.blocks, "blocks")?,
                    runs: i32_result(r.runs, "runs")?,
                })
            })
            .collect::<FfiResult<Vec<_>>>()?;
        copy_out(&runs, out, capacity, out_count)
    })
}
