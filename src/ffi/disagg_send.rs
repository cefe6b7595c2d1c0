//! C entry points of disaggregated prefill/decode, the prefill (sending) side: leases on a
//! request's computed blocks, posting them to a peer's receive ticket, polling the transfers,
//! settling holds and releasing quarantines.

use std::ffi::c_char;

use super::disagg_transport::{cstr_arg, outcome_arg, outcome_code};
use super::handle::{
    count_arg, invalid, kvb_manager_t, require_out, slice_arg, slice_arg_mut, with_manager,
    write_out,
};
use super::status::kvb_status_t;
use crate::disagg::{Layout, ReceiveTicket};
use crate::error::KvError;
use crate::manager::HoldId;

/// Takes a lease on the blocks of request `request_id` that hold tokens `[skip_tokens,
/// computed_tokens)` (whole blocks; beam 0; in each window the blocks it still holds): they
/// are pinned, so the engine may remove the sequence at once and the rows stay as they are
/// until the lease is settled (by `kvb_manager_poll_transfers` once posted, or
/// `kvb_manager_settle_hold`). `skip_tokens` is what the receiver already caches (its ticket's
/// skip, a multiple of the tokens per block); `computed_tokens` the tokens whose KV the engine
/// has computed. `*out_hold_id` receives the lease's id (never 0). Fails with
/// `KVB_STATUS_UNKNOWN_REQUEST`, `KVB_STATUS_INVALID_ARGUMENT` for a negative count, a skip
/// that is not a multiple of the tokens per block or not below `computed_tokens`, or
/// `computed_tokens` beyond the sequence's slots, `KVB_STATUS_UNSUPPORTED` for a beam width
/// above 1 or a block on the host tier, `KVB_STATUS_SEQUENCE_SUSPENDED` /
/// `KVB_STATUS_SEQUENCE_RECEIVING` for such a sequence, `KVB_STATUS_NULL_POINTER`. Nothing
/// changes on failure.
#[no_mangle]
pub extern "C" fn kvb_manager_begin_send(
    manager: *mut kvb_manager_t,
    request_id: u64,
    skip_tokens: i32,
    computed_tokens: i32,
    out_hold_id: *mut u64,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out_hold_id, "out_hold_id")?;
        let skip = count_arg(skip_tokens, "skip_tokens")?;
        let computed = count_arg(computed_tokens, "computed_tokens")?;
        let hold = m.begin_send(request_id, skip, computed)?;
        write_out(out_hold_id, hold.0, "out_hold_id")
    })
}

/// Posts lease `hold_id` (from `kvb_manager_begin_send`, not yet posted) to peer `peer_name`
/// (NUL-terminated, as `kvb_manager_add_transfer_peer` named it): the lease's rows are written
/// into the rows of the peer's receive ticket (`ticket`, `ticket_len` bytes from the peer's
/// `kvb_manager_get_receive_ticket`), block index by block index and window by window, laid
/// out as the peer's layout says (`layout`, `layout_len` bytes from its
/// `kvb_manager_export_layout`; identical layouts, or head slices for a different
/// tensor-parallel split), in as few descriptors as both sides' runs of rows allow. The peer
/// receives `notification` (`notification_len` bytes; none when 0) after the data. The
/// transfer is then watched by `kvb_manager_poll_transfers`, with the attached timeout.
/// Fails with `KVB_STATUS_INVALID_ARGUMENT` for a malformed layout or ticket blob (the message
/// says why), an unknown hold or one already posted or quarantined, a ticket asking for more
/// tokens or other blocks than the lease holds or for no rows, layouts that do not fit each
/// other, an unknown peer, or no attached backend; `KVB_STATUS_TRANSPORT` when the backend
/// refuses the transfer; `KVB_STATUS_NULL_POINTER`. Nothing is posted and nothing changes on
/// failure.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn kvb_manager_post_send(
    manager: *mut kvb_manager_t,
    hold_id: u64,
    peer_name: *const c_char,
    layout: *const u8,
    layout_len: usize,
    ticket: *const u8,
    ticket_len: usize,
    notification: *const u8,
    notification_len: usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        let peer = cstr_arg(peer_name, "peer_name")?;
        let layout = slice_arg(layout, layout_len, "layout")?;
        let ticket = slice_arg(ticket, ticket_len, "ticket")?;
        let notification = slice_arg(notification, notification_len, "notification")?;
        let layout = Layout::decode(layout)
            .map_err(|e| invalid(format!("the peer's layout blob is malformed: {e}")))?;
        let ticket = ReceiveTicket::decode(ticket)
            .map_err(|e| invalid(format!("the receive ticket blob is malformed: {e}")))?;
        m.post_send(HoldId(hold_id), &peer, &layout, &ticket, notification)?;
        Ok(())
    })
}

