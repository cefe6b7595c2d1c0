//! C entry points that configure, create and destroy a manager, and read its block size.

use super::handle::{
    destroy_handle, guard, kvb_manager_t, new_handle, require_out, with_manager, write_out,
    FfiError,
};
use super::status::kvb_status_t;
use super::types::{
    init_exact, kvb_manager_config_t, manager_config, manager_config_default, read_manager_config,
};
use crate::manager::KvCacheManager;

/// Fills `config` with defaults (reuse, partial reuse, copy-on-partial and onboarding on,
/// 32 tokens per block, beam 1, offload minimum priority 30, 2 bytes per element, no pool
/// memory) and sets `struct_size`. The caller then sets `windows` and `max_sequence_length`.
#[no_mangle]
pub extern "C" fn kvb_manager_config_init(config: *mut kvb_manager_config_t) -> kvb_status_t {
    guard(|| write_out(config, manager_config_default(), "config"))
}

/// `kvb_manager_config_init` of a struct of the caller's `size` (its `sizeof`, which the
/// header's `kvb_manager_config_init` macro passes): writes nothing past it.
/// `KVB_STATUS_STRUCT_SIZE` for a size that is no layout of this struct.
#[no_mangle]
pub extern "C" fn kvb_manager_config_init_sized(
    config: *mut kvb_manager_config_t,
    size: usize,
) -> kvb_status_t {
    init_exact(config, size, "config", manager_config_default())
}

/// Creates a manager. On success `*out` is a handle to free with `kvb_manager_destroy`; on
/// failure `*out` is set to null. Fails with `KVB_STATUS_INVALID_CONFIG` (inconsistent config,
/// pool sizes that overflow, more than `INT32_MAX` blocks in a window),
/// `KVB_STATUS_STRUCT_SIZE`, `KVB_STATUS_OUT_OF_MEMORY` (pools or bookkeeping the allocator
/// refuses), `KVB_STATUS_UNSUPPORTED` or `KVB_STATUS_CUDA` (CUDA backend).
#[no_mangle]
pub extern "C" fn kvb_manager_create(
    config: *const kvb_manager_config_t,
    out: *mut *mut kvb_manager_t,
) -> kvb_status_t {
    guard(|| {
        require_out(out, "out")?;
        write_out(out, std::ptr::null_mut(), "out")?;
        let c = read_manager_config(config)?;
        let cfg = manager_config(&c)?;
        let m = KvCacheManager::new(cfg)?;
        write_out(out, new_handle(m), "out")
    })
}

/// Destroys a manager. Null is accepted (no-op). Destroying twice returns
/// `KVB_STATUS_DESTROYED`; any other call on a destroyed handle returns it too.
#[no_mangle]
pub extern "C" fn kvb_manager_destroy(manager: *mut kvb_manager_t) -> kvb_status_t {
    guard(|| {
        if destroy_handle(manager) {
            Ok(())
        } else {
            Err(FfiError(
                kvb_status_t::KVB_STATUS_DESTROYED,
                "the manager was already destroyed".into(),
            ))
        }
    })
}

/// Tokens per block.
#[no_mangle]
pub extern "C" fn kvb_manager_get_tokens_per_block(
    manager: *mut kvb_manager_t,
    out: *mut i32,
) -> kvb_status_t {
    with_manager(manager, |m| {
        write_out(out, m.tokens_per_block() as i32, "out")
    })
}
