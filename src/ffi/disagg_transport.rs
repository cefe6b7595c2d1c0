//! C entry points of disaggregated prefill/decode, the transport half: transfer outcomes, the
//! in-process loopback hub, attaching a transfer backend to a manager, the blobs the two engines
//! exchange (backend metadata, layout), notifications and the transfer statistics.

use std::ffi::{c_char, CStr};
use std::sync::Mutex;

use super::handle::{
    guard, invalid, kvb_manager_t, null_error, require_out, slice_arg, slice_arg_mut, with_manager,
    write_out, FfiError, FfiResult,
};
use super::status::kvb_status_t;
use super::types::check_struct_size;
use crate::disagg::LoopbackHub;
use crate::error::KvError;
use crate::manager::{TransferOutcome, TransferStats};

/// How a transfer ended (values of the `int32_t outcome` arguments and of
/// `kvb_transfer_event_t::outcome`). Only `KVB_TRANSFER_DONE` and `KVB_TRANSFER_NOT_SUBMITTED`
/// end a transfer's access to its rows; the others quarantine them.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvb_transfer_outcome_t {
    /// The backend reported completion: the rows are quiescent.
    KVB_TRANSFER_DONE = 0,
    /// Never handed to a backend: the rows are quiescent.
    KVB_TRANSFER_NOT_SUBMITTED = 1,
    /// The backend reported an error: which bytes moved, and whether some still move, is
    /// unknown.
    KVB_TRANSFER_FAILED = 2,
    /// The deadline passed while the transfer was in progress.
    KVB_TRANSFER_TIMED_OUT = 3,
    /// The engine cannot tell (an abort from the peer, a lost connection).
    KVB_TRANSFER_IN_DOUBT = 4,
}

/// An `outcome` argument: a `kvb_transfer_outcome_t` value, anything else refused.
pub(crate) fn outcome_arg(v: i32) -> FfiResult<TransferOutcome> {
    Ok(match v {
        0 => TransferOutcome::Done,
        1 => TransferOutcome::NotSubmitted,
        2 => TransferOutcome::Failed,
        3 => TransferOutcome::TimedOut,
        4 => TransferOutcome::InDoubt,
        _ => {
            return Err(invalid(format!(
                "outcome {v} is not a kvb_transfer_outcome_t (0..=4)"
            )))
        }
    })
}

/// The `kvb_transfer_outcome_t` value of an outcome.
pub(crate) fn outcome_code(o: TransferOutcome) -> i32 {
    (match o {
        TransferOutcome::Done => kvb_transfer_outcome_t::KVB_TRANSFER_DONE,
        TransferOutcome::NotSubmitted => kvb_transfer_outcome_t::KVB_TRANSFER_NOT_SUBMITTED,
        TransferOutcome::Failed => kvb_transfer_outcome_t::KVB_TRANSFER_FAILED,
        TransferOutcome::TimedOut => kvb_transfer_outcome_t::KVB_TRANSFER_TIMED_OUT,
        TransferOutcome::InDoubt => kvb_transfer_outcome_t::KVB_TRANSFER_IN_DOUBT,
    }) as i32
}

/// A required NUL-terminated UTF-8 string argument.
pub(crate) fn cstr_arg(p: *const c_char, what: &str) -> FfiResult<String> {
    if p.is_null() {
        return Err(null_error(what));
    }
    // SAFETY: a NUL-terminated string supplied by the caller for the call's duration.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(str::to_owned)
        .map_err(|_| invalid(format!("{what} is not UTF-8")))
}

/// Copies a byte blob into a caller buffer of `capacity` bytes; `*out_len` receives its size
/// either way, and `KVB_STATUS_BUFFER_TOO_SMALL` when it does not fit (`buf` may then be null).
pub(crate) fn bytes_out(
    bytes: &[u8],
    buf: *mut u8,
    capacity: usize,
    out_len: *mut usize,
) -> FfiResult {
    write_out(out_len, bytes.len(), "out_len")?;
    if bytes.len() > capacity {
        return Err(KvError::BufferTooSmall {
            needed: bytes.len(),
            given: capacity,
        }
        .into());
    }
    slice_arg_mut(buf, bytes.len(), "buf")?.copy_from_slice(bytes);
    Ok(())
}

/// Whether a string fits a buffer of `capacity` bytes with its NUL.
fn string_fits(s: &str, capacity: usize) -> bool {
    s.len() < capacity
}

