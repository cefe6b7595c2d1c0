//! C entry point attaching a NIXL transfer agent (src/disagg/nixl): how two engine processes
//! move KV between each other.

use std::ffi::c_char;

use super::disagg_transport::{attach_args, cstr_arg};
use super::handle::{kvb_manager_t, with_manager};
use super::status::kvb_status_t;
use crate::disagg::nixl::{NixlBackend, NixlConfig};

/// Attaches a NIXL agent named `agent_name` (NUL-terminated; the name peers know it by) as the
/// manager's transfer backend: NIXL's UCX plugin with its default parameters and NIXL's progress
/// thread; every pool of every window, at both levels, is registered with it (GPU pools as
/// device memory of the configured device, host pools as host memory). `tp_rank` of `tp_size`
/// and `timeout_ms` as for `kvb_manager_attach_loopback`. NIXL's C API (`libnixl_capi.so`) is
/// loaded at run time, from `KVBLOCK_NIXL_LIBRARY` (a full path) or the loader path:
/// `KVB_STATUS_UNSUPPORTED` names both when it is missing (`scripts/setup.sh` installs the
/// `nixl-cu12` wheel; `scripts/nixl_env.sh` sets the variable). `KVB_STATUS_TRANSPORT` when NIXL
/// refuses to create the agent or register the pools (the message has NIXL's status);
/// `KVB_STATUS_INVALID_ARGUMENT`, `KVB_STATUS_UNSUPPORTED`, `KVB_STATUS_NULL_POINTER` and
/// `KVB_STATUS_DESTROYED` as for the loopback attach. Nothing changes on failure.
#[no_mangle]
pub extern "C" fn kvb_manager_attach_nixl(
    manager: *mut kvb_manager_t,
    agent_name: *const c_char,
    tp_rank: i32,
    tp_size: i32,
    timeout_ms: i64,
) -> kvb_status_t {
    with_manager(manager, |m| {
        let name = cstr_arg(agent_name, "agent_name")?;
        let (rank, size, timeout) = attach_args(tp_rank, tp_size, timeout_ms)?;
        let backend = NixlBackend::new(&NixlConfig::new(&name))?;
        m.attach_transfer_backend(Box::new(backend), rank, size, timeout)?;
        Ok(())
    })
}
