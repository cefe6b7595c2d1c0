//! The NIXL C API functions kvblock calls, resolved from `libnixl_capi.so` at run time.
//!
//! Declarations follow NIXL's C API header (`src/bindings/rust/wrapper.h`, identical for these
//! functions from NIXL 1.4.0 to 1.5.x); checked against the `nixl-cu12==1.5.1` wheel. Every
//! function returns a status: 0 success, 1 in progress, negative an error.

use std::ffi::{c_char, c_int, c_uint, c_void, OsString};
use std::sync::{Mutex, OnceLock};

use libloading::Library;

use crate::error::{KvError, KvResult};

// A status is a plain `c_int` (no alias: the C header generator would export one).
pub const SUCCESS: c_int = 0;
pub const IN_PROG: c_int = 1;

pub type Agent = *mut c_void;
pub type Params = *mut c_void;
pub type MemList = *mut c_void;
pub type Backend = *mut c_void;
pub type OptArgs = *mut c_void;
pub type XferDlist = *mut c_void;
pub type RegDlist = *mut c_void;
pub type XferReq = *mut c_void;
pub type NotifMap = *mut c_void;

/// `nixl_capi_mem_type_t`
pub const MEM_DRAM: c_int = 0;
pub const MEM_VRAM: c_int = 1;
/// `nixl_capi_xfer_op_t`
pub const OP_READ: c_int = 0;
pub const OP_WRITE: c_int = 1;
/// `nixl_capi_thread_sync_t`: NONE (kvblock calls an agent from one thread at a time).
pub const THREAD_SYNC_NONE: c_int = 0;

/// `nixl_capi_agent_config_t`
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AgentConfig {
    pub enable_prog_thread: bool,
    pub enable_listen_thread: bool,
    pub listen_port: c_int,
    pub thread_sync: c_int,
    pub num_workers: c_uint,
    pub pthr_delay_us: u64,
    pub lthr_delay_us: u64,
    pub capture_telemetry: bool,
}

/// The environment variable that names the library's full path.
pub const LIBRARY_ENV: &str = "KVBLOCK_NIXL_LIBRARY";
/// The name tried on the loader path when the variable is unset.
pub const LIBRARY_NAME: &str = "libnixl_capi.so";

macro_rules! symbols {
    ($( $name:ident : fn($($arg:ty),*) $(-> $ret:ty)?; )*) => {
        /// The resolved functions; the library stays loaded for the life of the process.
        pub struct Api {
            $( pub $name: unsafe extern "C" fn($($arg),*) $(-> $ret)?, )*
            _lib: Library,
        }

        /// Every C name kvblock resolves (for messages and tests).
        pub const SYMBOLS: &[&str] = &[$( concat!("nixl_capi_", stringify!($name)) ),*];

        impl Api {
            /// # Safety
            /// `lib` must be NIXL's C API library, whose functions have these signatures.
            unsafe fn resolve(lib: Library) -> Result<Api, String> {
                Ok(Api {
                    $( $name: *lib
                        .get::<unsafe extern "C" fn($($arg),*) $(-> $ret)?>(
                            concat!("nixl_capi_", stringify!($name), "\0").as_bytes())
                        .map_err(|e| format!("{}: {e}", concat!("nixl_capi_", stringify!($name))))?,
                    )*
                    _lib: lib,
                })
            }
        }
    };
}

symbols! {
    create_configured_agent: fn(*const c_char, *const AgentConfig, *mut Agent) -> c_int;
    destroy_agent: fn(Agent) -> c_int;
    get_plugin_params: fn(Agent, *const c_char, *mut MemList, *mut Params) -> c_int;
    destroy_mem_list: fn(MemList) -> c_int;
    destroy_params: fn(Params) -> c_int;
    create_backend: fn(Agent, *const c_char, Params, *mut Backend) -> c_int;
    destroy_backend: fn(Backend) -> c_int;
    create_reg_dlist: fn(c_int, *mut RegDlist) -> c_int;
    destroy_reg_dlist: fn(RegDlist) -> c_int;
    reg_dlist_add_desc: fn(RegDlist, usize, usize, u64, *const c_void, usize) -> c_int;
    register_mem: fn(Agent, RegDlist, OptArgs) -> c_int;
    deregister_mem: fn(Agent, RegDlist, OptArgs) -> c_int;
    get_local_md: fn(Agent, *mut *mut c_void, *mut usize) -> c_int;
    load_remote_md: fn(Agent, *const c_void, usize, *mut *mut c_char) -> c_int;
    invalidate_remote_md: fn(Agent, *const c_char) -> c_int;
    create_xfer_dlist: fn(c_int, *mut XferDlist) -> c_int;
    destroy_xfer_dlist: fn(XferDlist) -> c_int;
    xfer_dlist_add_desc: fn(XferDlist, usize, usize, u64) -> c_int;
    create_opt_args: fn(*mut OptArgs) -> c_int;
    destroy_opt_args: fn(OptArgs) -> c_int;
    opt_args_set_notif_msg: fn(OptArgs, *const c_void, usize) -> c_int;
    opt_args_set_has_notif: fn(OptArgs, bool) -> c_int;
    create_xfer_req: fn(Agent, c_int, XferDlist, XferDlist, *const c_char, *mut XferReq, OptArgs) -> c_int;
    post_xfer_req: fn(Agent, XferReq, OptArgs) -> c_int;
    get_xfer_status: fn(Agent, XferReq) -> c_int;
    release_xfer_req: fn(Agent, XferReq) -> c_int;
    destroy_xfer_req: fn(XferReq) -> c_int;
    gen_notif: fn(Agent, *const c_char, *const c_void, usize, OptArgs) -> c_int;
    create_notif_map: fn(*mut NotifMap) -> c_int;
    destroy_notif_map: fn(NotifMap) -> c_int;
    get_notifs: fn(Agent, NotifMap, OptArgs) -> c_int;
    notif_map_size: fn(NotifMap, *mut usize) -> c_int;
    notif_map_get_agent_at: fn(NotifMap, usize, *mut *const c_char) -> c_int;
    notif_map_get_notifs_size: fn(NotifMap, *const c_char, *mut usize) -> c_int;
    notif_map_get_notif: fn(NotifMap, *const c_char, usize, *mut *const c_void, *mut usize) -> c_int;
    notif_map_clear: fn(NotifMap) -> c_int;
}