/// Copies `s` and a NUL into `buf` (checked to fit); `*out_len` = its length without the NUL.
fn string_out(s: &str, buf: *mut c_char, capacity: usize, out_len: *mut usize) -> FfiResult {
    write_out(out_len, s.len(), "out_len")?;
    if !string_fits(s, capacity) {
        return Err(KvError::BufferTooSmall {
            needed: s.len() + 1,
            given: capacity,
        }
        .into());
    }
    let dst = slice_arg_mut(buf.cast::<u8>(), s.len() + 1, "buf")?;
    dst[..s.len()].copy_from_slice(s.as_bytes());
    dst[s.len()] = 0;
    Ok(())
}

/// Opaque in-process transfer hub: managers attached to the same hub
/// (`kvb_manager_attach_loopback`) move KV bytes between each other with memcpy, as two engine
/// processes would over a network. For tests and single-process setups; with fault injection.
/// Create with `kvb_loopback_hub_create`, free with `kvb_loopback_hub_destroy`. Like a manager
/// handle, a destroyed handle keeps a small shell, so that a second destroy or any later call
/// returns `KVB_STATUS_DESTROYED`.
pub struct kvb_loopback_hub_t {
    /// `None` once destroyed.
    state: Mutex<Option<LoopbackHub>>,
}

/// Destroyed hub handles keep their shell here, still reachable (as `handle::GRAVEYARD` does
/// for managers).
static GRAVEYARD: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// The live hub behind a handle (a clone sharing it).
fn hub_ref(hub: *const kvb_loopback_hub_t) -> FfiResult<LoopbackHub> {
    // SAFETY: a handle from kvb_loopback_hub_create (or null, checked here); destroyed handles
    // stay allocated (GRAVEYARD).
    let handle = unsafe { hub.as_ref() }.ok_or_else(|| null_error("hub"))?;
    let state = handle.state.lock().unwrap_or_else(|p| p.into_inner());
    state.clone().ok_or_else(|| {
        FfiError(
            kvb_status_t::KVB_STATUS_DESTROYED,
            "the loopback hub was destroyed".into(),
        )
    })
}

/// Creates an empty loopback hub; `*out` receives its handle (null on failure). Fails only with
/// `KVB_STATUS_NULL_POINTER`.
#[no_mangle]
pub extern "C" fn kvb_loopback_hub_create(out: *mut *mut kvb_loopback_hub_t) -> kvb_status_t {
    guard(|| {
        require_out(out, "out")?;
        let handle = Box::into_raw(Box::new(kvb_loopback_hub_t {
            state: Mutex::new(Some(LoopbackHub::new())),
        }));
        write_out(out, handle, "out")
    })
}

/// Frees a hub handle. Managers attached to the hub keep it alive and go on transferring
/// between each other; the handle's fault injection calls are gone. Null is accepted. A second
/// destroy, or any call after it, returns `KVB_STATUS_DESTROYED` (never a double free).
#[no_mangle]
pub extern "C" fn kvb_loopback_hub_destroy(hub: *mut kvb_loopback_hub_t) -> kvb_status_t {
    guard(|| {
        // SAFETY: a handle from kvb_loopback_hub_create; shells are never freed.
        let Some(handle) = (unsafe { hub.as_ref() }) else {
            return Ok(());
        };
        let taken = handle
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if taken.is_none() {
            return Err(FfiError(
                kvb_status_t::KVB_STATUS_DESTROYED,
                "the loopback hub was already destroyed".into(),
            ));
        }
        GRAVEYARD
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(hub as usize);
        Ok(())
    })
}

/// Fault injection: the next transfer posted on the hub (by any manager) stays in progress,
/// its bytes not copied and its notification not delivered, until
/// `kvb_loopback_hub_finish_held`. Cumulative: two calls hold the next two posts.
/// `KVB_STATUS_NULL_POINTER`, `KVB_STATUS_DESTROYED`.
#[no_mangle]
pub extern "C" fn kvb_loopback_hub_hold_next(hub: *mut kvb_loopback_hub_t) -> kvb_status_t {
    guard(|| {
        hub_ref(hub)?.hold_next();
        Ok(())
    })
}

/// Fault injection: the next transfer posted on the hub (by any manager) is accepted and ends
/// failed at once: nothing copied, no notification; the sender's poll reports
/// `KVB_TRANSFER_FAILED`. Cumulative. `KVB_STATUS_NULL_POINTER`, `KVB_STATUS_DESTROYED`.
#[no_mangle]
pub extern "C" fn kvb_loopback_hub_fail_next(hub: *mut kvb_loopback_hub_t) -> kvb_status_t {
    guard(|| {
        hub_ref(hub)?.fail_next("failed by kvb_loopback_hub_fail_next");
        Ok(())
    })
}

