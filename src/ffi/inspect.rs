//! C entry points for tests and debugging: one block's state, priorities, the invariant check,
//! the manual clock and the panic guard's test hook.

use super::handle::{
    block_id_arg, invalid, kvb_manager_t, require_out, window_arg, with_manager, write_out,
};
use super::status::kvb_status_t;
use super::types::kvb_block_info_t;

/// A snapshot of one block of a window.
#[no_mangle]
pub extern "C" fn kvb_manager_get_block_info(
    manager: *mut kvb_manager_t,
    window_size: i32,
    block_id: i32,
    out: *mut kvb_block_info_t,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        let b = block_id_arg(block_id)?;
        write_out(
            out,
            m.block_info(window_arg(window_size)?, b)?.into(),
            "out",
        )
    })
}

/// Retention priority of a block; 35 (the default) for an invalid id (TensorRT-LLM
/// `getPriorityByBlockId`).
#[no_mangle]
pub extern "C" fn kvb_manager_get_priority_by_block_id(
    manager: *mut kvb_manager_t,
    window_size: i32,
    block_id: i64,
    out: *mut i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        let p = m.priority_by_block_id(window_arg(window_size)?, block_id)?;
        write_out(out, i32::from(p), "out")
    })
}

/// Last block of beam 0 in the smallest window (TensorRT-LLM `getLastBlockId`).
#[no_mangle]
pub extern "C" fn kvb_manager_get_last_block_id(
    manager: *mut kvb_manager_t,
    request_id: u64,
    out: *mut i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        require_out(out, "out")?;
        write_out(out, m.last_block_id(request_id)? as i32, "out")
    })
}

/// Verifies the manager's invariants (free counters = queue lengths, queue levels, reference
/// counts, tree hashes and links, sliding-window bounds, ...). Returns
/// `KVB_STATUS_INVARIANT_VIOLATION` naming the first violation in the message.
#[no_mangle]
pub extern "C" fn kvb_manager_check_invariants(manager: *mut kvb_manager_t) -> kvb_status_t {
    with_manager(manager, |m| Ok(m.check_invariants()?))
}

/// Advances the manual clock by `ms` (managers created with `manual_clock`).
#[no_mangle]
pub extern "C" fn kvb_manager_advance_time(manager: *mut kvb_manager_t, ms: i64) -> kvb_status_t {
    with_manager(manager, |m| {
        let ms = u64::try_from(ms).map_err(|_| invalid(format!("ms is negative ({ms})")))?;
        Ok(m.advance_time(ms)?)
    })
}

/// Test hook for the panic guard: panics inside the library while holding the manager. The call
/// returns `KVB_STATUS_INTERNAL` and every later call on the handle `KVB_STATUS_POISONED`.
#[no_mangle]
pub extern "C" fn kvb_manager_debug_trigger_panic(manager: *mut kvb_manager_t) -> kvb_status_t {
    with_manager(manager, |_| panic!("kvb_manager_debug_trigger_panic"))
}