/// A hold whose state a poll changed (`kvb_manager_poll_transfers`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct kvb_transfer_event_t {
    /// The lease or quarantine (`kvb_manager_begin_send`, `kvb_manager_abort_receive`).
    pub hold_id: u64,
    /// A `kvb_transfer_outcome_t`: `KVB_TRANSFER_DONE` (the hold ended, its blocks released),
    /// `KVB_TRANSFER_FAILED` or `KVB_TRANSFER_TIMED_OUT` (the hold is quarantined).
    pub outcome: i32,
}

/// Reads every watched transfer without blocking and settles what ended: a completed transfer
/// ends its lease (its blocks are released), or a quarantine whose transfer completed late; a
/// failed one quarantines its lease; one past its deadline is quarantined as timed out and
/// still watched (its later completion releases it). `out_events` receives one entry per hold
/// whose state changed, `*out_count` their number. Outcomes are consumed by the poll, so none
/// may be lost: `capacity` must be at least the holds that can change, `active_leases +
/// quarantined_holds` of `kvb_transfer_stats_t`; otherwise the call fails with
/// `KVB_STATUS_BUFFER_TOO_SMALL` before polling (nothing read, `*out_count` = that bound).
/// Without an attached backend nothing changes (`*out_count` = 0). `KVB_STATUS_NULL_POINTER`
/// (`out_events` may be null when the bound is 0).
#[no_mangle]
pub extern "C" fn kvb_manager_poll_transfers(
    manager: *mut kvb_manager_t,
    out_events: *mut kvb_transfer_event_t,
    capacity: usize,
    out_count: *mut usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out_count, "out_count")?;
        let s = m.transfer_stats();
        let bound = (s.active_leases + s.quarantined_holds) as usize;
        if capacity < bound {
            write_out(out_count, bound, "out_count")?;
            return Err(KvError::BufferTooSmall {
                needed: bound,
                given: capacity,
            }
            .into());
        }
        let out = slice_arg_mut(out_events, bound, "out_events")?;
        let changes = m.poll_transfers();
        debug_assert!(changes.len() <= out.len());
        for (slot, &(hold, outcome)) in out.iter_mut().zip(&changes) {
            *slot = kvb_transfer_event_t {
                hold_id: hold.0,
                outcome: outcome_code(outcome),
            };
        }
        write_out(out_count, changes.len(), "out_count")
    })
}

/// Settles hold `hold_id` with the outcome of its transfer, as the engine learned it
/// (`outcome`, a `kvb_transfer_outcome_t`): `KVB_TRANSFER_DONE` and
/// `KVB_TRANSFER_NOT_SUBMITTED` end it (its blocks are released; a lease never posted is
/// settled so); any other outcome quarantines it (its rows are never reused until
/// `kvb_manager_release_quarantine`). `*out_still_held` receives whether the hold still
/// exists. A posted lease is settled by `kvb_manager_poll_transfers`: declaring it done here is
/// refused. Fails with `KVB_STATUS_INVALID_ARGUMENT` for an unknown hold, an outcome value
/// outside `kvb_transfer_outcome_t`, or a quiescent outcome for a posted lease;
/// `KVB_STATUS_NULL_POINTER`. Nothing changes on failure.
#[no_mangle]
pub extern "C" fn kvb_manager_settle_hold(
    manager: *mut kvb_manager_t,
    hold_id: u64,
    outcome: i32,
    out_still_held: *mut bool,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out_still_held, "out_still_held")?;
        let outcome = outcome_arg(outcome)?;
        let held = m.settle_hold(HoldId(hold_id), outcome)?;
        write_out(out_still_held, held, "out_still_held")
    })
}

/// Releases quarantined hold `hold_id`: the engine (or the peer's acknowledgement) says no
/// transfer touches its rows any more; its blocks go back to the free queues. Fails with
/// `KVB_STATUS_INVALID_ARGUMENT` for an unknown hold or one not quarantined (nothing changes).
#[no_mangle]
pub extern "C" fn kvb_manager_release_quarantine(
    manager: *mut kvb_manager_t,
    hold_id: u64,
) -> kvb_status_t {
    with_manager(manager, |m| {
        m.release_quarantine(HoldId(hold_id))?;
        Ok(())
    })
}
