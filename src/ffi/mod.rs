//! The C ABI. No logic lives here: argument validation, conversion to Rust types, one lock per
//! call, and a panic guard on every entry point.
#![allow(non_camel_case_types)]

pub mod status;