/// Loaded once per process and never unloaded: UCX and NIXL's plugins do not support being
/// unloaded, and a handle's functions must outlive every agent.
static API: OnceLock<Api> = OnceLock::new();
static LOADING: Mutex<()> = Mutex::new(());

/// The library named by `KVBLOCK_NIXL_LIBRARY`, else `libnixl_capi.so` on the loader path.
/// A failure is `KvError::Unsupported` naming both places (and is retried on the next call).
pub fn api() -> KvResult<&'static Api> {
    if let Some(api) = API.get() {
        return Ok(api);
    }
    let _guard = LOADING.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(api) = API.get() {
        return Ok(api);
    }
    let configured = std::env::var_os(LIBRARY_ENV).filter(|v| !v.is_empty());
    let (target, tried): (OsString, String) = match &configured {
        Some(path) => (
            path.clone(),
            format!("{LIBRARY_ENV}={}", path.to_string_lossy()),
        ),
        None => (
            LIBRARY_NAME.into(),
            format!("{LIBRARY_NAME} on the loader path ({LIBRARY_ENV} is unset)"),
        ),
    };
    // SAFETY: loading NIXL runs its (and UCX's) initializers; nothing else is assumed.
    let loaded = unsafe { Library::new(&target) }
        .map_err(|e| match std::error::Error::source(&e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        })
        // SAFETY: the library is NIXL's C API; the declarations above follow its header.
        .and_then(|lib| unsafe { Api::resolve(lib) });
    match loaded {
        Ok(api) => Ok(API.get_or_init(|| api)),
        Err(e) => Err(KvError::Unsupported(format!(
            "NIXL C API not available: tried {tried}: {e}. Set {LIBRARY_ENV} to the full path of \
             {LIBRARY_NAME} or put it on the loader path (scripts/setup.sh installs the \
             nixl-cu12 wheel; `source scripts/nixl_env.sh` sets {LIBRARY_ENV})"
        ))),
    }
}

/// A NIXL status as an error for `call`.
pub fn check(call: &str, status: c_int) -> KvResult<()> {
    if status == SUCCESS {
        Ok(())
    } else {
        Err(KvError::Transfer(format!(
            "{call} failed: {}",
            describe(status)
        )))
    }
}

/// `nixl_capi_status_t` in words.
pub fn describe(status: c_int) -> String {
    let name = match status {
        0 => "NIXL_CAPI_SUCCESS",
        1 => "NIXL_CAPI_IN_PROG",
        -1 => "NIXL_CAPI_ERROR_INVALID_PARAM",
        -2 => "NIXL_CAPI_ERROR_BACKEND",
        -3 => "NIXL_CAPI_ERROR_INVALID_STATE",
        -4 => "NIXL_CAPI_ERROR_EXCEPTION",
        -5 => "NIXL_CAPI_ERROR_NO_TELEMETRY",
        -6 => "NIXL_CAPI_ERROR_NOT_FOUND",
        _ => "unknown status",
    };
    format!("{name} ({status})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_layout_matches_the_c_struct() {
        // bool, bool, int, enum, unsigned, u64, u64, bool: 40 bytes on LP64.
        assert_eq!(std::mem::size_of::<AgentConfig>(), 40);
        assert_eq!(std::mem::offset_of!(AgentConfig, pthr_delay_us), 16);
        assert_eq!(std::mem::offset_of!(AgentConfig, capture_telemetry), 32);
    }

    #[test]
    fn statuses_are_described() {
        assert!(describe(-2).contains("BACKEND"));
        assert!(describe(42).contains("unknown"));
        assert!(check("x", 0).is_ok());
        assert!(matches!(check("x", -1), Err(KvError::Transfer(_))));
        assert_eq!(SYMBOLS.len(), 36);
        assert!(SYMBOLS.contains(&"nixl_capi_get_xfer_status"));
    }
}