/// Completes every held transfer of the hub, oldest first: copies its bytes, delivers its
/// notification, and its state becomes done (or failed when a side deregistered its memory
/// meanwhile); the sender sees it at its next `kvb_manager_poll_transfers`.
/// `*out_finished` receives how many were completed. `KVB_STATUS_NULL_POINTER`,
/// `KVB_STATUS_DESTROYED`.
#[no_mangle]
pub extern "C" fn kvb_loopback_hub_finish_held(
    hub: *mut kvb_loopback_hub_t,
    out_finished: *mut usize,
) -> kvb_status_t {
    guard(|| {
        require_out(out_finished, "out_finished")?;
        let hub = hub_ref(hub)?;
        let n = hub
            .held()
            .into_iter()
            .filter(|&x| hub.finish(x).is_ok())
            .count();
        write_out(out_finished, n, "out_finished")
    })
}

/// Attaches an agent of loopback hub `hub`, named `agent_name` (NUL-terminated, unique on the
/// hub), as the manager's transfer backend: every pool of every window, at both levels, is
/// registered with it. `tp_rank` of `tp_size` is the manager's tensor-parallel position (its
/// heads are that slice of the model's); `timeout_ms` bounds every transfer the manager posts
/// (past it, `kvb_manager_poll_transfers` reports `KVB_TRANSFER_TIMED_OUT` and quarantines the
/// lease). Needs pools with bytes in host memory (`KVB_COPY_BACKEND_HOST`: the loopback backend
/// moves host memory only). Fails with `KVB_STATUS_INVALID_ARGUMENT` for a name empty or taken
/// on the hub, a negative rank, a rank not below a positive size, a non-positive timeout, or a
/// manager that already has a backend; `KVB_STATUS_UNSUPPORTED` without pool bytes (or GPU
/// pools); `KVB_STATUS_NULL_POINTER`; `KVB_STATUS_DESTROYED` for a destroyed hub or manager.
/// Nothing changes on failure.
#[no_mangle]
pub extern "C" fn kvb_manager_attach_loopback(
    manager: *mut kvb_manager_t,
    hub: *mut kvb_loopback_hub_t,
    agent_name: *const c_char,
    tp_rank: i32,
    tp_size: i32,
    timeout_ms: i64,
) -> kvb_status_t {
    with_manager(manager, |m| {
        let hub = hub_ref(hub)?;
        let name = cstr_arg(agent_name, "agent_name")?;
        let (rank, size, timeout) = attach_args(tp_rank, tp_size, timeout_ms)?;
        // The agent is created last: dropping it (on the manager's error) leaves the hub as it
        // was.
        let agent = hub.agent(&name)?;
        m.attach_transfer_backend(Box::new(agent), rank, size, timeout)?;
        Ok(())
    })
}

/// The tensor-parallel position and the timeout of an attach call, checked.
pub(crate) fn attach_args(
    tp_rank: i32,
    tp_size: i32,
    timeout_ms: i64,
) -> FfiResult<(u32, u32, u64)> {
    let rank =
        u32::try_from(tp_rank).map_err(|_| invalid(format!("tp_rank is negative ({tp_rank})")))?;
    let size =
        u32::try_from(tp_size).map_err(|_| invalid(format!("tp_size is negative ({tp_size})")))?;
    let timeout = u64::try_from(timeout_ms)
        .map_err(|_| invalid(format!("timeout_ms is negative ({timeout_ms})")))?;
    if size == 0 || rank >= size || timeout == 0 {
        return Err(invalid(format!(
            "tensor-parallel rank {rank} of {size}, timeout {timeout} ms: the rank must be below \
             a positive size and the timeout positive"
        )));
    }
    Ok((rank, size, timeout))
}

/// Copies the attached backend's metadata blob (its agent name and registered memory) into
/// `buf` of `capacity` bytes, for the peer's `kvb_manager_add_transfer_peer`. `*out_len`
/// receives the blob's size; `KVB_STATUS_BUFFER_TOO_SMALL` when it is above `capacity` (call
/// with `capacity` 0 and `buf` null to learn it). `KVB_STATUS_INVALID_ARGUMENT` without an
/// attached backend; `KVB_STATUS_NULL_POINTER`.
#[no_mangle]
pub extern "C" fn kvb_manager_get_transfer_metadata(
    manager: *mut kvb_manager_t,
    buf: *mut u8,
    capacity: usize,
    out_len: *mut usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out_len, "out_len")?;
        let blob = m.transfer_metadata()?;
        bytes_out(&blob, buf, capacity, out_len)
    })
}

