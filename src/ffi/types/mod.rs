//! `#[repr(C)]` structs and enums of the C ABI, and their conversion to Rust types, one file per
//! group: enums, the configuration, requests, results.

mod config;
mod enums;
mod request;
mod results;

pub use config::*;
pub use enums::*;
pub use request::*;
pub use results::*;

use super::handle::{null_error, FfiError, FfiResult};
use super::status::kvb_status_t;

/// Initialises a caller's struct of `size` bytes (the caller's own `sizeof`, which the header's
/// `*_init` macros pass): the first `size` bytes of `value`, `struct_size` set to `size`, and
/// nothing past them, so a program built against an earlier, shorter layout is never written
/// past its struct. `size` must be a layout the library reads (`accepted`),
/// `KVB_STATUS_STRUCT_SIZE` otherwise.
pub(crate) fn init_sized<T: Copy>(
    out: *mut T,
    size: usize,
    accepted: &[usize],
    what: &str,
    mut value: T,
) -> FfiResult {
    if out.is_null() {
        return Err(null_error(what));
    }
    if !accepted.contains(&size) || size > std::mem::size_of::<T>() {
        return Err(FfiError(
            kvb_status_t::KVB_STATUS_STRUCT_SIZE,
            format!("{what}: size {size} is no layout this library reads ({accepted:?})"),
        ));
    }
    // SAFETY: every struct initialised here starts with its `uint32_t struct_size`; the caller
    // has `size` writable bytes, no more than `value` has.
    unsafe {
        (&mut value as *mut T).cast::<u32>().write(size as u32);
        std::ptr::copy_nonoverlapping((&value as *const T).cast::<u8>(), out.cast::<u8>(), size);
    }
    Ok(())
}

/// The body of an `*_init_sized` entry point for a struct with one layout: `init_sized` under
/// `guard`.
pub(crate) fn init_exact<T: Copy>(out: *mut T, size: usize, what: &str, value: T) -> kvb_status_t {
    super::handle::guard(|| init_sized(out, size, &[std::mem::size_of::<T>()], what, value))
}

pub(crate) fn check_struct_size(got: u32, expected: usize, what: &str) -> FfiResult {
    if got as usize != expected {
        return Err(FfiError(
            kvb_status_t::KVB_STATUS_STRUCT_SIZE,
            format!("{what}.struct_size is {got}, this library expects {expected} (call the *_init function)"),
        ));
    }
    Ok(())
}
