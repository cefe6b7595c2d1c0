//! The C ABI. No logic lives here: argument validation, conversion to Rust types, one lock per
//! call, and a panic guard on every entry point.
#![allow(non_camel_case_types)]
// C entry points take raw pointers by design: null is checked, validity is the C caller's
// documented contract, as for any C library.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub mod cuda;
pub mod events;
pub mod handle;
pub mod lifecycle;
pub mod manager;
pub mod multimodal;
pub mod publisher;
pub mod sizing;
pub mod status;
pub mod types;
pub mod version;