/// Copies this manager's layout blob (every pool's geometry, rows and address, the tokens per
/// block and the tensor-parallel position) into `buf` of `capacity` bytes, for the peer's
/// `kvb_manager_post_send`. `*out_len` receives its size; `KVB_STATUS_BUFFER_TOO_SMALL` when
/// it is above `capacity` (`buf` may be null for `capacity` 0). `KVB_STATUS_INVALID_ARGUMENT`
/// without an attached backend; `KVB_STATUS_NULL_POINTER`.
#[no_mangle]
pub extern "C" fn kvb_manager_export_layout(
    manager: *mut kvb_manager_t,
    buf: *mut u8,
    capacity: usize,
    out_len: *mut usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out_len, "out_len")?;
        let blob = m.export_layout()?.encode();
        bytes_out(&blob, buf, capacity, out_len)
    })
}

/// Loads a peer's metadata blob (`kvb_manager_get_transfer_metadata` of the peer, `len` bytes)
/// into the attached backend, so that transfers can be posted to it; loading it again updates
/// it. Its agent name, NUL-terminated, goes to `name_buf` of `name_capacity` bytes and its
/// length without the NUL to `*out_name_len`. Fails with `KVB_STATUS_INVALID_ARGUMENT` for a
/// malformed blob or without an attached backend, `KVB_STATUS_TRANSPORT` when the backend
/// cannot reach the peer (a loopback agent not on this hub), `KVB_STATUS_NULL_POINTER`; nothing
/// changes then. `KVB_STATUS_BUFFER_TOO_SMALL` (`*out_name_len` = the name's length) when the
/// name and its NUL do not fit: the peer is loaded nonetheless (the one exception to "nothing
/// changes on failure"; loading the same blob again with a larger buffer is harmless).
#[no_mangle]
pub extern "C" fn kvb_manager_add_transfer_peer(
    manager: *mut kvb_manager_t,
    metadata: *const u8,
    len: usize,
    name_buf: *mut c_char,
    name_capacity: usize,
    out_name_len: *mut usize,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out_name_len, "out_name_len")?;
        if name_capacity > 0 && name_buf.is_null() {
            return Err(null_error("name_buf"));
        }
        let blob = slice_arg(metadata, len, "metadata")?;
        let name = m.add_transfer_peer(blob)?;
        string_out(&name, name_buf, name_capacity, out_name_len)
    })
}

/// Hands out the oldest transfer notification the manager received and has not handed out:
/// the sender's agent name (NUL-terminated) into `peer_buf` of `peer_capacity` bytes with its
/// length (without the NUL) in `*out_peer_len`, the message into `msg_buf` of `msg_capacity`
/// bytes with its size in `*out_msg_len`, and `*out_got` true. With none, `*out_got` is false
/// and the lengths 0. One at a time: when either buffer is too small the call fails with
/// `KVB_STATUS_BUFFER_TOO_SMALL`, both lengths are written (the name's without its NUL) and the
/// notification stays first in the queue. `KVB_STATUS_INVALID_ARGUMENT` without an attached
/// backend; `KVB_STATUS_NULL_POINTER` (the buffers may be null only with capacity 0).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn kvb_manager_take_transfer_notification(
    manager: *mut kvb_manager_t,
    peer_buf: *mut c_char,
    peer_capacity: usize,
    out_peer_len: *mut usize,
    msg_buf: *mut u8,
    msg_capacity: usize,
    out_msg_len: *mut usize,
    out_got: *mut bool,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out_peer_len, "out_peer_len")?;
        require_out(out_msg_len, "out_msg_len")?;
        require_out(out_got, "out_got")?;
        if peer_capacity > 0 && peer_buf.is_null() {
            return Err(null_error("peer_buf"));
        }
        if msg_capacity > 0 && msg_buf.is_null() {
            return Err(null_error("msg_buf"));
        }
        let Some((peer, msg)) = m.peek_transfer_notification()? else {
            write_out(out_peer_len, 0, "out_peer_len")?;
            write_out(out_msg_len, 0, "out_msg_len")?;
            return write_out(out_got, false, "out_got");
        };
        write_out(out_got, false, "out_got")?;
        write_out(out_peer_len, peer.len(), "out_peer_len")?;
        write_out(out_msg_len, msg.len(), "out_msg_len")?;
        if !string_fits(peer, peer_capacity) || msg.len() > msg_capacity {
            return Err(FfiError(
                kvb_status_t::KVB_STATUS_BUFFER_TOO_SMALL,
                format!(
                    "the notification needs {} bytes for the peer name (with its NUL) and {} for \
                     the message; {peer_capacity} and {msg_capacity} given (it stays queued)",
                    peer.len() + 1,
                    msg.len()
                ),
            ));
        }
        string_out(peer, peer_buf, peer_capacity, out_peer_len)?;
        bytes_out(msg, msg_buf, msg_capacity, out_msg_len)?;
        m.pop_transfer_notification();
        write_out(out_got, true, "out_got")
    })
}

