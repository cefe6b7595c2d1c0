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

use super::handle::{FfiError, FfiResult};
use super::status::kvb_status_t;

pub(crate) fn check_struct_size(got: u32, expected: usize, what: &str) -> FfiResult {
    if got as usize != expected {
        return Err(FfiError(
            kvb_status_t::KVB_STATUS_STRUCT_SIZE,
            format!("{what}.struct_size is {got}, this library expects {expected} (call the *_init function)"),
        ));
    }
    Ok(())
}
