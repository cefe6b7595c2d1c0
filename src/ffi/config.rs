//! C entry points that configure, create and destroy a manager, and read its block size.

use super::handle::{
    destroy_handle, guard, kvb_manager_t, new_handle, null_error, require_out, with_manager,
    write_out, FfiError,
};
use super::status::kvb_status_t;
use super::types::{
    kvb_manager_config_t, manager_config, manager_config_default, MANAGER_CONFIG_V1_SIZE,
};
use crate::manager::KvCacheManager;

/// Fills `config` with defaults (reuse, partial reuse, copy-on-partial and onboarding on,
/// 32 tokens per block, beam 1, offload minimum priority 30, 2 bytes per element, no pool
/// memory) and sets `struct_size`. The caller then sets `windows` and `max_sequence_length`.
#[no_mangle]
pub extern "C" fn kvb_manager_config_init(config: *mut kvb_manager_config_t) -> kvb_status_t {
    guard(|| write_out(config, manager_config_default(), "config"))
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
        if config.is_null() {
            return Err(null_error("config"));
        }
        // SAFETY: non-null; every version of the struct starts with its `struct_size`.
        let size = unsafe { std::ptr::read_unaligned(config.cast::<u32>()) } as usize;
        let current;
        let c = if size == MANAGER_CONFIG_V1_SIZE {
            // A version-1 caller: its fields, and the defaults of the later ones.
            let mut upgraded = manager_config_default();
            // SAFETY: the caller's struct holds `size` readable bytes; `upgraded` is larger.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    config.cast::<u8>(),
                    (&mut upgraded as *mut kvb_manager_config_t).cast::<u8>(),
                    size,
                );
            }
            upgraded.struct_size = std::mem::size_of::<kvb_manager_config_t>() as u32;
            current = upgraded;
            &current
        } else {
            // SAFETY: non-null; a struct of this version or a size `manager_config` refuses
            // before reading further (it reads `struct_size` first).
            unsafe { &*config }
        };
        let cfg = manager_config(c)?;
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