/// Counters and gauges of the transfer lifecycle (`kvb_manager_get_transfer_stats`). Set
/// `struct_size` to `sizeof(kvb_transfer_stats_t)` before the call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct kvb_transfer_stats_t {
    /// `sizeof(kvb_transfer_stats_t)`, set by the caller.
    pub struct_size: u32,
    /// Leases not yet settled (taken or posted), now.
    pub active_leases: u64,
    /// Blocks of those leases.
    pub leased_blocks: u64,
    /// Sequences receiving now.
    pub receiving_requests: u64,
    /// Blocks those sequences receive.
    pub receiving_blocks: u64,
    /// Holds in quarantine now.
    pub quarantined_holds: u64,
    /// Blocks of those holds.
    pub quarantined_blocks: u64,
    /// Transfers posted (cumulative).
    pub transfers_posted: u64,
    /// Transfers that completed (cumulative).
    pub transfers_done: u64,
    /// Transfers the backend reported failed (cumulative).
    pub transfers_failed: u64,
    /// Transfers past their deadline (cumulative).
    pub transfers_timed_out: u64,
    /// Bytes of the posted transfers (cumulative).
    pub bytes_posted: u64,
    /// Descriptors the posted transfers had before adjacent ones were merged (cumulative).
    pub descriptors_unmerged: u64,
    /// Descriptors posted, after merging (cumulative).
    pub descriptors_posted: u64,
    /// Receives completed (cumulative).
    pub receives_completed: u64,
    /// Receives aborted (cumulative).
    pub receives_aborted: u64,
    /// Quarantines released, by the engine or by a late completion (cumulative).
    pub quarantines_released: u64,
}

impl From<TransferStats> for kvb_transfer_stats_t {
    fn from(s: TransferStats) -> Self {
        kvb_transfer_stats_t {
            struct_size: std::mem::size_of::<Self>() as u32,
            active_leases: s.active_leases,
            leased_blocks: s.leased_blocks,
            receiving_requests: s.receiving_requests,
            receiving_blocks: s.receiving_blocks,
            quarantined_holds: s.quarantined_holds,
            quarantined_blocks: s.quarantined_blocks,
            transfers_posted: s.transfers_posted,
            transfers_done: s.transfers_done,
            transfers_failed: s.transfers_failed,
            transfers_timed_out: s.transfers_timed_out,
            bytes_posted: s.bytes_posted,
            descriptors_unmerged: s.descriptors_unmerged,
            descriptors_posted: s.descriptors_posted,
            receives_completed: s.receives_completed,
            receives_aborted: s.receives_aborted,
            quarantines_released: s.quarantines_released,
        }
    }
}

/// The transfer lifecycle's counters and gauges (with or without an attached backend). Set
/// `out->struct_size` to `sizeof(kvb_transfer_stats_t)` first (`KVB_STATUS_STRUCT_SIZE`
/// otherwise). `KVB_STATUS_NULL_POINTER`.
#[no_mangle]
pub extern "C" fn kvb_manager_get_transfer_stats(
    manager: *mut kvb_manager_t,
    out: *mut kvb_transfer_stats_t,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        // SAFETY: non-null (checked); struct_size comes first.
        let size = unsafe { out.cast::<u32>().read_unaligned() };
        check_struct_size(
            size,
            std::mem::size_of::<kvb_transfer_stats_t>(),
            "kvb_transfer_stats_t",
        )?;
        write_out(out, m.transfer_stats().into(), "out")
    })
}
